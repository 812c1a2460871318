// Package postgres opens the pgx pool every binary uses, traced with otelpgx.
package postgres

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"time"

	"github.com/coinexport/export/pkg/rawio"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Open parses dsn, attaches the OpenTelemetry tracer (a span per statement,
// without its values) and checks the connection. JIT compilation is off unless the
// DSN sets it: every statement of the services reads or writes a handful of
// rows by index, and when an estimate goes wrong (statistics missing after a
// column's type changed, say) PostgreSQL's JIT spends 100-200 ms compiling a
// statement that runs in under a millisecond, on every execution.
func Open(ctx context.Context, dsn string, opts ...Option) (*pgxpool.Pool, error) {
	return open(ctx, dsn, nil, opts...)
}

// open is Open, each new session's settings checked when log is not nil
// (settingsWatch).
func open(ctx context.Context, dsn string, log *slog.Logger, opts ...Option) (*pgxpool.Pool, error) {
	pool, err := newPool(ctx, dsn, log, opts...)
	if err != nil {
		return nil, err
	}
	if err := ping(ctx, pool, 10*time.Second); err != nil {
		closeUnwaited(pool)
		return nil, err
	}
	return pool, nil
}

// OpenSide opens a pool of one connection with pool's settings, for a
// service's own checks of its database (its readiness, export-reader's
// replica lag): through the service's pool a check would wait behind every
// statement queued for a connection, so a service saturated with work,
// but doing it, would fail its probe and be taken out of rotation, and a
// lag reading would age into a refusal of the syncs. The checks share it,
// each a trivial query every second or so: one connection more per
// instance, counted in PostgreSQL's max_connections. It connects on first
// use; the caller closes it after the checks have stopped.
//
// Its connection is renewed every sideConnLifetime: what PostgreSQL
// decides when a session starts reaches only new sessions, and on pgxpool's
// hour-long default lifetime the checks, on a connection in use every
// second, saw none of it for up to an hour while the service's pool, whose
// connections come and go with the load, did. Seen on a make run stack: the
// role's password changed, every read and sale failed to connect (28P01)
// while /healthz answered 200 ok, so the gateway kept the instances in
// rotation; the same goes for a role made NOLOGIN, the database renamed
// and a default_transaction_read_only set with ALTER DATABASE or ALTER ROLE.
// A new connection a minute costs one session start (SCRAM, a fork) per
// instance.
func OpenSide(ctx context.Context, pool *pgxpool.Pool) (*pgxpool.Pool, error) {
	cfg := pool.Config()
	cfg.MaxConns, cfg.MinConns, cfg.MinIdleConns = 1, 0, 0
	cfg.MaxConnLifetime, cfg.MaxConnLifetimeJitter = sideConnLifetime, sideConnLifetime/10
	cfg.ConnConfig.Tracer = newTracer() // a line of its own: the checks' releases are not the service pool's
	side, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: side connection: %w", err)
	}
	return side, nil
}

// sideConnLifetime is how long OpenSide's connection serves before it is
// renewed: how late, at most, the checks see what PostgreSQL tells new
// sessions only (a variable for the tests).
var sideConnLifetime = time.Minute

// newPool is Open without the check: pgxpool connects when a connection is
// first asked for.
func newPool(ctx context.Context, dsn string, log *slog.Logger, opts ...Option) (*pgxpool.Pool, error) {
	cfg, err := parseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.Tracer = newTracer()
	cfg.ConnConfig.DialFunc = dialingRaw(cfg.ConnConfig.DialFunc)
	recordWarnings(&cfg.ConnConfig.Config) // WarningsOf: whether a COMMIT a cancel reached committed plainly
	setDefault(cfg.ConnConfig.RuntimeParams, "jit", "off")
	for _, opt := range opts {
		opt(cfg.ConnConfig.RuntimeParams)
	}
	if log != nil {
		watchSettings(&cfg.ConnConfig.Config, newSettingsWatch(ownSettings(dsn, opts), log))
	}
	// No otelpgx.RecordStats: no binary installs an OpenTelemetry meter
	// provider (the pool's series are Prometheus', poolmetrics.Register),
	// and the callback it registered on the global meter held the pool for
	// the process's life, one per pool OpenWhenReached tried during an
	// outage (TestClosedPoolIsNotRetained).
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	return pool, nil
}

