// Package schema owns the PostgreSQL schema shared by every service: the SQL
// migrations embedded in the binary and the function that applies them.
package schema

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pressly/goose/v3"

	"github.com/coinexport/export/pkg/postgres"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Applied is a migration that Up applied.
type Applied struct {
	Version  int64
	File     string
	Duration time.Duration
}

// Up applies every pending migration and returns the ones it applied, in
// order (those before a failure, with the failure), so that an
// administrator learns whether one that needs a restart of the services
// ran. A PostgreSQL advisory lock, held by a transaction of its own, makes
// it safe to run from several processes at once, directly or through a
// pooler in any mode (migrationlock.go). A migration that waits over
// MigrationLockWait for a lock fails with ErrTablesBusy; one that waits
// over MigrationLockHeldFor for another run fails with
// ErrMigrationLockHeld, and one that gets no second database session for
// its migrations beside its lock's with ErrNoSessionForMigration.
func Up(ctx context.Context, pool *pgxpool.Pool) (applied []Applied, err error) {
	held, err := takeMigrationLock(ctx, pool)
	if err != nil {
		return nil, fmt.Errorf("schema: migrate up: %w", err)
	}
	defer func() {
		if releaseErr := held.release(ctx); releaseErr != nil && err == nil {
			err = fmt.Errorf("schema: migrate up: %w", releaseErr)
		}
	}()
	return upLocked(ctx, pool)
}

// upLocked is Up under the migration lock.
func upLocked(ctx context.Context, pool *pgxpool.Pool) ([]Applied, error) {
	files, err := fs.Sub(migrations, "migrations")
	if err != nil {
		return nil, fmt.Errorf("schema: %w", err)
	}
	db := migrationDB(pool)
	defer db.Close()
	provider, err := goose.NewProvider(goose.DialectPostgres, db, files)
	if err != nil {
		return nil, fmt.Errorf("schema: %w", err)
	}
	results, err := provider.Up(ctx)
	// On a failure goose returns no results: the migrations applied before
	// it are in its PartialError.
	if partial := (*goose.PartialError)(nil); errors.As(err, &partial) {
		results = partial.Applied
	}
	var applied []Applied
	for _, r := range results {
		if r.Error == nil {
			applied = append(applied, Applied{Version: r.Source.Version, File: r.Source.Path, Duration: r.Duration})
		}
	}
	if postgres.LockTimedOut(err) {
		err = fmt.Errorf("%w: %s", ErrTablesBusy, postgres.OldTransactions(ctx, pool, MigrationLockWait))
	}
	if err != nil {
		return applied, fmt.Errorf("schema: migrate up: %w", err)
	}
	return applied, nil
}

// MigrationLockWait bounds each wait of a migration for a lock (lock_timeout
// in its sessions, unless the database URL sets one). A migration that
// changes a table waits for an exclusive lock on it, and while it waits
// every statement on that table queues behind it: behind a long report
// query or a pg_dump, which hold a shared lock for as long as they run, a
// migration waited 24.5 s, and a sale's read of idempotency_refusals 22.6 s
// with it (the sales writer answers 503 past 10 s); for as long as the
// report ran, every sale and sync of every owner would have failed so.
// Bounded, the queue lasts 5 s at most (under the services' query
// timeouts), and the migration fails instead, naming the sessions that
// hold their transactions that long: run it again once they have ended
// (the migrate Job's restarts do).
const MigrationLockWait = 5 * time.Second

// ErrTablesBusy is a migration that gave up on a lock after
// MigrationLockWait; nothing of it was applied.
var ErrTablesBusy = errors.New("a migration waited over " + MigrationLockWait.String() +
	" for a lock on its tables and gave up (every request to them queues behind it), applying nothing of it: " +
	"run exportctl migrate again once the sessions holding the lock have ended")

// Versions returns the newest migration applied to the database and the
// newest this build embeds. The database's is the larger when a newer
// release migrated it.
func Versions(ctx context.Context, pool *pgxpool.Pool) (database, build int64, err error) {
	needed, err := embeddedVersions()
	if err != nil {
		return 0, 0, err
	}
	applied, err := appliedVersions(ctx, pool)
	if err != nil {
		return 0, 0, fmt.Errorf("schema: reading the applied migrations: %w", err)
	}
	return newest(applied), newest(needed), nil
}

