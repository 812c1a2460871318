package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/coinexport/export/pkg/envelope"
	"github.com/coinexport/export/pkg/testenv"
	"github.com/gofiber/fiber/v2"
)

// The hop relays the request's method, path, query and body to the
// upstream and hands back its answer. POST, not GET: GET is what a request
// that lost its method would become.
func TestHopRelaysToTheUpstream(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/plain")
		io.WriteString(w, r.Method+" "+r.URL.RequestURI()+" "+string(body))
	}))
	defer upstream.Close()

	req := httptest.NewRequest("POST", "/v1/export/items/a%3Fb/sales/confirm?lang=ENG", strings.NewReader(`{"n":1}`))
	resp, err := newApp(upstream.URL).Test(req, -1)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if want := `POST /v1/export/items/a%3Fb/sales/confirm?lang=ENG {"n":1}`; resp.StatusCode != fiber.StatusOK || string(body) != want {
		t.Errorf("POST through the hop = %d %q, want 200 %q", resp.StatusCode, body, want)
	}
}

// A hop whose upstream refuses the connection answers 502 with the error
// envelope, and its request id is in meta and in X-Request-Id.
func TestFailedHopAnswersTheEnvelopeWithARequestID(t *testing.T) {
	resp, err := newApp(refusedUpstream(t)).Test(httptest.NewRequest("GET", "/v1/export/items/x", nil), -1)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != fiber.StatusBadGateway {
		t.Errorf("status = %d, want 502; body %s", resp.StatusCode, body)
	}
	var env struct {
		Error struct{ Code, Message string }
		Meta  struct {
			RequestID string `json:"request_id"`
		}
	}
	if err := json.Unmarshal(body, &env); err != nil {
		t.Fatalf("body is not the envelope: %v: %s", err, body)
	}
	if env.Error.Code != "bad_gateway" || env.Error.Message == "" {
		t.Errorf("error = %+v, want code bad_gateway and a message", env.Error)
	}
	if !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(env.Meta.RequestID) {
		t.Errorf("meta.request_id = %q, want 32 hex digits", env.Meta.RequestID)
	}
	if got := resp.Header.Get("Cache-Control"); got != envelope.ErrorCacheControl {
		t.Errorf("Cache-Control = %q, want %q", got, envelope.ErrorCacheControl)
	}
	if got := resp.Header.Get(envelope.RequestIDHeader); got != env.Meta.RequestID {
		t.Errorf("%s = %q, want meta.request_id %q", envelope.RequestIDHeader, got, env.Meta.RequestID)
	}
}

// A client error Fiber raises (here a body over its 4 MB default limit)
// keeps its 4xx status, in the envelope. Fiber raises it while reading the
// request, before any handler, so the hop is served on a real listener.
func TestClientErrorsKeepTheirStatus(t *testing.T) {
	app := newApp(refusedUpstream(t))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go app.Listener(ln)
	t.Cleanup(func() { _ = app.Shutdown() })

	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// The declared length alone is over the limit: no body needs sending.
	fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: plainhop\r\nContent-Length: %d\r\n\r\n", fiber.DefaultBodyLimit+1)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != fiber.StatusRequestEntityTooLarge {
		t.Errorf("status = %d, want 413", resp.StatusCode)
	}
	if resp.Header.Get(envelope.RequestIDHeader) == "" {
		t.Error("no request id on a client error")
	}
	if got := resp.Header.Get(fiber.HeaderContentType); got != envelope.ContentType {
		t.Errorf("Content-Type = %q, want the envelope's %q", got, envelope.ContentType)
	}
}

func TestUpstreamIsRequired(t *testing.T) {
	if _, err := parseFlags([]string{"--listen", "127.0.0.1:0"}); err == nil {
		t.Error("parseFlags without --upstream = nil error, want one")
	}
}

// refusedUpstream returns the base URL of an address nothing listens on.
func refusedUpstream(t *testing.T) string { return "http://" + testenv.RefusingAddr(t) }
