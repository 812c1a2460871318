package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/testenv"
	"github.com/coinexport/export/pkg/tracestore"
)

func TestMain(m *testing.M) {
	removeOrphanedBinaries(os.TempDir(), time.Hour)
	code := testenv.Run(m)
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// binaries are the processes of the stack, by import path.
var binaries = map[string]string{
	"gateway":       "github.com/coinexport/export/gateway",
	"export-reader": "github.com/coinexport/export/services/export-reader",
	"sales-writer":  "github.com/coinexport/export/services/sales-writer",
	"shop-schema":   "github.com/coinexport/export/services/shop-schema",
}

// stack is a running set of processes plus the trace receiver they export to.
type stack struct {
	baseURL string
	traces  *tracestore.Store
	logs    map[string]*testenv.Output
	admin   map[string]string // each binary's admin listener, which serves /metrics
	// common is the environment every binary of the stack starts with
	// (database, Redis, secrets, trace receiver), and bin the folder of
	// the binaries: what another gateway in front of it needs
	// (startGateway).
	common []string
	bin    string
	// upstreams are the stack's gateway's *_URLS settings, its services:
	// what another gateway in front of them is given.
	upstreams []string
	// sigterm, on a gateway of startGateway, asks it to stop.
	sigterm func()
}

// built is the folder build compiled the stack's binaries into, once for
// the whole test binary; TestMain removes it.
var built struct {
	once sync.Once
	dir  string
	err  error
}

// build returns the folder of every binary of a stack, compiled on the
// first call. Compiled again for each stack, as they were, the go command
// links four binaries afresh each time (its cache holds the packages, not
// the executables): on a busy 2-core machine that was 2 of
// TestMadeUpValuesAddNoSeries's 2.1 minutes, and the package, its tests one
// after another, took 531 s of go test's 10-minute limit.
func build(t *testing.T) string {
	t.Helper()
	built.once.Do(func() { built.dir, built.err = buildBinaries() })
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.dir
}

// binariesPrefix begins the name of a folder buildBinaries compiles into;
// the id of the test binary's process follows it.
const binariesPrefix = "e2e-binaries-"

// removeOrphanedBinaries removes the folders of binaries in parent that
// test binaries left as they died, once older than age: TestMain removes
// its own only when the tests return, not after a test's panic (its
// cleanups run, TestMain does not) nor after go test's -timeout, and each
// holds 129 MB. The age keeps a live run's folder whose process this one
// cannot see (another PID namespace sharing the folder).
func removeOrphanedBinaries(parent string, age time.Duration) {
	entries, _ := os.ReadDir(parent)
	for _, e := range entries {
		pid, ok := binariesOwner(e.Name())
		if info, err := e.Info(); ok && err == nil && time.Since(info.ModTime()) > age && !running(pid) {
			_ = os.RemoveAll(filepath.Join(parent, e.Name()))
		}
	}
}

// binariesOwner reads the process id in the name of a folder of
// buildBinaries.
func binariesOwner(name string) (pid int, ok bool) {
	rest, ok := strings.CutPrefix(name, binariesPrefix)
	if !ok {
		return 0, false
	}
	digits, _, ok := strings.Cut(rest, "-")
	pid, err := strconv.Atoi(digits)
	return pid, ok && err == nil && pid > 0
}

// running says whether process pid exists (a signal 0 reaches it, or is
// refused it).
func running(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// buildBinaries compiles every binary of a stack into a new folder.
func buildBinaries() (string, error) {
	dir, err := os.MkdirTemp("", fmt.Sprintf("%s%d-", binariesPrefix, os.Getpid()))
	if err != nil {
		return "", err
	}
	if err := readSourcesOf(slices.Collect(maps.Values(binaries))...); err != nil {
		return dir, err
	}
	for name, pkg := range binaries {
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, name), pkg)
		if out, err := cmd.CombinedOutput(); err != nil {
			return dir, fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
		}
	}
	return dir, nil
}

// readSourcesOf is testenv.ReadSourcesOf for this module, gateway/,
// through the links in testdata/workspace.
func readSourcesOf(pkgs ...string) error {
	gateway, err := filepath.Abs("..")
	if err != nil {
		return err
	}
	return testenv.ReadSourcesOf(gateway, filepath.Join(gateway, "e2e/testdata/workspace"), pkgs...)
}

