package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// kindFigures is one kind of B's requests over the run.
type kindFigures struct {
	Planned, Sent, Late int
	MaxLag              time.Duration
	Answered            int
	P50, P99            time.Duration
	Outcomes            map[string]int // "200", "429", "timeout", …
}

// failed is every request of the kind not answered 2xx.
func (k kindFigures) failed() int {
	n := 0
	for o, c := range k.Outcomes {
		if !strings.HasPrefix(o, "2") || len(o) != 3 {
			n += c
		}
	}
	return n
}

// neighboursReport is what the run found.
type neighboursReport struct {
	duration    time.Duration
	b           map[string]kindFigures
	skipped     int                       // B's pairs not sent: no item free
	a           map[string]map[string]int // A's answers: route → outcome → count
	maxInFlight int64                     // A's sale calls in flight at once, at most
	pools       []poolWait

	bExportInFlight, bSaleInFlight int64 // B's requests in flight at once on each service's routes, at most
}

func newNeighboursReport(f neighboursFlags, b *neighbourStats, paced map[string]*pacing, a *floodStats) neighboursReport {
	rates := map[string]float64{kindGet: f.getRate, kindList: f.listRate, kindSale: f.saleRate}
	rep := neighboursReport{duration: f.duration, b: map[string]kindFigures{}, skipped: b.skipped,
		a: a.snapshot(), maxInFlight: a.salesInFlight.most.Load(),
		bExportInFlight: b.exportInFlight.most.Load(), bSaleInFlight: b.saleInFlight.most.Load()}
	for _, kind := range neighbourKinds {
		k, p := b.kinds[kind], paced[kind]
		rep.b[kind] = kindFigures{Planned: plannedIn(rates[kind], f.duration), Sent: p.Sent, Late: p.Late, MaxLag: p.MaxLag,
			Answered: k.latencies.Count(), P50: k.latencies.Percentile(50), P99: k.latencies.Percentile(99), Outcomes: k.outcomes}
	}
	return rep
}

// writeNeighboursReport prints the report: B's kinds, A's routes, the pools.
func writeNeighboursReport(w io.Writer, r neighboursReport) error {
	var sb strings.Builder
	fmt.Fprintf(&sb, "B, the neighbour, over %s (a sale is each confirm and each cancel):\n", r.duration)
	for _, kind := range neighbourKinds {
		k := r.b[kind]
		fmt.Fprintf(&sb, "  %-5s p50 %s p99 %s, answered %d; sent %d of %d planned, %d late (latest by %s); %s\n",
			kind, fmtMS(k.P50), fmtMS(k.P99), k.Answered, k.Sent, k.Planned, k.Late, fmtMS(k.MaxLag), fmtOutcomes(k.Outcomes))
	}
	fmt.Fprintf(&sb, "  in flight at once, at most: %d on the export routes, %d on the sale routes\n", r.bExportInFlight, r.bSaleInFlight)
	if r.skipped > 0 {
		fmt.Fprintf(&sb, "  %d pairs not sent: every item of B's was in a pair or left sold\n", r.skipped)
	}
	sb.WriteString("A, the flood, answers within the run (retries included):\n")
	for _, route := range []string{kindList, kindSale} {
		fmt.Fprintf(&sb, "  %-5s 429 %d; %s\n", route, r.a[route]["429"], fmtOutcomes(without(r.a[route], "429")))
	}
	fmt.Fprintf(&sb, "  sale calls in flight at once, at most (the workers' first calls, sent together, included): %d\n", r.maxInFlight)
	if len(r.pools) > 0 {
		sb.WriteString("pool wait over the run (pgxpool acquire time per acquire):\n")
		for _, p := range r.pools {
			fmt.Fprintf(&sb, "  %s pool=%s: %s per acquire, %d acquires, %d of them waited\n",
				p.service, p.pool, fmtMS(p.perAcquire()), int64(p.acquires), int64(p.empty))
		}
	}
	_, err := io.WriteString(w, sb.String())
	return err
}

