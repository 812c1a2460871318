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
