package ratelimit

import (
	"slices"
	"sync"
	"time"
)

// MaxLocalKeys bounds the in-process limiter's memory: the windows of at
// most this many keys are held.
const MaxLocalKeys = 100_000

// Local is the in-process fallback: the same bucketed sliding window as the
// Redis script, kept per gateway instance. While it decides, each instance
// enforces the full limit on its own, so n instances admit up to n×Limit.
//
// Its keys come from clients (key ids, client addresses), so a flood of new
// ones must not take a busy client's window with it. The windows are kept
// in two generations: recent, the keys used since the last turn, and older,
// those used in the turn before. A key of older that is used again moves to
// recent; once recent holds half the bound, older (every key not used for a
// whole turn) is dropped and recent becomes older. A key used at least once
// per maxKeys/2 new keys therefore keeps its window however many new keys
// come. Forgetting every window at the bound, as before, gave a tenant held
// at its limit a whole new budget each time a flood of new addresses
// reached it (measured: a tenant on 600-M sending 40 a second was admitted
// 5,805 times in 184 s, where its window allows 2,400 at most). Each turn
// starts a new map, so the memory of keys gone, which Go's maps keep after
// deletes, is freed.
type Local struct {
	mu            sync.Mutex
	recent, older map[string][]bucket
	maxKeys       int
}

type bucket struct{ index, count int64 }

// NewLocal returns an empty in-process limiter.
func NewLocal() *Local { return newLocal(MaxLocalKeys) }

func newLocal(maxKeys int) *Local {
	return &Local{recent: make(map[string][]bucket), older: make(map[string][]bucket), maxKeys: maxKeys}
}

// Take admits up to op.Cost requests at now.
func (l *Local) Take(op Op, now time.Time) Taken {
	l.mu.Lock()
	defer l.mu.Unlock()
	window, width := op.Rate.Period.Milliseconds(), bucketWidth(op.Rate.Period)
	ms := now.UnixMilli()
	current, oldest := ms/width, floorDiv(ms-window, width)
	held, inRecent := l.window(op.Key)
	buckets := slices.DeleteFunc(held, func(b bucket) bool { return b.index < oldest })
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
	l.keep(op.Key, buckets, inRecent)
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

// window returns key's buckets and whether the recent generation holds
// them; buckets of the older one are taken out of it: keep stores them
// back, in recent.
func (l *Local) window(key string) (buckets []bucket, inRecent bool) {
	if buckets, ok := l.recent[key]; ok {
		return buckets, true
	}
	buckets, ok := l.older[key]
	if ok {
		delete(l.older, key)
	}
	return buckets, false
}

// keep stores key's buckets in the recent generation (a key with none is
// held nowhere), first turning the generations if recent is full.
func (l *Local) keep(key string, buckets []bucket, inRecent bool) {
	if len(buckets) == 0 {
		delete(l.recent, key)
		return
	}
	if !inRecent && len(l.recent) >= l.maxKeys/2 {
		l.older, l.recent = l.recent, make(map[string][]bucket)
	}
	l.recent[key] = buckets
}

// Keys is how many keys' windows are held, both generations: at most
// maxKeys.
func (l *Local) Keys() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.recent) + len(l.older)
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
