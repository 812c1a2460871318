package syncclient

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/testenv"
)

// answers serves one scripted answer per request: a status, with
// "Retry-After: N" when retryAfter is set; a 200 is a page of one item and
// no next cursor.
type answer struct {
	status     int
	retryAfter string
}

func scripted(t *testing.T, answers ...answer) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a := answers[min(int(calls.Add(1))-1, len(answers)-1)]
		if a.retryAfter != "" {
			w.Header().Set("Retry-After", a.retryAfter)
		}
		w.WriteHeader(a.status)
		if a.status == http.StatusOK {
			fmt.Fprint(w, `{"data":[{"id":"a","status":"active","stock_quantity":1,"updated_at":"2026-11-21T10:00:00.000001Z"}],"meta":{"request_id":"r","next_cursor":null}}`)
			return
		}
		fmt.Fprintf(w, `{"error":{"code":"e%d","message":"m"},"meta":{"request_id":"r"}}`, a.status)
	}))
	t.Cleanup(srv.Close)
	return srv, &calls
}

// A page refused for a reason that passes is asked for again, after
// Retry-After when the answer has one, else after a doubling backoff; a
// refusal that will not pass ends the sync at once.
func TestSyncRetriesWhatPasses(t *testing.T) {
	for _, tc := range []struct {
		name      string
		answers   []answer
		retries   int
		wantErr   string // "" for success
		wantWaits []time.Duration
	}{
		{"rate limited twice", []answer{{429, "7"}, {429, "61"}, {200, ""}}, 0, "",
			[]time.Duration{7 * time.Second, 61 * time.Second}},
		{"rate limited without Retry-After", []answer{{429, ""}, {200, ""}}, 0, "", []time.Duration{firstBackoff}},
		// An hourly or daily limit is waited out, not given up on.
		{"rate limited for an hour", []answer{{429, "3621"}, {200, ""}}, 0, "", []time.Duration{3621 * time.Second}},
		{"rate limited for a day", []answer{{429, "86400"}, {200, ""}}, 0, "", []time.Duration{24 * time.Hour}},
		{"Retry-After bounded", []answer{{429, "31536000"}, {200, ""}}, 0, "", []time.Duration{maxRetryAfter}},
		{"request timeout", []answer{{408, ""}, {200, ""}}, 0, "", []time.Duration{firstBackoff}},
		{"service unavailable, then bad gateway", []answer{{503, ""}, {502, ""}, {200, ""}}, 0, "",
			[]time.Duration{firstBackoff, 2 * firstBackoff}},
		{"unavailable with Retry-After: the longer of it and the backoff",
			[]answer{{503, "1"}, {503, "1"}, {503, "1"}, {503, "2"}, {200, ""}}, 0, "",
			[]time.Duration{time.Second, time.Second, 2 * time.Second, 4 * time.Second}},
		{"cursor refused", []answer{{400, ""}}, 0, "status 400 e400", nil},
		{"key revoked", []answer{{401, ""}}, 0, "status 401", nil},
		{"down for good", []answer{{503, ""}}, 3, "status 503",
			[]time.Duration{firstBackoff, 2 * firstBackoff, 4 * firstBackoff}},
		{"no retries", []answer{{429, "1"}}, -1, "status 429", nil},
		// A key whose budget others spend too (product pages, a parallel
		// run) meets 429 page after page; giving up would only start the
		// run over into the same limit, so 429s use up no Retries.
		{"rate limited more often than Retries", repeat(answer{429, "1"}, 2*DefaultRetries), 0, "",
			slices.Repeat([]time.Duration{time.Second}, 2*DefaultRetries)},
		{"429s leave the failures their Retries",
			[]answer{{503, ""}, {429, "2"}, {429, "2"}, {429, "2"}, {503, ""}, {200, ""}}, 2, "",
			[]time.Duration{firstBackoff, 2 * time.Second, 2 * time.Second, 2 * time.Second, 16 * firstBackoff}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, calls := scripted(t, tc.answers...)
			var waits []time.Duration
			c := &Client{BaseURL: srv.URL + "/v1", Retries: tc.retries,
				Wait: func(_ context.Context, d time.Duration) error { waits = append(waits, d); return nil }}
			mirror := Mirror{}
			_, n, err := c.Sync(context.Background(), time.Time{}, mirror.Upsert)
			switch {
			case tc.wantErr == "" && (err != nil || n != 1):
				t.Errorf("Sync = %d items, %v; want 1 item", n, err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("Sync error = %v, want one saying %q", err, tc.wantErr)
			}
			if !slices.Equal(waits, tc.wantWaits) {
				t.Errorf("waits = %v, want %v", waits, tc.wantWaits)
			}
			if want := int64(len(tc.wantWaits) + 1); calls.Load() != want {
				t.Errorf("requests = %d, want %d", calls.Load(), want)
			}
		})
	}
}

