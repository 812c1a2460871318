package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// salesCall is what the fake sales endpoint saw of one request.
type salesCall struct {
	Path, Key, IdempotencyKey, ContentType, Order string
}

// fakeSales answers confirm and cancel through respond and records every
// call; after stopAfter calls it cancels the run.
func fakeSales(t *testing.T, stopAfter int, cancel context.CancelFunc, respond func(op string) (int, string)) (*httptest.Server, func() []salesCall) {
	t.Helper()
	var mu sync.Mutex
	var calls []salesCall
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		var body struct {
			Order string `json:"external_order_id"`
		}
		if r.Method != http.MethodPost || json.Unmarshal(raw, &body) != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		mu.Lock()
		calls = append(calls, salesCall{r.URL.EscapedPath(), r.Header.Get("X-API-Key"), r.Header.Get("Idempotency-Key"), r.Header.Get("Content-Type"), body.Order})
		if len(calls) == stopAfter {
			cancel()
		}
		mu.Unlock()
		op := r.URL.Path[strings.LastIndexByte(r.URL.Path, '/')+1:]
		status, resp := respond(op)
		w.WriteHeader(status)
		fmt.Fprint(w, resp)
	}))
	t.Cleanup(srv.Close)
	return srv, func() []salesCall {
		mu.Lock()
		defer mu.Unlock()
		return calls
	}
}

func runWorker(t *testing.T, srv *httptest.Server, ctx context.Context, items []string) *salesWorker {
	t.Helper()
	w := newSalesWorker(testClient(t, srv.URL+"/v1"), randomHex(8), 3, "wk", items)
	w.loop(ctx, time.Now(), time.Now().Add(time.Minute))
	return w
}

func TestSalesWorkerSendsPairs(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv, calls := fakeSales(t, 20, cancel, func(string) (int, string) { return http.StatusOK, `{"data":{}}` })
	w := runWorker(t, srv, ctx, []string{"a/b c", "plain"})

	got := calls()
	if len(got) != 20 || w.pairs != 10 || w.errors != 0 || w.requests.Count() != 20 {
		t.Fatalf("%d calls, %d pairs, %d errors (%s), %d latencies; want 20, 10, 0, 20", len(got), w.pairs, w.errors, w.lastErr, w.requests.Count())
	}
	keys := map[string]bool{}
	for i, c := range got {
		item := []string{"a%2Fb%20c", "plain"}[i/2%2]
		op := []string{"confirm", "cancel"}[i%2]
		if want := "/v1/export/items/" + item + "/sales/" + op; c.Path != want {
			t.Errorf("call %d path %q, want %q", i, c.Path, want)
		}
		if c.Key != "wk" || c.ContentType != "application/json" || c.IdempotencyKey == "" || keys[c.IdempotencyKey] {
			t.Errorf("call %d = %+v, want X-API-Key wk, JSON, a fresh Idempotency-Key", i, c)
		}
		keys[c.IdempotencyKey] = true
		if i%2 == 1 && (c.Order != got[i-1].Order || c.Order == "") {
			t.Errorf("cancel %d names order %q, its confirm %q", i, c.Order, got[i-1].Order)
		}
		if i%2 == 0 && i > 0 && c.Order == got[i-2].Order {
			t.Errorf("confirm %d reuses the order id %q", i, c.Order)
		}
	}
}

func TestSalesWorkerCountsConflictsAndErrors(t *testing.T) {
	tests := []struct {
		name                    string
		respond                 func(op string) (int, string)
		wantConflicts, wantErrs int
		wantErr                 string
	}{
		{"409 on confirm", func(string) (int, string) {
			return http.StatusConflict, `{"error":{"code":"item_not_active","message":"sold"},"meta":{"request_id":"r"}}`
		}, 4, 0, ""},
		{"error envelope on cancel", func(op string) (int, string) {
			if op == "cancel" {
				return http.StatusUnprocessableEntity, `{"error":{"code":"validation_failed","message":"no"},"meta":{"request_id":"r"}}`
			}
			return http.StatusOK, `{"data":{}}`
		}, 0, 2, `cancel: status 422, error.code "validation_failed"`},
		{"status without envelope", func(string) (int, string) { return http.StatusBadGateway, "" }, 0, 4, "status 502"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			srv, _ := fakeSales(t, 4, cancel, tt.respond)
			w := runWorker(t, srv, ctx, []string{"x"})
			if w.conflicts != tt.wantConflicts || w.errors != tt.wantErrs || w.pairs != 0 || !strings.Contains(w.lastErr, tt.wantErr) {
				t.Errorf("conflicts %d, errors %d, pairs %d, last error %q; want %d, %d, 0, containing %q",
					w.conflicts, w.errors, w.pairs, w.lastErr, tt.wantConflicts, tt.wantErrs, tt.wantErr)
			}
		})
	}
}
