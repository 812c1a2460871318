package monotime

import (
	"strings"
	"testing"
	"time"
)

// Instants are measured from a time with a monotonic reading ("m=" in its
// text), so no step of the wall clock moves them; a base without one (as
// time.Unix makes) would measure on the wall clock.
func TestStartHasAMonotonicReading(t *testing.T) {
	if !strings.Contains(start.String(), "m=") {
		t.Fatalf("start = %v, want a time with a monotonic reading (m=)", start)
	}
}

// Now is the time elapsed since start, not a Unix time: about as long as
// the test has run, never negative, never going back.
func TestNowIsTheTimeSinceStart(t *testing.T) {
	before := time.Since(start)
	now := Now()
	after := time.Since(start)
	if time.Duration(now) < before || time.Duration(now) > after {
		t.Fatalf("Now() = %v, want between %v and %v since the process started", time.Duration(now), before, after)
	}
	if later := Now(); later < now {
		t.Fatalf("Now() = %d after %d: went back", later, now)
	}
}

// Of measures a time.Now on the monotonic clock, and a time built from a
// date (a test's clock) on the wall clock; Time gives back a time with a
// monotonic reading.
func TestOfAndTime(t *testing.T) {
	now := time.Now()
	i := Of(now)
	if back := i.Time(); !back.Equal(now) || !strings.Contains(back.String(), "m=") {
		t.Errorf("Of(%v).Time() = %v, want the same moment with a monotonic reading", now, back)
	}
	// Without a monotonic reading the wall clock is read, which agrees
	// with the monotonic one to within the clocks' slew.
	hourAgo := now.Round(0).Add(-time.Hour)
	if got, want := Of(hourAgo), i.Add(-time.Hour); time.Duration(got-want).Abs() > time.Millisecond {
		t.Errorf("Of(an hour before, wall clock only) = %d, want %d", got, want)
	}
}