// repeat is n times a, then a 200.
func repeat(a answer, n int) []answer {
	return append(slices.Repeat([]answer{a}, n), answer{status: http.StatusOK})
}

// A sync whose context ends while it waits to retry stops at once.
func TestSyncStopsWaitingWithItsContext(t *testing.T) {
	srv, _ := scripted(t, answer{429, "3600"})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, _, err := (&Client{BaseURL: srv.URL + "/v1"}).Sync(ctx, time.Time{}, Mirror{}.Upsert)
	if err == nil || time.Since(start) > 10*time.Second {
		t.Errorf("Sync = %v after %s, want an error as soon as the context ends", err, time.Since(start))
	}
}

// No answer from the network is asked for again; a request that cannot be
// made (a malformed BaseURL, a scheme not spoken) ends the run at once.
func TestSyncRetriesOnlyWhatMayPass(t *testing.T) {
	closed := "http://" + testenv.RefusingAddr(t) + "/v1"
	for _, tc := range []struct {
		name, baseURL string
		wantWaits     int
	}{
		{"connection refused", closed, 2},
		{"scheme not spoken", "ftp://127.0.0.1/v1", 0},
		{"malformed URL", "http://[::1/v1", 0},
	} {
		var waits int
		c := &Client{BaseURL: tc.baseURL, Retries: 2,
			Wait: func(context.Context, time.Duration) error { waits++; return nil }}
		if _, _, err := c.Sync(context.Background(), time.Time{}, Mirror{}.Upsert); err == nil {
			t.Errorf("%s: Sync = nil error, want one", tc.name)
		}
		if waits != tc.wantWaits {
			t.Errorf("%s: %d retries, want %d", tc.name, waits, tc.wantWaits)
		}
	}
}

// A page whose answer does not come (a connection the network dropped
// without a word, a peer that stopped reading), or stops halfway through
// its body, is timed out and asked for again with the same cursor:
// without a bound, http.DefaultClient waits on it for ever, and the run
// with it, however long the caller meant to sync. The body's read is
// timed too: a bound on the answer's head alone left a page whose body
// stalled holding the run.
func TestSyncTimesOutAPageThatNeverComes(t *testing.T) {
	const page = `{"data":[{"id":"a","status":"active","stock_quantity":1,"updated_at":"2026-11-21T10:00:00.000001Z"}],"meta":{"request_id":"r","next_cursor":null}}`
	stalls := map[string]func(w http.ResponseWriter){
		"no answer": func(http.ResponseWriter) {},
		"half a body": func(w http.ResponseWriter) {
			w.Header().Set("Content-Length", strconv.Itoa(len(page)))
			fmt.Fprint(w, page[:len(page)/2])
			w.(http.Flusher).Flush()
		},
	}
	for name, stall := range stalls {
		t.Run(name, func(t *testing.T) {
			var calls atomic.Int64
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if calls.Add(1) == 1 {
					stall(w)
					<-r.Context().Done() // the rest never comes: held until the client gives up on it
					return
				}
				fmt.Fprint(w, page)
			}))
			t.Cleanup(srv.Close)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var waits int
			c := &Client{BaseURL: srv.URL + "/v1", PageTimeout: 100 * time.Millisecond,
				Wait: func(context.Context, time.Duration) error { waits++; return nil }}
			if _, n, err := c.Sync(ctx, time.Time{}, Mirror{}.Upsert); err != nil || n != 1 || waits != 1 || calls.Load() != 2 {
				t.Errorf("Sync = %d items, %v after %d requests and %d waits; want the page timed out, asked again once, and 1 item", n, err, calls.Load(), waits)
			}
		})
	}
}

