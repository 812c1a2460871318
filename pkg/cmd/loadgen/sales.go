package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/coinexport/export/pkg/envelope"
	"github.com/coinexport/export/pkg/jsonw"
	"github.com/coinexport/export/pkg/postgres"
	"github.com/valyala/fasthttp"
)

// salesWorker confirms and cancels sales of its own items with its own
// platform key, so no two workers ever touch the same item. It reuses one
// request, one response and its buffers for every call.
type salesWorker struct {
	client   *httpClient
	key      string
	items    []string
	itemURLs []string  // per item: base + "/export/items/{id}/sales/", path-escaped once
	ids      *idSource // order ids and Idempotency-Keys

	req     fasthttp.Request
	resp    fasthttp.Response
	uri     []byte
	body    []byte
	order   []byte
	idemKey []byte

	pairs     int // pairs finished inside the measured window
	conflicts int // 409 on confirm: the item was sold already
	errors    int
	lastErr   string
	requests  Latencies // each confirm and cancel, measured window only
	pairTimes Latencies
}

// newSalesWorker returns worker number n of the run identified by run.
func newSalesWorker(client *httpClient, run string, n int, key string, items []string) *salesWorker {
	w := &salesWorker{client: client, key: key, items: items, ids: newIDSource(run, n)}
	w.itemURLs = make([]string, len(items))
	for i, item := range items {
		w.itemURLs[i] = client.base + "/export/items/" + url.PathEscape(item) + "/sales/"
	}
	return w
}

// loop runs pairs until stop; only pairs started at or after measureFrom count.
func (w *salesWorker) loop(ctx context.Context, measureFrom, stop time.Time) {
	for i := 0; time.Now().Before(stop) && ctx.Err() == nil; i++ {
		item := i % len(w.items)
		t0 := time.Now()
		measured := !t0.Before(measureFrom)
		w.order = w.ids.appendNext(append(w.order[:0], "bench-"...))
		w.body = appendSalesBody(w.body[:0], w.order)
		status, d, err := w.post(item, "confirm")
		if measured {
			w.requests.Add(d)
		}
		switch {
		case err != nil || (status != fasthttp.StatusOK && status != fasthttp.StatusConflict):
			w.fail(status, err)
			continue
		case status == fasthttp.StatusConflict:
			w.conflicts++
			continue
		}
		status, d, err = w.post(item, "cancel")
		if measured {
			w.requests.Add(d)
		}
		if err != nil || status != fasthttp.StatusOK {
			w.fail(status, err)
			continue
		}
		if measured {
			w.pairs++
			w.pairTimes.Add(time.Since(t0))
		}
	}
}

func (w *salesWorker) fail(status int, err error) {
	w.errors++
	if err != nil {
		w.lastErr = err.Error()
	} else {
		w.lastErr = fmt.Sprintf("status %d", status)
	}
}

// post sends one confirm or cancel of items[item] with w.body and a fresh
// Idempotency-Key (spec 4.7).
func (w *salesWorker) post(item int, op string) (int, time.Duration, error) {
	req := &w.req
	req.Reset()
	req.Header.SetMethod(fasthttp.MethodPost)
	w.uri = append(append(w.uri[:0], w.itemURLs[item]...), op...)
	req.SetRequestURIBytes(w.uri)
	req.Header.Set("X-API-Key", w.key)
	w.idemKey = w.ids.appendNext(w.idemKey[:0])
	req.Header.SetBytesV("Idempotency-Key", w.idemKey)
	req.Header.SetContentType("application/json")
	req.SetBody(w.body)
	t0 := time.Now()
	err := w.client.do(req, &w.resp)
	d := time.Since(t0)
	if err != nil {
		return 0, d, err
	}
	status := w.resp.StatusCode()
	if status != fasthttp.StatusOK && status != fasthttp.StatusConflict {
		var p envelope.Parsed
		if json.Unmarshal(w.resp.Body(), &p) == nil && p.Error != nil {
			return status, d, fmt.Errorf("%s: status %d, error.code %q", op, status, p.Error.Code)
		}
	}
	return status, d, nil
}

// appendSalesBody appends the confirm/cancel body {"external_order_id": order}.
func appendSalesBody(dst, order []byte) []byte {
	dst = append(dst, `{"external_order_id":`...)
	return append(jsonw.String(dst, string(order)), '}')
}

