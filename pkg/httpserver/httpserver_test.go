package httpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/coinexport/export/pkg/apikey"
	"github.com/coinexport/export/pkg/envelope"
	"github.com/coinexport/export/pkg/identity"
	"github.com/coinexport/export/pkg/testenv"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

const secret = "0123456789abcdef0123456789abcdef"

func newTestServer(t *testing.T, logs io.Writer) (*httptest.Server, *identity.Signer) {
	t.Helper()
	signer, err := identity.NewSigner(secret)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/things/{id}", func(w http.ResponseWriter, r *http.Request) {
		envelope.WriteData(w, http.StatusOK, map[string]string{"id": r.PathValue("id")}, envelope.Meta{RequestID: RequestID(r)})
	})
	mux.HandleFunc("POST /v1/boom", func(w http.ResponseWriter, r *http.Request) { panic("boom") })
	srv := New(Config{Service: "test", Log: slog.New(slog.NewJSONHandler(logs, nil)), Signer: signer}, mux)
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	return ts, signer
}

func TestDispatch(t *testing.T) {
	var logs bytes.Buffer
	ts, signer := newTestServer(t, &logs)
	signed := identity.Identity{OwnerID: "o1", KeyID: "k1", Scopes: []string{identity.ScopeExportRead}, RequestID: "4bf92f3577b34da6a3ce929d0e0e4736"}
	tests := []struct {
		name       string
		method     string
		path       string
		sign       bool
		wantStatus int
		wantCode   string
		wantAllow  string
	}{
		{"unsigned", "GET", "/v1/things/1", false, 401, "unauthenticated", ""},
		{"signed", "GET", "/v1/things/1", true, 200, "", ""},
		{"unknown route", "GET", "/v1/nothing", true, 404, "not_found", ""},
		{"unclean path", "GET", "/v1//things/1", true, 404, "not_found", ""},
		{"dot segments", "GET", "/v1/x/../things/1", true, 404, "not_found", ""},
		{"wrong method", "DELETE", "/v1/things/1", true, 405, "method_not_allowed", "GET, HEAD"},
		{"panic", "POST", "/v1/boom", true, 500, "internal_error", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequest(tt.method, ts.URL+tt.path, nil)
			if tt.sign {
				for _, h := range signer.Sign(signed, identity.RequestOf(req), time.Now()) {
					req.Header.Set(h.Name, h.Value)
				}
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var body envelope.Parsed
			if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
				t.Fatalf("body is not an envelope: %v", err)
			}
			if resp.StatusCode != tt.wantStatus {
				t.Errorf("status = %d, want %d", resp.StatusCode, tt.wantStatus)
			}
			if tt.wantCode != "" && (body.Error == nil || body.Error.Code != tt.wantCode) {
				t.Errorf("error = %+v, want code %q", body.Error, tt.wantCode)
			}
			if body.Meta.RequestID == "" || resp.Header.Get("X-Request-Id") != body.Meta.RequestID {
				t.Errorf("meta.request_id = %q, X-Request-Id = %q; want equal and non-empty", body.Meta.RequestID, resp.Header.Get("X-Request-Id"))
			}
			if tt.sign && body.Meta.RequestID != signed.RequestID {
				t.Errorf("meta.request_id = %q, want the signed %q", body.Meta.RequestID, signed.RequestID)
			}
			if got := resp.Header.Get("Allow"); got != tt.wantAllow {
				t.Errorf("Allow = %q, want %q", got, tt.wantAllow)
			}
		})
	}
	if !strings.Contains(logs.String(), `"route":"GET /v1/things/{id}"`) || strings.Count(logs.String(), `"msg":"panic"`) != 1 {
		t.Errorf("logs lack the route of the access line or the single panic line:\n%s", logs.String())
	}
	// Refused again within the interval: still one line saying why.
	if resp, err := http.Get(ts.URL + "/v1/things/1"); err == nil {
		resp.Body.Close()
	}
	if n := strings.Count(logs.String(), `"msg":"request refused: its identity is unsigned`); n != 1 {
		t.Errorf("%d lines saying why an identity was refused, want 1:\n%s", n, logs.String())
	}
}

