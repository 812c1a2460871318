package testenv

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/envelope"
)

// FreeAddr returns a loopback address with a port free at the time of the
// call, for a server the test starts itself (a binary's run, a process).
// It never returns an address it gave a test still running: two servers
// of one stack were once given the same port; nor one that another test
// binary of this user was given in the last two minutes (claimPort). At
// the end of the test (its cleanups, after those of the servers it started
// after this call), the address is let go for the tests after it: held
// for the binary's life, pkg/stopsignal's run.sh tests, 9 ports each, used
// up a TEST_PORTS of 100 and failed. A server stopped by a cleanup
// registered before this call is stopped after its port is let go: stop
// it in a cleanup registered after (pkg/stopsignal's runScript.freeAddr).
//
// Between this call and the server's listen, the port is free for anyone
// to take, so it is chosen below the kernel's ephemeral range (Linux's
// ip_local_port_range, 32768 and up unless set otherwise): every listen on
// ":0" and every outgoing connection of every process takes its port from
// that range, and one of them took a port handed out here about once in
// 14,000 (another test binary running beside this one). Below it, only
// another FreeAddr choosing the same random port within those few
// milliseconds could.
func FreeAddr(t testing.TB) string {
	t.Helper()
	addr, err := freeAddr()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { letGo(addr) })
	return addr
}

// freeAddr is FreeAddr for callers without a test (a Redis the harness
// starts for a whole test binary).
func freeAddr() (string, error) {
	givenMu.Lock()
	defer givenMu.Unlock()
	if v := os.Getenv("TEST_PORTS"); v != "" {
		low, high, ok := portsSet(v)
		if !ok {
			return "", fmt.Errorf("testenv: TEST_PORTS=%q is not low-high (24200-24299)", v)
		}
		if err := outsideEphemeralRange(v, low, high); err != nil {
			return "", err
		}
	}
	low, high := freePortRange()
	for range 1000 {
		port := 0 // the kernel's choice, where there is no range to keep out of
		var claim *os.File
		if low < high {
			port = low + rand.IntN(high-low)
			var err error
			if claim, err = claimPort(port); err != nil {
				return "", err
			}
			if claim == nil {
				continue // another test binary's, or a running test's of this one
			}
		}
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if errors.Is(err, syscall.EADDRINUSE) && port != 0 {
			claim.Close()
			continue // another one
		}
		if err != nil {
			claim.Close()
			return "", err
		}
		addr := ln.Addr().String()
		ln.Close()
		if _, held := given[addr]; !held {
			given[addr] = claim
			return addr, nil
		}
		// A port a test of this binary still holds, whose claim ended
		// (claimHold) while the test ran on: the claim just taken would
		// keep it from this binary for claimHold after that test let go.
		claim.Close()
	}
	return "", errors.New("testenv: no loopback port free that was not handed out already")
}

// freePortRange returns the ports [low, high) FreeAddr chooses from: from
// 22000 up to the ephemeral range or to 30000, whichever comes first (the
// ports above are Kubernetes' NodePorts, which kube-proxy may answer on a
// runner's loopback; those below, the usual ones of PostgreSQL, Redis and
// make run's stack), or low == high where that range cannot be read (not
// Linux) or leaves fewer than 1,000 ports below it.
//
// TEST_PORTS=low-high (inclusive) chooses from those ports instead: a
// machine whose runs share loopback (several checkouts tested at once)
// gives each its own range. One in the kernel's ephemeral range is
// refused (outsideEphemeralRange).
func freePortRange() (low, high int) {
	if low, high, ok := portsSet(os.Getenv("TEST_PORTS")); ok {
		return low, high
	}
	ephemeralLow, _, ok := ephemeralRange()
	if !ok {
		return 0, 0
	}
	low, high = 22000, min(ephemeralLow, 30000)
	if high-low < 1000 {
		return 0, 0
	}
	return low, high
}

// portsSet reads TEST_PORTS's "low-high", inclusive, as [low, high+1).
func portsSet(v string) (low, high int, ok bool) {
	from, to, found := strings.Cut(v, "-")
	if !found {
		return 0, 0, false
	}
	low, err1 := strconv.Atoi(from)
	last, err2 := strconv.Atoi(to)
	if err1 != nil || err2 != nil || low < 1 || last > 65535 || last < low {
		return 0, 0, false
	}
	return low, last + 1, true
}

