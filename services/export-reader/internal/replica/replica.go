// Package replica measures how far the reader's database, when it is a hot
// standby, lags behind its primary, so that a sync is refused rather than
// served from a standby further behind than a client's overlap covers (the
// README's sync guide, "Reading from a replica").
package replica

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// ErrBehind is Check's error: the standby lags (or may lag) beyond the
// bound. A list page refused with it is asked for again later, with the
// same cursor.
var ErrBehind = errors.New("replica: the read database lags behind its primary beyond READ_MAX_LAG")

// Unknown is the lag of a standby whose lag cannot be told (no reading
// yet, or none since the monitor started): over any bound.
const Unknown = time.Duration(math.MaxInt64)

// Options are a Monitor's settings.
type Options struct {
	// MaxLag is the bound of Check; 0 only measures (the gauge), refusing
	// nothing.
	MaxLag time.Duration
	// Interval is how often the lag is read (DefaultInterval when 0).
	Interval time.Duration
}

// DefaultInterval is how often the lag is read: one trivial query a second
// on a connection of its own.
const DefaultInterval = time.Second

// pollTimeout bounds one reading; a slower one counts as failed (and the
// last reading ages meanwhile).
const pollTimeout = 5 * time.Second

// reading is one measure of the lag and when it was taken.
type reading struct {
	lag     time.Duration
	at      time.Time
	standby bool // read from a standby; a primary's reading does not age
}

// Monitor reads the lag in the background; Lag and Check cost a page an
// atomic load.
type Monitor struct {
	conn     *pgxpool.Pool // one connection apart from the reader's pool (postgres.OpenSide): a busy pool would delay the reading, and age it into a refusal
	log      *slog.Logger
	opts     Options
	last     atomic.Pointer[reading]
	behind   bool  // as last logged; the poll goroutine's alone
	cause    error // why the last poll gave no reading; the poll goroutine's alone
	stop     context.CancelFunc
	finished chan struct{}
}

// Start takes a first reading on conn, a pool of one connection apart
// from the reader's (postgres.OpenSide, shared with the readiness check),
// and goes on reading every interval until ctx ends or Close. The caller
// closes conn after Close.
func Start(ctx context.Context, conn *pgxpool.Pool, log *slog.Logger, opts Options) *Monitor {
	if opts.Interval <= 0 {
		opts.Interval = DefaultInterval
	}
	ctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	m := &Monitor{conn: conn, log: log, opts: opts, stop: stop, finished: make(chan struct{})}
	m.poll(ctx)
	m.behind = m.opts.MaxLag > 0 && m.Lag() > m.opts.MaxLag
	if m.behind {
		m.log.Warn("read replica behind: list pages (syncs) answer 503 until it catches up", m.lagAttrs()...)
	}
	go m.run(ctx)
	return m
}

// Close stops the readings.
func (m *Monitor) Close() {
	m.stop()
	<-m.finished
}

// Lag is the standby's lag behind its primary as last read, plus the time
// the reading is overdue: a monitor that cannot read it (the database out
// of reach, no WAL receiver) never reports a lag smaller than the truth
// could be. 0 on a primary, even when overdue: a primary lags behind
// nothing, and one out of reach fails the pages' own reads (503 "the export
// store is unreachable"), which name the cause better than a lag would; a
// primary turned standby (a failover) has ended the connection, so the next
// reading is a standby's. Unknown before any reading.
func (m *Monitor) Lag() time.Duration {
	r := m.last.Load()
	switch {
	case r == nil:
		return Unknown
	case !r.standby:
		return 0
	}
	return r.lag + max(0, time.Since(r.at)-m.staleAfter())
}

// staleAfter is the age past which a reading is overdue: three polls.
func (m *Monitor) staleAfter() time.Duration { return 3 * m.opts.Interval }

// Check returns ErrBehind when the lag is over MaxLag (never when MaxLag
// is 0).
func (m *Monitor) Check() error {
	if m.opts.MaxLag > 0 && m.Lag() > m.opts.MaxLag {
		return ErrBehind
	}
	return nil
}

// Collector is the lag gauge, for the service's registry.
func (m *Monitor) Collector() prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "export_reader_read_replica_lag_seconds",
		Help: "How far the read database (READ_DATABASE_URL) lags behind its primary: 0 on a primary, +Inf while unknown; over READ_MAX_LAG, list pages answer 503.",
	}, func() float64 { return seconds(m.Lag()) })
}

func seconds(d time.Duration) float64 {
	if d == Unknown {
		return math.Inf(1)
	}
	return d.Seconds()
}

func (m *Monitor) run(ctx context.Context) {
	defer close(m.finished)
	tick := time.NewTicker(m.opts.Interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			m.poll(ctx)
			m.logCrossing()
		}
	}
}

// poll takes one reading; a failed one leaves the last in place, to age.
func (m *Monitor) poll(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, pollTimeout)
	defer cancel()
	at := time.Now()
	var s sample
	err := m.conn.QueryRow(ctx, sampleSQL).Scan(&s.recovery, &s.replayedAll, &s.sinceReplay, &s.receiver, &s.receiverHidden, &s.silence, &s.sinceSent, &s.heard)
	if err == nil {
		var lag time.Duration
		if lag, err = s.lag(); err == nil {
			m.last.Store(&reading{lag: lag, at: at, standby: s.recovery})
		}
	}
	m.cause = err
}

// logCrossing logs when the lag goes over the bound and when it is back
// under it: once each, not once per refused page.
func (m *Monitor) logCrossing() {
	if m.opts.MaxLag == 0 {
		return
	}
	behind := m.Lag() > m.opts.MaxLag
	switch {
	case behind && !m.behind:
		m.log.Warn("read replica behind: list pages (syncs) answer 503 until it catches up", m.lagAttrs()...)
	case !behind && m.behind:
		m.log.Info("read replica caught up: list pages served again", m.lagAttrs()...)
	}
	m.behind = behind
}

// lagAttrs name the lag on a crossing's log line: lag_seconds when it is
// known, lag_unknown when it is not (JSON has no +Inf: the line carried
// "!ERROR:json: unsupported value: +Inf" where the lag belongs).
func (m *Monitor) lagAttrs() []any {
	attrs := []any{"lag_unknown", true}
	if lag := m.Lag(); lag != Unknown {
		attrs = []any{"lag_seconds", lag.Seconds()}
	}
	attrs = append(attrs, "max_lag", m.opts.MaxLag.String())
	if m.cause != nil {
		attrs = append(attrs, "cause", m.cause.Error())
	}
	return attrs
}
