package logging

import (
	"sync"
	"time"
)

// Throttle lets through at most one log line per key and Interval, and
// counts those it held back, so that a failure met on every request or
// every dial is a line every so often, not a flood, exactly when the
// process is busiest. Keys come from a small set (a message, an upstream
// and an error kind): each is kept for the process's life.
type Throttle struct {
	Interval time.Duration
	Now      func() time.Time // time.Now when nil

	mu   sync.Mutex
	keys map[string]*throttled
}

type throttled struct {
	last    time.Time
	skipped int
}

// Allow reports whether a line for key may be written now and, if so, how
// many lines for key it held back since the last one let through.
func (t *Throttle) Allow(key string) (ok bool, skipped int) {
	now := time.Now
	if t.Now != nil {
		now = t.Now
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	at := now()
	k := t.keys[key]
	switch {
	case k == nil:
		if t.keys == nil {
			t.keys = map[string]*throttled{}
		}
		t.keys[key] = &throttled{last: at}
		return true, 0
	case at.Sub(k.last) < t.Interval:
		k.skipped++
		return false, 0
	}
	skipped = k.skipped
	k.last, k.skipped = at, 0
	return true, skipped
}