func TestHealthNeedsNoIdentity(t *testing.T) {
	ts, _ := newTestServer(t, io.Discard)
	resp, err := http.Get(ts.URL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("GET /healthz = %d, want 200", resp.StatusCode)
	}
	// HEAD is answered as GET is, as the 405's Allow says.
	resp, err = http.Head(ts.URL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("HEAD /healthz = %d, want 200", resp.StatusCode)
	}
	resp, err = http.Post(ts.URL+"/healthz", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 405 || resp.Header.Get("Allow") != "GET, HEAD" {
		t.Errorf("POST /healthz = %d (Allow %q), want 405 with Allow GET, HEAD", resp.StatusCode, resp.Header.Get("Allow"))
	}
}

// A probe signed by the gateway is healthy only if its identity verifies:
// a gateway with another IDENTITY_SECRET, whose every request this service
// would refuse, sees the instance unhealthy (503) and takes it out.
func TestSignedProbeMustVerify(t *testing.T) {
	ts, signer := newTestServer(t, io.Discard)
	other, err := identity.NewSigner(secret + "-other")
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name   string
		signer *identity.Signer
		want   int
	}{{"same secret", signer, 200}, {"another secret", other, 503}} {
		req, _ := http.NewRequest("GET", ts.URL+"/healthz", nil)
		for _, h := range tt.signer.Sign(identity.Identity{RequestID: "health-probe"}, identity.RequestOf(req), time.Now()) {
			req.Header.Set(h.Name, h.Value)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body envelope.Parsed
		_ = json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if resp.StatusCode != tt.want || (tt.want == 503 && (body.Error == nil || body.Error.Code != "identity_refused")) {
			t.Errorf("probe signed with %s = %d %+v, want %d", tt.name, resp.StatusCode, body.Error, tt.want)
		}
	}
}

func TestAdminHandlerServesMetricsAndProfiles(t *testing.T) {
	reg := prometheus.NewRegistry()
	hits := prometheus.NewCounter(prometheus.CounterOpts{Name: "admin_test_hits_total", Help: "test"})
	reg.MustRegister(hits)
	hits.Inc()
	srv := httptest.NewServer(AdminHandler(reg))
	defer srv.Close()
	for path, want := range map[string]string{
		"/metrics":                       "admin_test_hits_total 1",
		"/debug/pprof/":                  "goroutine",
		"/debug/pprof/goroutine?debug=1": "goroutine profile",
	} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), want) {
			t.Errorf("GET %s: %d, body lacks %q", path, resp.StatusCode, want)
		}
	}
	// go tool pprof symbolizes with a POST of "+"-separated addresses.
	pc := reflect.ValueOf(AdminHandler).Pointer()
	resp, err := http.Post(srv.URL+"/debug/pprof/symbol", "text/plain", strings.NewReader(fmt.Sprintf("%#x", pc)))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "httpserver.AdminHandler") {
		t.Errorf("POST /debug/pprof/symbol = %d %q, want 200 naming httpserver.AdminHandler", resp.StatusCode, body)
	}
}

// A routed request's server span continues the gateway's trace, is named
// after the route and carries the identity and the status; a 5xx marks it
// failed; the health probe has no span.
func TestServerSpans(t *testing.T) {
	previous := otel.GetTextMapPropagator()
	otel.SetTextMapPropagator(propagation.TraceContext{})
	t.Cleanup(func() { otel.SetTextMapPropagator(previous) })
	signer, err := identity.NewSigner(secret)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/things/{id}", func(w http.ResponseWriter, r *http.Request) {
		status := http.StatusOK
		if r.PathValue("id") == "broken" {
			status = http.StatusServiceUnavailable
		}
		envelope.WriteData(w, status, "x", envelope.Meta{RequestID: RequestID(r)})
	})
	sr := tracetest.NewSpanRecorder()
	srv := New(Config{Service: "test", Log: slog.New(slog.NewJSONHandler(io.Discard, nil)), Signer: signer,
		TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))}, mux)
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)

	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	signed := identity.Identity{OwnerID: "o1", KeyID: "k1", Scopes: []string{identity.ScopeExportRead}, RequestID: traceID}
	for _, path := range []string{"/v1/things/1", "/v1/things/broken", "/healthz"} {
		req, _ := http.NewRequest("GET", ts.URL+path, nil)
		for _, h := range signer.Sign(signed, identity.RequestOf(req), time.Now()) {
			req.Header.Set(h.Name, h.Value)
		}
		req.Header.Set("Traceparent", "00-"+traceID+"-"+parentID+"-01")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}

	// A trace the gateway does not record: no span here either, and the
	// answer (a 401: unsigned) still quotes the trace id as request id.
	req, _ := http.NewRequest("GET", ts.URL+"/v1/things/1", nil)
	req.Header.Set("Traceparent", "00-"+traceID+"-"+parentID+"-00")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var env envelope.Parsed
	_ = json.NewDecoder(resp.Body).Decode(&env)
	resp.Body.Close()
	if resp.StatusCode != 401 || env.Meta.RequestID != traceID {
		t.Errorf("unsigned, unsampled request = %d, request id %q; want 401 quoting %s", resp.StatusCode, env.Meta.RequestID, traceID)
	}

	spans := sr.Ended()
	if len(spans) != 2 {
		t.Fatalf("%d spans, want 2 (none for /healthz nor for the unsampled trace)", len(spans))
	}
	for i, wantStatus := range []int64{200, 503} {
		sp := spans[i]
		if sp.Name() != "GET /v1/things/{id}" || sp.SpanKind() != trace.SpanKindServer ||
			sp.SpanContext().TraceID().String() != traceID || sp.Parent().SpanID().String() != parentID {
			t.Errorf("span %d = %q kind %v trace %s parent %s; want the route, server, the gateway's trace and span",
				i, sp.Name(), sp.SpanKind(), sp.SpanContext().TraceID(), sp.Parent().SpanID())
		}
		attrs := map[attribute.Key]attribute.Value{}
		for _, a := range sp.Attributes() {
			attrs[a.Key] = a.Value
		}
		if attrs["http.route"].AsString() != "GET /v1/things/{id}" || attrs["request.id"].AsString() != traceID ||
			attrs["owner.id"].AsString() != "o1" || attrs["http.response.status_code"].AsInt64() != wantStatus {
			t.Errorf("span %d attributes = %v, want the route, request id, owner and status %d", i, sp.Attributes(), wantStatus)
		}
		if failed := sp.Status().Code == codes.Error; failed != (wantStatus >= 500) {
			t.Errorf("span %d status = %v for HTTP %d", i, sp.Status(), wantStatus)
		}
	}
}

