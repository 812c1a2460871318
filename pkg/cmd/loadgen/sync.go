package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"
)

// syncQuery is what a syncing client asks for (spec 4.3, 4.8).
type syncQuery struct {
	Limit        int
	Lang         string
	UpdatedAfter string // RFC 3339; "" for a full sync
}

// syncResult is one finished sync.
type syncResult struct {
	Items, Pages int
	Took         time.Duration
	PageLatency  Latencies
	// CPU is the CPU time the accounted parts and this process used over
	// the sync (empty without --cpu).
	CPU cpuUsage
}

// syncer reads every page of an owner's items like a real client: one page
// at a time, passing meta.next_cursor back unchanged. It reuses one request,
// one response (whose body buffer grows to the largest page once) and one
// URI buffer for every page.
type syncer struct {
	client *httpClient
	auth   authenticator
	req    fasthttp.Request
	resp   fasthttp.Response
	uri    []byte
}

// newSyncer returns a syncer of base (the URL, /v1 included) that
// authenticates as auth says (authFor); a bad base or auth fails here,
// before any request.
func newSyncer(cfg Config, auth, base string) (*syncer, error) {
	a, err := authFor(cfg, auth)
	if err != nil {
		return nil, err
	}
	client, err := newHTTPClient(base, 1)
	if err != nil {
		return nil, err
	}
	return &syncer{client: client, auth: a}, nil
}

// run syncs until the last page.
func (s *syncer) run(ctx context.Context, q syncQuery) (syncResult, error) {
	var res syncResult
	start := time.Now()
	cursor := ""
	for {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		t0 := time.Now()
		p, err := s.page(q, cursor)
		if err != nil {
			return res, fmt.Errorf("page %d: %w", res.Pages+1, err)
		}
		res.PageLatency.Add(time.Since(t0))
		res.Pages++
		res.Items += p.Items
		if p.NextCursor == "" {
			break
		}
		if p.NextCursor == cursor {
			return res, fmt.Errorf("page %d: cursor did not advance", res.Pages)
		}
		cursor = p.NextCursor
	}
	res.Took = time.Since(start)
	return res, nil
}

// page fetches one page.
func (s *syncer) page(q syncQuery, cursor string) (page, error) {
	s.uri = q.appendURI(append(s.uri[:0], s.client.base...), cursor)
	s.req.Reset()
	s.req.SetRequestURIBytes(s.uri)
	s.auth(&s.req)
	if err := s.client.do(&s.req, &s.resp); err != nil {
		return page{}, err
	}
	status := s.resp.StatusCode()
	p, err := scanPage(s.resp.Body())
	if err != nil {
		return page{}, fmt.Errorf("status %d: %w", status, err)
	}
	if status != fasthttp.StatusOK || p.Error != nil {
		code := ""
		if p.Error != nil {
			code = p.Error.Code
		}
		return page{}, fmt.Errorf("status %d, error.code %q", status, code)
	}
	return p, nil
}

// appendURI appends the list path and query of one page to dst (which holds
// the base URL); query values are escaped as url.Values would.
func (q syncQuery) appendURI(dst []byte, cursor string) []byte {
	dst = append(dst, "/export/items?limit="...)
	dst = strconv.AppendInt(dst, int64(q.Limit), 10)
	dst = appendQueryArg(dst, "lang", q.Lang)
	if q.UpdatedAfter != "" {
		dst = appendQueryArg(dst, "updated_after", q.UpdatedAfter)
	}
	if cursor != "" {
		dst = appendQueryArg(dst, "cursor", cursor)
	}
	return dst
}

// appendQueryArg appends "&name=value" with value query-escaped.
func appendQueryArg(dst []byte, name, value string) []byte {
	dst = append(append(append(dst, '&'), name...), '=')
	return fasthttp.AppendQuotedArg(dst, []byte(value))
}

// runSync is "loadgen sync": one full sync, recorded as items/s.
func runSync(ctx context.Context, cfg Config, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("sync", flag.ContinueOnError)
	name := fs.String("name", "sync", "scenario name in the results file")
	base := fs.String("base", "http://127.0.0.1:18080/v1", "base URL including /v1")
	auth := fs.String("auth", "key", "key (X-API-Key, through the gateway) or signed (identity headers, direct to a service)")
	limit := fs.Int("limit", 100, "page size")
	lang := fs.String("lang", "ENG", "content language")
	expect := fs.Int("expect", 0, "expected item count; a different count fails the scenario (0: no check)")
	warmup := fs.Int("warmup-pages", 0, "pages read and discarded before the timed sync (warms caches and connections)")
	repeat := fs.Int("repeat", 1, "timed syncs; the fastest is recorded")
	var parts cpuParts
	fs.Var(&parts, "cpu", "name=pid: a process tree whose CPU time per page to record (repeatable)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if _, err := parts.sample(); err != nil { // fail before the run, not after it
		return fmt.Errorf("%s: %w", *name, err)
	}
	s, err := newSyncer(cfg, *auth, *base)
	if err != nil {
		return err
	}
	q := syncQuery{Limit: *limit, Lang: *lang}
	if err := s.warm(q, *warmup); err != nil {
		return fmt.Errorf("%s: warm-up: %w", *name, err)
	}
	res, err := fastest(*repeat, func() (syncResult, error) {
		res, err := s.measuredRun(ctx, q, parts)
		if err == nil && *expect > 0 && res.Items != *expect {
			err = fmt.Errorf("synced %d items, want %d", res.Items, *expect)
		}
		return res, err
	})
	if err != nil {
		return fmt.Errorf("%s: %w", *name, err)
	}
	rec := syncRecord(*name, res)
	if leftOut := res.CPU.record(res.CPU.self, float64(res.Pages), rec.Figures); len(leftOut) > 0 {
		rec.Note = leftOutNote(leftOut)
	}
	return appendRecord(cfg.Results, rec, stdout)
}

// measuredRun is run with the CPU time of parts (and of this process)
// taken over the sync, so that its record can say what each part of the
// path spends per page.
func (s *syncer) measuredRun(ctx context.Context, q syncQuery, parts cpuParts) (syncResult, error) {
	window, err := parts.start()
	if err != nil {
		return syncResult{}, err
	}
	res, err := s.run(ctx, q)
	if err != nil {
		return res, err
	}
	res.CPU, err = window.stop()
	return res, err
}

// fastest runs f n times and keeps the quickest run. On a machine shared
// with other work, the fastest of a few runs is the one least disturbed;
// the baseline gets the same treatment, so ratios stay fair.
func fastest(n int, f func() (syncResult, error)) (syncResult, error) {
	var best syncResult
	for i := range max(n, 1) {
		res, err := f()
		if err != nil {
			return res, err
		}
		if i == 0 || res.Took < best.Took {
			best = res
		}
	}
	return best, nil
}

// warm reads up to n pages from the start and throws them away.
func (s *syncer) warm(q syncQuery, n int) error {
	cursor := ""
	for range n {
		p, err := s.page(q, cursor)
		if err != nil {
			return err
		}
		if p.NextCursor == "" {
			return nil
		}
		cursor = p.NextCursor
	}
	return nil
}

func syncRecord(name string, res syncResult) Record {
	secs := res.Took.Seconds()
	return Record{Scenario: name, Figures: map[string]float64{
		"items":       float64(res.Items),
		"pages":       float64(res.Pages),
		"seconds":     secs,
		"items_per_s": float64(res.Items) / secs,
		"page_p50_ms": ms(res.PageLatency.Percentile(50)),
		"page_p99_ms": ms(res.PageLatency.Percentile(99)),
	}}
}
