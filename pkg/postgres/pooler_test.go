package postgres_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/postgres"
	"github.com/coinexport/export/pkg/testenv"
)

// PgBouncer refuses a connection whose startup message has a setting it
// does not pass on (jit, which Open always asks for): the error says which
// of its settings to change, not PgBouncer's words alone.
func TestOpenNamesASettingAPoolerRefuses(t *testing.T) {
	pooled := testenv.PgBouncer(t, testenv.PostgresURL(t), "transaction")
	log := slog.New(slog.NewTextHandler(&testenv.Output{}, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := postgres.OpenWhenReached(ctx, pooled, log)
	if err == nil {
		pool.Close()
		t.Fatal("OpenWhenReached through a PgBouncer that refuses jit succeeded")
	}
	if !errors.Is(err, postgres.ErrSettingRefused) || !strings.Contains(err.Error(), "ignore_startup_parameters") {
		t.Errorf("error = %v, want ErrSettingRefused naming ignore_startup_parameters", err)
	}
}

// Told to ignore them (PoolerIgnoredSettings, as the error and the README
// say), PgBouncer drops the settings without a word: the sessions have the
// server's defaults, and the binary warns of each one it asked for and
// does not have. Every Option is given, as sales-writer gives them: with
// the list that left out default_transaction_isolation (ReadCommitted),
// the writer was refused at start.
func TestOpenWarnsOfSettingsAPoolerDrops(t *testing.T) {
	dsn := testenv.PostgresURL(t)
	pooled := testenv.PgBouncer(t, dsn, "transaction", "ignore_startup_parameters = "+postgres.PoolerIgnoredSettings)
	opts := []postgres.Option{postgres.IndexScansOnly(), postgres.StatementTimeout(7 * time.Second), postgres.ApplicationName("sales-writer"),
		postgres.ReadCommitted()}
	for _, tc := range []struct {
		name, dsn string
		dropped   []string
	}{
		{"through the pooler", pooled + " default_query_exec_mode=exec", []string{"enable_seqscan", "jit", "statement_timeout"}},
		{"to PostgreSQL", dsn, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logged testenv.Output
			pool, err := postgres.OpenWhenReached(context.Background(), tc.dsn, slog.New(slog.NewTextHandler(&logged, nil)), opts...)
			if err != nil {
				t.Fatal(err)
			}
			pool.Close()
			got := logged.String()
			if n := strings.Count(got, "level=WARN"); n != len(tc.dropped) {
				t.Errorf("%d warnings, want %d: %q", n, len(tc.dropped), got)
			}
			for _, name := range tc.dropped {
				if !strings.Contains(got, "setting="+name) {
					t.Errorf("log = %q, want a warning of %s", got, name)
				}
			}
		})
	}
}

// The README's PgBouncer set-up ("Behind PgBouncer": a [databases] line per
// service whose connect_query gives the server connections what the
// startup message cannot carry) leaves each binary every setting it asks
// for: opened through a PgBouncer built from that very line, with the
// options each binary gives (sales-writer's at its default 10 s query
// timeout), the pool warns of no dropped setting. A line that left one out,
// or a statement_timeout other than the writer's, fails here.
func TestTheREADMEsPoolerSetUpKeepsEverySetting(t *testing.T) {
	lines := readmeConnectQueries(t)
	dsn := testenv.PostgresURL(t)
	for _, tc := range []struct {
		database string // the README's [databases] name
		opts     []postgres.Option
	}{
		{"exportsvc", []postgres.Option{postgres.ApplicationName("export-reader")}},
		{"exportsvc_writer", []postgres.Option{postgres.IndexScansOnly(), postgres.StatementTimeout(10 * time.Second),
			postgres.ApplicationName("sales-writer"), postgres.ReadCommitted()}},
	} {
		t.Run(tc.database, func(t *testing.T) {
			query, ok := lines[tc.database]
			if !ok {
				t.Fatalf("README's PgBouncer set-up has no %s line with a connect_query: %v", tc.database, lines)
			}
			pooled := testenv.PgBouncerConnecting(t, dsn, "transaction", query,
				"ignore_startup_parameters = "+postgres.PoolerIgnoredSettings)
			var logged testenv.Output
			pool, err := postgres.OpenWhenReached(context.Background(), pooled+" default_query_exec_mode=exec",
				slog.New(slog.NewTextHandler(&logged, nil)), tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			pool.Close()
			if got := logged.String(); strings.Contains(got, "level=WARN") {
				t.Errorf("through the README's connect_query %q, settings were dropped: %s", query, got)
			}
		})
	}
}

// readmeConnectQueries reads the [databases] lines of the repository
// README's PgBouncer set-up: each database's name and its connect_query,
// unquoted.
func readmeConnectQueries(t *testing.T) map[string]string {
	t.Helper()
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	line := regexp.MustCompile(`(?m)^(\w+)\s*=\s*host=.*\bconnect_query='((?:[^']|'')*)'`)
	found := map[string]string{}
	for _, m := range line.FindAllStringSubmatch(string(readme), -1) {
		found[m[1]] = strings.ReplaceAll(m[2], "''", "'")
	}
	return found
}

// Behind PgBouncer in session mode, connect_query's settings hold for a
// server connection's first client only: when a client disconnects,
// PgBouncer's DISCARD ALL undoes them, and the connection's next client
// has none. A binary that started well then runs on such a session later
// (its pool's connection renewed), without its statement_timeout: every
// new session is checked, and the first without a setting warns of it.
func TestASessionThatLostItsSettingsLaterIsWarnedOf(t *testing.T) {
	lines := readmeConnectQueries(t)
	pooled := testenv.PgBouncerConnecting(t, testenv.PostgresURL(t), "session", lines["exportsvc_writer"],
		"ignore_startup_parameters = "+postgres.PoolerIgnoredSettings, "default_pool_size = 1")
	var logged testenv.Output
	pool, err := postgres.OpenWhenReached(context.Background(), pooled+" pool_max_conns=1",
		slog.New(slog.NewTextHandler(&logged, nil)), postgres.IndexScansOnly(), postgres.StatementTimeout(10*time.Second),
		postgres.ApplicationName("sales-writer"), postgres.ReadCommitted())
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if got := logged.String(); strings.Contains(got, "level=WARN") {
		t.Fatalf("the first session, connect_query's, lacks a setting: %s", got)
	}
	// The pool's session ends (a connection renewed) and a new one gets
	// the same server connection, reset.
	pool.Reset()
	var timeout string
	if err := pool.QueryRow(context.Background(), "SHOW statement_timeout").Scan(&timeout); err != nil {
		t.Fatal(err)
	}
	if timeout != "0" {
		t.Skipf("the second session has statement_timeout %s: PgBouncer gave it a new server connection, not the reset one", timeout)
	}
	got := logged.String()
	for _, name := range []string{"statement_timeout", "jit", "enable_seqscan"} {
		if !strings.Contains(got, "setting="+name) {
			t.Errorf("a later session without %s was not warned of: log %q", name, got)
		}
	}
	if n := strings.Count(got, "level=WARN"); n != 3 {
		t.Errorf("%d warnings, want one per setting (3): %q", n, got)
	}
}

// Behind a pooler with no server connection free, Open gives up when its
// check does (here at its context's 1 s), not once the pooler frees one:
// pgx, closing the check's cancelled connection, reads it until the pooler
// closes it, for up to 15 s, and PgBouncer reads nothing from a client it
// queues. exportctl migrate started during another run's migration behind
// a transaction pool of 2 failed `ping: timeout` after 25 s, not 10, and
// Ctrl-C ended it after 15 s.
func TestOpenGivesUpAtOnceBehindAPoolerWithNoServerConnectionFree(t *testing.T) {
	pooled := testenv.PgBouncer(t, testenv.PostgresURL(t), "transaction", "default_pool_size = 1",
		"ignore_startup_parameters = "+postgres.PoolerIgnoredSettings) + " default_query_exec_mode=exec"
	testenv.InTransaction(t, testenv.Pool(t, pooled), "SELECT 1") // the one server connection
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	_, err := postgres.Open(ctx, pooled)
	if took := time.Since(start); err == nil || took > 5*time.Second {
		t.Errorf("Open behind a pooler with no server connection free = %v after %s; want a failure within 5 s",
			err, took.Round(100*time.Millisecond))
	}
}
