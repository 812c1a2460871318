package postgres

import (
	"testing"
	"time"

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
