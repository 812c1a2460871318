package testenv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/jackc/pgx/v5"
)

// PasswordRole is a role that logs in with a password (scram-sha-256),
// the owner of a migrated database on a cluster of a test's own: the
// shared cluster trusts every login, so a password refused (SQLSTATE
// 28P01) never happens there, and its pg_hba.conf is not the test's to
// change.
type PasswordRole struct {
	DSN      string // of the migrated database, as the role, with its password
	Password string // the role's password, which DSN holds
	admin    string // the cluster's superuser, trusted
	role     string
}

// passwordRoleName is the role's name on its cluster.
const passwordRoleName = "svc"

// PasswordCluster starts a cluster that asks passwordRoleName for its
// password (a pg_hba.conf line before initdb's trust lines) and trusts
// its superuser, creates the role with a random password and a database
// it owns, and migrates that database as the role. The cluster stops when
// the test ends. It takes a second or two.
func PasswordCluster(t testing.TB) *PasswordRole {
	t.Helper()
	c := ownClusters(t, "testenv-password-")
	c.initdb(t, "main")
	hba := filepath.Join(c.dir, "main", "pg_hba.conf")
	trust, err := os.ReadFile(hba)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	// The first line that matches a login decides it: the role's comes
	// before initdb's "local all all trust".
	ask := fmt.Sprintf("local all %s scram-sha-256\n", passwordRoleName)
	if err := os.WriteFile(hba, append([]byte(ask), trust...), 0o600); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	c.start(t, "main", "password_encryption=scram-sha-256")
	p := &PasswordRole{admin: c.dsn("main", "postgres"), role: passwordRoleName, Password: randomHex(16)}
	p.DSN = c.dsn("main", "export")
	cfg, err := pgx.ParseConfig(p.DSN)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	p.DSN = fmt.Sprintf("host=%s user=%s password=%s dbname=%s sslmode=disable", cfg.Host, p.role, p.Password, cfg.Database)
	p.adminExec(t, fmt.Sprintf("CREATE ROLE %s LOGIN PASSWORD '%s'", p.role, p.Password))
	p.adminExec(t, "CREATE DATABASE export OWNER "+p.role)
	migrateExisting(t, p.DSN)
	return p
}

// ChangePassword changes the role's password, as an operator rotating it
// before DATABASE_URL does: the sessions open serve on, and each new one
// on DSN is refused with SQLSTATE 28P01 (a test's own pool meets that
// after its Reset; EndSessions ends the sessions of pools that are not
// the test's). The returned restore sets DSN's password back.
func (p *PasswordRole) ChangePassword(t testing.TB) (restore func()) {
	t.Helper()
	p.adminExec(t, fmt.Sprintf("ALTER ROLE %s PASSWORD '%s'", p.role, randomHex(16)))
	return func() {
		t.Helper()
		p.adminExec(t, fmt.Sprintf("ALTER ROLE %s PASSWORD '%s'", p.role, p.Password))
	}
}

// EndSessions ends every session of the role, as pg_terminate_backend
// does: a pool on DSN opens new ones at its next statement.
func (p *PasswordRole) EndSessions(t testing.TB) {
	t.Helper()
	p.adminExec(t, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '"+p.role+"'")
}

// adminExec runs sql as the cluster's superuser.
func (p *PasswordRole) adminExec(t testing.TB, sql string) {
	t.Helper()
	conn := connect(t, p.admin)
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), sql); err != nil {
		t.Fatalf("testenv: %v", err)
	}
}
