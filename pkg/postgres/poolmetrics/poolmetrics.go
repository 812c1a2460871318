// Package poolmetrics exports a pgx pool's statistics as Prometheus
// series. It is apart from package postgres so that the binaries that open
// a pool without serving metrics (exportctl, loadgen) do not link
// Prometheus for it.
package poolmetrics

import (
	"github.com/coinexport/export/pkg/postgres"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// Register exports the pool's statistics on reg as gauges and counters
// (pgxpool_*), labelled pool=name.
func Register(reg prometheus.Registerer, name string, pool *pgxpool.Pool) {
	labels := prometheus.Labels{"pool": name}
	gauge := func(metric, help string, f func(*pgxpool.Stat) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: metric, Help: help, ConstLabels: labels},
			func() float64 { return f(pool.Stat()) })
	}
	counter := func(metric, help string, f func(*pgxpool.Stat) float64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: metric, Help: help, ConstLabels: labels},
			func() float64 { return f(pool.Stat()) })
	}
	reg.MustRegister(
		gauge("pgxpool_total_conns", "Connections in the pool.", func(s *pgxpool.Stat) float64 { return float64(s.TotalConns()) }),
		gauge("pgxpool_acquired_conns", "Connections in use.", func(s *pgxpool.Stat) float64 { return float64(s.AcquiredConns()) }),
		gauge("pgxpool_idle_conns", "Idle connections.", func(s *pgxpool.Stat) float64 { return float64(s.IdleConns()) }),
		gauge("pgxpool_max_conns", "Pool size limit.", func(s *pgxpool.Stat) float64 { return float64(s.MaxConns()) }),
		counter("pgxpool_acquire_total", "Connections acquired.", func(s *pgxpool.Stat) float64 { return float64(s.AcquireCount()) }),
		counter("pgxpool_empty_acquire_total", "Acquires that had to wait for a connection.", func(s *pgxpool.Stat) float64 { return float64(s.EmptyAcquireCount()) }),
		counter("pgxpool_acquire_wait_seconds_total", "Time spent waiting for a connection.", func(s *pgxpool.Stat) float64 { return s.AcquireDuration().Seconds() }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "pgxpool_slot_waits_total", ConstLabels: labels,
			Help: "Calls that waited for one of the pool's own connections because the server refused the pool a new one for want of a slot (SQLSTATE 53300: max_connections, or a CONNECTION LIMIT): refused themselves, or come while such calls waited, in line behind them."},
			func() float64 { waits, _ := postgres.SlotWaits(pool); return float64(waits) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "pgxpool_slot_wait_seconds_total", ConstLabels: labels,
			Help: "Time those calls spent waiting for one of the pool's connections."},
			func() float64 { _, waited := postgres.SlotWaits(pool); return waited.Seconds() }),
	)
}
