// Package poolmetrics exports a go-redis client's connection pool
// statistics as Prometheus series, as pkg/postgres/poolmetrics does a pgx
// pool's. It is apart from package redisclient so that a binary that opens
// a client without serving metrics does not link Prometheus for it.
// (go-redis' own extra/redisprometheus does the same but is not in the
// module proxy this project builds from; its series are these, renamed to
// sit beside pgxpool_*.)
package poolmetrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// Register exports client's pool statistics on reg (redis_pool_*),
// labelled pool=name. They are read at each scrape, all from one
// PoolStats call, so that the counts of one scrape agree with each other.
func Register(reg prometheus.Registerer, name string, client *redis.Client) {
	reg.MustRegister(newCollector(name, client))
}

type collector struct {
	client  *redis.Client
	maxSize float64
	descs   map[string]*prometheus.Desc
}

// series are the exported statistics: name, help, and whether a counter.
var series = []struct {
	name, help string
	counter    bool
}{
	{"redis_pool_total_conns", "Connections in the pool.", false},
	{"redis_pool_idle_conns", "Idle connections.", false},
	{"redis_pool_max_conns", "Pool size limit.", false},
	{"redis_pool_hits_total", "Commands that found an idle connection.", true},
	{"redis_pool_misses_total", "Commands that found no idle connection and dialled a new one.", true},
	{"redis_pool_waits_total", "Commands that waited for the pool to have room (all connections in use).", true},
	{"redis_pool_wait_seconds_total", "Time spent waiting for room in the pool.", true},
	{"redis_pool_timeouts_total", "Commands that gave up waiting for room in the pool after the pool timeout (a wait cut short by the command's own, shorter deadline is not counted).", true},
	{"redis_pool_stale_conns_total", "Idle connections closed as stale or broken.", true},
}

func newCollector(name string, client *redis.Client) *collector {
	labels := prometheus.Labels{"pool": name}
	c := &collector{client: client, maxSize: float64(client.Options().PoolSize), descs: map[string]*prometheus.Desc{}}
	for _, s := range series {
		c.descs[s.name] = prometheus.NewDesc(s.name, s.help, nil, labels)
	}
	return c
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	s := c.client.PoolStats()
	values := map[string]float64{
		"redis_pool_total_conns":        float64(s.TotalConns),
		"redis_pool_idle_conns":         float64(s.IdleConns),
		"redis_pool_max_conns":          c.maxSize,
		"redis_pool_hits_total":         float64(s.Hits),
		"redis_pool_misses_total":       float64(s.Misses),
		"redis_pool_waits_total":        float64(s.WaitCount),
		"redis_pool_wait_seconds_total": float64(s.WaitDurationNs) / 1e9,
		"redis_pool_timeouts_total":     float64(s.Timeouts),
		"redis_pool_stale_conns_total":  float64(s.StaleConns),
	}
	for _, sr := range series {
		kind := prometheus.GaugeValue
		if sr.counter {
			kind = prometheus.CounterValue
		}
		ch <- prometheus.MustNewConstMetric(c.descs[sr.name], kind, values[sr.name])
	}
}
