package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/coinexport/export/pkg/logging"
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
	throttle *logging.Throttle
}

// redisLogInterval is how often at most a go-redis message is logged.
const redisLogInterval = 10 * time.Second

func newRedisLogger(log *slog.Logger) *redisLogger {
	return &redisLogger{log: log, throttle: &logging.Throttle{Interval: redisLogInterval}}
}

func (l *redisLogger) Printf(ctx context.Context, format string, v ...any) {
	if ok, skipped := l.throttle.Allow(format); ok {
		l.log.WarnContext(ctx, fmt.Sprintf(format, v...), "component", "go-redis", "skipped_since_last", skipped)
	}
}

// routeRedisLogs installs redisLogger. go-redis keeps its logger in a
// package variable, so only run does this, once.
func routeRedisLogs(log *slog.Logger) {
	redis.SetLogger(newRedisLogger(log))
}
