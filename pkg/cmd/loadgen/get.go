package main

import (
	"bufio"
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/coinexport/export/pkg/identity"
)

//go:embed wrk.lua
var wrkScript []byte

// wrkSummary is the WRK_JSON line of wrk.lua.
type wrkSummary struct {
	Requests   int64   `json:"requests"`
	DurationUS int64   `json:"duration_us"`
	Bytes      int64   `json:"bytes"`
	Connect    int64   `json:"connect"`
	Read       int64   `json:"read"`
	Write      int64   `json:"write"`
	Status     int64   `json:"status"`
	Timeout    int64   `json:"timeout"`
	P50US      float64 `json:"p50_us"`
	P99US      float64 `json:"p99_us"`
	MaxUS      float64 `json:"max_us"`

	// CPU is the CPU time wrk itself used (not from its output).
	CPU time.Duration `json:"-"`
}

// Errors is every failed request: socket errors, timeouts and non-2xx/3xx.
func (s wrkSummary) Errors() int64 { return s.Connect + s.Read + s.Write + s.Status + s.Timeout }

// RPS is completed requests per second.
func (s wrkSummary) RPS() float64 {
	if s.DurationUS == 0 {
		return 0
	}
	return float64(s.Requests) / (float64(s.DurationUS) / 1e6)
}

// parseWrk finds the WRK_JSON line in wrk's output.
func parseWrk(out []byte) (wrkSummary, error) {
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "WRK_JSON "); ok {
			var s wrkSummary
			if err := json.Unmarshal([]byte(rest), &s); err != nil {
				return s, fmt.Errorf("wrk summary: %w", err)
			}
			return s, nil
		}
	}
	return wrkSummary{}, errors.New("wrk printed no WRK_JSON line")
}

// getRun is one wrk invocation.
type getRun struct {
	URL        string // scheme://host:port
	PathPrefix string
	IDsFile    string
	Script     string
	Threads    int
	Conns      int
	Duration   time.Duration
	Headers    http.Header
}

// args are wrk's arguments: nothing secret, the headers travel in env.
func (g getRun) args() []string {
	return []string{
		"-t", strconv.Itoa(min(g.Threads, g.Conns)),
		"-c", strconv.Itoa(g.Conns),
		"-d", strconv.Itoa(max(1, int(g.Duration.Round(time.Second).Seconds()))) + "s",
		"--timeout", "10s",
		"-s", g.Script,
		g.URL,
	}
}

// env is wrk's environment: ours plus the script's inputs.
func (g getRun) env() []string {
	var hs []string
	for name, vs := range g.Headers {
		for _, v := range vs {
			hs = append(hs, name+": "+v)
		}
	}
	return append(os.Environ(),
		"WRK_HEADERS="+strings.Join(hs, "\n"),
		"WRK_PATH_PREFIX="+g.PathPrefix,
		"WRK_IDS_FILE="+g.IDsFile,
	)
}

func (g getRun) exec(ctx context.Context) (wrkSummary, error) {
	cmd := exec.CommandContext(ctx, "wrk", g.args()...)
	cmd.Env = g.env()
	out, err := cmd.CombinedOutput()
	if err != nil {
		return wrkSummary{}, fmt.Errorf("wrk: %w: %s", err, bytes.TrimSpace(out))
	}
	s, err := parseWrk(out)
	s.CPU = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	return s, err
}