// appliedVersions are the versions of the migrations applied to the
// database, in order. goose appends a row per migration applied or rolled
// back; a version is applied when its latest row says so. It only reads
// goose's version table, with no lock. A database without that table was
// never migrated (the first migration creates it): none is applied, so
// that Check and Versions say version 0 of it, not that a table is missing.
func appliedVersions(ctx context.Context, pool *pgxpool.Pool) ([]int64, error) {
	var applied []int64
	err := pool.QueryRow(ctx, `
		SELECT coalesce(array_agg(version_id ORDER BY version_id), '{}') FROM (
		    SELECT DISTINCT ON (version_id) version_id, is_applied
		    FROM goose_db_version ORDER BY version_id, id DESC) latest
		WHERE is_applied`).Scan(&applied)
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table
		return nil, nil
	}
	return applied, err
}

// newest is the last of versions in order, 0 when there is none.
func newest(versions []int64) int64 {
	if len(versions) == 0 {
		return 0
	}
	return versions[len(versions)-1]
}

// Version identifies the set of migrations (a hash of their contents), so
// tests can cache a migrated template database per schema version.
func Version() string {
	h := sha256.New()
	entries, _ := migrations.ReadDir("migrations")
	for _, e := range entries {
		b, _ := migrations.ReadFile("migrations/" + e.Name())
		h.Write([]byte(e.Name()))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:12]
}

// Check returns nil when the database holds every migration this build
// embeds, and otherwise an error naming the version it is at and the one
// the build needs. It only reads goose's version table, with no lock (goose's
// own HasPending would create that table when missing), so it can run on a
// replica and as often as a readiness probe asks.
func Check(ctx context.Context, pool *pgxpool.Pool) error {
	applied, err := appliedVersions(ctx, pool)
	if err != nil {
		return fmt.Errorf("schema: reading the applied migrations (run exportctl migrate): %w", err)
	}
	needed, err := embeddedVersions()
	if err != nil {
		return err
	}
	for _, v := range needed {
		if !slices.Contains(applied, v) {
			return fmt.Errorf("schema: the database is at version %d, this build needs %d: run exportctl migrate",
				newest(applied), newest(needed))
		}
	}
	return nil
}

// embeddedVersions are the versions of the embedded migrations, in order.
func embeddedVersions() ([]int64, error) {
	entries, err := migrations.ReadDir("migrations")
	if err != nil {
		return nil, fmt.Errorf("schema: %w", err)
	}
	var versions []int64
	for _, e := range entries {
		v, err := goose.NumericComponent(e.Name())
		if err != nil {
			return nil, fmt.Errorf("schema: migration %s: %w", e.Name(), err)
		}
		versions = append(versions, v)
	}
	slices.Sort(versions)
	return versions, nil
}

// Readiness is a service's readiness check: PostgreSQL answers and its
// schema is the one the build was written for. A service built for a newer
// schema stays unready (the gateway and Kubernetes send it nothing) until
// exportctl migrate has run, rather than failing on a column that is not
// there yet; this is what makes a rollout wait for its migration Job.
// Migrations only go up in production, so once current it only pings.
//
// The check runs on a connection apart from the service's pool
// (postgres.OpenSide). Through that pool its ping would wait behind every
// statement queued for a connection: a service saturated with work, but
// doing it, would fail its probe (the gateway's gives up after a second)
// and be taken out of rotation, which turns load into an outage. Seen in the sales bench when a pause of the
// machine queued the 32 workers' statements behind the pool's 8
// connections for over a second. The price: a service whose own pool is
// wedged (connections leaked or stuck) stays ready while its requests time
// out; pgxpool_acquire_wait_seconds_total and pgxpool_empty_acquire_total
// on /metrics show that state, and are what to alert on.
type Readiness struct {
	conn     *pgxpool.Pool // a pool of one connection apart from the service's (postgres.OpenSide)
	log      *slog.Logger
	writable bool          // the service writes: a read-only database is not ready (Writable)
	serving  *pgxpool.Pool // the service's own pool, asked when conn's new session is refused (ServingOn)
	setting  string        // the variable conn's DSN came from, which the causes name (SettingNamed)
	current  atomic.Bool
	warnedAt atomic.Int64 // unix seconds of the last "serving on the connections opened before" warning
}

