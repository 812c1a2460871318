package postgres

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ShortenSideConnLifetime renews OpenSide's connection every d for the
// rest of the test, which must not run in parallel with others using OpenSide.
func ShortenSideConnLifetime(t testing.TB, d time.Duration) {
	old := sideConnLifetime
	sideConnLifetime = d
	t.Cleanup(func() { sideConnLifetime = old })
}

// NotReachedYet exposes notReachedYet: PgBouncer's words of releases the
// tests cannot run (only Debian's 1.18 is installed) are checked on it.
var NotReachedYet = notReachedYet

// HeadLooks is how many times the heads of pool's line have looked at the
// pool for a connection come free.
func HeadLooks(pool *pgxpool.Pool) int64 { return lineOf(pool).looks.Load() }

// OpenHoldingConnects is newPool with a pool of maxConns, whose new
// connection asked for under a context of HoldConnect waits, before it
// connects, until that hold is let go: a connect under way as long as the
// test wants.
func OpenHoldingConnects(t testing.TB, dsn string, maxConns int) *pgxpool.Pool {
	t.Helper()
	cfg, err := parseConfig(fmt.Sprintf("%s pool_max_conns=%d", dsn, maxConns))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = newTracer()
	cfg.BeforeConnect = func(ctx context.Context, _ *pgx.ConnConfig) error {
		if hold, ok := ctx.Value(connectHold{}).(<-chan struct{}); ok {
			<-hold
		}
		return nil
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

type connectHold struct{}

// HoldConnect is ctx under which a new connection of a pool of
// OpenHoldingConnects waits until hold is closed.
func HoldConnect(ctx context.Context, hold <-chan struct{}) context.Context {
	return context.WithValue(ctx, connectHold{}, hold)
}

// IsWarning exposes isWarning: a notice without its unlocalized severity
// (a pooler's, a server before 9.6) no server of the tests sends.
var IsWarning = isWarning