// claimPort claims port for claimHold among the test binaries of this
// user: the binaries of one go test ./... run side by side on one range
// (TEST_PORTS gives each run, not each binary, its own), and FreeAddr's
// listen finds a port free that another binary has handed out and not yet
// listened on (a stack's binaries take a second or more to start). Four
// binaries side by side on 70 ports, each listening 100 ms after
// FreeAddr, had 8 of 240 ports taken by another's listen (none since).
// The claim is an flock on a file named by the port, which the kernel
// lets go when the binary ends, however it ends, and the binary after
// claimHold: by then its server listens, and FreeAddr's listen finds it
// taken; held for the binary's life, a few binaries each given 50 ports
// would use up a range of 100 between them. nil: another binary holds
// it, or this one does.
func claimPort(port int) (*os.File, error) {
	f, err := lockPortFile(port)
	if f == nil || err != nil {
		return nil, err
	}
	time.AfterFunc(claimHold, func() { f.Close() }) // keeps f, whose finalizer would let the claim go, until then
	return f, nil
}

// claimHold is how long claimPort holds a claim: far longer than a server
// takes to listen once given its port.
const claimHold = 2 * time.Minute

// lockPortFile opens port's claim file and locks it, exclusively and
// without waiting: nil when another open of it holds the lock (another
// binary's, or this one's).
func lockPortFile(port int) (*os.File, error) {
	dir := filepath.Join(os.TempDir(), "testenv-ports-"+strconv.Itoa(os.Getuid()))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("testenv: claiming a port: %w", err)
	}
	if err := ownFolder(dir); err != nil {
		return nil, err
	}
	// O_NOFOLLOW: a link in the folder is not followed (ownFolder keeps
	// others out of it; this keeps a stray link from creating a file
	// elsewhere).
	f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(port)), os.O_RDONLY|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("testenv: claiming a port: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, nil
		}
		return nil, fmt.Errorf("testenv: claiming port %d: %w", port, err)
	}
	return f, nil
}

// ownFolder checks that dir, the claims' folder under the shared temp
// folder, is a folder of this user's alone, not a link: another user who
// made it first (its name is predictable) could hold every claim, or
// plant links that make the claims create files where this user can
// write.
func ownFolder(dir string) error {
	info, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("testenv: claiming a port: %w", err)
	}
	st, ok := info.Sys().(*syscall.Stat_t)
	if !info.IsDir() || !ok || int(st.Uid) != os.Getuid() || info.Mode().Perm()&0o077 != 0 {
		return fmt.Errorf("testenv: claiming a port: %s is not a folder of this user's alone (mode %v): remove it, or set TMPDIR to a folder of your own", dir, info.Mode())
	}
	return nil
}

// outsideEphemeralRange refuses a TEST_PORTS (v, [low, high)) that
// overlaps the kernel's ephemeral range, where every outgoing connection
// and every listen on ":0" of every process takes its port: one may take
// a port FreeAddr handed out before the test's server listens on it, and
// the test fails with "address already in use" (one in 14,000 ports, when
// FreeAddr's own range was not kept out of it). Ports the kernel reserves
// (ip_local_reserved_ports) it never hands out, and may be in the range.
func outsideEphemeralRange(v string, low, high int) error {
	ephemeralLow, ephemeralHigh, ok := ephemeralRange()
	reserved, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_reserved_ports")
	if !ok || err != nil {
		return nil // not Linux: no range to read
	}
	first, last, overlaps := ephemeralOverlap(low, high, ephemeralLow, ephemeralHigh, string(reserved))
	if !overlaps {
		return nil
	}
	return fmt.Errorf("testenv: TEST_PORTS=%s overlaps the kernel's ephemeral port range %d-%d (/proc/sys/net/ipv4/ip_local_port_range) "+
		"at %d-%d: any process's outgoing connection may take one of those ports before the test's server listens on it; "+
		"choose ports below %d, or have the kernel keep them (sysctl -w net.ipv4.ip_local_reserved_ports=%d-%d)",
		v, ephemeralLow, ephemeralHigh, first, last, ephemeralLow, first, last)
}

// ephemeralRange is the kernel's ephemeral port range, both ends
// included (ip_local_port_range, "32768\t60999"); false where it cannot be
// read (not Linux).
func ephemeralRange() (low, high int, ok bool) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0, 0, false
	}
	if _, err := fmt.Sscan(string(b), &low, &high); err != nil {
		return 0, 0, false
	}
	return low, high, true
}

