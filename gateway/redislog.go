package main

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/redis/go-redis/v9"
)

// redisLogger sends go-redis' own messages (dial failures while Redis is
// down) to the JSON log instead of bare lines on stderr.
type redisLogger struct{ log *slog.Logger }

func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	l.log.WarnContext(ctx, fmt.Sprintf(format, v...), "component", "go-redis")
}

// routeRedisLogs installs redisLogger. go-redis keeps its logger in a
// package variable, so only run does this, once.
func routeRedisLogs(log *slog.Logger) {
	redis.SetLogger(redisLogger{log})
}
