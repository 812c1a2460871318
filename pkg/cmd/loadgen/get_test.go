package main

import (
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/coinexport/export/pkg/identity"
)

func TestParseWrk(t *testing.T) {
	out := "Running 5s test @ http://127.0.0.1:18080\n  2 threads and 64 connections\n" +
		`WRK_JSON {"requests":50000,"duration_us":5000000,"bytes":1,"connect":0,"read":1,"write":0,"status":2,"timeout":3,"p50_us":1500.5,"p99_us":9000.0,"max_us":12000.0}` + "\n"
	got, err := parseWrk([]byte(out))
	if err != nil {
		t.Fatalf("parseWrk() error %v", err)
	}
	want := wrkSummary{Requests: 50000, DurationUS: 5000000, Bytes: 1, Read: 1, Status: 2, Timeout: 3, P50US: 1500.5, P99US: 9000, MaxUS: 12000}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("parseWrk() mismatch (-want +got):\n%s", diff)
	}
	if got.RPS() != 10000 {
		t.Errorf("RPS() = %v, want 10000", got.RPS())
	}
	if got.Errors() != 6 {
		t.Errorf("Errors() = %v, want 6", got.Errors())
	}
	if _, err := parseWrk([]byte("unable to connect to 127.0.0.1:18080 Connection refused\n")); err == nil {
		t.Errorf("parseWrk(no summary) = nil error, want one")
	}
}

// The API key must travel in the environment, never on wrk's command line.
func TestGetRunKeepsHeadersOffTheCommandLine(t *testing.T) {
	g := getRun{URL: "http://127.0.0.1:1", PathPrefix: "/v1/export/items/", IDsFile: "ids", Script: "s.lua",
		Threads: 2, Conns: 64, Duration: 10 * time.Second, Headers: http.Header{"X-Api-Key": {"secret-key"}}}
	if args := strings.Join(g.args(), " "); strings.Contains(args, "secret-key") {
		t.Errorf("args() = %q, holds the key", args)
	}
	if !slices.Contains(g.env(), "WRK_HEADERS=X-Api-Key: secret-key") {
		t.Errorf("env() lacks WRK_HEADERS with the key")
	}
	if got, want := g.args()[:6], []string{"-t", "2", "-c", "64", "-d", "10s"}; !slices.Equal(got, want) {
		t.Errorf("args()[:6] = %q, want %q", got, want)
	}
}

// Each line of the signed requests file is an id and the identity headers
// signed for that id's own target, which verify for it and for no other.
func TestWriteSignedRequests(t *testing.T) {
	dir := t.TempDir()
	ids := filepath.Join(dir, "ids")
	if err := os.WriteFile(ids, []byte("a%2Fb\ns1-2\n\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	signer, err := identity.NewSigner(strings.Repeat("s", 32))
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "signed")
	const prefix = "/v1/export/items/"
	if err := writeSignedRequests(out, bySignedIdentity(signer, identity.Identity{OwnerID: "o1"}), prefix, ids); err != nil {
		t.Fatal(err)
	}
	text, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(text), "\n"), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d lines, want one per id (2):\n%s", len(lines), text)
	}
	for i, line := range lines {
		id, headers, _ := strings.Cut(line, "\t")
		h := http.Header{}
		for _, field := range strings.Split(headers, "\t") {
			name, value, _ := strings.Cut(field, ": ")
			h.Add(name, value)
		}
		if _, err := signer.Verify(h.Get, identity.Request{Method: "GET", Target: prefix + id}, time.Now()); err != nil {
			t.Errorf("line %d (%s): its headers do not verify for its own target: %v", i, id, err)
		}
		other := strings.Split(lines[1-i], "\t")[0]
		if _, err := signer.Verify(h.Get, identity.Request{Method: "GET", Target: prefix + other}, time.Now()); err == nil {
			t.Errorf("line %d (%s): its headers verify for %s too", i, id, other)
		}
	}
}

// A get run's record carries its figures per request, CPU included, and a
// note naming the failed requests by kind and any part without a CPU figure.
func TestGetRecord(t *testing.T) {
	s := wrkSummary{Requests: 1000, DurationUS: 2_000_000, Read: 1, Timeout: 2, P50US: 1500, P99US: 9000, CPU: 500 * time.Millisecond}
	used := cpuUsage{parts: map[string]time.Duration{"service": time.Second, "postgres": -time.Millisecond}}
	got := getRecord("get-64", 64, s, used)
	want := Record{Scenario: "get-64", Figures: map[string]float64{
		"conns": 64, "requests": 1000, "rps": 500, "p50_ms": 1.5, "p99_ms": 9, "errors": 3,
		"cpu_us.service": 1000, "cpu_us.client": 500,
	}, Note: "no CPU figure for postgres: a process left the tree during the round; " +
		"errors: connect 0, read 1, write 0, status 0, timeout 2"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("getRecord() mismatch (-want +got):\n%s", diff)
	}
	if got := getRecord("get", 1, wrkSummary{Requests: 10, DurationUS: 1e6}, cpuUsage{}); got.Note != "" {
		t.Errorf("getRecord(no errors, no parts).Note = %q, want none", got.Note)
	}
}