// ReadinessOption adds a condition to a Readiness.
type ReadinessOption func(*Readiness)

// Writable makes a read-only database unready: a writer sent to a hot
// standby (a failover that moved the primary while its address still
// names the old one, now a standby) or to a primary fenced with
// default_transaction_read_only would fail every write with SQLSTATE
// 25006, and unready it is taken out of the gateway's rotation and of
// Kubernetes' endpoints until the database takes writes again. The check
// reads its own session's transaction_read_only, which is on in recovery
// and follows default_transaction_read_only as set in the server's
// configuration (ALTER SYSTEM and a reload) or the DSN, in the same round
// trip as the ping it replaces. A default set with ALTER DATABASE or ALTER
// ROLE reaches only sessions opened after it, the check's at its next
// connection, within a minute (postgres.OpenSide renews it); the writes
// fail meanwhile, answered 503. A reader leaves it
// off: it reads from a replica on purpose.
func Writable() ReadinessOption { return func(r *Readiness) { r.writable = true } }

// ServingOn keeps the service ready while PostgreSQL refuses new sessions
// (postgres.SessionRefused: a password changed, the role made NOLOGIN, no
// connection slot left because another client holds max_connections) but
// pool, the service's own, still has a connection that serves (poolServes): the
// check's connection is renewed every minute (postgres.OpenSide), so it
// meets the refusal first, while the service goes on serving on the
// connections it opened before, for as long as they last (an hour at most,
// pgxpool's lifetime). Unready, every instance left the gateway's rotation
// within a minute of a password changed too early, a whole outage where
// the calls that needed no new connection were served; the gateway takes
// an instance out only on evidence that it cannot serve. Meanwhile a WARN
// a minute names the cause; once the pool has no connection left that
// answers, the check fails as before. A schema not yet current is checked
// on the check's own connection, so it stays unready. The same holds while
// PostgreSQL is slow to start the check's session (errSessionSlow), as it
// is when its slots are taken and other clients retry theirs, but only on
// an idle connection that answers: a hung server starts no session either,
// and the statements in flight on the others may never end.
func ServingOn(pool *pgxpool.Pool) ReadinessOption {
	return func(r *Readiness) { r.serving = pool }
}

// SettingNamed makes the causes of the check's failures (postgres.CauseOf)
// name setting, the variable the service's DSN came from, rather than
// DATABASE_URL: export-reader's READ_DATABASE_URL, a replica, when set.
func SettingNamed(setting string) ReadinessOption {
	return func(r *Readiness) { r.setting = setting }
}

// ErrReadOnly is Ready's error for a Writable check on a read-only database.
var ErrReadOnly = errors.New("schema: the database is read-only (a standby, or default_transaction_read_only): this service writes; point it at the primary")

// NewReadiness returns the check for the database of conn, a pool of one
// connection apart from the service's (postgres.OpenSide), which the
// caller closes. It checks once at once, warning when the service starts
// unready, and logs when the schema becomes current.
func NewReadiness(ctx context.Context, conn *pgxpool.Pool, log *slog.Logger, opts ...ReadinessOption) *Readiness {
	r := &Readiness{conn: conn, log: log, setting: "DATABASE_URL"}
	for _, opt := range opts {
		opt(r)
	}
	if err := r.Ready(ctx); err != nil {
		log.Warn("not ready until the database answers and is migrated", "error", err)
	}
	return r
}

// ping pings PostgreSQL, twice if the first fails on the check's idle
// connection: after a PostgreSQL restart that connection is dead, and pgx
// finds out only by using it (and then drops it), so the first probe after
// every restart would fail, and the gateway would take a service out that
// can serve, until its next probe. A new session PostgreSQL refused
// (postgres.SessionRefused) is not tried again: the second login is
// refused as well, one more FATAL line in the server's log a probe; nor is
// one slow to start (errSessionSlow): a second wait would outlast the
// prober's.
func (r *Readiness) ping(ctx context.Context) error {
	err := r.probe(ctx)
	if err != nil && ctx.Err() == nil && !errors.Is(err, ErrReadOnly) && !slowToAnswer(err) &&
		!postgres.SessionRefused(err) {
		err = r.probe(ctx)
	}
	return err
}