// When the admin address is taken, Run fails and leaves nothing serving:
// the main address it had taken first is free again.
func TestRunWithATakenAddressServesNothing(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	main := testenv.FreeAddr(t)
	srv := New(Config{Service: "test", Addr: main, AdminAddr: taken.Addr().String(),
		Log: slog.New(slog.DiscardHandler)}, http.NewServeMux())
	if err := srv.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "listen") {
		t.Fatalf("Run = %v, want the admin address's listen error", err)
	}
	ln, err := net.Listen("tcp", main)
	if err != nil {
		t.Fatalf("the main address is still taken after Run failed: %v", err)
	}
	ln.Close()
}

// A listener that stops serving on its own (an accept error no retry
// waits out) stops Run, naming it, and the other listener with it: Run
// returned with the main listener still serving, and its error did not
// say which listener had failed.
func TestAFailedListenerStopsTheOther(t *testing.T) {
	main, admin := testenv.FreeAddr(t), testenv.FreeAddr(t)
	srv := New(Config{Service: "test", Addr: main, AdminAddr: admin, Log: slog.New(slog.DiscardHandler)}, http.NewServeMux())
	breakAdmin := make(chan struct{})
	srv.listen = func(network, addr string) (net.Listener, error) {
		ln, err := net.Listen(network, addr)
		if err != nil || addr != admin {
			return ln, err
		}
		return &breakingListener{Listener: ln, broken: breakAdmin}, nil
	}
	ran := make(chan error, 1)
	go func() { ran <- srv.Run(context.Background()) }()
	testenv.WaitListening(t, main)
	close(breakAdmin)
	err := <-ran
	if err == nil || !strings.Contains(err.Error(), "admin listener "+admin+" stopped serving") {
		t.Errorf("Run = %v, want an error naming the admin listener", err)
	}
	ln, lerr := net.Listen("tcp", main)
	if lerr != nil {
		t.Fatalf("the main listener still serves after the admin one failed: %v", lerr)
	}
	ln.Close()
}

// breakingListener accepts until broken is closed, then fails every
// accept with an error that is no shortage.
type breakingListener struct {
	net.Listener
	broken chan struct{}
}

func (l *breakingListener) Accept() (net.Conn, error) {
	<-l.broken
	return nil, errors.New("accept: listener broken")
}

// The admin listener answers its own formats, and every error as the
// envelope.
func TestAdminErrorsAreEnvelopes(t *testing.T) {
	ts := httptest.NewServer(AdminHandler(prometheus.NewRegistry()))
	t.Cleanup(ts.Close)
	for _, tt := range []struct {
		method, path string
		status       int
		code         string
	}{
		{"GET", "/metrics", 200, ""},
		{"GET", "/debug/pprof/heap?debug=1", 200, ""},
		{"GET", "/debug/pprof/cmdline", 200, ""},
		{"GET", "/nope", 404, "not_found"},
		{"POST", "/metrics", 405, "method_not_allowed"},
		{"GET", "/debug/pprof/nonexistent", 404, "not_found"},
		// pprof's own errors, written as its text, answered as envelopes.
		{"GET", "/debug/pprof/heap?seconds=abc", 400, "invalid_parameter"},
		{"GET", "/debug/pprof/allocs?seconds=1&debug=1", 400, "invalid_parameter"},
		// ServeMux's redirects to a clean path, its HTML body answered as
		// the envelope (the status and Location kept).
		{"GET", "//metrics", 307, "moved"},
		{"GET", "/debug/pprof", 307, "moved"},
	} {
		req, _ := http.NewRequest(tt.method, ts.URL+tt.path, nil)
		resp, err := noRedirects.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tt.status {
			t.Errorf("%s %s = %d, want %d", tt.method, tt.path, resp.StatusCode, tt.status)
			continue
		}
		if tt.code == "" {
			continue
		}
		var env envelope.Parsed
		if err := json.Unmarshal(body, &env); err != nil || env.Error == nil || env.Error.Code != tt.code || env.Meta.RequestID == "" {
			t.Errorf("%s %s = %s, want an envelope with code %s and a request id", tt.method, tt.path, body, tt.code)
		}
		if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
			t.Errorf("%s %s: Content-Type %q, want JSON", tt.method, tt.path, ct)
		}
		if loc := resp.Header.Get("Location"); tt.code == "moved" && (loc == "" || !strings.Contains(env.Error.Message, loc)) {
			t.Errorf("%s %s: Location %q, message %q; want the clean path in both", tt.method, tt.path, loc, env.Error.Message)
		}
	}
}

// noRedirects is a client that reads a redirect instead of following it.
var noRedirects = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// A second CPU profile (or execution trace) while one runs is refused, 409
// and not pprof's 500: the process is fine, the profiler busy; the refusal
// is an envelope that says why. Two are asked for at once: one runs, the
// other is refused, whichever comes second.
func TestAdminProfileInUseIsAnEnvelope(t *testing.T) {
	for path, what := range map[string]string{
		"/debug/pprof/profile?seconds=2": "CPU profile",
		"/debug/pprof/trace?seconds=2":   "execution trace",
	} {
		t.Run(what, func(t *testing.T) {
			ts := httptest.NewServer(AdminHandler(prometheus.NewRegistry()))
			t.Cleanup(ts.Close)
			refused := refusedOfTwoAtOnce(t, ts.URL+path)
			var env envelope.Parsed
			if err := json.Unmarshal(refused.body, &env); err != nil || env.Error == nil ||
				refused.status != http.StatusConflict || env.Error.Code != "profile_in_use" ||
				!strings.Contains(env.Error.Message, what) || env.Meta.RequestID == "" {
				t.Errorf("refused %s = %d %s, want a 409 profile_in_use envelope naming it", what, refused.status, refused.body)
			}
			if cd := refused.header.Get("Content-Disposition"); cd != "" {
				t.Errorf("the refusal still says it is an attachment: %q", cd)
			}
		})
	}
}