// A 200 that is not a list page (no data, or no meta.request_id: a
// proxy's or a portal's page, a BaseURL that names another API) is not the
// end of the run: read as one, the run "succeeded" with what it had, and
// its checkpoint skipped the rest for good, the very failure the sync
// guide warns a script of. It is asked for again, as an answer cut short.
func TestSyncTakesOnlyAListPageForOne(t *testing.T) {
	const page = `{"data":[{"id":"a","status":"active","stock_quantity":1,"updated_at":"2026-11-21T10:00:00.000001Z"}],"meta":{"request_id":"r","next_cursor":null}}`
	for name, body := range map[string]string{
		"an empty object":         `{}`,
		"items without meta":      `{"data":[{"id":"b","status":"active","stock_quantity":1,"updated_at":"2026-11-21T10:00:00.000001Z"}]}`,
		"meta without request_id": `{"data":[],"meta":{"next_cursor":null}}`,
		"data null":               `{"data":null,"meta":{"request_id":"r","next_cursor":null}}`,
		"an error with a 200":     `{"error":{"code":"blocked","message":"m"},"meta":{"request_id":"r"}}`,
		"not an object":           `[]`,
	} {
		t.Run(name, func(t *testing.T) {
			var calls atomic.Int64
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if calls.Add(1) == 1 {
					fmt.Fprint(w, body)
					return
				}
				fmt.Fprint(w, page)
			}))
			t.Cleanup(srv.Close)
			var waits int
			c := &Client{BaseURL: srv.URL + "/v1", Wait: func(context.Context, time.Duration) error { waits++; return nil }}
			mirror := Mirror{}
			if _, n, err := c.Sync(context.Background(), time.Time{}, mirror.Upsert); err != nil || n != 1 || waits != 1 || mirror["b"].ID != "" {
				t.Errorf("Sync = %d items (%v), %v after %d requests and %d waits; want the answer asked for again once, and the page's 1 item", n, mirror, err, calls.Load(), waits)
			}
			c.Retries = -1
			calls.Store(0)
			if checkpoint, _, err := c.Sync(context.Background(), time.Time{}, Mirror{}.Upsert); err == nil || !checkpoint.IsZero() {
				t.Errorf("Sync without retries = %v, %v; want no checkpoint and an error", checkpoint, err)
			}
		})
	}
}

// Spec 2.1: meta.next_cursor is "null or absent when there is no further
// page". A list page without it (data, and meta with its request_id, as
// every answer has) is the last one, as with null: the run ends a success.
// Asked for again as no page, every run against a server that leaves it
// out spent its retries and failed, its checkpoint never moving.
func TestSyncEndsOnAPageWithoutNextCursor(t *testing.T) {
	for name, body := range map[string]string{
		"items":    `{"data":[{"id":"a","status":"active","stock_quantity":1,"updated_at":"2026-11-21T10:00:00.000001Z"}],"meta":{"request_id":"r"}}`,
		"no items": `{"data":[],"meta":{"request_id":"r"}}`,
	} {
		t.Run(name, func(t *testing.T) {
			var calls atomic.Int64
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				calls.Add(1)
				fmt.Fprint(w, body)
			}))
			t.Cleanup(srv.Close)
			c := &Client{BaseURL: srv.URL + "/v1", Wait: func(context.Context, time.Duration) error { return nil }}
			mirror := Mirror{}
			checkpoint, n, err := c.Sync(context.Background(), time.Time{}, mirror.Upsert)
			if err != nil || checkpoint.IsZero() || n != len(mirror) || calls.Load() != 1 {
				t.Errorf("Sync = %v, %d items, %v after %d requests; want a checkpoint after one request", checkpoint, n, err, calls.Load())
			}
		})
	}
}