// probe is one round trip to PostgreSQL on the check's connection: a
// ping, or for a Writable check the query that reads whether the session
// is read-only.
func (r *Readiness) probe(ctx context.Context) error {
	conn, err := r.acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if !r.writable {
		return conn.Ping(ctx)
	}
	var readOnly bool
	if err := conn.QueryRow(ctx, "SELECT current_setting('transaction_read_only') = 'on'").Scan(&readOnly); err != nil {
		return err
	}
	if readOnly {
		return ErrReadOnly
	}
	return nil
}

// acquire takes the check's connection, waiting at most sessionStartWait
// for it: errSessionSlow past that. The connection is renewed every minute
// (postgres.OpenSide), and PostgreSQL may take seconds to start a session,
// or to refuse one, while its max_connections are taken and other clients
// retry theirs (2.4-2.6 s measured on a make run stack, 0.8-1.3 s without
// the retries): the probe waited for it, the gateway's prober gave up after
// its second, three times over, and every instance left the rotation while
// its pool served. pgxpool goes on starting the session past the wait, for
// the next probe.
func (r *Readiness) acquire(ctx context.Context) (*pgxpool.Conn, error) {
	startCtx, cancel := context.WithTimeout(ctx, sessionStartWait)
	defer cancel()
	conn, err := r.conn.Acquire(startCtx)
	if err != nil && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
		if r.conn.Stat().AcquiredConns() > 0 {
			// The session is there, held by what shares it (a check
			// its prober gave up on, the replica's lag reading) or
			// by pgxpool's ping of a connection idle over a second:
			// PostgreSQL is slow to answer on it, not to start one.
			return nil, errCheckConnInUse
		}
		return nil, errSessionSlow
	}
	return conn, err
}

// sessionStartWait is how long a probe waits for the check's connection:
// well under the gateway prober's second (UPSTREAM_PROBE_INTERVAL, at most
// 1 s) and Kubernetes' (timeoutSeconds, 1 s), with room for a ping of the
// service's pool after it (servesOnOpenConnections). A session starts in
// milliseconds on a healthy database, TLS and SCRAM included.
const sessionStartWait = 500 * time.Millisecond

// errSessionSlow is a probe's when PostgreSQL did not give the check its
// connection within sessionStartWait (acquire).
var errSessionSlow = fmt.Errorf("PostgreSQL did not start the readiness check's session within %s", sessionStartWait)

// errCheckConnInUse is a probe's when the check's open connection was in
// use past sessionStartWait (acquire), waiting on PostgreSQL: by an earlier
// check that outlived its prober (readyTimeout), by export-reader's replica
// lag reading, or by pgxpool's liveness ping of a connection idle over a
// second. It is treated as errSessionSlow.
var errCheckConnInUse = fmt.Errorf("PostgreSQL did not answer on the readiness check's open connection within %s (in use by an earlier check, the replica's lag reading, or pgxpool's liveness ping)", sessionStartWait)

// slowToAnswer reports whether err is acquire's when the check's
// connection did not come within sessionStartWait, new or in use: no
// answer from PostgreSQL, neither tried again nor trusted as a refusal.
func slowToAnswer(err error) bool {
	return errors.Is(err, errSessionSlow) || errors.Is(err, errCheckConnInUse)
}

// readyTimeout bounds one check. The check does not end with its caller:
// a prober that hangs up mid-ping would make pgx close the check's
// connection, and the next probe would pay for a new one (TLS, SCRAM) on
// a database that is already slow.
const readyTimeout = 5 * time.Second