// runGet is "loadgen get": GET-by-id at a fixed connection count, with a
// warm-up run first, measured by wrk (the load generator then costs far
// less CPU per request than a Go client, which matters on two shared cores).
func runGet(ctx context.Context, cfg Config, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("get", flag.ContinueOnError)
	name := fs.String("name", "get", "scenario name in the results file")
	target := fs.String("url", "http://127.0.0.1:18080", "scheme://host:port of the gateway or proxy")
	prefix := fs.String("path-prefix", "/v1/export/items/", "path before the id")
	ids := fs.String("ids", "ids.txt", "file of path-escaped ids (loadgen ids)")
	auth := fs.String("auth", "key", "key (X-API-Key) or signed (identity headers, for nginx or a service)")
	conns := fs.Int("conns", 64, "connections")
	threads := fs.Int("threads", 2, "wrk threads")
	duration := fs.Duration("duration", 10*time.Second, "measured duration")
	warmup := fs.Duration("warmup", 3*time.Second, "unmeasured run before")
	var parts cpuParts
	fs.Var(&parts, "cpu", "name=pid: a process tree whose CPU time per request to record (repeatable)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *auth == "signed" && *warmup+*duration > identity.MaxSkew-10*time.Second {
		return errUsagef("a signed run must end within %s of signing", identity.MaxSkew)
	}
	a, err := authFor(cfg, *auth)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "loadgen-wrk")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	script := filepath.Join(dir, "get.lua")
	if err := os.WriteFile(script, wrkScript, 0o600); err != nil {
		return err
	}
	if _, err := parts.sample(); err != nil { // fail before the runs, not after them
		return fmt.Errorf("%s: %w", *name, err)
	}
	run := getRun{URL: *target, PathPrefix: *prefix, Script: script, Threads: *threads, Conns: *conns}
	// authorize gives the run its credentials, fresh: a signature ages.
	authorize := func() error {
		if *auth != "signed" {
			run.IDsFile, run.Headers = *ids, headersOf(a, fasthttp.MethodGet, *prefix)
			return nil
		}
		run.IDsFile = filepath.Join(dir, "signed-requests")
		return writeSignedRequests(run.IDsFile, a, *prefix, *ids)
	}
	if err := run.warmUp(ctx, *warmup, authorize); err != nil {
		return fmt.Errorf("%s: %w", *name, err)
	}
	run.Duration = *duration
	if err := authorize(); err != nil {
		return fmt.Errorf("%s: %w", *name, err)
	}
	s, used, err := run.measure(ctx, parts)
	if err != nil {
		return fmt.Errorf("%s: %w", *name, err)
	}
	return appendRecord(cfg.Results, getRecord(*name, *conns, s, used), stdout)
}

// warmUp runs wrk for d, unmeasured, with the credentials authorize gives
// it; none when d is 0.
func (g *getRun) warmUp(ctx context.Context, d time.Duration, authorize func() error) error {
	if d <= 0 {
		return nil
	}
	g.Duration = d
	if err := authorize(); err != nil {
		return err
	}
	if _, err := g.exec(ctx); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	return nil
}

// measure runs wrk once, with the CPU time of parts taken over the run.
func (g getRun) measure(ctx context.Context, parts cpuParts) (wrkSummary, cpuUsage, error) {
	window, err := parts.start()
	if err != nil {
		return wrkSummary{}, cpuUsage{}, err
	}
	s, err := g.exec(ctx)
	if err != nil {
		return wrkSummary{}, cpuUsage{}, err
	}
	used, err := window.stop()
	return s, used, err
}

// getRecord is the record of a measured get run of conns connections:
// its figures, wrk's CPU and the parts' per request, and a note of the
// failed requests by kind and of any part left without a CPU figure.
func getRecord(name string, conns int, s wrkSummary, used cpuUsage) Record {
	rec := Record{Scenario: name, Figures: map[string]float64{
		"conns":    float64(conns),
		"requests": float64(s.Requests),
		"rps":      s.RPS(),
		"p50_ms":   s.P50US / 1000,
		"p99_ms":   s.P99US / 1000,
		"errors":   float64(s.Errors()),
	}}
	var notes []string
	if leftOut := used.record(s.CPU, float64(s.Requests), rec.Figures); len(leftOut) > 0 {
		notes = append(notes, leftOutNote(leftOut))
	}
	if s.Errors() > 0 {
		notes = append(notes, fmt.Sprintf("errors: connect %d, read %d, write %d, status %d, timeout %d", s.Connect, s.Read, s.Write, s.Status, s.Timeout))
	}
	rec.Note = strings.Join(notes, "; ")
	return rec
}

// headersOf captures the headers a sets on a request of method for target
// (path and query), signed now.
func headersOf(a authenticator, method, target string) http.Header {
	var req fasthttp.Request
	req.Header.SetMethod(method)
	req.SetRequestURI(target) // a path: the request has no Host header to capture
	a(&req)
	h := http.Header{}
	for name, value := range req.Header.All() {
		h.Add(string(name), string(value))
	}
	return h
}

// writeSignedRequests writes to path, for each id of idsFile, a line of the
// id and the headers a signs for GET prefix+id, tab-separated, for wrk.lua:
// a signature binds the request-target, so each id needs its own (signing
// 10,000 takes milliseconds; the file is written again for each run, as
// signatures age).
func writeSignedRequests(path string, a authenticator, prefix, idsFile string) error {
	ids, err := os.ReadFile(idsFile)
	if err != nil {
		return err
	}
	var out bytes.Buffer
	for id := range strings.Lines(string(ids)) {
		id = strings.TrimRight(id, "\r\n")
		if id == "" {
			continue
		}
		out.WriteString(id)
		for name, values := range headersOf(a, fasthttp.MethodGet, prefix+id) {
			for _, v := range values {
				out.WriteString("\t" + name + ": " + v)
			}
		}
		out.WriteByte('\n')
	}
	return os.WriteFile(path, out.Bytes(), 0o600)
}
