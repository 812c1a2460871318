package postgres_test

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/coinexport/export/pkg/postgres"
)

// A stop while PostgreSQL was awaited is said, once, and reported as a
// stop; any other error, or none, is not one and writes nothing.
func TestStoppedBeforeReached(t *testing.T) {
	tests := []struct {
		name     string
		err      error
		want     bool
		wantLine string
	}{
		{"stopped", fmt.Errorf("%w before PostgreSQL was reached", postgres.ErrStopped), true,
			`"msg":"stopped before PostgreSQL was reached"`},
		{"another error", errors.New("postgres: password authentication failed"), false, ""},
		{"no error", nil, false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			log := slog.New(slog.NewJSONHandler(&out, nil))
			if got := postgres.StoppedBeforeReached(tt.err, log); got != tt.want {
				t.Errorf("StoppedBeforeReached(%v) = %v, want %v", tt.err, got, tt.want)
			}
			if tt.wantLine == "" && out.Len() != 0 || tt.wantLine != "" && strings.Count(out.String(), tt.wantLine) != 1 {
				t.Errorf("StoppedBeforeReached(%v) logged %q, want %q", tt.err, out.String(), tt.wantLine)
			}
		})
	}
}