// startStack starts the services and the gateway against dsn and redisURL.
// Their ports come from FreeAddr: free when chosen, but open to any
// process until the binary binds them, and one can take one meanwhile
// ("address already in use"): the test binaries beside this one claim
// theirs (testenv.FreeAddr), but another user's, another checkout's on an
// older testenv, or any server of a fixed port do not. A
// stack one of whose processes exits before the stack is healthy is
// therefore stopped and started again on new ports, up to three times.
// settings ("NAME=value") are given to every binary, after the stack's own.
func startStack(t *testing.T, dsn, redisURL string, settings ...string) *stack {
	t.Helper()
	bin := build(t)
	store := tracestore.New(nil, 0)
	receiver := testenv.LoopbackServer(t, store)
	receiver.Start()
	const attempts = 3
	for attempt := 1; ; attempt++ {
		s, exited, stop := launch(t, bin, receiver.URL, store, dsn, redisURL, settings)
		err := s.waitHealthy(exited)
		if err == nil {
			t.Cleanup(stop)
			s.bin = bin
			return s
		}
		stop()
		if !errors.Is(err, errExited) || attempt == attempts {
			for name, l := range s.logs {
				t.Logf("%s output:\n%s", name, l.String())
			}
			t.Fatal(err)
		}
		t.Logf("stack attempt %d: %v; starting it again on new ports. Its output:", attempt, err)
		for name, l := range s.logs {
			t.Logf("%s:\n%s", name, l.String())
		}
	}
}

// The stack's identity secrets: IDENTITY_SECRET, which the gateway, export-reader
// and sales-writer hold, and shop-schema's own, the gateway's
// SHOP_SCHEMA_IDENTITY_SECRET and shop-schema's IDENTITY_SECRET.
const (
	identitySecret   = "e2e-identity-secret-0123456789abcdef"
	shopSchemaSecret = "e2e-shop-schema-identity-secret-0123456789"
)

// errExited is a process of the stack that ended before the stack was
// healthy.
var errExited = errors.New("a process of the stack exited")

// launch starts the four binaries on new ports, exporting their spans to
// receiverURL, which stores them in traces, each with settings added to
// its environment. exited receives the name of each process that ends; stop
// ends them all (TERM, then KILL after 10 s) and waits for them.
func launch(t *testing.T, bin, receiverURL string, traces *tracestore.Store, dsn, redisURL string, settings []string) (s *stack, exited <-chan string, stop func()) {
	t.Helper()
	addr, admin := map[string]string{}, map[string]string{}
	for name := range binaries {
		addr[name], admin[name] = testenv.FreeAddr(t), testenv.FreeAddr(t)
	}
	common := []string{
		"PATH=" + os.Getenv("PATH"),
		"DATABASE_URL=" + dsn,
		"REDIS_URL=" + redisURL,
		"IDENTITY_SECRET=" + identitySecret,
		"SHOP_SCHEMA_IDENTITY_SECRET=" + shopSchemaSecret,
		"CURSOR_SECRET=e2e-cursor-secret-0123456789abcdefgh",
		"OTEL_EXPORTER_OTLP_ENDPOINT=" + receiverURL,
		"OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
		"OTEL_BSP_SCHEDULE_DELAY=100",
		"LOG_LEVEL=info",
	}
	own := map[string][]string{
		"export-reader": {"EXPORT_READER_ADDR=" + addr["export-reader"], "EXPORT_READER_ADMIN_ADDR=" + admin["export-reader"]},
		"sales-writer":  {"SALES_WRITER_ADDR=" + addr["sales-writer"], "SALES_WRITER_ADMIN_ADDR=" + admin["sales-writer"]},
		// Its own identity secret, as deployed: the last value of a name wins.
		"shop-schema": {"SHOP_SCHEMA_ADDR=" + addr["shop-schema"], "SHOP_SCHEMA_ADMIN_ADDR=" + admin["shop-schema"],
			"IDENTITY_SECRET=" + shopSchemaSecret},
		"gateway": {
			"GATEWAY_ADDR=" + addr["gateway"], "GATEWAY_ADMIN_ADDR=" + admin["gateway"],
			// Limits counted apart from every other stack's and run's in
			// the shared Redis: under the default prefix a second run
			// within the minute (go test -count=2, make test again) found
			// the shop schema route's 30 calls a minute per address spent,
			// and got 429s where the cases expect their answers.
			"RATE_LIMIT_KEY_PREFIX=" + testenv.KeyPrefix(t),
		},
	}
	upstreams := []string{
		"EXPORT_READER_URLS=http://" + addr["export-reader"],
		"SALES_WRITER_URLS=http://" + addr["sales-writer"],
		"SHOP_SCHEMA_URLS=http://" + addr["shop-schema"],
	}
	own["gateway"] = append(own["gateway"], upstreams...)
	s = &stack{baseURL: "http://" + addr["gateway"] + "/v1", traces: traces, logs: map[string]*testenv.Output{}, admin: admin, common: common, upstreams: upstreams}
	ended := make(chan string, len(binaries))
	var stops []func()
	stop = func() { // newest first: the gateway before the services it calls
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	for _, name := range []string{"export-reader", "sales-writer", "shop-schema", "gateway"} {
		logs := &testenv.Output{}
		s.logs[name] = logs
		cmd := exec.Command(filepath.Join(bin, name))
		cmd.Env = append(append(append([]string{}, common...), own[name]...), settings...)
		cmd.Stdout, cmd.Stderr = logs, logs
		testenv.DiesWithTest(cmd)
		if err := cmd.Start(); err != nil {
			stop()
			t.Fatalf("start %s: %v", name, err)
		}
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done); ended <- name }()
		stops = append(stops, func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				_ = cmd.Process.Kill()
				<-done
			}
		})
	}
	return s, ended, stop
}

