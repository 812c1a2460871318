package logging

import (
	"testing"
	"time"
)

// One line per key and interval; the next one let through counts those
// held back; keys do not hold each other back.
func TestThrottle(t *testing.T) {
	now := time.Unix(1000, 0)
	th := &Throttle{Interval: 10 * time.Second, Now: func() time.Time { return now }}
	type call struct {
		key         string
		wantOK      bool
		wantSkipped int
	}
	for i, c := range []call{
		{"a", true, 0}, {"a", false, 0}, {"b", true, 0}, {"a", false, 0},
	} {
		if ok, skipped := th.Allow(c.key); ok != c.wantOK || skipped != c.wantSkipped {
			t.Errorf("call %d (%s) = %v, %d; want %v, %d", i, c.key, ok, skipped, c.wantOK, c.wantSkipped)
		}
		now = now.Add(time.Second)
	}
	now = now.Add(10 * time.Second)
	if ok, skipped := th.Allow("a"); !ok || skipped != 2 {
		t.Errorf("a after the interval = %v, %d; want true, 2 held back", ok, skipped)
	}
	if ok, skipped := th.Allow("b"); !ok || skipped != 0 {
		t.Errorf("b after the interval = %v, %d; want true, none held back", ok, skipped)
	}
}