// ephemeralOverlap returns the first and last port of [low, high) that
// are in the ephemeral range [ephemeralLow, ephemeralHigh] and not in
// reserved ("8080,9000-9010", as ip_local_reserved_ports reads); false
// when there is none.
func ephemeralOverlap(low, high, ephemeralLow, ephemeralHigh int, reserved string) (first, last int, ok bool) {
	var kept [][2]int
	for _, r := range strings.Split(strings.TrimSpace(reserved), ",") {
		from, to, _ := strings.Cut(r, "-")
		a, errA := strconv.Atoi(from)
		b, errB := strconv.Atoi(cmp.Or(to, from))
		if errA == nil && errB == nil {
			kept = append(kept, [2]int{a, b})
		}
	}
	for port := max(low, ephemeralLow); port < high && port <= ephemeralHigh; port++ {
		if !slices.ContainsFunc(kept, func(r [2]int) bool { return r[0] <= port && port <= r[1] }) {
			if !ok {
				first, ok = port, true
			}
			last = port
		}
	}
	return first, last, ok
}

// given holds the addresses FreeAddr returned and no test has let go of,
// each with its claim (claimPort; nil for the kernel's choice).
var (
	givenMu sync.Mutex
	given   = map[string]*os.File{}
)

// letGo gives addr back at the end of the test FreeAddr gave it to.
func letGo(addr string) {
	givenMu.Lock()
	claim := given[addr]
	delete(given, addr)
	givenMu.Unlock()
	claim.Close() // nil, or closed already after claimHold: nothing to do
}

// Output collects what a server under test writes (its logs) while the
// test reads it: writes and reads may come from different goroutines.
type Output struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (o *Output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.Write(p)
}

// String returns everything written so far.
func (o *Output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}

// Drain returns what was written since the last Drain (everything, at the
// first) and forgets it: a fuzz target that reads the lines of each input
// alone keeps neither a log that grows with every input nor its copies.
func (o *Output) Drain() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	text := o.buf.String()
	o.buf.Reset()
	return text
}

// WaitFor waits until text has been written, and fails the test with all
// that was written if it is not within 30 s.
func (o *Output) WaitFor(t testing.TB, text string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(o.String(), text); {
		if time.Now().After(deadline) {
			t.Fatalf("%q was not written within 30 s:\n%s", text, o.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// WantCleanStopWhilePostgreSQLIsAwaited checks a binary's run against a
// stop that comes while PostgreSQL is still awaited (the database not up
// yet when the pod starts): run, given a database that refuses
// connections, says it is waiting, and once stopped returns nil (the
// process exits 0) and says why nothing was served.
func WantCleanStopWhilePostgreSQLIsAwaited(t *testing.T, run func(ctx context.Context, dsn string, logs *Output) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel) // ends run if WaitFor fails the test
	var logs Output
	done := make(chan error, 1)
	dsn := "postgres://u@" + RefusingAddr(t) + "/x"
	go func() { done <- run(ctx, dsn, &logs) }()
	logs.WaitFor(t, "PostgreSQL not reached")
	cancel()
	if err := <-done; err != nil {
		t.Errorf("run() = %v after a stop while PostgreSQL was awaited, want nil (exit 0)", err)
	}
	if !strings.Contains(logs.String(), "stopped before PostgreSQL was reached") {
		t.Errorf("log does not say the stop came before PostgreSQL was reached:\n%s", logs.String())
	}
}

// WantUnreadyUntilMigrated checks a service's readiness against the schema:
// start runs the service's binary on a database one migration behind the
// build, listening on addr and logging to logs, and returns the function
// that stops it. Its /healthz must answer 503 not_ready, with a log line
// saying what to run, until the migration is there, and 200 after.
func WantUnreadyUntilMigrated(t *testing.T, start func(dsn, addr string, logs *Output) (stop func())) {
	t.Helper()
	dsn := PostgresURL(t)
	migrated := forgetLatestMigration(t, dsn)
	addr := FreeAddr(t)
	var out Output
	defer start(dsn, addr, &out)()
	url := "http://" + addr + "/healthz"
	if status, code := health(t, url); status != http.StatusServiceUnavailable || code != "not_ready" {
		t.Errorf("/healthz with the schema behind = %d %q, want 503 not_ready", status, code)
	}
	if !strings.Contains(out.String(), "run exportctl migrate") {
		t.Errorf("the log does not say what to run:\n%s", out.String())
	}
	migrated()
	if status, code := health(t, url); status != http.StatusOK {
		t.Errorf("/healthz once migrated = %d %q, want 200", status, code)
	}
}

// health polls url (a service's /healthz) until its server answers, and
// returns the status and, for an error envelope, its code.
func health(t testing.TB, url string) (status int, code string) {
	t.Helper()
	var resp *http.Response
	var err error
	for range 100 {
		if resp, err = http.Get(url); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("testenv: %s never answered: %v", url, err)
	}
	defer resp.Body.Close()
	var body envelope.Parsed
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatalf("testenv: %s: %v", url, err)
	}
	if body.Error != nil {
		code = body.Error.Code
	}
	return resp.StatusCode, code
}
