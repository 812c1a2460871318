package testenv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/coinexport/export/pkg/schema"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Pair is a streaming-replication pair of PostgreSQL clusters of a test's
// own: a primary with a migrated database and a hot standby of it.
type Pair struct {
	Primary string // DSN of the migrated database on the primary
	Standby string // DSN of the same database on the standby
	*clusters
}

// clusters are PostgreSQL clusters of a test's own, each in a folder of
// dir named after it, listening on a socket of its own.
type clusters struct {
	bin  string // the server's binaries
	user string // the user that runs the server ("" for the current one)
	dir  string
}

// ownClusters makes the folder of a test's own clusters, removed when the
// test ends.
func ownClusters(t testing.TB, pattern string) *clusters {
	t.Helper()
	bin, err := postgresBinDir()
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	dir, err := os.MkdirTemp("", pattern)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	asUser, err := serverUser(dir)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return &clusters{bin: bin, user: asUser, dir: dir}
}

// initdb creates the cluster name, trusting every local login.
func (c *clusters) initdb(t testing.TB, name string) {
	t.Helper()
	if out, err := runAs(c.user, filepath.Join(c.bin, "initdb"), "-D", filepath.Join(c.dir, name), "-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8"); err != nil {
		t.Fatalf("testenv: initdb: %v: %s", err, out)
	}
}

// StandbyPair starts a primary (its own cluster, not the shared one: a
// base backup of that would copy every test's database) with a migrated
// database, and a hot standby of it made with pg_basebackup -R. Each
// standbyOpts entry is a server setting of the standby ("-c name=value"
// pairs for postgres). Both stop when the test ends. It takes about two
// seconds.
func StandbyPair(t testing.TB, standbyOpts ...string) *Pair {
	t.Helper()
	return standbyPair(t, nil, standbyOpts...)
}

// standbyPair is StandbyPair; link, when not nil, is called once the
// primary is up and returns more settings of the standby (how it reaches
// the primary).
func standbyPair(t testing.TB, link func(*Pair) []string, standbyOpts ...string) *Pair {
	t.Helper()
	p := &Pair{clusters: ownClusters(t, "testenv-pair-")}
	p.initdb(t, "primary")
	p.start(t, "primary")
	admin := p.dsn("primary", "postgres")
	migrate(t, admin, p.dsn("primary", "export"))
	// -R writes standby.signal and primary_conninfo (the primary's socket);
	// a fast checkpoint, as the default spread one took 100 s.
	if out, err := runAs(p.user, filepath.Join(p.bin, "pg_basebackup"), "-h", p.socketDir("primary"), "-U", "postgres",
		"-D", filepath.Join(p.dir, "standby"), "-R", "-X", "stream", "--no-sync", "--checkpoint=fast"); err != nil {
		t.Fatalf("testenv: pg_basebackup: %v: %s", err, out)
	}
	if link != nil {
		standbyOpts = append(link(p), standbyOpts...)
	}
	p.start(t, "standby", standbyOpts...)
	p.Primary, p.Standby = p.dsn("primary", "export"), p.dsn("standby", "export")
	return p
}

// StopPrimary stops the primary at once (as a crash would): the standby's
// WAL receiver loses it and retries.
func (p *Pair) StopPrimary(t testing.TB) {
	t.Helper()
	if out, err := runAs(p.user, filepath.Join(p.bin, "pg_ctl"), "-D", filepath.Join(p.dir, "primary"), "-m", "immediate", "-w", "stop"); err != nil {
		t.Fatalf("testenv: stop the primary: %v: %s", err, out)
	}
}

// StartPrimary starts the primary again after StopPrimary: it recovers
// as after a crash, and the standby's WAL receiver, retrying, reconnects.
func (p *Pair) StartPrimary(t testing.TB) {
	t.Helper()
	p.start(t, "primary")
}

// start starts the cluster in folder name, listening only on a socket of
// its own folder, and stops it when the test ends.
func (p *clusters) start(t testing.TB, name string, opts ...string) {
	t.Helper()
	p.startUnder(t, name, nil, opts...)
}

// startUnder is start with the server run under command (its words,
// before postgres's: prlimit and its limits, which the server inherits).
func (p *clusters) startUnder(t testing.TB, name string, command []string, opts ...string) {
	t.Helper()
	pm, err := p.launch(name, command, opts...)
	if err != nil {
		t.Fatalf("testenv: start %s: %v", name, err)
	}
	t.Cleanup(pm.stop)
}

// launch starts the server of the cluster name, as startUnder, and
// returns it running; its caller stops it.
func (p *clusters) launch(name string, command []string, opts ...string) (*postmaster, error) {
	sock := p.socketDir(name)
	if err := os.MkdirAll(sock, 0o700); err != nil {
		return nil, err
	}
	if p.user != "" {
		if out, err := runAs("", "chown", p.user, sock); err != nil {
			return nil, fmt.Errorf("chown: %v: %s", err, out)
		}
	}
	args := []string{"-c", "listen_addresses=", "-k", sock, "-c", "unix_socket_permissions=0700", "-c", "fsync=off", "-c", "synchronous_commit=off"}
	for _, opt := range opts {
		args = append(args, "-c", opt)
	}
	return startPostmaster(p.bin, p.user, filepath.Join(p.dir, name), filepath.Join(p.dir, name+".log"), command, args...)
}

func (p *clusters) socketDir(name string) string { return filepath.Join(p.dir, name+"-socket") }

func (p *clusters) dsn(name, db string) string {
	return fmt.Sprintf("host=%s user=postgres dbname=%s sslmode=disable", p.socketDir(name), db)
}

// migrate creates the database of dsn through admin and applies every
// migration to it.
func migrate(t testing.TB, admin, dsn string) {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, admin)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	_, err = pool.Exec(ctx, "CREATE DATABASE export")
	pool.Close()
	if err != nil {
		t.Fatalf("testenv: create database: %v", err)
	}
	migrateExisting(t, dsn)
}

// migrateExisting applies every migration to the database of dsn.
func migrateExisting(t testing.TB, dsn string) {
	t.Helper()
	ctx := context.Background()
	db, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	defer db.Close()
	if _, err := schema.Up(ctx, db); err != nil {
		t.Fatalf("testenv: migrate: %v", err)
	}
}
