package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// fakeReader serves total items in pages, with the cursor being the next
// offset; stuck makes it hand back the same cursor forever.
func fakeReader(t *testing.T, total int, stuck bool) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if ae := r.Header.Get("Accept-Encoding"); ae != "" {
			// The figures measure the service, not gzip: the client must not ask for compression.
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprintf(w, `{"error":{"code":"asked_for_%s","message":"no"},"meta":{"request_id":"r"}}`, ae)
			return
		}
		if r.Header.Get("X-API-Key") != "k" {
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprint(w, `{"error":{"code":"unauthenticated","message":"no"},"meta":{"request_id":"r"}}`)
			return
		}
		limit, _ := strconv.Atoi(r.URL.Query().Get("limit"))
		from, _ := strconv.Atoi(r.URL.Query().Get("cursor"))
		to := min(from+limit, total)
		items := make([]string, 0, to-from)
		for i := from; i < to; i++ {
			items = append(items, fmt.Sprintf(`{"id":"%d"}`, i))
		}
		next := "null"
		if to < total {
			next = strconv.Quote(strconv.Itoa(to))
		}
		if stuck {
			next = `"0"`
		}
		fmt.Fprintf(w, `{"data":[%s],"meta":{"request_id":"r","next_cursor":%s}}`, strings.Join(items, ","), next)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func testClient(t *testing.T, base string) *httpClient {
	t.Helper()
	c, err := newHTTPClient(base, 1)
	if err != nil {
		t.Fatalf("newHTTPClient(%q) error %v", base, err)
	}
	return c
}

func TestSyncerFollowsCursors(t *testing.T) {
	srv := fakeReader(t, 250, false)
	s := &syncer{client: testClient(t, srv.URL), auth: byAPIKey("k")}
	res, err := s.run(context.Background(), syncQuery{Limit: 100, Lang: "ENG"})
	if err != nil {
		t.Fatalf("run() error %v", err)
	}
	if res.Items != 250 || res.Pages != 3 {
		t.Errorf("run() = %d items in %d pages, want 250 in 3", res.Items, res.Pages)
	}
}

func TestSyncerFailures(t *testing.T) {
	tests := []struct {
		name  string
		srv   *httptest.Server
		key   string
		wantE string
	}{
		{"error envelope", fakeReader(t, 10, false), "wrong", `error.code "unauthenticated"`},
		{"cursor does not advance", fakeReader(t, 10, true), "k", "cursor did not advance"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &syncer{client: testClient(t, tt.srv.URL), auth: byAPIKey(tt.key)}
			_, err := s.run(context.Background(), syncQuery{Limit: 5, Lang: "ENG"})
			if err == nil || !strings.Contains(err.Error(), tt.wantE) {
				t.Errorf("run() error = %v, want one containing %q", err, tt.wantE)
			}
		})
	}
}

func TestFastestKeepsTheQuickestRun(t *testing.T) {
	took := []time.Duration{3 * time.Second, time.Second, 2 * time.Second}
	i := 0
	got, err := fastest(3, func() (syncResult, error) {
		r := syncResult{Items: i, Took: took[i]}
		i++
		return r, nil
	})
	if err != nil || got.Took != time.Second || got.Items != 1 {
		t.Errorf("fastest(3) = %+v, %v, want the second run (1 s)", got, err)
	}
	if i != 3 {
		t.Errorf("fastest(3) ran f %d times, want 3", i)
	}
}

// A sync given --cpu records each part's CPU time per page, and this
// process's as the client's, from the window of the run it keeps.
func TestSyncRecordsCPUPerPage(t *testing.T) {
	srv := fakeReader(t, 250, false)
	results := filepath.Join(t.TempDir(), "results.jsonl")
	cfg := Config{ReadKey: "k", Results: results}
	args := []string{"--name", "sync_x", "--base", srv.URL, "--limit", "100", "--expect", "250",
		"--repeat", "2", "--cpu", "proxy=" + strconv.Itoa(os.Getpid())}
	if err := runSync(context.Background(), cfg, args, io.Discard); err != nil {
		t.Fatalf("runSync() error %v", err)
	}
	f, err := os.Open(results)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rs, err := readRecords(f)
	if err != nil {
		t.Fatal(err)
	}
	got := rs["sync_x"].Figures
	if got["pages"] != 3 {
		t.Errorf("pages = %v, want 3", got["pages"])
	}
	for _, part := range []string{"cpu_us.proxy", "cpu_us.client"} {
		if _, ok := got[part]; !ok {
			t.Errorf("record lacks %s: %v", part, got)
		}
	}
}

// Without --cpu a sync records no CPU figure (no CPU table line).
func TestSyncWithoutPartsRecordsNoCPU(t *testing.T) {
	srv := fakeReader(t, 10, false)
	results := filepath.Join(t.TempDir(), "results.jsonl")
	if err := runSync(context.Background(), Config{ReadKey: "k", Results: results}, []string{"--name", "s", "--base", srv.URL}, io.Discard); err != nil {
		t.Fatalf("runSync() error %v", err)
	}
	b, err := os.ReadFile(results)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), cpuFigurePrefix) {
		t.Errorf("record without --cpu has CPU figures: %s", b)
	}
}
