package testenv

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// PgBouncer starts a PgBouncer in front of the database of dsn (one of
// PostgresURL's) for the test's length, pooling in mode ("transaction" or
// "session"), and returns the DSN of that database through it. settings
// are more lines of its [pgbouncer] section ("ignore_startup_parameters =
// jit"). It listens on loopback only and trusts every client, as the test
// clusters do. The test is skipped when PgBouncer is not installed
// (Debian's pgbouncer package; .ci/run installs it).
//
// Its one database has default_pool_size 2: few server connections, as
// behind a real pooler, so that the clients' transactions move between
// them.
func PgBouncer(t testing.TB, dsn, mode string, settings ...string) string {
	t.Helper()
	return PgBouncerConnecting(t, dsn, mode, "", settings...)
}

// PgBouncerConnecting is PgBouncer whose database runs connectQuery (its
// connect_query: "SET jit = off") on each server connection it opens, as
// the README's PgBouncer set-up gives the services their settings. An
// empty connectQuery is none.
func PgBouncerConnecting(t testing.TB, dsn, mode, connectQuery string, settings ...string) string {
	t.Helper()
	bin, err := pgbouncerBinary()
	if err != nil {
		t.Skipf("testenv: %v", err)
	}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatalf("testenv: parse dsn: %v", err)
	}
	dir, err := os.MkdirTemp("", "testenv-pgbouncer-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	// PgBouncer refuses to run as root: as root, it runs as the server's
	// user, which can reach the cluster's socket (mode 0700).
	asUser, err := serverUser(dir)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	addr := FreeAddr(t)
	_, port, _ := net.SplitHostPort(addr)
	for name, content := range pgbouncerFiles(cfg, dir, port, mode, connectQuery, settings) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out := startPgBouncer(t, bin, dir, asUser)
	if !waitFor(10*time.Second, func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	}) {
		log, _ := os.ReadFile(filepath.Join(dir, "pgbouncer.log"))
		t.Fatalf("testenv: pgbouncer did not listen on %s: %s%s", addr, out.String(), log)
	}
	return fmt.Sprintf("host=127.0.0.1 port=%s user=%s dbname=db sslmode=disable", port, cfg.User)
}

// startPgBouncer starts bin on dir's pgbouncer.ini, as asUser when it is
// not "" (the server's user, when the test runs as root), killed with the
// test, and returns what it writes.
func startPgBouncer(t testing.TB, bin, dir, asUser string) *Output {
	t.Helper()
	cmd := exec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
	if asUser != "" {
		// Started as that user, not switched to it by its own -u: the
		// kernel drops DiesWithTest's signal from a process that changes
		// its user, and a PgBouncer whose test binary was killed served
		// on (TestPgBouncerDiesWithItsTest).
		cred, err := credentialOf(asUser)
		if err != nil {
			t.Fatalf("testenv: %v", err)
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	DiesWithTest(cmd)
	out := &Output{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("testenv: start pgbouncer: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	return out
}

// pgbouncerFiles are PgBouncer's files in dir, by name: its ini, with one
// database, db, that is the server of cfg (running connectQuery on each
// connection unless it is empty), listening on loopback's port and pooling
// in mode, with settings as more lines of its [pgbouncer] section; and its
// auth_file, which names cfg's user (auth_type trust).
func pgbouncerFiles(cfg *pgx.ConnConfig, dir, port, mode, connectQuery string, settings []string) map[string]string {
	server := fmt.Sprintf("host=%s port=%d dbname=%s user=%s", cfg.Host, cfg.Port, cfg.Database, cfg.User)
	if cfg.Password != "" {
		server += " password=" + cfg.Password
	}
	if connectQuery != "" {
		server += " connect_query=" + pgbouncerQuote(connectQuery)
	}
	ini := strings.Join(append([]string{
		"[databases]",
		"db = " + server,
		"[pgbouncer]",
		"listen_addr = 127.0.0.1",
		"listen_port = " + port,
		"unix_socket_dir =",
		"auth_type = trust",
		"auth_file = " + filepath.Join(dir, "users.txt"),
		"pool_mode = " + mode,
		"default_pool_size = 2",
		"logfile = " + filepath.Join(dir, "pgbouncer.log"),
	}, settings...), "\n") + "\n"
	return map[string]string{"pgbouncer.ini": ini, "users.txt": strconv.Quote(cfg.User) + ` ""` + "\n"}
}

// pgbouncerQuote quotes a value of a [databases] line as PgBouncer reads
// it: in single quotes, a quote inside doubled.
func pgbouncerQuote(v string) string {
	return "'" + strings.ReplaceAll(v, "'", "''") + "'"
}

// pgbouncerBinary finds pgbouncer on PATH or where Debian puts it
// (/usr/sbin, not on a non-root user's PATH).
func pgbouncerBinary() (string, error) {
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/sbin/pgbouncer"); err == nil {
		return "/usr/sbin/pgbouncer", nil
	}
	return "", fmt.Errorf("pgbouncer not installed (apt-get install pgbouncer): the tests of the product behind it are skipped")
}

// credentialOf is the user name's uid and gid, to start a process as.
func credentialOf(name string) (*syscall.Credential, error) {
	u, err := user.Lookup(name)
	if err != nil {
		return nil, err
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}
