package startup

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// settings are the names a binary of these tests reads.
var settings = []string{"STARTUP_TEST_SECRET", "STARTUP_TEST_TIMEOUT"}

// maskedConfig is a configuration whose LogValue masks its secret, as each
// binary's Config does.
type maskedConfig struct{ secret string }

func (c maskedConfig) LogValue() slog.Value {
	return slog.GroupValue(slog.String("secret", strings.Repeat("*", min(len(c.secret), 3))))
}

// The logger's first lines are "starting" with the configuration as its
// LogValue gives it, then the variable set under a wrong name (its name
// and the setting meant, never its value), each line naming the service.
func TestLoggerSaysStartingThenTheMisspelt(t *testing.T) {
	t.Setenv("STARTUP_TEST_TIMOUT", "misspelt-value")
	var out bytes.Buffer
	log := Logger(&out, "a-service", "info", maskedConfig{secret: "not-to-be-seen"}, settings)

	var lines []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var fields map[string]any
		if err := json.Unmarshal([]byte(line), &fields); err != nil {
			t.Fatalf("a line that is not JSON: %q: %v", line, err)
		}
		delete(fields, "time")
		lines = append(lines, fields)
	}
	want := []map[string]any{
		{"level": "INFO", "msg": "starting", "service": "a-service", "config": map[string]any{"secret": "***"}},
		{"level": "WARN", "msg": "environment variable ignored: no setting has this name", "service": "a-service",
			"name": "STARTUP_TEST_TIMOUT", "did_you_mean": "STARTUP_TEST_TIMEOUT"},
	}
	if diff := cmp.Diff(want, lines); diff != "" {
		t.Errorf("Logger's first lines (-want +got):\n%s", diff)
	}
	// The level is the one asked for, past the first lines.
	out.Reset()
	log.Debug("not at info")
	if out.Len() != 0 {
		t.Errorf("Logger(level info) wrote a debug line: %s", out.String())
	}
}

// A refused configuration is told with the variables set under a wrong
// name, names only; with none, it is the error as it was.
func TestConfigErrorNamesTheMisspelt(t *testing.T) {
	refused := errors.New("config: STARTUP_TEST_SECRET is required")
	if err := ConfigError(refused, settings); err.Error() != refused.Error() {
		t.Errorf("ConfigError with nothing misspelt = %q, want %q", err, refused)
	}
	t.Setenv("STARTUP_TEST_SECRT", "misspelt-value")
	err := ConfigError(refused, settings)
	if !errors.Is(err, refused) || !strings.Contains(err.Error(), "STARTUP_TEST_SECRT is set: did you mean STARTUP_TEST_SECRET?") ||
		strings.Contains(err.Error(), "misspelt-value") {
		t.Errorf("ConfigError = %q, want the error and the misspelt name, without its value", err)
	}
}