// loopbackListener listens on an address from FreeAddr, as every
// process of the stack does: a test's own servers keep to the same range
// of ports (its httptest servers, the trace receiver and the fake shops,
// are testenv.LoopbackServers, for the same reason).
func loopbackListener(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", testenv.FreeAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// waitHealthy waits up to 30 s for the stack to be healthy, and gives up
// at once when one of its processes exits.
func (s *stack) waitHealthy(exited <-chan string) error {
	deadline := time.After(30 * time.Second)
	for !s.allChecksOK() {
		select {
		case name := <-exited:
			return fmt.Errorf("%w before it was healthy: %s", errExited, name)
		case <-deadline:
			return errors.New("the stack did not become healthy within 30 s")
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}

// waitHearsRevocations waits up to 10 s for the gateway's revocation
// listener to connect, as gatewaytest.Start does: /v1/health does not wait
// for it, and until it listens a cached key is trusted for
// KEY_CACHE_UNHEARD_TTL (an hour in a test that means to see only what
// the listener hears), so a revocation made before it connects is not
// heard at all.
func (s *stack) waitHearsRevocations(t *testing.T) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(s.logs["gateway"].String(), revocationListenerListening); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the gateway's revocation listener did not connect within 10 s:\n%s", s.logs["gateway"].String())
		}
	}
}

// revocationListenerListening is the message of the gateway's line once
// its revocation listener listens (keystore.Listen).
const revocationListenerListening = "revocation listener listening"

// healthClient gives up on a health check that gets no answer: a port
// taken by another process may accept the connection and say nothing.
var healthClient = &http.Client{Timeout: 2 * time.Second}

// allChecksOK reports whether /v1/health answers 200 with every dependency
// and upstream "ok" (the gateway answers 200 even while some are down).
func (s *stack) allChecksOK() bool {
	resp, err := healthClient.Get(s.baseURL + "/health")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var body struct {
		Data struct {
			Checks map[string]string `json:"checks"`
		} `json:"data"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&body) != nil || len(body.Data.Checks) == 0 {
		return false
	}
	for _, state := range body.Data.Checks {
		if state != "ok" {
			return false
		}
	}
	return true
}

// waitHealthy gives up as soon as a process of the stack exits (the stack
// is then started again on new ports), not after its 30 s.
func TestWaitHealthyGivesUpWhenAProcessExits(t *testing.T) {
	s := &stack{baseURL: "http://" + testenv.RefusingAddr(t) + "/v1"}
	exited := make(chan string, 1)
	exited <- "export-reader"
	began := time.Now()
	err := s.waitHealthy(exited)
	if !errors.Is(err, errExited) || time.Since(began) > 10*time.Second {
		t.Fatalf("waitHealthy with a process exited = %v after %v, want errExited at once", err, time.Since(began))
	}
}
