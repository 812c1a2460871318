package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/coinexport/export/pkg/identity"
)

func TestAppendSalesBodyIsValidJSON(t *testing.T) {
	for _, order := range []string{
		"bench-0123abcd-3-17",
		`with "quotes" and \backslashes\`,
		"control\x00chars\n\tand\x7f",
		"unicode ключ 🔑",
		"<html>&amp;",
	} {
		body := appendSalesBody([]byte("junk before"), []byte(order))[len("junk before"):]
		var got map[string]string
		if err := json.Unmarshal(body, &got); err != nil {
			t.Errorf("appendSalesBody(%q) = %s, not JSON: %v", order, body, err)
			continue
		}
		if len(got) != 1 || got["external_order_id"] != order {
			t.Errorf("appendSalesBody(%q) decodes to %q, want only external_order_id = the order", order, got)
		}
	}
}

func TestIDSourceIsUniqueAcrossWorkersAndRuns(t *testing.T) {
	seen := map[string]bool{}
	for _, run := range []string{randomHex(8), randomHex(8)} {
		// Worker 1's 12th id and worker 11's 2nd id must not meet.
		for worker := range 12 {
			src := newIDSource(run, worker)
			for range 12 {
				id := string(src.appendNext(nil))
				if seen[id] {
					t.Fatalf("id %q handed out twice", id)
				}
				seen[id] = true
				if len(id) > 128 {
					t.Fatalf("id %q is longer than the 128 characters an Idempotency-Key may have", id)
				}
			}
		}
	}
}

func TestNewHTTPClientRejectsBadBase(t *testing.T) {
	for _, base := range []string{"127.0.0.1:18080/v1", "ftp://127.0.0.1/v1", "http:///v1", "http://[::1"} {
		if _, err := newHTTPClient(base, 1); err == nil {
			t.Errorf("newHTTPClient(%q) = nil error, want one", base)
		}
	}
	c, err := newHTTPClient("http://127.0.0.1:18080/v1/", 4)
	if err != nil || c.base != "http://127.0.0.1:18080/v1" || c.hc.Addr != "127.0.0.1:18080" {
		t.Errorf("newHTTPClient() = %+v, %v, want base without trailing slash, addr host:port", c, err)
	}
}

// The signed headers must verify as the services verify them, for the
// request they were signed for only, with a fresh request id per request.
func TestSignedIdentityVerifies(t *testing.T) {
	signer, err := identity.NewSigner(strings.Repeat("s", 32))
	if err != nil {
		t.Fatal(err)
	}
	want := identity.Identity{OwnerID: "owner-1", KeyID: "bench", Scopes: []string{identity.ScopeExportRead}}
	auth := bySignedIdentity(signer, want)
	const target = "/v1/export/items/a%2Fb?lang=ENG"
	first, second := headersOf(auth, "GET", target), headersOf(auth, "GET", target)
	got, err := signer.Verify(first.Get, identity.Request{Method: "GET", Target: target}, time.Now())
	if err != nil {
		t.Fatalf("Verify(signed headers) error %v; headers %v", err, first)
	}
	if got.OwnerID != want.OwnerID || got.KeyID != want.KeyID || !got.HasScope(identity.ScopeExportRead) {
		t.Errorf("Verify() = %+v, want %+v", got, want)
	}
	if _, err := signer.Verify(first.Get, identity.Request{Method: "GET", Target: "/v1/export/items/a%2Fc?lang=ENG"}, time.Now()); err == nil {
		t.Error("Verify(headers signed for another target) = nil error, want ErrUnsigned")
	}
	if a, b := first.Get(identity.HeaderRequestID), second.Get(identity.HeaderRequestID); a == "" || a == b {
		t.Errorf("request ids %q and %q, want two different non-empty ones", a, b)
	}
}

// What the sync client signs is what it sends: a service verifying the
// request-target it receives accepts it, escaped ids and cursors included.
func TestSignedRequestsReachAServiceIntact(t *testing.T) {
	signer, err := identity.NewSigner(strings.Repeat("s", 32))
	if err != nil {
		t.Fatal(err)
	}
	var seen []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := signer.Verify(r.Header.Get, identity.RequestOf(r), time.Now()); err != nil {
			w.WriteHeader(http.StatusUnauthorized)
		}
		seen = append(seen, r.RequestURI)
	}))
	defer srv.Close()
	client, err := newHTTPClient(srv.URL+"/v1", 1)
	if err != nil {
		t.Fatal(err)
	}
	auth := bySignedIdentity(signer, identity.Identity{OwnerID: "owner-1", Scopes: []string{identity.ScopeExportRead}})
	for _, target := range []string{
		"/v1/export/items?limit=100&lang=ENG&cursor=eyJ1IjoxfQ.c2ln-_",
		"/v1/export/items/a%2F..%2Fb",
		"/v1/export/items/%D0%BA%20x?q=%2B+",
	} {
		var req fasthttp.Request
		var resp fasthttp.Response
		req.SetRequestURI(srv.URL + target)
		auth(&req)
		if err := client.do(&req, &resp); err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode() != http.StatusOK {
			t.Errorf("GET %s, signed: status %d, want 200 (the service saw %q)", target, resp.StatusCode(), seen[len(seen)-1])
		}
	}
}

func TestHeadersOfAPIKey(t *testing.T) {
	got := headersOf(byAPIKey("secret-key"), "GET", "/v1/export/items/1")
	if want := (http.Header{"X-Api-Key": {"secret-key"}}); len(got) != 1 || got.Get("X-Api-Key") != "secret-key" {
		t.Errorf("headersOf(byAPIKey) = %v, want %v", got, want)
	}
}