// runSales is "loadgen sales": confirm + cancel pairs on distinct items,
// one worker (and one platform key) per concurrent platform.
func runSales(ctx context.Context, cfg Config, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("sales", flag.ContinueOnError)
	name := fs.String("name", "sales", "scenario name in the results file")
	base := fs.String("base", "http://127.0.0.1:18080/v1", "base URL including /v1")
	workers := fs.Int("workers", 32, "concurrent platforms (each needs its own key in LOADGEN_WRITE_KEYS)")
	perWorker := fs.Int("items-per-worker", 50, "items each worker cycles through")
	duration := fs.Duration("duration", 10*time.Second, "measured duration")
	warmup := fs.Duration("warmup", 3*time.Second, "unmeasured time before")
	var parts cpuParts
	fs.Var(&parts, "cpu", "name=pid: a process tree whose CPU time per pair to record (repeatable)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := cfg.need("DATABASE_URL", "LOADGEN_OWNER_ID", "LOADGEN_WRITE_KEYS"); err != nil {
		return err
	}
	if len(cfg.WriteKeys) < *workers {
		return fmt.Errorf("LOADGEN_WRITE_KEYS has %d keys, --workers wants %d", len(cfg.WriteKeys), *workers)
	}
	if _, err := parts.sample(); err != nil { // fail before the run, not after it
		return fmt.Errorf("%s: %w", *name, err)
	}
	ws, err := newSalesWorkers(ctx, cfg, *base, *workers, *perWorker)
	if err != nil {
		return err
	}
	start := time.Now()
	measureFrom, stop := start.Add(*warmup), start.Add(*warmup+*duration)
	var wg sync.WaitGroup
	for _, w := range ws {
		wg.Go(func() { w.loop(ctx, measureFrom, stop) })
	}
	// The CPU window is the measured one, from measureFrom until the last
	// measured pair has finished.
	opened := parts.startAt(ctx, measureFrom)
	wg.Wait()
	window, startErr := opened()
	if err := ctx.Err(); err != nil {
		return err // an interrupted run has no figures
	}
	if startErr != nil {
		return fmt.Errorf("%s: %w", *name, startErr)
	}
	measured := time.Since(measureFrom)
	used, err := window.stop()
	if err != nil {
		return fmt.Errorf("%s: %w", *name, err)
	}
	rec := salesRecord(*name, ws, measured)
	if leftOut := used.record(used.self, rec.Figures["pairs"], rec.Figures); len(leftOut) > 0 {
		rec.Note = strings.TrimPrefix(rec.Note+"; "+leftOutNote(leftOut), "; ")
	}
	return appendRecord(cfg.Results, rec, stdout)
}

// newSalesWorkers gives each worker its key and its own active items.
func newSalesWorkers(ctx context.Context, cfg Config, base string, n, perWorker int) ([]*salesWorker, error) {
	pool, err := postgres.Open(ctx, cfg.DatabaseURL)
	if err != nil {
		return nil, err
	}
	defer postgres.Close(pool)
	ids, err := sampleIDs(ctx, pool, cfg.OwnerID, n*perWorker, true)
	if err != nil {
		return nil, err
	}
	if len(ids) < n {
		return nil, fmt.Errorf("owner has %d active items, need at least %d", len(ids), n)
	}
	client, err := newHTTPClient(base, n)
	if err != nil {
		return nil, err
	}
	run := randomHex(8)
	ws := make([]*salesWorker, n)
	per := len(ids) / n
	for i := range ws {
		ws[i] = newSalesWorker(client, run, i, cfg.WriteKeys[i], ids[i*per:(i+1)*per])
	}
	return ws, nil
}

func salesRecord(name string, ws []*salesWorker, window time.Duration) Record {
	var all, pairs Latencies
	n, conflicts, errs, lastErr := 0, 0, 0, ""
	for _, w := range ws {
		n += w.pairs
		conflicts += w.conflicts
		errs += w.errors
		all.Merge(&w.requests)
		pairs.Merge(&w.pairTimes)
		if w.lastErr != "" {
			lastErr = w.lastErr
		}
	}
	rec := Record{Scenario: name, Figures: map[string]float64{
		"workers":     float64(len(ws)),
		"pairs":       float64(n),
		"pairs_per_s": float64(n) / window.Seconds(),
		"p50_ms":      ms(all.Percentile(50)),
		"p99_ms":      ms(all.Percentile(99)),
		"pair_p99_ms": ms(pairs.Percentile(99)),
		"conflicts":   float64(conflicts),
		"errors":      float64(errs),
	}}
	if errs > 0 {
		rec.Note = "last error: " + lastErr
	}
	return rec
}