type adminAnswer struct {
	status int
	header http.Header
	body   []byte
	err    error
}

// refusedOfTwoAtOnce asks for url twice at once and returns the one answer
// that is not a 200; it fails the test unless exactly one is.
func refusedOfTwoAtOnce(t *testing.T, url string) adminAnswer {
	t.Helper()
	answers := make(chan adminAnswer, 2)
	for range 2 {
		go func() {
			resp, err := http.Get(url)
			if err != nil {
				answers <- adminAnswer{err: err}
				return
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			answers <- adminAnswer{resp.StatusCode, resp.Header, body, err}
		}()
	}
	var refused []adminAnswer
	for range 2 {
		a := <-answers
		if a.err != nil {
			t.Fatal(a.err)
		}
		if a.status != http.StatusOK {
			refused = append(refused, a)
		}
	}
	if len(refused) != 1 {
		t.Fatalf("%d of two at once were refused, want 1", len(refused))
	}
	return refused[0]
}

// A probe that hangs up before the readiness check ends is logged as a
// slow check, not as the service being unready.
func TestHealthCheckOutlastingItsProber(t *testing.T) {
	var logs testenv.Output
	srv := New(Config{Service: "test", Log: slog.New(slog.NewJSONHandler(&logs, nil)),
		Ready: func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }}, http.NewServeMux())
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()
	client := &http.Client{Timeout: 100 * time.Millisecond}
	if resp, err := client.Get(ts.URL + "/healthz"); err == nil {
		resp.Body.Close()
		t.Fatalf("GET /healthz = %d, want the client to give up", resp.StatusCode)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(logs.String(), "outlasted") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := logs.String(); !strings.Contains(got, "readiness check outlasted the prober's wait") || strings.Contains(got, "not ready") {
		t.Errorf("logs = %s, want the slow check named, and no not-ready line", got)
	}
	// The probe got no answer: the route's metrics must not count a 200.
	admin := httptest.NewServer(AdminHandler(srv.Registry()))
	defer admin.Close()
	const abandoned = `http_requests_total{method="GET",route="/healthz",status_class="5xx"} 1`
	var metrics []byte
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		resp, err := http.Get(admin.URL + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		metrics, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(metrics), `route="/healthz"`) { // recorded once the handler returned
			break
		}
	}
	if !strings.Contains(string(metrics), abandoned) {
		t.Errorf("metrics lack the abandoned probe as a 5xx:\n%s", metrics)
	}
}

// A method token the caller made up reaches no metric label or log field
// as sent ("_OTHER"), and "OPTIONS *" gets an envelope on both listeners,
// not net/http's empty 200.
func TestCallerChosenMethodsAndOptionsStar(t *testing.T) {
	addrs, logs := runOnTwoAddrs(t)
	raw := func(addr, request string) string {
		t.Helper()
		resp, body := rawExchange(t, addr, request)
		return fmt.Sprintf("%d %s", resp.StatusCode, body)
	}
	for _, addr := range addrs {
		if got := raw(addr, "OPTIONS * HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"); !strings.Contains(got, `"error":{"code":`) {
			t.Errorf("OPTIONS * on %s = %s, want an error envelope", addr, got)
		}
	}
	raw(addrs[0], "ABC1 /v1/things HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	metrics := raw(addrs[1], "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	if strings.Contains(metrics, "ABC1") || !strings.Contains(metrics, `method="_OTHER"`) {
		t.Errorf("metrics after a request with method ABC1 lack method=\"_OTHER\" or show ABC1:\n%s", metrics)
	}
	if strings.Contains(logs.String(), "ABC1") {
		t.Errorf("logs show the made-up method: %s", logs.String())
	}
}

// runOnTwoAddrs runs a Server with no routes of its own on a main and an
// admin address until the test ends, and returns them (main first) and
// its log.
func runOnTwoAddrs(t *testing.T) ([]string, *testenv.Output) {
	t.Helper()
	addrs := []string{testenv.FreeAddr(t), testenv.FreeAddr(t)}
	logs := &testenv.Output{}
	srv := New(Config{Service: "test", Addr: addrs[0], AdminAddr: addrs[1],
		Log: slog.New(slog.NewJSONHandler(logs, nil))}, http.NewServeMux())
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() { stop(); <-done })
	testenv.WaitListening(t, addrs[0])
	testenv.WaitListening(t, addrs[1])
	return addrs, logs
}

// A stop says at once that the server drains and how many requests it
// waits for, and a drain that runs out of time says how many it cut off:
// their clients saw the connection close.
func TestShutdownSaysWhatItDrainsAndCutsOff(t *testing.T) {
	signer, err := identity.NewSigner(secret)
	if err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan struct{}), make(chan struct{})
	defer close(release)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/slow", func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-release
	})
	var logs testenv.Output
	addr, stop := runServer(t, mux, signer, slog.New(slog.NewJSONHandler(&logs, nil)), 200*time.Millisecond)
	go sendSigned(context.Background(), signer, "http://"+addr+"/v1/slow")
	<-entered
	if err := stop(); err == nil {
		t.Error("Run = nil after a drain that timed out, want its error")
	}
	out := logs.String()
	if !strings.Contains(out, `"msg":"draining","in_flight":1`) || !strings.Contains(out, `"msg":"drain timed out: requests cut off","cut_off":1`) {
		t.Errorf("logs = %s, want draining with in_flight 1 and a drain timed out line with cut_off 1", out)
	}
}