// ping checks that pool reaches PostgreSQL within timeout.
func ping(ctx context.Context, pool *pgxpool.Pool, timeout time.Duration) error {
	pingCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		return fmt.Errorf("%w: %w", ErrNotReached, settingRefused(err))
	}
	return nil
}

// OpenServing is Open for a process with answers to give while PostgreSQL
// cannot be reached (the gateway: its 503 envelopes, /v1/health, the shop
// schema route): it returns the pool at once, reached or not, and the pool
// connects when a connection is next asked for. Waiting, as OpenWhenReached
// does, left a gateway started during an outage (a rollout, a node drained)
// with no listener, so that once every gateway pod was such a one clients got
// an ingress's HTML page instead of the envelope. It still refuses at once
// what waiting would not mend (an invalid DSN, a server that refuses this
// client), and returns ErrStopped if ctx ends during its one check.
func OpenServing(ctx context.Context, dsn string, log *slog.Logger, opts ...Option) (*pgxpool.Pool, error) {
	pool, err := newPool(ctx, dsn, log, opts...)
	if err != nil {
		return nil, err
	}
	err = ping(ctx, pool, startCheckTimeout)
	switch {
	case err == nil:
		return pool, nil
	case ctx.Err() != nil:
		closeUnwaited(pool)
		return nil, fmt.Errorf("%w before PostgreSQL was reached", ErrStopped)
	case notReachedYet(err):
		log.Warn("PostgreSQL not reached; serving meanwhile, connecting again on each use", "error", err.Error())
		return pool, nil
	}
	pool.Close()
	return nil, err
}

// startCheckTimeout bounds OpenServing's check: a PostgreSQL that does not
// answer (a network cut) must not keep the listener down for long.
const startCheckTimeout = 3 * time.Second

// ErrNotReached is Open's error when PostgreSQL did not answer its ping.
var ErrNotReached = errors.New("postgres: ping")

// OpenWhenReached is Open for a long-running service: while PostgreSQL
// cannot be reached (a failover, or a database that starts after the
// service), it tries again, with a back-off up to 5 s, logging the failure
// every 10 s at most, until it is reached or ctx ends. Exiting instead put
// a Kubernetes pod into CrashLoopBackOff, whose back-off could keep it out
// for minutes after the database was back; waiting, it is unready (its
// listener not up yet), then serves. Any other error (an invalid DSN, a
// server that refuses this client: a wrong password, an unknown database)
// is returned at once, and ErrStopped if ctx ends first.
func OpenWhenReached(ctx context.Context, dsn string, log *slog.Logger, opts ...Option) (*pgxpool.Pool, error) {
	delay := 250 * time.Millisecond
	var logged time.Time
	for {
		pool, err := open(ctx, dsn, log, opts...)
		if ctx.Err() != nil {
			if pool != nil {
				pool.Close()
			}
			return nil, fmt.Errorf("%w before PostgreSQL was reached", ErrStopped)
		}
		if err == nil {
			return pool, nil
		}
		if !errors.Is(err, ErrNotReached) || !notReachedYet(err) {
			return pool, err
		}
		if time.Since(logged) >= 10*time.Second {
			log.Warn("PostgreSQL not reached; trying again until it is", "error", err.Error(), "retry_in", delay.String())
			logged = time.Now()
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w before PostgreSQL was reached", ErrStopped)
		case <-time.After(delay):
		}
		delay = min(2*delay, 5*time.Second)
	}
}