// record is the report as one line of the results file.
func (r neighboursReport) record(name string) Record {
	rec := Record{Scenario: name, Figures: map[string]float64{
		"seconds":           r.duration.Seconds(),
		"b_skipped_pairs":   float64(r.skipped),
		"a_sales_inflight":  float64(r.maxInFlight),
		"b_export_inflight": float64(r.bExportInFlight),
		"b_sale_inflight":   float64(r.bSaleInFlight),
	}}
	for kind, k := range r.b {
		rec.Figures["b_"+kind+"_p50_ms"] = ms(k.P50)
		rec.Figures["b_"+kind+"_p99_ms"] = ms(k.P99)
		rec.Figures["b_"+kind+"_answered"] = float64(k.Answered)
		rec.Figures["b_"+kind+"_failed"] = float64(k.failed())
		rec.Figures["b_"+kind+"_late"] = float64(k.Late)
	}
	for route, m := range r.a {
		total := 0
		for _, n := range m {
			total += n
		}
		rec.Figures["a_"+route+"_429"] = float64(m["429"])
		rec.Figures["a_"+route+"_200"] = float64(m["200"])
		rec.Figures["a_"+route+"_answers"] = float64(total)
	}
	for _, p := range r.pools {
		rec.Figures["pool_wait_ms."+p.service+"."+p.pool] = ms(p.perAcquire())
	}
	return rec
}

// fmtOutcomes lists counts by outcome, statuses first in order, "none"
// without any.
func fmtOutcomes(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys) // digits sort before "timeout" and "transport"
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, k+": "+strconv.Itoa(m[k]))
	}
	if len(parts) == 0 {
		return "no answers"
	}
	return strings.Join(parts, ", ")
}

func without(m map[string]int, key string) map[string]int {
	out := map[string]int{}
	for k, v := range m {
		if k != key {
			out[k] = v
		}
	}
	return out
}

func fmtMS(d time.Duration) string {
	return strconv.FormatFloat(ms(d), 'f', 1, 64) + " ms"
}

// poolCounters are one pgx pool's acquire counters at a moment
// (pkg/postgres/poolmetrics).
type poolCounters struct{ acquires, empty, waitSeconds float64 }

// poolWait is one pool's acquires over the run.
type poolWait struct {
	service, pool   string
	acquires, empty float64
	wait            time.Duration // all acquires together
}

// perAcquire is the mean time an acquire took: pgx's acquire duration
// counts every acquire, the ones a free connection answered at once too.
func (p poolWait) perAcquire() time.Duration {
	if p.acquires <= 0 {
		return 0
	}
	return time.Duration(float64(p.wait) / p.acquires)
}

// scrapeAll reads every target's pool counters: service → pool → counters.
func scrapeAll(ctx context.Context, targets metricsTargets) (map[string]map[string]poolCounters, error) {
	out := map[string]map[string]poolCounters{}
	for _, t := range targets {
		pools, err := scrapePools(ctx, t.url)
		if err != nil {
			return nil, fmt.Errorf("metrics of %s: %w", t.name, err)
		}
		out[t.name] = pools
	}
	return out, nil
}

func scrapePools(ctx context.Context, url string) (map[string]poolCounters, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("status %d", resp.StatusCode)
	}
	return parsePoolCounters(resp.Body)
}

// parsePoolCounters reads the pgxpool_* counters of a Prometheus text
// exposition, by their pool label.
func parsePoolCounters(r io.Reader) (map[string]poolCounters, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return nil, err
	}
	out := map[string]poolCounters{}
	for _, metric := range []string{"pgxpool_acquire_total", "pgxpool_empty_acquire_total", "pgxpool_acquire_wait_seconds_total"} {
		fam := families[metric]
		if fam == nil {
			continue
		}
		for _, m := range fam.GetMetric() {
			pool := ""
			for _, l := range m.GetLabel() {
				if l.GetName() == "pool" {
					pool = l.GetValue()
				}
			}
			c := out[pool]
			v := m.GetCounter().GetValue()
			switch metric {
			case "pgxpool_acquire_total":
				c.acquires = v
			case "pgxpool_empty_acquire_total":
				c.empty = v
			default:
				c.waitSeconds = v
			}
			out[pool] = c
		}
	}
	return out, nil
}

// poolWaits is each pool's acquires between two scrapes, in the targets'
// order and by pool name.
func poolWaits(targets metricsTargets, before, after map[string]map[string]poolCounters) []poolWait {
	var out []poolWait
	for _, t := range targets {
		names := make([]string, 0, len(after[t.name]))
		for pool := range after[t.name] {
			names = append(names, pool)
		}
		slices.Sort(names)
		for _, pool := range names {
			a, b := after[t.name][pool], before[t.name][pool]
			out = append(out, poolWait{service: t.name, pool: pool, acquires: a.acquires - b.acquires, empty: a.empty - b.empty,
				wait: time.Duration((a.waitSeconds - b.waitSeconds) * float64(time.Second))})
		}
	}
	return out
}