// A drain that runs out of time ends what it cuts off: the request's
// context is cancelled, as a query waiting on it is, and its client sees
// the connection close. Left running, such a request held its database
// connection, and main's pool.Close waited for it past the drain.
func TestADrainThatTimesOutCancelsWhatItCutsOff(t *testing.T) {
	signer, err := identity.NewSigner(secret)
	if err != nil {
		t.Fatal(err)
	}
	entered, cancelled := make(chan struct{}), make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/slow", func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		select {
		case <-r.Context().Done():
			close(cancelled)
			// As the services answer a call cut off (CutOff): a 503. It
			// reaches the client only if written before Run closes the
			// connection, a race the test leaves to the scheduler.
			w.WriteHeader(http.StatusServiceUnavailable)
		case <-time.After(10 * time.Second): // a query's own timeout
		}
	})
	addr, stop := runServer(t, mux, signer, slog.New(slog.DiscardHandler), 200*time.Millisecond)
	type answer struct {
		status int
		err    error
	}
	answered := make(chan answer, 1)
	go func() {
		status, err := sendSignedStatus(context.Background(), signer, "http://"+addr+"/v1/slow")
		answered <- answer{status, err}
	}()
	<-entered
	stop()
	select {
	case <-cancelled:
	case <-time.After(2 * time.Second):
		t.Fatal("the request cut off by the drain still runs 2 s after Run returned; want its context cancelled")
	}
	if a := <-answered; a.err == nil && a.status != http.StatusServiceUnavailable {
		t.Errorf("the client of a request cut off got %d; want the connection closed, or the handler's 503", a.status)
	}
}

// A request the drain cuts off has its access line and its server span by
// the time Run returns, when main flushes the last spans and exits: they
// were written as its handler returned, after the cut, and the process
// (shop-schema and sales-writer frozen through their drains on a make run
// stack) logged "stopped" first and exported no server span, its trace
// holding the children alone (the shop's requests, the SQL), their parent
// missing.
func TestARequestCutOffIsLoggedAndTracedBeforeRunReturns(t *testing.T) {
	signer, err := identity.NewSigner(secret)
	if err != nil {
		t.Fatal(err)
	}
	sr := tracetest.NewSpanRecorder()
	// The span's end takes a while too, so that a count of the requests in
	// flight that ends before it (the handler's return) lets Run return
	// with the span not yet recorded.
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(slowEnd{sr}))
	entered := make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/slow", func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-r.Context().Done()
		time.Sleep(20 * time.Millisecond) // a query's cancellation coming back
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	var logs testenv.Output
	addr := testenv.FreeAddr(t)
	srv := New(Config{Service: "test", Addr: addr, Log: slog.New(slog.NewJSONHandler(&logs, nil)), Signer: signer,
		ShutdownTimeout: 200 * time.Millisecond, TracerProvider: tp}, mux)
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- srv.Run(ctx) }()
	testenv.WaitListening(t, addr)
	go sendSigned(context.Background(), signer, "http://"+addr+"/v1/slow")
	<-entered
	cancel()
	<-ran
	if len(sr.Ended()) != 1 {
		t.Errorf("Run returned with %d server spans ended, want the one of the request cut off", len(sr.Ended()))
	}
	out := logs.String()
	access, stopped := strings.Index(out, `"msg":"request"`), strings.Index(out, `"msg":"stopped"`)
	if access < 0 || stopped < 0 || access > stopped {
		t.Errorf("want the access line of the request cut off before \"stopped\":\n%s", out)
	}
}

// slowEnd is a span processor whose OnEnd takes 20 ms, as an export
// queue's lock or a busy core can.
type slowEnd struct{ sdktrace.SpanProcessor }

func (p slowEnd) OnEnd(s sdktrace.ReadOnlySpan) {
	time.Sleep(20 * time.Millisecond)
	p.SpanProcessor.OnEnd(s)
}

// A request the drain cuts off is the service's doing: its cancellation is
// CutOff, not CallerGone, so that the services answer it 503 rather than
// count it as a 499 of a caller that left. Taken for one, a rollout whose
// drain ran short showed in the services' logs and metrics as clients
// hanging up.
func TestARequestCutOffByTheDrainIsNotACallerGone(t *testing.T) {
	signer, err := identity.NewSigner(secret)
	if err != nil {
		t.Fatal(err)
	}
	entered := make(chan struct{})
	type verdict struct{ callerGone, cutOff bool }
	seen := make(chan verdict, 1)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/slow", func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-r.Context().Done()
		err := fmt.Errorf("query: %w", r.Context().Err())
		seen <- verdict{CallerGone(r, err), CutOff(r, err)}
	})
	addr, stop := runServer(t, mux, signer, slog.New(slog.DiscardHandler), 200*time.Millisecond)
	go sendSigned(context.Background(), signer, "http://"+addr+"/v1/slow")
	<-entered
	stop()
	select {
	case v := <-seen:
		if v.callerGone || !v.cutOff {
			t.Errorf("request cut off by the drain: CallerGone = %v, CutOff = %v; want false, true", v.callerGone, v.cutOff)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the request cut off by the drain was not cancelled")
	}
}

