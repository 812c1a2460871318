package postgres_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
	"weak"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/coinexport/export/pkg/postgres"
	"github.com/coinexport/export/pkg/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

// The sessions of a pool get Open's defaults: no JIT, no sequential scans
// with IndexScansOnly, the binary's name with ApplicationName; a setting in
// the DSN wins over each.
func TestOpenSessionDefaults(t *testing.T) {
	dsn := testenv.PostgresURL(t) // key=value form
	indexScansOnly := []postgres.Option{postgres.IndexScansOnly()}
	for _, tc := range []struct {
		name, dsn string
		opts      []postgres.Option
		setting   string
		want      string
	}{
		{"jit off by default", dsn, nil, "jit", "off"},
		{"dsn sets jit", dsn + " jit=on", nil, "jit", "on"},
		{"seqscan on without the option", dsn, nil, "enable_seqscan", "on"},
		{"seqscan off with IndexScansOnly", dsn, indexScansOnly, "enable_seqscan", "off"},
		{"dsn sets enable_seqscan", dsn + " enable_seqscan=on", indexScansOnly, "enable_seqscan", "on"},
		{"application_name from ApplicationName", dsn, []postgres.Option{postgres.ApplicationName("sales-writer")}, "application_name", "sales-writer"},
		{"dsn sets application_name", dsn + " application_name=ops", []postgres.Option{postgres.ApplicationName("sales-writer")}, "application_name", "ops"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool, err := postgres.Open(context.Background(), tc.dsn, tc.opts...)
			if err != nil {
				t.Fatalf("Open(dsn): %v", err)
			}
			defer pool.Close()
			var got string
			if err := pool.QueryRow(context.Background(), "SHOW "+tc.setting).Scan(&got); err != nil {
				t.Fatalf("SHOW %s: %v", tc.setting, err)
			}
			if got != tc.want {
				t.Errorf("SHOW %s = %q, want %q", tc.setting, got, tc.want)
			}
		})
	}
}

// A service started before its database waits for it: OpenWhenReached
// keeps trying while PostgreSQL refuses connections (here a loopback port
// that starts forwarding to it only later), and returns the pool once it
// answers, having said in the log why it waited.
func TestOpenWhenReachedWaitsForTheDatabase(t *testing.T) {
	_, tcpDSN, listen, socket := postgresBehindAClosedPort(t)
	go func() {
		time.Sleep(700 * time.Millisecond)
		forwardFrom(listen(), socket)
	}()
	var logs bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := postgres.OpenWhenReached(ctx, tcpDSN, slog.New(slog.NewJSONHandler(&logs, nil)))
	if err != nil {
		t.Fatalf("OpenWhenReached(database reachable after 0.7 s) = %v", err)
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		t.Errorf("Ping after OpenWhenReached: %v", err)
	}
	if !strings.Contains(logs.String(), "PostgreSQL not reached") {
		t.Errorf("log = %q, want the wait explained", logs.String())
	}
}