// ErrStopped is the error of OpenWhenReached and OpenServing when ctx
// ended (the process was told to stop) before PostgreSQL was reached: a
// stop, which the binary exits 0 for (StoppedBeforeReached).
var ErrStopped = errors.New("postgres: stopped")

// StoppedBeforeReached reports whether err says the binary was told to
// stop while it waited for PostgreSQL (ErrStopped), and logs so: a stop,
// not a failure, which run returns nil for (exit status 0). It is here,
// not in pkg/startup, so that a binary without a database (shop-schema)
// links no PostgreSQL client.
func StoppedBeforeReached(err error, log *slog.Logger) bool {
	if !errors.Is(err, ErrStopped) {
		return false
	}
	log.Info("stopped before PostgreSQL was reached")
	return true
}

// notReachedYet tells a database that is not there yet (refused, no
// socket, starting up, the ping timing out) from one that answered and
// refused this client (a wrong password, an unknown database, pg_hba): only
// waiting mends the first; the second is a configuration to fix, reported
// at once. A pooler's own refusals are reported at once too, as before
// Unreachable counted them: at start most are its configuration (no such
// database, an unsupported startup parameter: ErrSettingRefused), but
// those that say PostgreSQL is not there behind it (poolerWaiting).
func notReachedYet(err error) bool {
	return Unreachable(err) && (!fromPooler(err) || poolerWaiting(err)) || errors.Is(err, context.DeadlineExceeded)
}

// Option sets defaults for the pool's sessions; a setting in the DSN wins.
type Option func(runtimeParams map[string]string)

// IndexScansOnly keeps the planner off sequential scans (enable_seqscan=off)
// wherever an index can serve, for a service whose every statement reaches
// its rows through an index (by key, or an index range such as the sales
// writer's purge by expiry). It guards against a table analyzed while empty
// (an ANALYZE or `vacuumdb --analyze` right after a deployment or an
// upgrade): PostgreSQL then records it as empty, a statement planned on it
// scans it whole, and the connection keeps that plan while the table fills,
// until autovacuum's next ANALYZE (at most once a minute). The sales writer
// on such tables ran at 1,359 confirm + cancel pairs/s with PostgreSQL at
// 768 µs per pair, against 1,762 and 522 µs with this option, on the same
// machine (services/sales-writer/README.md). A statement with no index path
// at all still scans, at a cost above 10^10 that also crosses
// jit_above_cost if a DSN turns JIT on: EXPLAIN new statements.
func IndexScansOnly() Option {
	return func(params map[string]string) { setDefault(params, "enable_seqscan", "off") }
}

// ReadCommitted runs every transaction of the pool's sessions at READ
// COMMITTED, whatever the database's or the role's
// default_transaction_isolation (ALTER DATABASE or ALTER ROLE … SET, which
// a session's start-up parameter overrides) or the DSN's: unlike the
// Options above it is not a default, for a service whose correctness rests
// on a snapshot per statement. The sales writer takes an idempotency key's
// lock in one statement and reads the key in the next (its sales/queries.go,
// keyLock); at REPEATABLE READ or SERIALIZABLE the transaction's one
// snapshot was the lock statement's, taken before its wait, so the next
// statement did not see what the lock's holder had committed: a sale under
// a key bound meanwhile to another request was executed (both then held
// the key), and at SERIALIZABLE calls failed with serialization failures
// (500 once their retries ran out, seen in a drill).
func ReadCommitted() Option {
	return func(params map[string]string) { params["default_transaction_isolation"] = "read committed" }
}

// ApplicationName names the pool's sessions (application_name) after the
// binary, unless the DSN or PGAPPNAME names them: pg_stat_activity, the
// server's log (%a) and pg_stat_statements' callers then say which service
// holds a connection or runs a statement. Unnamed, every service's
// sessions looked alike, so a pool that grew or a session idle in a
// transaction could not be traced to its service (Unix-socket clients have
// no address either).
func ApplicationName(name string) Option {
	return func(params map[string]string) { setDefault(params, "application_name", name) }
}