// A handler's own outbound HTTP call that the drain cuts off is CutOff
// too: net/http's client returns the context's cause (ErrCutOff), not
// context.Canceled. Missed, shop-schema answered a read cut off as its
// shop's fault, 504 shop_timeout.
func TestAnOutboundCallCutOffByTheDrainIsCutOff(t *testing.T) {
	signer, err := identity.NewSigner(secret)
	if err != nil {
		t.Fatal(err)
	}
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done() // answers nothing until the call is given up
	}))
	t.Cleanup(upstream.Close)
	entered := make(chan struct{})
	seen := make(chan bool, 1)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/slow", func(w http.ResponseWriter, r *http.Request) {
		req, _ := http.NewRequestWithContext(r.Context(), http.MethodGet, upstream.URL, nil)
		close(entered)
		resp, err := upstream.Client().Do(req)
		if err == nil {
			resp.Body.Close()
		}
		seen <- CutOff(r, err) && !CallerGone(r, err)
	})
	addr, stop := runServer(t, mux, signer, slog.New(slog.DiscardHandler), 200*time.Millisecond)
	go sendSigned(context.Background(), signer, "http://"+addr+"/v1/slow")
	<-entered
	stop()
	select {
	case ok := <-seen:
		if !ok {
			t.Error("an outbound call cut off by the drain: CutOff && !CallerGone = false, want true")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the outbound call cut off by the drain was not cancelled")
	}
}

// A caller that hangs up is still CallerGone on a server run by Run (whose
// requests' contexts descend from its own).
func TestACallerThatHangsUpIsCallerGoneUnderRun(t *testing.T) {
	signer, err := identity.NewSigner(secret)
	if err != nil {
		t.Fatal(err)
	}
	entered := make(chan struct{})
	gone := make(chan bool, 1)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/slow", func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-r.Context().Done()
		err := r.Context().Err()
		gone <- CallerGone(r, err) && !CutOff(r, err)
	})
	addr, stop := runServer(t, mux, signer, slog.New(slog.DiscardHandler), 0)
	defer stop()
	reqCtx, hangUp := context.WithCancel(context.Background())
	go sendSigned(reqCtx, signer, "http://"+addr+"/v1/slow")
	<-entered
	hangUp()
	select {
	case ok := <-gone:
		if !ok {
			t.Error("a request whose caller hung up: CallerGone && !CutOff = false, want true")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the request whose caller hung up was not cancelled")
	}
}

// runServer runs a Server of mux on a free address, its identities checked
// with signer, logging to log, draining for shutdownTimeout (0: the
// default), and returns the address and stop, which ends Run and returns
// its error.
func runServer(t *testing.T, mux *http.ServeMux, signer *identity.Signer, log *slog.Logger, shutdownTimeout time.Duration) (addr string, stop func() error) {
	t.Helper()
	addr = testenv.FreeAddr(t)
	srv := New(Config{Service: "test", Addr: addr, Log: log, Signer: signer, ShutdownTimeout: shutdownTimeout}, mux)
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- srv.Run(ctx) }()
	testenv.WaitListening(t, addr)
	return addr, func() error { cancel(); return <-ran }
}

// sendSigned sends a GET of url signed as a reader, until ctx ends, and
// returns the error of the exchange; the answer is not read.
func sendSigned(ctx context.Context, signer *identity.Signer, url string) error {
	_, err := sendSignedStatus(ctx, signer, url)
	return err
}

// sendSignedStatus is sendSigned returning the answer's status too (0
// with the error when none came).
func sendSignedStatus(ctx context.Context, signer *identity.Signer, url string) (int, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	signAsReader(signer, req)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// A panicking handler's 500 carries the service's PanicMessage when it has
// one (sales-writer's says how to retry a sale that may have been
// applied), and "internal error" when not.
func TestPanicMessage(t *testing.T) {
	signer, err := identity.NewSigner(secret)
	if err != nil {
		t.Fatal(err)
	}
	for configured, want := range map[string]string{"": "internal error", "retry with the same key": "retry with the same key"} {
		mux := http.NewServeMux()
		mux.HandleFunc("POST /v1/boom", func(w http.ResponseWriter, r *http.Request) { panic("boom") })
		srv := New(Config{Service: "test", Log: slog.New(slog.DiscardHandler), Signer: signer, PanicMessage: configured}, mux)
		ts := httptest.NewServer(srv.Handler())
		status, env, decodeErr := postSigned(t, signer, ts.URL+"/v1/boom")
		ts.Close()
		if decodeErr != nil || status != 500 || env.Error == nil || env.Error.Code != "internal_error" || env.Error.Message != want {
			t.Errorf("panic with PanicMessage %q = %d %+v (%v), want 500 internal_error %q", configured, status, env.Error, decodeErr, want)
		}
	}
}

// A handler that answers its own panic (AnswerPanicWith) gets the message
// and notes its answer gives when the panic comes, not those it would have
// given when it was registered nor the service's PanicMessage and
// PanicNotes; a handler that registers none gets the service's.
func TestAnswerPanicWith(t *testing.T) {
	signer, err := identity.NewSigner(secret)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/own", func(w http.ResponseWriter, r *http.Request) {
		stage := "before"
		AnswerPanicWith(w, func() (string, map[string]string) {
			return "internal error " + stage, map[string]string{"stage": stage}
		})
		stage = "after"
		panic("boom")
	})
	mux.HandleFunc("POST /v1/service", func(w http.ResponseWriter, r *http.Request) { panic("boom") })
	var logs testenv.Output
	srv := New(Config{Service: "test", Log: slog.New(slog.NewJSONHandler(&logs, nil)), Signer: signer,
		PanicMessage: "the service's", PanicNotes: map[string]string{"stage": "unknown"}}, mux)
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()
	for path, want := range map[string]string{"/v1/own": "internal error after", "/v1/service": "the service's"} {
		status, env, decodeErr := postSigned(t, signer, ts.URL+path)
		if decodeErr != nil || status != 500 || env.Error == nil || env.Error.Code != "internal_error" || env.Error.Message != want {
			t.Errorf("panic of %s = %d %+v (%v), want 500 internal_error %q", path, status, env.Error, decodeErr, want)
		}
	}
	for _, line := range []string{`"route":"POST /v1/own","status":500,`, `"route":"POST /v1/service","status":500,`} {
		if !strings.Contains(logs.String(), line) {
			t.Errorf("no access line with %s:\n%s", line, logs.String())
		}
	}
	if !strings.Contains(logs.String(), `"stage":"after"`) || !strings.Contains(logs.String(), `"stage":"unknown"`) ||
		strings.Contains(logs.String(), `"stage":"before"`) {
		t.Errorf("the access lines do not record stage after (the handler's answer) and unknown (the service's):\n%s", logs.String())
	}
}