// A redirect is not followed: the service never redirects, and net/http
// sends every header Prepare set, the API key among them, to wherever a
// redirect points (it keeps back only Authorization and cookies from
// another host, and goes from https to http alike). The run ends, saying
// why, and the key stays with the host it was meant for.
func TestSyncFollowsNoRedirect(t *testing.T) {
	var keysElsewhere atomic.Int64
	elsewhere := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-API-Key") != "" {
			keysElsewhere.Add(1)
		}
		fmt.Fprint(w, `{"data":[],"meta":{"request_id":"r","next_cursor":null}}`)
	}))
	t.Cleanup(elsewhere.Close)
	for _, status := range []int{http.StatusMovedPermanently, http.StatusFound, http.StatusTemporaryRedirect, http.StatusPermanentRedirect} {
		var calls atomic.Int64
		service := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			calls.Add(1)
			http.Redirect(w, r, elsewhere.URL+r.URL.RequestURI(), status)
		}))
		for _, hc := range []*http.Client{nil, service.Client()} { // the default client, and one of the caller's
			c := &Client{BaseURL: service.URL + "/v1", HTTP: hc, Prepare: func(r *http.Request) { r.Header.Set("X-API-Key", "cxr_secret") },
				Wait: func(context.Context, time.Duration) error { return nil }}
			_, _, err := c.Sync(context.Background(), time.Time{}, Mirror{}.Upsert)
			if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("status %d", status)) || !strings.Contains(err.Error(), "redirect") {
				t.Errorf("%d: Sync error = %v, want the run ended on the redirect, saying so", status, err)
			}
		}
		if calls.Load() != 2 {
			t.Errorf("%d: %d requests to the service, want 2 (one per run, not retried)", status, calls.Load())
		}
		service.Close()
	}
	if n := keysElsewhere.Load(); n > 0 {
		t.Errorf("the redirect's target received the API key %d times", n)
	}
}

// Spec 4.8 as the reference client follows it: the checkpoint a run
// returns is the time it started (step 1), read before its first page and
// not when it ends, however long it ran; every page is asked for with
// limit=100 and the same updated_after, the previous checkpoint less the
// overlap, following meta.next_cursor unchanged (step 2); items are
// upserted by id (step 3); a run that fails returns no checkpoint, so the
// caller keeps its previous one (step 5).
func TestSyncCheckpointIsItsStart(t *testing.T) {
	previous := time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name       string
		lastStatus int // of the second page
	}{
		{"success", http.StatusOK},
		{"second page refused", http.StatusBadRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var queries []string
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				queries = append(queries, r.URL.RawQuery)
				switch r.URL.Query().Get("cursor") {
				case "":
					fmt.Fprint(w, `{"data":[{"id":"a","status":"active","stock_quantity":1,"updated_at":"2026-11-21T10:00:00.000001Z"}],"meta":{"request_id":"r","next_cursor":"c/2+"}}`)
				case "c/2+":
					w.WriteHeader(tc.lastStatus)
					if tc.lastStatus != http.StatusOK {
						fmt.Fprint(w, `{"error":{"code":"invalid_cursor","message":"m"},"meta":{"request_id":"r"}}`)
						return
					}
					fmt.Fprint(w, `{"data":[{"id":"a","status":"inactive","stock_quantity":0,"updated_at":"2026-11-21T10:00:01.000001Z"}],"meta":{"request_id":"r","next_cursor":null}}`)
				default:
					w.WriteHeader(http.StatusBadRequest)
				}
			}))
			t.Cleanup(srv.Close)
			clock := time.Date(2026, 11, 21, 9, 0, 0, 0, time.UTC)
			started := clock
			c := &Client{BaseURL: srv.URL + "/v1", Now: func() time.Time { now := clock; clock = clock.Add(time.Hour); return now }}
			mirror := Mirror{}
			checkpoint, _, err := c.Sync(context.Background(), previous, mirror.Upsert)
			since := "updated_after=" + previous.Add(-DefaultOverlap).Format(time.RFC3339Nano)
			for i, q := range queries {
				if !strings.Contains(q, "limit=100") || !strings.Contains(q, strings.ReplaceAll(since, ":", "%3A")) {
					t.Errorf("page %d asked with %q, want limit=100 and %s", i+1, q, since)
				}
			}
			if len(queries) != 2 || !strings.Contains(queries[1], "cursor=c%2F2%2B") {
				t.Errorf("pages asked: %q, want the second with the first's next_cursor unchanged", queries)
			}
			if tc.lastStatus == http.StatusOK {
				if err != nil || !checkpoint.Equal(started) || len(mirror) != 1 || mirror["a"].Status != "inactive" {
					t.Errorf("Sync = %v, %v, %d items (a %q); want the checkpoint %v it started at and item a upserted, inactive", checkpoint, err, len(mirror), mirror["a"].Status, started)
				}
				return
			}
			if err == nil || !checkpoint.IsZero() {
				t.Errorf("Sync with a page refused = %v, %v; want an error and no checkpoint", checkpoint, err)
			}
		})
	}
}
