// Package testenv gives tests real PostgreSQL and Redis servers. When
// TEST_DATABASE_URL / TEST_REDIS_URL name running servers they are used (make
// test starts one of each for the whole run); otherwise the first test that
// asks starts a throwaway one under a temporary folder, and Run stops it.
//
// Every caller of Postgres gets a fresh database cloned from a migrated
// template, so tests can run in parallel without seeing each other's rows.
package testenv

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/schema"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

var (
	mu       sync.Mutex
	cleanups []func()

	adminOnce sync.Once
	adminDSN  string
	adminErr  error

	templateOnce sync.Once
	templateName string
	templateErr  error
)

// Run runs the tests of a package and then stops the servers it started.
// Use it from TestMain: func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }.
func Run(m *testing.M) int {
	code := m.Run()
	mu.Lock()
	defer mu.Unlock()
	for i := len(cleanups) - 1; i >= 0; i-- {
		cleanups[i]()
	}
	return code
}

func atExit(f func()) {
	mu.Lock()
	cleanups = append(cleanups, f)
	mu.Unlock()
}

// PostgresURL returns the DSN of a fresh, migrated database that is dropped
// when the test ends.
func PostgresURL(t testing.TB) string {
	t.Helper()
	admin := adminURL(t)
	tmpl := migratedTemplate(t, admin)
	name := "t_" + randomHex(8)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Fatalf("testenv: connect: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s", name, tmpl)); err != nil {
		t.Fatalf("testenv: create database: %v", err)
	}
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), admin)
		if err != nil {
			return
		}
		defer c.Close(context.Background())
		_, _ = c.Exec(context.Background(), fmt.Sprintf("DROP DATABASE IF EXISTS %s WITH (FORCE)", name))
	})
	return withDatabase(t, admin, name)
}

// Postgres returns a pool on a fresh, migrated database.
func Postgres(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return Pool(t, PostgresURL(t))
}

// Pool returns a pool on dsn, closed when the test ends (pgx connects
// lazily: a dsn that cannot be reached fails at the first use, not here).
func Pool(t testing.TB, dsn string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatalf("testenv: pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func withDatabase(t testing.TB, dsn, db string) string {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatalf("testenv: parse dsn: %v", err)
	}
	return fmt.Sprintf("host=%s port=%d user=%s dbname=%s sslmode=disable", cfg.Host, cfg.Port, cfg.User, db) + password(cfg)
}

func password(cfg *pgx.ConnConfig) string {
	if cfg.Password == "" {
		return ""
	}
	return " password=" + cfg.Password
}

func adminURL(t testing.TB) string {
	t.Helper()
	adminOnce.Do(func() {
		if dsn := os.Getenv("TEST_DATABASE_URL"); dsn != "" {
			adminDSN = dsn
			return
		}
		adminDSN, adminErr = startPostgres()
	})
	if adminErr != nil {
		t.Fatalf("testenv: PostgreSQL: %v", adminErr)
	}
	return adminDSN
}

// migratedTemplate creates, once per schema version, a database with every
// migration applied; an advisory lock keeps parallel test binaries from
// racing to build it.
func migratedTemplate(t testing.TB, admin string) string {
	t.Helper()
	templateOnce.Do(func() { templateName, templateErr = buildTemplate(admin) })
	if templateErr != nil {
		t.Fatalf("testenv: template database: %v", templateErr)
	}
	return templateName
}

func buildTemplate(admin string) (string, error) {
	ctx := context.Background()
	name := "tmpl_" + schema.Version()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock(7341)"); err != nil {
		return "", err
	}
	defer conn.Exec(ctx, "SELECT pg_advisory_unlock(7341)")
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		return "", err
	}
	if exists {
		return name, nil
	}
	building := name + "_building"
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+building); err != nil {
		return "", err
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+building); err != nil {
		return "", err
	}
	cfg, _ := pgx.ParseConfig(admin)
	dsn := fmt.Sprintf("host=%s port=%d user=%s dbname=%s sslmode=disable", cfg.Host, cfg.Port, cfg.User, building) + password(cfg)
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return "", err
	}
	_, err = schema.Up(ctx, pool)
	pool.Close()
	if err != nil {
		return "", err
	}
	if _, err := conn.Exec(ctx, fmt.Sprintf("ALTER DATABASE %s RENAME TO %s", building, name)); err != nil {
		return "", err
	}
	return name, nil
}

