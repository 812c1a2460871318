package postgres_test

import (
	"context"
	"errors"
	"log/slog"
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
