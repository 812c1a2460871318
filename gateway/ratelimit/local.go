package ratelimit

import (
	"slices"
	"sync"
	"time"
)

// maxLocalKeys bounds the in-process limiter's memory.
const maxLocalKeys = 100_000

// Local is the in-process fallback: the same bucketed sliding window as the
// Redis script, kept per gateway instance. While it decides, each instance
// enforces the full limit on its own, so n instances admit up to n×Limit.
type Local struct {
	mu      sync.Mutex
	windows map[string][]bucket
}

type bucket struct{ index, count int64 }

// NewLocal returns an empty in-process limiter.
func NewLocal() *Local {
	return &Local{windows: make(map[string][]bucket)}
}

// Take admits up to op.Cost requests at now.
func (l *Local) Take(op Op, now time.Time) Taken {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.windows) >= maxLocalKeys {
		l.sweep()
	}
	window, width := op.Rate.Period.Milliseconds(), bucketWidth(op.Rate.Period)
	ms := now.UnixMilli()
	current, oldest := ms/width, floorDiv(ms-window, width)
	buckets := slices.DeleteFunc(l.windows[op.Key], func(b bucket) bool { return b.index < oldest })
	bringBack(buckets, current)
	var total int64
	for _, b := range buckets {
		total += b.count
	}
	admitted := min(max(op.Rate.Limit-total, 0), op.Cost)
	if admitted > 0 {
		if n := len(buckets); n > 0 && buckets[n-1].index == current {
			buckets[n-1].count += admitted
		} else {
			buckets = append(buckets, bucket{current, admitted})
		}
		total += admitted
	}
	if len(buckets) == 0 {
		delete(l.windows, op.Key)
	} else {
		l.windows[op.Key] = buckets
	}
	return Taken{
		Admitted:   admitted,
		Remaining:  max(op.Rate.Limit-total, 0),
		RetryAfter: retryAfter(buckets, total, op.Rate.Limit, window, width, ms),
		ResetAfter: resetAfter(buckets, window, width, ms),
		Now:        time.UnixMilli(ms),
	}
}

// bringBack moves the buckets after current into it, as the script does:
// the clock stepped back (NTP, a VM resumed), and their requests must
// leave the window one window from now, not once the clock has caught up
// with them. The buckets stay in order, since those after current were
// the last ones.
func bringBack(buckets []bucket, current int64) {
	for i := range buckets {
		buckets[i].index = min(buckets[i].index, current)
	}
}

// sweep forgets every window. It runs only when maxLocalKeys distinct keys
// are held, which only a flood of distinct clients during a Redis outage
// reaches; forgetting errs towards admitting, like the outage itself.
func (l *Local) sweep() {
	clear(l.windows)
}

// retryAfter mirrors the script: the time until enough of the oldest buckets
// have left the window for one more request to fit.
func retryAfter(buckets []bucket, total, limit, window, width, now int64) time.Duration {
	if total < limit {
		return 0
	}
	need, freed := total-limit+1, int64(0)
	for _, b := range buckets {
		freed += b.count
		if freed >= need {
			return time.Duration((b.index+1)*width+window-now) * time.Millisecond
		}
	}
	return time.Duration(window) * time.Millisecond
}

func resetAfter(buckets []bucket, window, width, now int64) time.Duration {
	if len(buckets) == 0 {
		return 0
	}
	return time.Duration((buckets[len(buckets)-1].index+1)*width+window-now) * time.Millisecond
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q--
	}
	return q
}