// startPostgres starts a throwaway cluster on a Unix socket in a temporary
// folder. initdb refuses to run as root, so as root it runs as "postgres".
func startPostgres() (string, error) {
	bin, err := postgresBinDir()
	if err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp("", "testenv-pg-")
	if err != nil {
		return "", err
	}
	atExit(func() { os.RemoveAll(dir) })
	data := filepath.Join(dir, "data")
	asUser, err := serverUser(dir)
	if err != nil {
		return "", err
	}
	if out, err := runAs(asUser, filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8"); err != nil {
		return "", fmt.Errorf("initdb: %v: %s", err, out)
	}
	// The cluster trusts whoever connects: its socket is the server
	// user's alone (deploy/local/lib.sh, pg_start).
	pm, err := startPostmaster(bin, asUser, data, filepath.Join(dir, "log"), nil, "-c", "listen_addresses=", "-k", dir,
		"-c", "unix_socket_permissions=0700", "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off", "-c", "max_connections=300")
	if err != nil {
		return "", err
	}
	atExit(pm.stop)
	return fmt.Sprintf("host=%s user=postgres dbname=postgres sslmode=disable", dir), nil
}

// postgresBinDir finds initdb on PATH or in Debian's versioned folders.
// An initdb on PATH that links to the server's folder (/usr/local/bin's
// on the CI image) resolves to it: pg_basebackup is there, not beside the
// link.
func postgresBinDir() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		return filepath.Dir(p), nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return versionOf(dirs[i]) > versionOf(dirs[j]) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	return "", fmt.Errorf("initdb not found: install PostgreSQL server binaries (apt-get install postgresql)")
}

func versionOf(dir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return n
}

// serverUser returns the user to run PostgreSQL as ("" for the current one)
// and hands dir to that user.
func serverUser(dir string) (string, error) {
	if os.Geteuid() != 0 {
		return "", nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return "", fmt.Errorf("running as root needs a 'postgres' user to run the server: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.Chown(dir, uid, gid); err != nil {
		return "", err
	}
	return "postgres", nil
}

func runAs(asUser, name string, args ...string) ([]byte, error) {
	if asUser != "" {
		args = append([]string{"-u", asUser, "--", name}, args...)
		name = "runuser"
	}
	cmd := exec.Command(name, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.Bytes(), err
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// waitFor polls ok until it returns true or d passes.
func waitFor(d time.Duration, ok func() bool) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if ok() {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return ok()
}

// forgetLatestMigration makes the database at dsn look one migration behind
// the build: goose's record of the latest migration is deleted (the schema
// itself is left as it is). The returned function puts the record back.
func forgetLatestMigration(t testing.TB, dsn string) (restore func()) {
	t.Helper()
	ctx := context.Background()
	conn := connect(t, dsn)
	defer conn.Close(ctx)
	var version int64
	err := conn.QueryRow(ctx, `DELETE FROM goose_db_version WHERE id = (SELECT max(id) FROM goose_db_version)
		RETURNING version_id`).Scan(&version)
	if err != nil {
		t.Fatalf("testenv: forget the latest migration: %v", err)
	}
	return func() {
		t.Helper()
		conn := connect(t, dsn)
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "INSERT INTO goose_db_version (version_id, is_applied) VALUES ($1, true)", version); err != nil {
			t.Fatalf("testenv: restore migration %d: %v", version, err)
		}
	}
}

// InTransaction begins a transaction on pool, runs stmt in it (taking a
// lock, say) and returns it open: whatever stmt holds stays held until the
// test ends it, or until the test's own end, when it is rolled back.
func InTransaction(t testing.TB, pool *pgxpool.Pool, stmt string, args ...any) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatalf("testenv: begin: %v", err)
	}
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	if _, err := tx.Exec(ctx, stmt, args...); err != nil {
		t.Fatalf("testenv: %s: %v", stmt, err)
	}
	return tx
}

// WantSessionNamed fails t unless a session on dsn's database other than
// the check's own is named application (application_name): a binary names
// its sessions after itself, so that pg_stat_activity says which service
// holds a connection (postgres.ApplicationName). Call it while the binary
// holds a connection.
func WantSessionNamed(t testing.TB, dsn, application string) {
	t.Helper()
	ctx := context.Background()
	conn := connect(t, dsn)
	defer conn.Close(ctx)
	var names []string
	err := conn.QueryRow(ctx, `SELECT coalesce(array_agg(application_name ORDER BY application_name), '{}')
		FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`).Scan(&names)
	if err != nil {
		t.Fatalf("testenv: sessions: %v", err)
	}
	if !slices.Contains(names, application) {
		t.Errorf("sessions on the database are named %q, want one named %q", names, application)
	}
}

// connect opens one connection to dsn for a helper's own statements; the
// caller closes it.
func connect(t testing.TB, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatalf("testenv: connect: %v", err)
	}
	return conn
}
