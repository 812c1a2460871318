package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisLogger sends go-redis' own messages (dial failures while Redis is
// down) to the JSON log instead of bare lines on stderr, at most one of
// each kind (its format) per interval: while Redis is down go-redis reports
// each failed dial, several a second, and the outage is already in the
// health check, the metrics and the limiter's own log. A line that follows
// skipped ones of its kind counts them.
type redisLogger struct {
	log      *slog.Logger
	interval time.Duration
	now      func() time.Time

	mu    sync.Mutex
	kinds map[string]*redisLogKind // by format: go-redis has a handful
}

type redisLogKind struct {
	last    time.Time
	skipped int
}

// redisLogInterval is how often at most a go-redis message is logged.
const redisLogInterval = 10 * time.Second

func newRedisLogger(log *slog.Logger) *redisLogger {
	return &redisLogger{log: log, interval: redisLogInterval, now: time.Now, kinds: map[string]*redisLogKind{}}
}

func (l *redisLogger) Printf(ctx context.Context, format string, v ...any) {
	l.mu.Lock()
	now := l.now()
	k := l.kinds[format]
	if k == nil {
		k = &redisLogKind{}
		l.kinds[format] = k
	} else if now.Sub(k.last) < l.interval {
		k.skipped++
		l.mu.Unlock()
		return
	}
	skipped := k.skipped
	k.last, k.skipped = now, 0
	l.mu.Unlock()
	l.log.WarnContext(ctx, fmt.Sprintf(format, v...), "component", "go-redis", "skipped_since_last", skipped)
}

// routeRedisLogs installs redisLogger. go-redis keeps its logger in a
// package variable, so only run does this, once.
func routeRedisLogs(log *slog.Logger) {
	redis.SetLogger(newRedisLogger(log))
}
