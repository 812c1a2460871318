package api_test

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/catalog"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// BenchmarkFullSync measures a full sync (pages of 100, following
// next_cursor) straight from the service over loopback HTTP, beside the raw
// pgx keyset scan of the same rows reading the same stored JSON, in the same
// run, and reports both rates, their ratio, and the rate with gzip. It also
// reports the same sync through the service's whole handler called in
// process (signed identity, routing, composing, envelope; no TCP), which
// separates the service's own cost from the loopback hop between a client
// and a server sharing the benchmark's two cores.
// BENCH_ITEMS sets the catalog size (default 20000; the figure is
// 1000000, which takes about a minute to seed):
//
//	BENCH_ITEMS=1000000 go test ./internal/api -run '^$' -bench FullSync -benchtime 1x -timeout 30m
func BenchmarkFullSync(b *testing.B) {
	n := 20000
	if v, err := strconv.Atoi(os.Getenv("BENCH_ITEMS")); err == nil && v > 0 {
		n = v
	}
	ctx := context.Background()
	e := newEnv(b)
	owner := e.owner(b)
	seedStart := time.Now()
	if _, err := catalog.Seed(ctx, e.pool, owner, n, 1); err != nil {
		b.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, "VACUUM ANALYZE export_items"); err != nil {
		b.Fatal(err)
	}
	b.Logf("seeded %d items in %v", n, time.Since(seedStart).Round(time.Millisecond))

	var raw, svc, svcGzip, inProcess time.Duration
	var bytesOut int64
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		if got := rawScan(b, e.pool, owner); got != n {
			b.Fatalf("raw scan read %d items, want %d", got, n)
		}
		raw += time.Since(start)

		start = time.Now()
		got, size := serviceSync(b, e, owner, false)
		if got != n {
			b.Fatalf("service sync read %d items, want %d", got, n)
		}
		svc += time.Since(start)
		bytesOut += size

		start = time.Now()
		if got := handlerSync(b, e, owner); got != n {
			b.Fatalf("in-process sync read %d items, want %d", got, n)
		}
		inProcess += time.Since(start)

		start = time.Now()
		if got, _ := serviceSync(b, e, owner, true); got != n {
			b.Fatalf("gzip service sync read %d items, want %d", got, n)
		}
		svcGzip += time.Since(start)
	}
	b.StopTimer()
	items := float64(n * b.N)
	b.ReportMetric(items/raw.Seconds(), "raw_items/s")
	b.ReportMetric(items/svc.Seconds(), "service_items/s")
	b.ReportMetric(items/svcGzip.Seconds(), "gzip_items/s")
	b.ReportMetric(items/inProcess.Seconds(), "inprocess_items/s")
	b.ReportMetric(raw.Seconds()/svc.Seconds(), "ratio")
	b.ReportMetric(raw.Seconds()/inProcess.Seconds(), "inprocess_ratio")
	b.ReportMetric(float64(bytesOut)/items, "bytes/item")
}

// rawScan is the floor: the service's own keyset query, rows read straight
// from pgx without composing or sending anything.
func rawScan(b *testing.B, pool *pgxpool.Pool, owner string) int {
	ctx := context.Background()
	total := 0
	var lastAt time.Time
	var lastID string
	for first := true; ; first = false {
		sql := `SELECT id, status, updated_at, doc_eng FROM export_items WHERE owner_id = $1
			AND (updated_at, id) > ($2, $3) ORDER BY updated_at, id LIMIT 101`
		args := []any{owner, lastAt, lastID}
		if first {
			sql = `SELECT id, status, updated_at, doc_eng FROM export_items WHERE owner_id = $1 ORDER BY updated_at, id LIMIT 101`
			args = args[:1]
		}
		rows, err := pool.Query(ctx, sql, args...)
		if err != nil {
			b.Fatal(err)
		}
		var id, status, doc pgtype.DriverBytes
		var at time.Time
		page := 0
		for page < 100 && rows.Next() {
			if err := rows.Scan(&id, &status, &at, &doc); err != nil {
				b.Fatal(err)
			}
			page++
			lastAt, lastID = at, string(id)
		}
		more := rows.Next()
		rows.Close()
		if err := rows.Err(); err != nil {
			b.Fatal(err)
		}
		total += page
		if !more {
			return total
		}
	}
}

// serviceSync follows next_cursor through the service, reading each body
// whole and counting items without decoding them.
func serviceSync(b *testing.B, e *env, owner string, gzip bool) (int, int64) {
	client := &http.Client{Transport: &http.Transport{DisableCompression: !gzip, MaxIdleConnsPerHost: 4}}
	defer client.CloseIdleConnections()
	sign := e.sign(owner)
	q := url.Values{"limit": {"100"}}
	total, size := 0, int64(0)
	var buf bytes.Buffer
	buf.Grow(256 << 10)
	for {
		req, _ := http.NewRequest(http.MethodGet, e.srv.URL+"/v1/export/items?"+q.Encode(), nil)
		sign(req)
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		buf.Reset()
		_, err = buf.ReadFrom(resp.Body)
		resp.Body.Close()
		body := buf.Bytes()
		if err != nil || resp.StatusCode != 200 {
			b.Fatalf("page: %d %v %.200s", resp.StatusCode, err, body)
		}
		size += int64(len(body))
		total += bytes.Count(body, []byte(`{"status":`))
		i := bytes.LastIndex(body, []byte(`"next_cursor":"`))
		if i < 0 {
			return total, size
		}
		rest := body[i+len(`"next_cursor":"`):]
		q.Set("cursor", string(rest[:bytes.IndexByte(rest, '"')]))
	}
}

// handlerSync is serviceSync through the handler in process: no sockets.
func handlerSync(b *testing.B, e *env, owner string) int {
	h := e.srv.Config.Handler
	sign := e.sign(owner)
	q := url.Values{"limit": {"100"}}
	total := 0
	for {
		req := httptest.NewRequest(http.MethodGet, "/v1/export/items?"+q.Encode(), nil)
		sign(req)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		body := w.Body.Bytes()
		if w.Code != 200 {
			b.Fatalf("page: %d %.200s", w.Code, body)
		}
		total += bytes.Count(body, []byte(`{"status":`))
		i := bytes.LastIndex(body, []byte(`"next_cursor":"`))
		if i < 0 {
			return total
		}
		rest := body[i+len(`"next_cursor":"`):]
		q.Set("cursor", string(rest[:bytes.IndexByte(rest, '"')]))
	}
}
