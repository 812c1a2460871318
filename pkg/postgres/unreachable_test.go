package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/postgres"
	"github.com/coinexport/export/pkg/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

func TestUnreachableClassifiesErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"admin shutdown", &pgconn.PgError{Code: "57P01"}, true},
		{"starting up", fmt.Errorf("read: %w", &pgconn.PgError{Code: "57P03"}), true},
		{"connection failure", &pgconn.PgError{Code: "08006"}, true},
		{"broken pipe", &net.OpError{Op: "write", Net: "unix", Err: syscall.EPIPE}, true},
		{"connection reset", fmt.Errorf("x: %w", syscall.ECONNRESET), true},
		{"cut short", fmt.Errorf("receive: %w", io.ErrUnexpectedEOF), true},
		{"closed by pgx", pgconn.ErrConnClosed, true},
		{"no connection slot", &pgconn.PgError{Code: "53300"}, true},
		{"protocol violation (a client bug)", &pgconn.PgError{Code: "08P01", Routine: "SocketBackend"}, false},
		{"PgBouncer: PostgreSQL refuses its login", &pgconn.PgError{Severity: "FATAL", Code: "08P01",
			Message: "server login has been failing, try again later (server_login_retry)"}, true},
		{"PgBouncer: no server connection in time", &pgconn.PgError{Severity: "FATAL", Code: "08P01", Message: "query_wait_timeout"}, true},
		{"caller's deadline", context.DeadlineExceeded, false},
		{"caller's deadline, wrapped", fmt.Errorf("read: %w", context.DeadlineExceeded), false},
		{"caller hung up", context.Canceled, false},
		{"unique violation", &pgconn.PgError{Code: "23505"}, false},
		{"deadlock", &pgconn.PgError{Code: "40P01"}, false},
		{"query canceled", &pgconn.PgError{Code: "57014"}, false},
		{"a bug", errors.New("scan: wrong number of columns"), false},
		{"nil", nil, false},
	} {
		if got := postgres.Unreachable(tc.err); got != tc.want {
			t.Errorf("Unreachable(%s: %v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}

// Of a pooler's own errors, only PgBouncer's query_wait_timeout, the
// whole message, says that nothing was sent: its other words (its
// query_timeout, a lost server connection) may come once a statement was,
// and PostgreSQL's own 08P01, with its routine, is not a pooler's (its
// message may quote anything). The real query_wait_timeout is met in
// sales-writer's TestSaleThatWaitedInThePoolerSaysNothingWasApplied.
func TestNothingSentReadsOnlyThePoolersWait(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"no server connection in time (FATAL)", fmt.Errorf("sales: %w", &pgconn.PgError{Severity: "FATAL", Code: "08P01", Message: "query_wait_timeout"}), true},
		{"no server connection in time (ERROR)", &pgconn.PgError{Severity: "ERROR", Code: "08P01", Message: "query_wait_timeout"}, true},
		{"query_timeout", &pgconn.PgError{Severity: "FATAL", Code: "08P01", Message: "query_timeout"}, false},
		{"server connection lost", &pgconn.PgError{Severity: "FATAL", Code: "08P01", Message: "server conn crashed?"}, false},
		{"the words quoted in another message", &pgconn.PgError{Severity: "FATAL", Code: "08P01", Message: "server login has been failing, cached error: query_wait_timeout"}, false},
		{"PostgreSQL's protocol violation", &pgconn.PgError{Severity: "FATAL", Code: "08P01", Message: "query_wait_timeout", Routine: "SocketBackend"}, false},
		{"another code", &pgconn.PgError{Severity: "FATAL", Code: "57P01", Message: "query_wait_timeout"}, false},
	} {
		if got := postgres.NothingSent(tc.err); got != tc.want {
			t.Errorf("NothingSent(%s: %v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}

// Behind PgBouncer, what says that PostgreSQL is down or starting is
// waited for at start, in the words of each release (notThereYet; 1.18's
// are also met for real in TestOpenWhenReachedWaitsBehindAPooler*), and
// what says it refuses the pooler's login or the pooler's own setting is
// not.
func TestNotReachedYetReadsPgBouncersWords(t *testing.T) {
	for _, tc := range []struct {
		message string
		want    bool
	}{
		{"query_wait_timeout", true},
		{"the database system is starting up", true},
		{"the database system is not yet accepting connections", true},
		{"sorry, too many clients already", true},
		{"remaining connection slots are reserved for non-replication superuser connections", true},
		{`too many connections for role "svc"`, true},
		{`too many connections for database "exportsvc"`, true},
		{`server login has been failing, cached error: too many connections for role "svc" (server_login_retry)`, true},
		{"server login has been failing, cached error: connect failed (server_login_retry)", true},
		{"server login has been failing, cached error: the database system is starting up (server_login_retry)", true},
		{"pgbouncer cannot connect to server", true},
		{"server login has been failing, try again later (server_login_retry)", false},
		{`server login has been failing, cached error: password authentication failed for user "svc" (server_login_retry)`, false},
		{`database "exportsvc" does not exist`, false},
		{"no such database: exportsvc", false},
		{"unsupported startup parameter: jit", false},
	} {
		err := fmt.Errorf("ping: %w", &pgconn.PgError{Severity: "FATAL", Code: "08P01", Message: tc.message})
		if got := postgres.NotReachedYet(err); got != tc.want {
			t.Errorf("NotReachedYet(PgBouncer: %q) = %v, want %v", tc.message, got, tc.want)
		}
	}
}

// What pgx returns when the server is not there, and when the server ends
// the session under a pool's feet, is read as unreachable.
func TestUnreachableOnRealFailures(t *testing.T) {
	ctx := context.Background()
	nobody := "postgres://postgres@" + testenv.RefusingAddr(t) + "/postgres?connect_timeout=2"
	conn, err := pgconn.Connect(ctx, nobody)
	if err == nil {
		conn.Close(ctx)
		t.Fatal("connected to a closed port")
	}
	if !postgres.Unreachable(err) {
		t.Errorf("Unreachable(connect to a closed port: %v) = false, want true", err)
	}

	// The server answered the connection: the database does not exist. A
	// configuration error, not an outage.
	unknown := testenv.PostgresURL(t) + " dbname=no_such_database"
	if conn, err := pgconn.Connect(ctx, unknown); err == nil {
		conn.Close(ctx)
		t.Error("connected to a database that does not exist")
	} else if postgres.Unreachable(err) {
		t.Errorf("Unreachable(connect to an unknown database: %v) = true, want false", err)
	}

	pool := testenv.Postgres(t)
	c, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	var pid uint32 = c.Conn().PgConn().PID()
	if _, err := pool.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
		t.Fatal(err)
	}
	_, err = c.Exec(ctx, "SELECT 1")
	if err == nil || !postgres.Unreachable(err) {
		t.Errorf("Unreachable(statement on a terminated session: %v) = false, want true", err)
	}
	if _, err := pool.Exec(ctx, "SELECT 1/0"); err == nil || postgres.Unreachable(err) {
		t.Errorf("Unreachable(division by zero: %v) = true, want false", err)
	}
}

// Every SQLSTATE a production PostgreSQL sends for work it cannot do now
// is Unavailable (the services' 503 with Retry-After), and what no retry
// mends is not (their 500, or a refusal the caller gets).
func TestUnavailableClassifiesErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"connection failure (unreachable)", &pgconn.PgError{Code: "08006"}, true},
		{"connection refused (unreachable)", fmt.Errorf("x: %w", syscall.ECONNREFUSED), true},
		{"recovery conflict: snapshot, lock, tablespace", fmt.Errorf("read: %w", &pgconn.PgError{Code: "40001", Message: "canceling statement due to conflict with recovery"}), true},
		{"recovery conflict: buffer pin deadlock; deadlock", &pgconn.PgError{Code: "40P01"}, true},
		{"read-only transaction (a standby, a fenced primary)", &pgconn.PgError{Code: "25006"}, true},
		{"insufficient resources", &pgconn.PgError{Code: "53000"}, true},
		{"disk full", &pgconn.PgError{Code: "53100"}, true},
		{"out of memory", &pgconn.PgError{Code: "53200"}, true},
		{"too many connections", &pgconn.PgError{Code: "53300"}, true},
		{"configuration limit exceeded", &pgconn.PgError{Code: "53400"}, true},
		{"transaction-id wraparound guard (program limit exceeded)", &pgconn.PgError{Code: "54000"}, true},
		{"lock_timeout", &pgconn.PgError{Code: "55P03"}, true},
		{"operator intervention", &pgconn.PgError{Code: "57000"}, true},
		{"query canceled", &pgconn.PgError{Code: "57014"}, true},
		{"admin shutdown", &pgconn.PgError{Code: "57P01"}, true},
		{"crash shutdown", &pgconn.PgError{Code: "57P02"}, true},
		{"cannot connect now", &pgconn.PgError{Code: "57P03"}, true},
		{"database dropped (a standby's database conflict)", &pgconn.PgError{Code: "57P04"}, true},
		{"idle session timeout", &pgconn.PgError{Code: "57P05"}, true},
		{"protocol violation (a client bug)", &pgconn.PgError{Code: "08P01", Routine: "SocketBackend"}, false},
		{"PgBouncer: PostgreSQL refuses its login", &pgconn.PgError{Code: "08P01", Message: "server login has been failing, try again later (server_login_retry)"}, true},
		{"unique violation", &pgconn.PgError{Code: "23505"}, false},
		{"deferred constraint at commit", &pgconn.PgError{Code: "40002"}, false},
		{"in failed transaction (a bug)", &pgconn.PgError{Code: "25P02"}, false},
		{"object in use", &pgconn.PgError{Code: "55006"}, false},
		{"undefined column (a schema behind)", &pgconn.PgError{Code: "42703"}, false},
		{"password changed under the service", &pgconn.PgError{Code: "28P01"}, true},
		{"role dropped or NOLOGIN, no pg_hba line", &pgconn.PgError{Code: "28000"}, true},
		{"database dropped or renamed", &pgconn.PgError{Code: "3D000"}, true},
		{"I/O error", &pgconn.PgError{Code: "58030"}, true},
		{"a file of the cluster missing", &pgconn.PgError{Code: "58P01"}, true},
		{"internal error", &pgconn.PgError{Code: "XX000"}, true},
		{"data corrupted", &pgconn.PgError{Code: "XX001"}, true},
		{"index corrupted", &pgconn.PgError{Code: "XX002"}, true},
		{"permission denied (a grant missing: a bug of the migration or the setup)", &pgconn.PgError{Code: "42501"}, false},
		{"caller's deadline", context.DeadlineExceeded, false},
		{"caller hung up", context.Canceled, false},
		{"a bug", errors.New("scan: wrong number of columns"), false},
		{"nil", nil, false},
	} {
		if got := postgres.Unavailable(tc.err); got != tc.want {
			t.Errorf("Unavailable(%s: %v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}

// What a real server answers a write on a read-only session, a statement
// and a statement behind another session's lock past lock_timeout or
// statement_timeout, is Unavailable.
func TestUnavailableOnRealRefusals(t *testing.T) {
	ctx := context.Background()
	url, pool, err := tableRefusedOnAReadOnlySession(t)
	if !postgres.Unavailable(err) {
		t.Errorf("Unavailable(insert on a read-only session: %v) = false, want true", err)
	}

	tx := testenv.InTransaction(t, pool, "LOCK TABLE t IN ACCESS EXCLUSIVE MODE")
	defer tx.Rollback(ctx)
	for _, setting := range []string{"lock_timeout=50", "statement_timeout=50"} {
		blocked, err := pgconn.Connect(ctx, url+" "+setting)
		if err != nil {
			t.Fatal(err)
		}
		_, err = blocked.Exec(ctx, "SELECT * FROM t").ReadAll()
		blocked.Close(ctx)
		if !postgres.Unavailable(err) {
			t.Errorf("Unavailable(read behind a lock with %s: %v) = false, want true", setting, err)
		}
	}
}

// What a running service meets when its database is renamed or dropped,
// its role dropped or its password changed, under it: the server refuses
// each new connection of its pool (the password on a cluster that asks
// for one: the shared one trusts every login). That is Unavailable (503
// with Retry-After, the client retries and the operator acts), not the
// 500 of a bug, but still not Unreachable, which would have a binary
// starting with such a DSN wait for ever instead of stopping on the
// configuration to fix; and Cause says what to do.
func TestRefusedConnectionsAreUnavailable(t *testing.T) {
	ctx := context.Background()
	url := testenv.PostgresURL(t)
	for _, tc := range []struct {
		name, dsn, code, cause string
	}{
		{"a database that does not exist", url + " dbname=no_such_database", "3D000", "DATABASE_URL's database does not exist"},
		{"a role that does not exist", url + " user=no_such_role", "28000", "PostgreSQL refused DATABASE_URL's role"},
		{"a password that does not match", testenv.PasswordCluster(t).DSN + " password=" + wrongPassword, "28P01", "PostgreSQL refused the password of DATABASE_URL's role"},
	} {
		pool := testenv.Pool(t, tc.dsn)
		_, err := pool.Exec(ctx, "SELECT 1")
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != tc.code {
			t.Fatalf("a statement on %s: %v, want SQLSTATE %s", tc.name, err, tc.code)
		}
		if !postgres.Unavailable(err) || postgres.Unreachable(err) {
			t.Errorf("%s: Unavailable = %v, Unreachable = %v, want true, false", tc.name, postgres.Unavailable(err), postgres.Unreachable(err))
		}
		if got := postgres.Cause(err); !strings.HasPrefix(got, tc.cause) {
			t.Errorf("Cause(%s) = %q, want it to start %q", tc.name, got, tc.cause)
		}
		if strings.Contains(err.Error(), wrongPassword) {
			t.Errorf("the error of %s holds the password: %v", tc.name, err)
		}
	}
}

// wrongPassword is a password no role has.
const wrongPassword = "not-the-roles-password"

// What a real server answers when its disk is full (53100) or it is out
// of memory (53200), had from a server under file-size and memory caps
// (testenv.ShortOfResources), is Unavailable, not Unreachable (the
// connection serves on), nor NothingSent (the statement was sent), and
// Cause says what to put right.
func TestResourceShortagesAreUnavailable(t *testing.T) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testenv.ShortOfResources(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var version int
	if err := conn.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&version); err != nil {
		t.Fatal(err)
	}
	type shortage struct{ name, stmt, code, cause string }
	shortages := []shortage{{"out of memory", "SELECT length(repeat('x', 900000000))", "53200", "PostgreSQL is out of memory"}}
	if version < 160000 {
		// A table extended past the file-size cap: 1,000 bytes a row,
		// more rows than the cap holds.
		shortages = append(shortages, shortage{"disk full", "INSERT INTO t SELECT repeat('x', 1000) FROM generate_series(1, " +
			fmt.Sprint(2*testenv.FileSizeCap/1000) + ")", "53100", "PostgreSQL's disk is full"})
	} else {
		t.Logf("PostgreSQL %d: a file-size cap is not a full disk there (testenv.ShortOfResources); 53100 left untested", version)
	}
	if _, err := conn.Exec(ctx, "CREATE TABLE t (v text)"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range shortages {
		_, err := conn.Exec(ctx, tc.stmt)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != tc.code {
			t.Fatalf("%s: %v, want SQLSTATE %s", tc.name, err, tc.code)
		}
		if !postgres.Unavailable(err) || postgres.Unreachable(err) || postgres.NothingSent(err) {
			t.Errorf("%s: Unavailable = %v, Unreachable = %v, NothingSent = %v, want true, false, false", tc.name,
				postgres.Unavailable(err), postgres.Unreachable(err), postgres.NothingSent(err))
		}
		if got := postgres.Cause(err); !strings.HasPrefix(got, tc.cause) {
			t.Errorf("Cause(%s) = %q, want it to start %q", tc.name, got, tc.cause)
		}
		// The session serves on once the statement failed.
		if _, err := conn.Exec(ctx, "SELECT 1"); err != nil {
			t.Errorf("a statement after %s: %v", tc.name, err)
		}
	}
}

// What a server past its guard against transaction-id wraparound answers
// a write (a year or more of sales with autovacuum held back) is
// Unavailable, the services' 503 with Retry-After, not a 500 "the sale may
// have been applied": nothing is written, and the write passes once an
// operator's VACUUM has frozen the tables. Reads go on, and Cause says
// what to do.
func TestTheWraparoundGuardIsUnavailable(t *testing.T) {
	ctx := context.Background()
	cluster := testenv.NewWraparoundCluster(t)
	cluster.Guard(t)
	pool := testenv.Pool(t, cluster.DSN)
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM export_items").Scan(&n); err != nil {
		t.Fatalf("a read past the guard: %v", err)
	}
	_, err := pool.Exec(ctx, "INSERT INTO platforms (id) VALUES ('p1')")
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "54000" {
		t.Fatalf("a write past the guard: %v, want SQLSTATE 54000", err)
	}
	if !postgres.Unavailable(err) || postgres.Unreachable(err) || postgres.NothingSent(err) {
		t.Errorf("Unavailable = %v, Unreachable = %v, NothingSent = %v, want true, false, false",
			postgres.Unavailable(err), postgres.Unreachable(err), postgres.NothingSent(err))
	}
	if got := postgres.Cause(err); !strings.HasPrefix(got, "PostgreSQL refuses to write, to avoid transaction-id wraparound") {
		t.Errorf("Cause = %q, want it to name the wraparound guard", got)
	}
}

// PostgreSQL refuses a connection 57P03 while it starts, recovers or shuts
// down, saying which in its message; the cause read "starting up or in
// recovery" to an exportctl run during a restart's shutdown, whose message
// said "the database system is shutting down".
func TestCauseOfCannotConnectNowFitsEveryState(t *testing.T) {
	for _, state := range []string{"starting up", "shutting down", "recovery"} {
		err := &pgconn.PgError{Severity: "FATAL", Code: "57P03", Message: "the database system is " + state}
		if got := postgres.Cause(err); !strings.Contains(got, state) {
			t.Errorf("Cause(%s) = %q, want it to name %q", err.Message, got, state)
		}
	}
}

// Cause has a text for every SQLSTATE Unavailable takes, directly or by
// its class, and none for an error without one.
func TestCauseNamesWhatToDo(t *testing.T) {
	for _, code := range []string{"28P01", "28000", "3D000", "25006", "53100", "53200", "53300", "53400", "54000", "55P03",
		"57014", "57P01", "57P03", "57P04", "58030", "58P01", "XX000", "XX001", "XX002", "40001", "40P01"} {
		err := fmt.Errorf("sales: %w", &pgconn.PgError{Code: code})
		if !postgres.Unavailable(err) {
			t.Errorf("Unavailable(%s) = false", code)
		}
		if postgres.Cause(err) == "" {
			t.Errorf("Cause(%s) is empty", code)
		}
	}
	for _, err := range []error{errors.New("scan: wrong number of columns"), &pgconn.PgError{Code: "23505"}, &pgconn.PgError{Code: "X"}} {
		if got := postgres.Cause(err); got != "" {
			t.Errorf("Cause(%v) = %q, want none", err, got)
		}
	}
}

// CauseAttr adds no empty cause to a log line: a connection refused or
// lost has nothing Cause would add to its error.
func TestCauseAttrIsLeftOutWhenEmpty(t *testing.T) {
	var out strings.Builder
	log := slog.New(slog.NewJSONHandler(&out, nil))
	log.Error("x", postgres.CauseAttr(fmt.Errorf("dial: %w", syscall.ECONNREFUSED)))
	log.Error("y", postgres.CauseAttr(&pgconn.PgError{Code: "3D000"}))
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 || strings.Contains(lines[0], "cause") || !strings.Contains(lines[1], `"cause":"DATABASE_URL's database does not exist`) {
		t.Errorf("log lines = %q, want no cause on the first, the database's on the second", lines)
	}
}

// RolledBack is PostgreSQL's ERROR, after which the transaction committed
// nothing: a statement refused on a read-only session, one cancelled by
// statement_timeout, a deadlock raised in a batch's implicit transaction
// (whose first statement had inserted a row: it is gone too). A FATAL
// (the session ended, perhaps after a commit), an error without the
// unlocalized severity (a pooler's own) and a connection error are not.
func TestRolledBackIsAnErrorOfTheServer(t *testing.T) {
	ctx := context.Background()
	url, pool, readOnlyErr := tableRefusedOnAReadOnlySession(t)
	timed, err := pgconn.Connect(ctx, url+" statement_timeout=10")
	if err != nil {
		t.Fatal(err)
	}
	defer timed.Close(ctx)
	_, timeoutErr := timed.Exec(ctx, "SELECT pg_sleep(1)").ReadAll()
	batch := &pgx.Batch{}
	batch.Queue("INSERT INTO t VALUES (2)")
	batch.Queue(`DO $$BEGIN RAISE EXCEPTION 'deadlock detected' USING ERRCODE = '40P01'; END$$`)
	batchErr := pool.SendBatch(ctx, batch).Close()
	var rows int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM t").Scan(&rows); err != nil || rows != 0 {
		t.Fatalf("rows after the failed batch = %d (%v), want 0", rows, err)
	}
	for _, tt := range []struct {
		name string
		err  error
		want bool
	}{
		{"read-only", readOnlyErr, true},
		{"statement_timeout", timeoutErr, true},
		{"a deadlock in a batch", batchErr, true},
		{"a session the server ended", &pgconn.PgError{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: "57P05"}, false},
		{"an error without the unlocalized severity", &pgconn.PgError{Severity: "ERROR", Code: "08P01", Message: "server conn crashed?"}, false},
		{"a connection lost", io.ErrUnexpectedEOF, false},
	} {
		if got := postgres.RolledBack(tt.err); got != tt.want {
			t.Errorf("RolledBack(%s: %v) = %v, want %v", tt.name, tt.err, got, tt.want)
		}
	}
}

// tableRefusedOnAReadOnlySession makes table t on a test database and
// returns its URL, a pool on it, and what a read-only session answered an
// insert into t.
func tableRefusedOnAReadOnlySession(t *testing.T) (url string, pool *pgxpool.Pool, refused error) {
	t.Helper()
	ctx := context.Background()
	url = testenv.PostgresURL(t)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(ctx, "CREATE TABLE t (id int PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	readOnly, err := pgconn.Connect(ctx, url+" default_transaction_read_only=on")
	if err != nil {
		t.Fatal(err)
	}
	defer readOnly.Close(ctx)
	_, refused = readOnly.Exec(ctx, "INSERT INTO t VALUES (1)").ReadAll()
	return url, pool, refused
}

// A batch refused while PostgreSQL prepared its statements ran none of
// them, whatever it holds: NothingDone. One that failed building an
// argument is not: the statements queued before it reach PostgreSQL with
// pgx's Terminate and run, and here their COMMIT commits the row. Nor is
// a statement that failed as it ran, or a connection lost.
func TestNothingDoneReadsABatchThatFailedBeforeItRan(t *testing.T) {
	ctx := context.Background()
	_, pool, _ := tableRefusedOnAReadOnlySession(t)
	send := func(queue func(*pgx.Batch)) error {
		batch := &pgx.Batch{}
		queue(batch)
		return pool.SendBatch(ctx, batch).Close()
	}
	notPrepared := send(func(b *pgx.Batch) {
		b.Queue("INSERT INTO t VALUES (1)")
		b.Queue("COMMIT")
		b.Queue("SELECT * FROM no_such_table")
	})
	notBuilt := send(func(b *pgx.Batch) {
		b.Queue("INSERT INTO t VALUES (2)")
		b.Queue("COMMIT")
		b.Queue("SELECT $1::int", make(chan int))
	})
	_, ran := pool.Exec(ctx, "INSERT INTO t VALUES (1/0)")
	waitForRow(t, pool, 2) // the Terminate goes out after Close returns
	var rows int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM t WHERE id <> 2").Scan(&rows); err != nil || rows != 0 {
		t.Fatalf("rows of the batch refused in its prepare = %d (%v), want 0", rows, err)
	}
	for _, tt := range []struct {
		name string
		err  error
		want bool
	}{
		{"a statement not prepared", notPrepared, true},
		{"an argument not encoded, after a COMMIT", notBuilt, false},
		{"a statement that failed as it ran", ran, false},
		{"a connection lost", io.ErrUnexpectedEOF, false},
	} {
		if tt.err == nil {
			t.Fatalf("%s: no error", tt.name)
		}
		if got := postgres.NothingDone(tt.err); got != tt.want {
			t.Errorf("NothingDone(%s: %v) = %v, want %v", tt.name, tt.err, got, tt.want)
		}
	}
}

// waitForRow waits until table t holds the row id, committed by another
// session; it fails the test after 10 s.
func waitForRow(t *testing.T, pool *pgxpool.Pool, id int) {
	t.Helper()
	for range 500 {
		var there bool
		if err := pool.QueryRow(context.Background(), "SELECT EXISTS (SELECT FROM t WHERE id = $1)", id).Scan(&there); err != nil {
			t.Fatal(err)
		}
		if there {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("row %d of t was never committed", id)
}
