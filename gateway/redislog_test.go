package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// While Redis is down, go-redis reports every failed dial; the log gets one
// line per interval, and the next line says how many were skipped.
func TestRedisMessagesAreLoggedAtMostOncePerInterval(t *testing.T) {
	var buf bytes.Buffer
	l := newRedisLogger(slog.New(slog.NewJSONHandler(&buf, nil)))
	now := time.Unix(1000, 0)
	l.throttle.Now = func() time.Time { return now }
	for i := 0; i < 40; i++ { // 4 a second for 10 s
		l.Printf(context.Background(), "redis: failed to dial after %d attempts", i)
		now = now.Add(250 * time.Millisecond)
	}
	l.Printf(context.Background(), "redis: failed to dial after %d attempts", 40)
	// Another kind of message is not held back by the dial failures.
	l.Printf(context.Background(), "redis: connection pool: %s", "other")

	type logLine struct {
		Msg     string `json:"msg"`
		Skipped int    `json:"skipped_since_last"`
	}
	var lines []logLine
	for _, raw := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var line logLine
		if err := json.Unmarshal([]byte(raw), &line); err != nil {
			t.Fatalf("log line %q: %v", raw, err)
		}
		lines = append(lines, line)
	}
	if len(lines) != 3 || lines[0].Skipped != 0 || lines[1].Skipped != 39 ||
		lines[1].Msg != "redis: failed to dial after 40 attempts" || lines[2].Msg != "redis: connection pool: other" {
		t.Errorf("log = %+v, want 3 lines: the first dial failure, the one 10 s later counting 39 skipped, the other kind", lines)
	}
}