// StatementTimeout has PostgreSQL cancel any statement of the pool that
// runs longer than d (statement_timeout, counted per statement), unless
// the DSN sets one: a statement waiting on a lock is then rolled back by
// the server itself, and its error (SQLSTATE 57014, QueryCanceled) says
// so, before the work is committed. A deadline on the client's context
// ends the call too, but pgx then sends a cancel request that races the
// statement and drops the connection, and the caller cannot tell whether
// the work committed.
func StatementTimeout(d time.Duration) Option {
	return func(params map[string]string) {
		setDefault(params, "statement_timeout", strconv.FormatInt(d.Milliseconds(), 10))
	}
}

// QueryCanceled reports whether err is PostgreSQL's cancel of a statement
// (statement_timeout, or an operator's pg_cancel_backend): it was rolled
// back.
func QueryCanceled(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "57014"
}

// RolledBack reports whether err is PostgreSQL's ERROR for a statement:
// the transaction it ran in was rolled back and committed nothing (the
// server never answers ERROR once a commit is done: a failure after it is
// a WARNING, or a PANIC that ends the session). A FATAL (the session ended)
// or a PANIC may come after the commit, and is not (but for the FATAL of a
// terminated session, which never does: Terminated). The severity is read
// unlocalized, as lc_messages translates the other; an error without it
// (a pooler's own, such as PgBouncer's "server conn crashed?" after the
// commit may have been sent) is not taken for one.
func RolledBack(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.SeverityUnlocalized == "ERROR"
}

// Terminated reports whether err is PostgreSQL's own FATAL 57P01
// (admin_shutdown: pg_terminate_backend, or a fast shutdown) read in
// place of a statement's answer: the session ended before its transaction
// committed, so nothing of it was done. PostgreSQL sends that FATAL only
// from a session running a statement or idle: its commit holds off the
// signal until the transaction has ended, and the ReadyForQuery that
// follows reaches the client before the FATAL would (pq_flush, then the
// next read of a command handles the signal; a session blocked writing to
// its client ends without a word); a session terminated while its COMMIT
// waits for a synchronous standby sends a WARNING instead, and then
// nothing (syncrep.c sets DestNone: a FATAL there would say that a
// committed transaction was not). An error without the routine that
// PostgreSQL names in every error it raises is a pooler's, which may
// follow a commit, and is not this; nor is another FATAL.
//
// It says so only of a transaction committed by the Sync that ends the
// batch whose answer it replaces (a batch without BEGIN or COMMIT of its
// own, or a COMMIT sent alone). PostgreSQL handles a pending termination
// after reading each message (PostgresMain's CHECK_FOR_INTERRUPTS after
// ReadCommand), so in a batch that carries its own COMMIT the FATAL can
// come after that COMMIT's answer, before the Sync's ReadyForQuery, and
// pgx reads it as the batch's error with the COMMIT done (a batch BEGIN,
// INSERT, COMMIT terminated while its commit slept in commit_delay: the
// FATAL, and the row there; the same INSERT alone: no error, the row
// there, and the FATAL read by the connection's next use, whose
// statements never ran).
func Terminated(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "57P01" && pgErr.SeverityUnlocalized == "FATAL" && pgErr.Routine != ""
}

// setDefault sets params[name] unless the DSN already did.
func setDefault(params map[string]string, name, value string) {
	if _, ok := params[name]; !ok {
		params[name] = value
	}
}

// dialingRaw is dial (pgconn's own, which keeps the DSN's connect_timeout)
// whose sockets are read and written with raw system calls (rawio), which
// do not wake the runtime's monitor thread: a sync page is ~13 reads of
// PostgreSQL's 8 KB messages. TLS, when the DSN asks for it, goes over the
// wrapped socket, a cancel request's too (TestSessionsOverTLSWorkOnRawSockets).
func dialingRaw(dial pgconn.DialFunc) pgconn.DialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return rawio.Wrap(c), nil
	}
}
