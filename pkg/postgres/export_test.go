package postgres

import (
	"testing"
	"time"
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