// Error answers are counted by their code, and recovered panics on their
// own: an alert can tell a run of invalid_cursor, or a bug, from other
// 4xx and 5xx.
func TestErrorsAreCountedByCode(t *testing.T) {
	signer, err := identity.NewSigner(secret)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/boom", func(w http.ResponseWriter, r *http.Request) { panic("boom") })
	srv := New(Config{Service: "test", Log: slog.New(slog.DiscardHandler), Signer: signer}, mux)
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()
	for _, c := range []struct{ method, path string }{{"POST", "/v1/boom"}, {"GET", "/v1/nope"}, {"GET", "/v1/nope"}} {
		req, _ := http.NewRequest(c.method, ts.URL+c.path, nil)
		signAsReader(signer, req)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	for _, c := range []struct {
		got  prometheus.Collector
		want float64
		name string
	}{
		{srv.metrics.panics, 1, "http_panics_total"},
		{srv.metrics.errors.WithLabelValues("POST /v1/boom", "internal_error"), 1, "http_errors_total{internal_error}"},
		{srv.metrics.errors.WithLabelValues("unmatched", "not_found"), 2, "http_errors_total{not_found}"},
	} {
		if got := testutil.ToFloat64(c.got); got != c.want {
			t.Errorf("%s = %v, want %v", c.name, got, c.want)
		}
	}
}

// A handler that panics after it has sent its status gets no envelope
// after its bytes (a second status cannot follow) but its answer broken
// off, and its panic is still counted, logged once and marks its span
// failed, though the status says 200: the one request whose span nothing
// else marks.
func TestAPanicAfterTheStatusIsStillRecorded(t *testing.T) {
	signer, err := identity.NewSigner(secret)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/half", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte(`{"data":[`))
		_ = http.NewResponseController(w).Flush() // the status and bytes are on their way
		panic("boom")
	})
	// Written by the server's goroutine: its last lines come before the
	// connection is cut, which the race detector cannot see through the
	// socket, so the buffer is one that locks (it failed every -race run).
	var logs testenv.Output
	sr := tracetest.NewSpanRecorder()
	srv := New(Config{Service: "test", Log: slog.New(slog.NewJSONHandler(&logs, nil)), Signer: signer,
		TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))}, mux)
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()
	req, _ := http.NewRequest("GET", ts.URL+"/v1/half", nil)
	signAsReader(signer, req)
	req.Header.Set("Traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	// Aborted: a chunked answer ended well formed would be a 200 holding
	// half a document, which a caller would take for a whole one.
	if resp.StatusCode != http.StatusOK || string(body) != `{"data":[` || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("answer = %d %q, read error %v; want the handler's 200 and its bytes alone, then the answer broken off (unexpected EOF)",
			resp.StatusCode, body, err)
	}
	if got := testutil.ToFloat64(srv.metrics.panics); got != 1 {
		t.Errorf("http_panics_total = %v, want 1", got)
	}
	if n := strings.Count(logs.String(), `"msg":"panic"`); n != 1 {
		t.Errorf("%d panic lines, want 1:\n%s", n, logs.String())
	}
	spans := sr.Ended()
	if len(spans) != 1 {
		t.Fatalf("%d spans, want 1", len(spans))
	}
	if status := spans[0].Status(); status.Code != codes.Error {
		t.Errorf("span status = %+v, want an error", status)
	}
}