// Ready is the check, for httpserver.Config.Ready.
func (r *Readiness) Ready(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), readyTimeout)
	defer cancel()
	if err := r.ping(ctx); err != nil {
		if r.servesOnOpenConnections(ctx, err) {
			return nil
		}
		if cause := postgres.CauseOf(err, r.setting); cause != "" {
			// The WARN not ready says what to put right, as the
			// request's lines do: the gateway's line that takes the
			// instance out says only "503 not_ready".
			return fmt.Errorf("%w: %s", err, cause)
		}
		return err
	}
	if r.current.Load() {
		return nil
	}
	if err := Check(ctx, r.conn); err != nil {
		return err
	}
	if r.current.CompareAndSwap(false, true) {
		r.log.Info("database schema is current", "schema_version", Version())
	}
	return nil
}

// servesOnOpenConnections reports whether the service still serves though
// PostgreSQL refused the check's new session, or did not start it within
// sessionStartWait (ServingOn): its schema was current, and its own pool
// has a connection that answers. It warns of the refusal or the slowness
// once a minute while it lasts.
func (r *Readiness) servesOnOpenConnections(ctx context.Context, refused error) bool {
	slow := slowToAnswer(refused)
	if r.serving == nil || !r.current.Load() || !(slow || postgres.SessionRefused(refused)) {
		return false
	}
	// A refusal is PostgreSQL answering, so the connections in use are
	// trusted to come back; a session that does not start is no answer (a
	// hung server starts none either), so only a connection that answers
	// now shows that the service serves.
	if !poolServes(ctx, r.serving, !slow) {
		return false
	}
	now := time.Now().Unix()
	if last := r.warnedAt.Load(); now-last >= 60 && r.warnedAt.CompareAndSwap(last, now) {
		if errors.Is(refused, errCheckConnInUse) {
			r.log.Warn("PostgreSQL is slow to answer on the readiness check's open connection; serving on the connections that answer",
				"error", refused, "cause", "PostgreSQL (export-reader: READ_DATABASE_URL's) may be overloaded, or a statement it runs waits: pg_stat_activity shows what the sessions wait on")
			return true
		}
		if slow {
			r.log.Warn("PostgreSQL is slow to start new sessions; serving on the connections opened before",
				"error", refused, "cause", "PostgreSQL may be out of connection slots (max_connections) with clients retrying theirs, or overloaded: pg_stat_activity shows who holds the sessions")
			return true
		}
		attrs := []any{"error", refused, postgres.CauseAttrOf(refused, r.setting)}
		if postgres.NoSlotLeft(refused) {
			// The service's calls that need one connection more are
			// refused it too, and wait for the pool's own
			// (postgres.Acquire): how many have, since the start, says
			// whether the refusal holds the pool below its size.
			waits, _ := postgres.SlotWaits(r.serving)
			attrs = append(attrs, "calls_waited_for_a_slot", waits)
		}
		r.log.Warn("PostgreSQL refuses new sessions; serving on the connections opened before, until they end", attrs...)
	}
	return true
}

// poolServes reports whether pool has a connection that answers: an idle
// one pinged, or, with none idle and trustInUse, one in use by a request
// (a statement in flight may be hung with its server: trusted only when
// PostgreSQL has just answered the check, if with a refusal). Its Ping finds
// no idle connection when the service is busy, and then asks the pool for
// one more session, which PostgreSQL refuses, or, the pool full, waits
// behind the queued statements past the prober's second (see Readiness):
// either took a loaded instance out of rotation while it served. Like the
// check itself, it trusts the connections in use to come back.
//
// A request may take the last idle connection between Stat and Ping, and
// Ping then asks for a session, refused: the check fails once, in a state
// where the requests themselves ask for sessions, refused (they outnumber
// the connections left). pgxpool has no acquire of an idle connection
// alone but AcquireAllIdle, which holds every idle one at once: a request
// meanwhile asks for a session, refused where none would be. Measured with
// new sessions refused and the check called in a loop for 10 s:
// AcquireAllIdle refused 94 requests of 2 workers on 3 connections (1,273
// of one worker on 2), Stat and Ping none; Stat and Ping failed the check
// 89 times in 3.0 M, only with 2 workers on 2 connections, where 1.49 M of
// their 1.50 M statements were refused.
func poolServes(ctx context.Context, pool *pgxpool.Pool, trustInUse bool) bool {
	stat := pool.Stat()
	if stat.IdleConns() == 0 {
		return trustInUse && stat.AcquiredConns() > 0
	}
	return pool.Ping(ctx) == nil
}