// Behind PgBouncer, a binary started before PostgreSQL (a stack started
// all at once) meets PgBouncer's own "query_wait_timeout" (08P01) when the
// pooler's wait is shorter than Open's ping. OpenWhenReached waits on it
// as on PostgreSQL itself, and returns the pool once PostgreSQL answers
// behind the pooler; it stopped the binary at once, as for a wrong setting.
func TestOpenWhenReachedWaitsBehindAPooler(t *testing.T) {
	_, tcpDSN, listen, socket := postgresBehindAClosedPort(t)
	pooled := testenv.PgBouncer(t, tcpDSN, "session", "query_wait_timeout = 1", "server_login_retry = 1",
		"ignore_startup_parameters = "+postgres.PoolerIgnoredSettings)
	var logs testenv.Output
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	go func() {
		for !strings.Contains(logs.String(), "query_wait_timeout") {
			select {
			case <-ctx.Done():
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
		forwardFrom(listen(), socket)
	}()
	pool, err := postgres.OpenWhenReached(ctx, pooled, slog.New(slog.NewJSONHandler(&logs, nil)))
	if err != nil {
		t.Fatalf("OpenWhenReached(PgBouncer before PostgreSQL) = %v, want it to wait for PostgreSQL; log:\n%s", err, logs.String())
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		t.Errorf("Ping after OpenWhenReached: %v", err)
	}
}

// PostgreSQL that is up but not ready refuses each new connection: while
// it starts or recovers (57P03), or with every slot taken (53300).
// OpenWhenReached waits on both without a pooler; PgBouncer 1.18 passes
// the refusal on as its own 08P01, and the binary stopped at once, as for
// a wrong setting, whenever a stack started together met PostgreSQL so. It
// now waits there too, a role's CONNECTION LIMIT reached included (whose
// words it did not know until session 62); a login PostgreSQL refuses
// behind the pooler (here
// a database it does not have) still stops it at once.
func TestOpenWhenReachedWaitsBehindAPoolerForAPostgreSQLNotReady(t *testing.T) {
	dsn := testenv.PostgresURL(t)
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(cfg.Host, fmt.Sprintf(".s.PGSQL.%d", cfg.Port))
	for _, refusal := range []*pgproto3.ErrorResponse{
		{Severity: "FATAL", Code: "57P03", Message: "the database system is starting up", Routine: "ProcessStartupPacket"},
		{Severity: "FATAL", Code: "53300", Message: "sorry, too many clients already", Routine: "InitProcess"},
		{Severity: "FATAL", Code: "53300", Message: `too many connections for role "svc"`, Routine: "InitializeSessionUserId"},
	} {
		t.Run(refusal.Message, func(t *testing.T) {
			var logs testenv.Output
			// Ready once the wait has logged the refusal (JSON escapes its quotes).
			logged, _ := json.Marshal(refusal.Message)
			ready := func() bool { return strings.Contains(logs.String(), strings.Trim(string(logged), `"`)) }
			host, port, _ := net.SplitHostPort(refusingUntil(t, refusal, ready, socket))
			pooled := testenv.PgBouncer(t, fmt.Sprintf("%s host=%s port=%s", dsn, host, port), "session",
				"server_login_retry = 1", "ignore_startup_parameters = "+postgres.PoolerIgnoredSettings)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			pool, err := postgres.OpenWhenReached(ctx, pooled, slog.New(slog.NewJSONHandler(&logs, nil)))
			if err != nil {
				t.Fatalf("OpenWhenReached(PgBouncer before PostgreSQL refusing %q) = %v, want it to wait; log:\n%s", refusal.Message, err, logs.String())
			}
			pool.Close()
		})
	}

	refusing := testenv.PgBouncer(t, dsn+" dbname=no_such_database_here", "session",
		"ignore_startup_parameters = "+postgres.PoolerIgnoredSettings)
	_, err = postgres.OpenWhenReached(context.Background(), refusing, slog.New(slog.NewJSONHandler(io.Discard, nil)))
	if err == nil || errors.Is(err, postgres.ErrStopped) {
		t.Errorf("OpenWhenReached(PgBouncer before an unknown database) = %v, want the refusal at once", err)
	}
}

// refusingUntil serves a loopback port where a PostgreSQL not ready would:
// it answers each connection's startup with refusal, as PostgreSQL does
// then, until ready reports true, and from then on forwards connections
// to the PostgreSQL at socket.
func refusingUntil(t *testing.T, refusal *pgproto3.ErrorResponse, ready func() bool, socket string) string {
	t.Helper()
	return testenv.ServeConns(t, func(c net.Conn) {
		if ready() {
			forward(c, socket)
			return
		}
		refuseStartup(c, refusal)
	})
}

// refuseStartup answers a connection's startup with refusal.
func refuseStartup(c net.Conn, refusal *pgproto3.ErrorResponse) {
	backend := pgproto3.NewBackend(c, c)
	for {
		msg, err := backend.ReceiveStartupMessage()
		if err != nil {
			return
		}
		if _, ok := msg.(*pgproto3.SSLRequest); ok {
			if _, err := c.Write([]byte("N")); err != nil {
				return
			}
			continue
		}
		backend.Send(refusal)
		_ = backend.Flush()
		return
	}
}

// It stops trying when ctx ends (the process is told to stop), and an
// invalid DSN or a server that refuses the client is no reason to wait.
func TestOpenWhenReachedGivesUp(t *testing.T) {
	host, port, _ := net.SplitHostPort(testenv.RefusingAddr(t))
	log := slog.New(slog.NewJSONHandler(io.Discard, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 600*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := postgres.OpenWhenReached(ctx, fmt.Sprintf("host=%s port=%s user=postgres connect_timeout=1", host, port), log)
	if !errors.Is(err, postgres.ErrStopped) || time.Since(start) > 10*time.Second {
		t.Errorf("OpenWhenReached(nothing listening, ctx of 0.6 s) = %v after %s, want ErrStopped soon after ctx ends", err, time.Since(start))
	}
	// A server that answers and refuses this client (here: no such
	// database) is a configuration to fix, not a wait.
	start = time.Now()
	_, err = postgres.OpenWhenReached(context.Background(), testenv.PostgresURL(t)+" dbname=no_such_database_here", log)
	if err == nil || errors.Is(err, postgres.ErrStopped) || time.Since(start) > 5*time.Second {
		t.Errorf("OpenWhenReached(unknown database) = %v after %s, want the refusal at once", err, time.Since(start))
	}
	if _, err := postgres.OpenWhenReached(context.Background(), "host=::bad:: port=x", log); err == nil || errors.Is(err, postgres.ErrNotReached) {
		t.Errorf("OpenWhenReached(invalid DSN) = %v, want the DSN refused at once", err)
	}
}

// A gateway started while PostgreSQL cannot be reached serves at once:
// OpenServing returns the pool unreached, having said so in the log, and
// the pool connects once PostgreSQL answers (here a loopback port that
// starts forwarding to it only after). What waiting cannot mend is still
// refused at once, and a stop during its check is a stop.
func TestOpenServingDoesNotWaitForTheDatabase(t *testing.T) {
	dsn, tcpDSN, listen, socket := postgresBehindAClosedPort(t)
	var logs bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&logs, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := postgres.OpenServing(ctx, tcpDSN, log)
	if err != nil {
		t.Fatalf("OpenServing(nothing listening) = %v, want the pool, unreached", err)
	}
	defer pool.Close()
	if !strings.Contains(logs.String(), "PostgreSQL not reached") {
		t.Errorf("log = %q, want the unreached database said", logs.String())
	}
	go forwardFrom(listen(), socket)
	for err = pool.Ping(ctx); err != nil && ctx.Err() == nil; err = pool.Ping(ctx) {
		time.Sleep(50 * time.Millisecond) // the forwarder's listener may not be up yet
	}
	if err != nil {
		t.Errorf("Ping once the database is there: %v", err)
	}

	if _, err := postgres.OpenServing(context.Background(), dsn+" dbname=no_such_database_here", log); err == nil || errors.Is(err, postgres.ErrStopped) {
		t.Errorf("OpenServing(unknown database) = %v, want the refusal", err)
	}
	if _, err := postgres.OpenServing(context.Background(), "host=::bad:: port=x", log); err == nil || errors.Is(err, postgres.ErrNotReached) {
		t.Errorf("OpenServing(invalid DSN) = %v, want the DSN refused", err)
	}
	stopped, stop := context.WithCancel(context.Background())
	stop()
	if _, err := postgres.OpenServing(stopped, tcpDSN, log); !errors.Is(err, postgres.ErrStopped) {
		t.Errorf("OpenServing(ctx ended) = %v, want ErrStopped", err)
	}
}

// postgresBehindAClosedPort returns the test database's DSN, the same on a
// loopback address that refuses connections until listen is called (no
// other listener can take it meanwhile) and forwardFrom(listen(),
// socket) forwards them to the database's socket, and those two.
func postgresBehindAClosedPort(t *testing.T) (dsn, tcpDSN string, listen func() net.Listener, socket string) {
	dsn = testenv.PostgresURL(t)
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	socket = filepath.Join(cfg.Host, fmt.Sprintf(".s.PGSQL.%d", cfg.Port))
	addr, listen := testenv.RefusingUntilListen(t)
	host, port, _ := net.SplitHostPort(addr)
	return dsn, fmt.Sprintf("%s host=%s port=%s", dsn, host, port), listen, socket
}

// forwardFrom forwards the connections fwd accepts to the Unix socket of
// a PostgreSQL, until the test ends (testenv closes fwd).
func forwardFrom(fwd net.Listener, socket string) {
	for {
		c, err := fwd.Accept()
		if err != nil {
			return
		}
		go forward(c, socket)
	}
}

func forward(c net.Conn, socket string) {
	defer c.Close()
	s, err := net.Dial("unix", socket)
	if err != nil {
		return
	}
	defer s.Close()
	go io.Copy(s, c)
	io.Copy(c, s)
}

// A closed pool is garbage: nothing the package registers keeps it. An
// OpenWhenReached that waits out an outage opens and closes a pool on
// every attempt (up to one every 250 ms), and each one kept alive was
// memory lost for the process's life (otelpgx.RecordStats registered a
// callback holding the pool on OpenTelemetry's global meter, which no
// provider ever replaced, so it was never released).
func TestClosedPoolIsNotRetained(t *testing.T) {
	pool, err := postgres.Open(context.Background(), testenv.PostgresURL(t))
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	closed := weak.Make(pool)
	pool.Close()
	pool = nil
	deadline := time.Now().Add(5 * time.Second)
	for closed.Value() != nil {
		if time.Now().After(deadline) {
			t.Fatal("a closed pool is still reachable 5 s after Close: something registered at Open holds it")
		}
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
}

// The side connection of the readiness checks is renewed, so that they see
// what PostgreSQL tells new sessions only: here a
// default_transaction_read_only set with ALTER DATABASE (a primary fenced
// during a failover), which the service's pool meets at its next
// connection; as well a password changed or a role made NOLOGIN, which
// refuse the next connection. On pgxpool's default hour-long lifetime the
// check, on its connection in use every second, kept reading the old
// session's state.
func TestSideConnectionSeesWhatNewSessionsSee(t *testing.T) {
	postgres.ShortenSideConnLifetime(t, 200*time.Millisecond)
	ctx := context.Background()
	url := testenv.PostgresURL(t)
	pool := testenv.Pool(t, url)
	side, err := postgres.OpenSide(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	defer side.Close()
	readOnly := func() string {
		var v string
		if err := side.QueryRow(ctx, "SELECT current_setting('default_transaction_read_only')").Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	if got := readOnly(); got != "off" {
		t.Fatalf("default_transaction_read_only = %q before, want off", got)
	}
	if _, err := pool.Exec(ctx, "ALTER DATABASE "+pool.Config().ConnConfig.Database+" SET default_transaction_read_only = on"); err != nil {
		t.Fatal(err)
	}
	// Used as the checks use it, every 50 ms: on the hour-long lifetime its
	// one connection would serve all this while.
	for deadline := time.Now().Add(10 * time.Second); readOnly() != "on"; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the side connection still reads default_transaction_read_only off 10 s after ALTER DATABASE: it was never renewed")
		}
	}
}