// A handler that panics after writing a whole answer that is still in
// net/http's buffer (every envelope under 2 KiB, a sale's among them) has
// it dropped whole: the connection closes before a byte is sent, which
// the gateway takes for a connection closed before any answer (a GET and
// a sale with its Idempotency-Key are sent again, the sale's repeat
// replaying it). The access line still says the status the handler set.
func TestAPanicAfterAWholeUnsentAnswerDropsIt(t *testing.T) {
	signer, err := identity.NewSigner(secret)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/whole", func(w http.ResponseWriter, r *http.Request) {
		envelope.WriteData(w, http.StatusOK, map[string]string{"sale": "applied"}, envelope.Meta{RequestID: RequestID(r)})
		panic("boom")
	})
	var logs testenv.Output // as in TestAPanicAfterTheStatusIsStillRecorded
	srv := New(Config{Service: "test", Log: slog.New(slog.NewJSONHandler(&logs, nil)), Signer: signer}, mux)
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()
	req, _ := http.NewRequest("GET", ts.URL+"/v1/whole", nil)
	signAsReader(signer, req)
	conn, err := net.Dial("tcp", ts.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := req.Write(conn); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(conn)
	if len(got) != 0 || err != nil {
		t.Errorf("read %q, %v; want the connection closed before any byte", got, err)
	}
	if !strings.Contains(logs.String(), `"status":200`) {
		t.Errorf("the access line does not say the handler's 200:\n%s", logs.String())
	}
}

func TestLoggableClientValue(t *testing.T) {
	long := strings.Repeat("é", maxClientValue+1)
	key, _, err := apikey.Generate([]string{"sales:write"})
	if err != nil {
		t.Fatal(err)
	}
	untagged := key[strings.IndexByte(key, '_')+1:] // the whole secret, an item id or order id to a client that cut the key at its '_'
	for _, tt := range []struct{ value, want string }{
		{"coin-1", "coin-1"},
		{key, "[holds an API key]"},
		{untagged, "[holds an API key]"},
		{"order-" + untagged, "[holds an API key]"},
		{untagged[1:], untagged[1:]}, // a run of letters and digits is an id like any other
		{"", ""},
		{"coin\n1", "coin\uFFFD1"},
		{"\x1b[2Jcoin", "\uFFFD[2Jcoin"},
		{"coin\xff\xfe", "coin\uFFFD"},
		{"a\u0085b\u2028c", "a\uFFFDb\uFFFDc"},
		{long, long[:2*maxClientValue] + "…"},
		{"\n" + long, "\uFFFD" + long[:2*(maxClientValue-1)] + "…"},
	} {
		if got := LoggableClientValue(tt.value); got != tt.want {
			t.Errorf("LoggableClientValue(%q) = %q, want %q", tt.value, got, tt.want)
		}
	}
}

// FuzzLoggableClientValue: whatever a client sends, what is logged and
// put on spans is UTF-8 (OTLP encodes no other string), holds no control
// character or line separator (no forged log line, no terminal escape) and
// no key-like text, and is at most maxClientValue characters and "…"; a
// value with none of those comes back as it was.
func FuzzLoggableClientValue(f *testing.F) {
	for _, s := range []string{"coin-1", "", "coin\n1", "\x1b[2Jcoin", "coin\xff\xfe", "a\u0085b\u2028c", "ORDER-2024-0001",
		"0b9b3c6e-5f7d-4b0e-9a7e-0c1d2e3f4a5b", strings.Repeat("é", maxClientValue+1), strings.Repeat("x", maxClientValue),
		"cxr_0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJ012345", "cxr_0123456789\nabcdefghijklmnopqrstuvwxyzABCDEFGHIJ012345"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, value string) {
		got := LoggableClientValue(value)
		if !utf8.ValidString(got) || strings.ContainsFunc(got, control) || apikey.ContainsKeyLike(got) {
			t.Fatalf("LoggableClientValue(%q) = %q, which is not UTF-8, holds a control character or key-like text", value, got)
		}
		if n := utf8.RuneCountInString(got); n > maxClientValue+1 || n == maxClientValue+1 && !strings.HasSuffix(got, "…") {
			t.Fatalf("LoggableClientValue(%q) = %q, %d characters, want at most %d and …", value, got, n, maxClientValue)
		}
		plain := utf8.ValidString(value) && !strings.ContainsFunc(value, control) && !apikey.ContainsKeyLike(value) &&
			utf8.RuneCountInString(value) <= maxClientValue
		if plain && got != value {
			t.Fatalf("LoggableClientValue(%q) = %q, want it unchanged", value, got)
		}
	})
}

// postSigned sends an empty POST to url, signed as a reader, and returns
// the answer's status and its envelope, with the error of decoding it.
func postSigned(t *testing.T, signer *identity.Signer, url string) (int, envelope.Parsed, error) {
	t.Helper()
	req, _ := http.NewRequest("POST", url, nil)
	signAsReader(signer, req)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var env envelope.Parsed
	decodeErr := json.NewDecoder(resp.Body).Decode(&env)
	return resp.StatusCode, env, decodeErr
}

// A stop with no connection open drains at once, whatever the
// ShutdownDelay: there is no connection to close under a request (make
// run's Ctrl-C stops the gateway first, and must not wait out each
// service's delay). An hour's delay waited out would time the test out.
func TestAStopWithNoConnectionOpenSkipsTheDelay(t *testing.T) {
	addr := testenv.FreeAddr(t)
	logs := &testenv.Output{}
	srv := New(Config{Service: "test", Addr: addr, Log: slog.New(slog.NewJSONHandler(logs, nil)), ShutdownDelay: time.Hour},
		http.NewServeMux())
	ctx, stop := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- srv.Run(ctx) }()
	testenv.WaitListening(t, addr)
	for srv.conns.Load() != 0 { // WaitListening's connection, until the server has seen it close
		time.Sleep(time.Millisecond)
	}
	stop()
	if err := <-ran; err != nil {
		t.Fatalf("Run() = %v", err)
	}
	if !strings.Contains(logs.String(), "no connection open, draining at once") {
		t.Errorf("the log does not say the delay was skipped:\n%s", logs.String())
	}
}
