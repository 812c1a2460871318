package replica

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

func f(v float64) *float64 { return &v }
func s(v string) *string   { return &v }

func TestSampleLag(t *testing.T) {
	tests := []struct {
		name    string
		in      sample
		want    time.Duration
		wantErr error
	}{
		{"primary", sample{recovery: false}, 0, nil},
		{"idle primary: all replayed, last commit old", sample{recovery: true, replayedAll: true, sinceReplay: f(3600), receiver: s("streaming"), silence: f(0.5)}, 500 * time.Millisecond, nil},
		{"replay behind", sample{recovery: true, sinceReplay: f(70), receiver: s("streaming"), silence: f(0.2)}, 70 * time.Second, nil},
		{"receiver silent longer than replay is behind", sample{recovery: true, sinceReplay: f(3), receiver: s("streaming"), silence: f(45)}, 45 * time.Second, nil},
		{"no receiver", sample{recovery: true, replayedAll: true}, 0, errNoReceiver},
		{"receiver not streaming", sample{recovery: true, replayedAll: true, receiver: s("waiting"), silence: f(1)}, 0, errNoReceiver},
		{"receiver hidden from the role", sample{recovery: true, replayedAll: true, receiverHidden: true}, 0, errReceiverHidden},
		{"nothing replayed yet", sample{recovery: true, receiver: s("streaming"), silence: f(0)}, 0, errNoReplay},
	}
	for _, tt := range tests {
		got, err := tt.in.lag()
		if got != tt.want || !errors.Is(err, tt.wantErr) {
			t.Errorf("%s: lag() = %v, %v, want %v, %v", tt.name, got, err, tt.want, tt.wantErr)
		}
	}
}

// On a primary the monitor reads 0 and refuses nothing.
func TestMonitorOnAPrimary(t *testing.T) {
	t.Parallel()
	m := Start(context.Background(), testenv.Postgres(t), slog.New(slog.NewTextHandler(io.Discard, nil)), Options{MaxLag: 2 * time.Second})
	defer m.Close()
	if lag, err := m.Lag(), m.Check(); lag != 0 || err != nil {
		t.Errorf("on a primary: Lag() = %v, Check() = %v, want 0, nil", lag, err)
	}
}

// A monitor that cannot reach its database never reports a lag of 0: with
// no reading at all the lag is unknown, and over any bound.
func TestMonitorWithoutAReadingRefuses(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t, "host=127.0.0.1 port="+port(t)+" user=postgres connect_timeout=1")
	m := Start(context.Background(), pool, slog.New(slog.NewTextHandler(io.Discard, nil)), Options{MaxLag: time.Hour})
	defer m.Close()
	if lag, err := m.Lag(), m.Check(); lag != Unknown || !errors.Is(err, ErrBehind) {
		t.Errorf("unreachable: Lag() = %v, Check() = %v, want Unknown, ErrBehind", lag, err)
	}
	off := &Monitor{opts: Options{MaxLag: 0}}
	if err := off.Check(); err != nil {
		t.Errorf("READ_MAX_LAG=0, no reading: Check() = %v, want nil", err)
	}
}

// The WARN of a lag not known is a line a JSON log store reads: the lag
// is said unknown, not written as +Inf, which JSON cannot hold.
func TestAnUnknownLagIsLoggedAsUnknown(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t, "host=127.0.0.1 port="+port(t)+" user=postgres connect_timeout=1")
	var logs testenv.Output
	m := Start(context.Background(), pool, slog.New(slog.NewJSONHandler(&logs, nil)),
		Options{MaxLag: time.Hour, Interval: 10 * time.Millisecond})
	defer m.Close()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), "read replica behind") {
		if time.Now().After(deadline) {
			t.Fatalf("no WARN that the replica is behind:\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	var line string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "read replica behind") {
			line = l
			break
		}
	}
	var fields map[string]any
	if err := json.Unmarshal([]byte(line), &fields); err != nil || strings.Contains(line, "!ERROR") ||
		fields["lag_unknown"] != true || fields["lag_seconds"] != nil {
		t.Errorf("WARN of an unknown lag = %s (%v), want lag_unknown true and no lag_seconds", line, err)
	}
}

// A reading ages once overdue: the time past three polls counts as lag.
func TestAReadingAges(t *testing.T) {
	m := &Monitor{opts: Options{MaxLag: 10 * time.Second, Interval: time.Second}}
	m.last.Store(&reading{lag: 2 * time.Second, at: time.Now().Add(-time.Minute), standby: true})
	if lag := m.Lag(); lag < 59*time.Second {
		t.Errorf("a 2 s reading a minute old: Lag() = %v, want at least 59 s", lag)
	}
	if !errors.Is(m.Check(), ErrBehind) {
		t.Errorf("a reading a minute old passes a 10 s bound")
	}
}

func port(t *testing.T) string {
	_, p, err := net.SplitHostPort(testenv.RefusingAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// A primary's reading does not age: a primary out of reach for a minute
// fails the pages' own reads, and is not reported as a lagging replica.
func TestAPrimarysReadingDoesNotAge(t *testing.T) {
	m := &Monitor{opts: Options{MaxLag: 10 * time.Second, Interval: time.Second}}
	m.last.Store(&reading{at: time.Now().Add(-time.Minute)})
	if lag, err := m.Lag(), m.Check(); lag != 0 || err != nil {
		t.Errorf("a primary's reading a minute old: Lag() = %v, Check() = %v, want 0, nil", lag, err)
	}
}
