package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

func TestMain(m *testing.M) { os.Exit(Run(m)) }

func TestPostgresGivesFreshMigratedDatabases(t *testing.T) {
	a, b := Postgres(t), Postgres(t)
	ctx := context.Background()
	if _, err := a.Exec(ctx, "INSERT INTO owners (name) VALUES ('only in a')"); err != nil {
		t.Fatalf("insert into migrated schema: %v", err)
	}
	var n int
	if err := b.QueryRow(ctx, "SELECT count(*) FROM owners").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("second database has %d owners, want 0 (databases must be separate)", n)
	}
}

func TestRedisServerStopsAndStarts(t *testing.T) {
	srv := StartRedis(t)
	opts, _ := redis.ParseURL(srv.URL)
	c := redis.NewClient(opts)
	defer c.Close()
	ctx := context.Background()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("Ping = %v, want nil", err)
	}
	srv.Stop()
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("Ping after Stop = nil, want an error")
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(ctx).Err(); err != nil {
		t.Errorf("Ping after restart = %v, want nil", err)
	}
}

// redisHelperEnv makes the test binary, started by
// TestRedisServerDiesWithItsTest, start a redis-server of its own and wait
// to be killed.
const redisHelperEnv = "TESTENV_REDIS_HELPER"

// A test binary killed before its cleanups run (go test's -timeout, a
// Ctrl-C) takes the redis-servers it started (StartRedis) with it: they
// served on, orphaned, on their ports.
func TestRedisServerDiesWithItsTest(t *testing.T) {
	if os.Getenv(redisHelperEnv) == "1" {
		StartRedis(t)
		fmt.Println("redis listening")
		select {}
	}
	cmd := StartHelper(t, "TestRedisServerDiesWithItsTest", "redis listening", redisHelperEnv+"=1", "TMPDIR="+helperTempDir(t))
	if left := SurvivorsOfKill(cmd); len(left) > 0 {
		t.Errorf("10 s after their test binary was killed, its redis-servers still run: %v", left)
	}
}

func TestSharedRedis(t *testing.T) {
	opts, err := redis.ParseURL(RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opts)
	defer c.Close()
	key := KeyPrefix(t) + "k"
	if err := c.Set(context.Background(), key, "v", 0).Err(); err != nil {
		t.Fatalf("Set = %v", err)
	}
}

func TestFreeAddrAndOutput(t *testing.T) {
	addr := FreeAddr(t)
	ln, err := net.Listen("tcp", addr)
	if err != nil || !strings.HasPrefix(addr, "127.0.0.1:") {
		t.Fatalf("FreeAddr() = %q, listen: %v; want a loopback address free to listen on", addr, err)
	}
	ln.Close()
	var out Output
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() { defer wg.Done(); fmt.Fprintf(&out, "line %d\n", i) }()
	}
	wg.Wait()
	if got := strings.Count(out.String(), "\n"); got != 8 {
		t.Errorf("Output holds %d lines after 8 concurrent writes, want 8", got)
	}
}

// FreeAddr never gives a port twice while the tests given it run: 200
// ports, taken a round at a time, each round's all held at once.
//
// A round takes at most a tenth of the range, 10 of TEST_PORTS's 100:
// the range is the whole run's, shared by every test binary of go test
// ./... side by side, and pkg/stopsignal's run.sh tests (-parallel 8)
// held up to 76 of 100 at once. Taking a quarter, this test found none
// free (testenv: no loopback port free...) in 5 of 254 runs beside
// pkg/stopsignal on one CPU, and left none for a stopsignal test once.
// In rounds, a FreeAddr that gave ports at random, held or not, repeats
// one in nearly every run still (a round of 10 out of 100 does in 37% of
// rounds, and there are 20); without TEST_PORTS (8,000 ports) it is one
// round of 200, as before.
func TestFreeAddrNeverRepeats(t *testing.T) {
	const n = 200
	round := n
	if low, high := freePortRange(); low < high {
		round = max(1, min(n, (high-low)/10))
	}
	for r := range (n + round - 1) / round {
		t.Run(fmt.Sprintf("round %d", r), func(t *testing.T) {
			seen := map[string]bool{}
			for range round {
				addr := FreeAddr(t)
				if seen[addr] {
					t.Fatalf("FreeAddr returned %s twice", addr)
				}
				seen[addr] = true
			}
		})
	}
}

// FreeAddr's ports are below the kernel's ephemeral range, where no
// listen on ":0" and no outgoing connection of another process can take
// one before the server the test starts listens on it.
func TestFreeAddrIsBelowTheEphemeralRange(t *testing.T) {
	if v := os.Getenv("TEST_PORTS"); v != "" {
		t.Skipf("TEST_PORTS=%s chooses the range", v)
	}
	ephemeralLow, ephemeralHigh, ok := ephemeralRange()
	if !ok {
		t.Skip("no ephemeral range to keep out of here")
	}
	if ephemeralLow < 12000 {
		t.Skipf("the ephemeral range starts at %d: too few ports below it", ephemeralLow)
	}
	for range 50 {
		_, port, err := net.SplitHostPort(FreeAddr(t))
		if err != nil {
			t.Fatal(err)
		}
		if p, _ := strconv.Atoi(port); p < 1024 || p >= ephemeralLow {
			t.Fatalf("FreeAddr gave port %d, want one below the ephemeral range (%d–%d)", p, ephemeralLow, ephemeralHigh)
		}
	}
}

// A Redis started where another already listens (another test binary's
// took the port) is an error, not a pass against the other server, which
// this test's pauses and stops would then hit.
func TestStartRedisRefusesAnotherServersPort(t *testing.T) {
	first := StartRedis(t)
	second := &RedisServer{URL: first.URL, addr: first.addr, dir: t.TempDir()}
	if err := second.Start(); err == nil {
		second.Stop()
		t.Fatalf("a second redis-server on %s started without error, want one: the server answering is the first's", first.addr)
	}
}

// A dial to UnacceptingAddr times out, every time: it is neither refused
// nor made.
func TestUnacceptingAddrTimesOutEveryDial(t *testing.T) {
	addr := UnacceptingAddr(t)
	for range 3 {
		conn, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			conn.Close()
			t.Fatalf("a connection to %s was made, want the dial to time out", addr)
		}
		if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
			t.Fatalf("Dial(%s) = %v, want a timeout", addr, err)
		}
	}
}

// RefusingAddr's port refuses connections, and no listener can take it
// while the test runs: one from FreeAddr, closed, could be taken by any
// process's next listen, and the instance meant to be down then answered.
func TestRefusingAddrCannotBeTaken(t *testing.T) {
	addr := RefusingAddr(t)
	if !strings.HasPrefix(addr, "127.0.0.1:") {
		t.Fatalf("RefusingAddr() = %q, want a loopback address", addr)
	}
	if ln, err := net.Listen("tcp", addr); err == nil {
		ln.Close()
		t.Fatalf("another listener took %s, want the port held until the test ends", addr)
	}
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err == nil {
		conn.Close()
		t.Fatalf("a connection to %s was accepted, want it refused", addr)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("Dial(%s) = %v, want connection refused", addr, err)
	}
}

// RefusingUntilListen's address refuses connections until listen, then
// answers on the same port, which no other listener could take between.
func TestRefusingUntilListenAnswersOnItsAddress(t *testing.T) {
	addr, listen := RefusingUntilListen(t)
	if ln, err := net.Listen("tcp", addr); err == nil {
		ln.Close()
		t.Fatalf("another listener took %s before listen, want the port held", addr)
	}
	if conn, err := net.DialTimeout("tcp", addr, 5*time.Second); err == nil {
		conn.Close()
		t.Fatalf("a connection to %s was accepted before listen, want it refused", addr)
	}
	l := listen()
	if got := l.Addr().String(); got != addr {
		t.Fatalf("listener on %s, want %s", got, addr)
	}
	accepted := make(chan error, 1)
	go func() {
		conn, err := l.Accept()
		if err == nil {
			conn.Close()
		}
		accepted <- err
	}()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("Dial(%s) after listen = %v, want a connection", addr, err)
	}
	conn.Close()
	if err := <-accepted; err != nil {
		t.Fatalf("Accept() = %v", err)
	}
}

// TestPostgresSocketIsPrivate: the clusters of make run, make test and
// testenv trust whoever connects as the superuser, so their Unix socket
// must be closed to other local accounts (before, it was 0777: any account
// on a shared machine could mint API keys or run programs as postgres).
func TestPostgresSocketIsPrivate(t *testing.T) {
	cfg, err := pgx.ParseConfig(adminURL(t))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(cfg.Host, "/") {
		t.Skipf("TEST_DATABASE_URL names no Unix socket (host %q)", cfg.Host)
	}
	socket := filepath.Join(cfg.Host, fmt.Sprintf(".s.PGSQL.%d", cfg.Port))
	info, err := os.Stat(socket)
	if err != nil {
		t.Fatal(err)
	}
	if perm := info.Mode().Perm(); perm&0o077 != 0 {
		t.Errorf("mode of %s = %v, want no access for group and others", socket, perm)
	}
}

// TEST_PORTS gives the range FreeAddr chooses from, both ends included;
// anything else is not a range.
func TestPortsSet(t *testing.T) {
	for _, c := range []struct {
		v         string
		low, high int
		ok        bool
	}{
		{"24200-24299", 24200, 24300, true},
		{"24200-24200", 24200, 24201, true},
		{"24299-24200", 0, 0, false},
		{"24200", 0, 0, false},
		{"0-10", 0, 0, false},
		{"1-65536", 0, 0, false},
		{"a-b", 0, 0, false},
	} {
		low, high, ok := portsSet(c.v)
		if low != c.low || high != c.high || ok != c.ok {
			t.Errorf("portsSet(%q) = %d, %d, %v, want %d, %d, %v", c.v, low, high, ok, c.low, c.high, c.ok)
		}
	}
}

// Under TEST_PORTS, every address FreeAddr gives is in that range.
func TestFreeAddrKeepsToTestPorts(t *testing.T) {
	low, high, ok := portsSet(os.Getenv("TEST_PORTS"))
	if !ok {
		t.Skip("TEST_PORTS is not set")
	}
	for range 5 {
		_, port, _ := net.SplitHostPort(FreeAddr(t))
		if p, _ := strconv.Atoi(port); p < low || p >= high {
			t.Fatalf("FreeAddr gave port %d under TEST_PORTS=%s", p, os.Getenv("TEST_PORTS"))
		}
	}
}

// A port another test binary claimed (the test's own lock on its file
// here, which conflicts as another process's does) is not handed out,
// though nothing listens on it yet: that binary's server is about to.
// Once let go it is, and then this binary holds it.
func TestFreeAddrSkipsAPortAnotherBinaryClaimed(t *testing.T) {
	port, other := unclaimedPort(t)
	t.Setenv("TEST_PORTS", fmt.Sprintf("%d-%d", port, port))
	if addr, err := freeAddrUntilTheEnd(t); err == nil {
		t.Fatalf("FreeAddr with only port %d, claimed by another binary = %s, want none", port, addr)
	}
	other.Close()
	addr, err := freeAddrUntilTheEnd(t)
	if want := fmt.Sprintf("127.0.0.1:%d", port); addr != want || err != nil {
		t.Fatalf("FreeAddr with port %d let go = %q, %v; want %s", port, addr, err, want)
	}
	if f, err := lockPortFile(port); f != nil || err != nil {
		f.Close()
		t.Fatalf("port %d handed out could be claimed again (%v): the claim was not kept", port, err)
	}
}

// A TEST_PORTS in the kernel's ephemeral range is refused, saying why and
// what to do: an outgoing connection of any process may take a port of it
// between FreeAddr and the server's listen. Ports the kernel reserves
// (ip_local_reserved_ports) it never takes, and may be in it.
func TestTestPortsInTheEphemeralRangeAreRefused(t *testing.T) {
	for _, tc := range []struct {
		low, last         int
		reserved          string
		wantFirst, wantTo int
		wantOverlap       bool
	}{
		{24200, 24299, "", 0, 0, false},
		{32700, 32799, "", 32768, 32799, true},
		{32700, 32799, "\n", 32768, 32799, true},
		{32700, 32799, "32768-32799\n", 0, 0, false},
		{32700, 32799, "8080,32768-32780,32790\n", 32781, 32799, true},
		{60990, 61100, "", 60990, 60999, true},
		{61000, 61100, "", 0, 0, false},
	} {
		first, last, ok := ephemeralOverlap(tc.low, tc.last+1, 32768, 60999, tc.reserved)
		if ok != tc.wantOverlap || first != tc.wantFirst || last != tc.wantTo {
			t.Errorf("ephemeralOverlap(%d-%d, reserved %q) = %d, %d, %v; want %d, %d, %v",
				tc.low, tc.last, tc.reserved, first, last, ok, tc.wantFirst, tc.wantTo, tc.wantOverlap)
		}
	}

	ephemeralLow, ephemeralHigh, ok := ephemeralRange()
	if !ok {
		t.Skip("no ephemeral range here")
	}
	reserved, _ := os.ReadFile("/proc/sys/net/ipv4/ip_local_reserved_ports")
	if _, _, ok := ephemeralOverlap(ephemeralLow, ephemeralLow+100, ephemeralLow, ephemeralHigh, string(reserved)); !ok {
		t.Skipf("the kernel reserves ports %d-%d", ephemeralLow, ephemeralLow+99)
	}
	v := fmt.Sprintf("%d-%d", ephemeralLow, ephemeralLow+99)
	t.Setenv("TEST_PORTS", v)
	addr, err := freeAddrUntilTheEnd(t)
	if err == nil || !strings.Contains(err.Error(), "TEST_PORTS="+v+" overlaps the kernel's ephemeral port range") ||
		!strings.Contains(err.Error(), "net.ipv4.ip_local_reserved_ports") {
		t.Errorf("FreeAddr with TEST_PORTS=%s = %q, %v; want it refused, naming the ephemeral range and the sysctl", v, addr, err)
	}
}

// A port FreeAddr gave a test is not given again while the test runs, and
// is given back at its end (after the servers it started stopped): held
// for the binary's life, pkg/stopsignal's run.sh tests, 9 ports each, used
// up a TEST_PORTS of 100 and failed.
func TestFreeAddrGivesAPortBackAfterItsTest(t *testing.T) {
	port := onlyPort(t)
	var first string
	t.Run("its test", func(t *testing.T) {
		first = FreeAddr(t)
		if addr, err := freeAddrUntilTheEnd(t); err == nil {
			t.Errorf("FreeAddr gave %s while its test runs, and %s again", first, addr)
		}
	})
	if addr, err := freeAddrUntilTheEnd(t); addr != first || err != nil {
		t.Fatalf("FreeAddr with only port %d, after the test given it ended = %q, %v; want %s again", port, addr, err, first)
	}
}

// A port whose claim ended (claimHold) while the test given it runs on is
// not given again, and once that test ends it is given again at once: the
// claim taken while it was held was kept, and the port was this binary's
// own for two more minutes.
func TestFreeAddrKeepsNoClaimOfAPortItWillNotGive(t *testing.T) {
	port := onlyPort(t)
	var first string
	t.Run("its test", func(t *testing.T) {
		first = FreeAddr(t)
		givenMu.Lock()
		given[first].Close() // as claimPort's timer does after claimHold
		givenMu.Unlock()
		if addr, err := freeAddrUntilTheEnd(t); err == nil {
			t.Errorf("FreeAddr gave %s while its test runs, and %s again", first, addr)
		}
	})
	if addr, err := freeAddrUntilTheEnd(t); addr != first || err != nil {
		t.Fatalf("FreeAddr with only port %d, after the test given it ended = %q, %v; want %s again", port, addr, err, first)
	}
}

// freeAddrUntilTheEnd is freeAddr whose address is let go when t ends,
// as FreeAddr's is. Held, it stayed this binary's for good, and once its
// claim ended (claimHold) the port tests of a run of the package 2
// minutes later (go test -count=2) were given the same port, unclaimed,
// which freeAddr would never give again: TestFreeAddrSkipsAPortAnotherBinaryClaimed,
// TestFreeAddrGivesAPortBackAfterItsTest and
// TestFreeAddrKeepsNoClaimOfAPortItWillNotGive failed.
func freeAddrUntilTheEnd(t *testing.T) (string, error) {
	addr, err := freeAddr()
	if err == nil {
		t.Cleanup(func() { letGo(addr) })
	}
	return addr, err
}

// onlyPort leaves FreeAddr one port, unclaimed, for the rest of t
// (TEST_PORTS of that port alone).
func onlyPort(t *testing.T) int {
	t.Helper()
	port, lock := unclaimedPort(t)
	lock.Close()
	t.Setenv("TEST_PORTS", fmt.Sprintf("%d-%d", port, port))
	return port
}

// unclaimedPort finds a port of FreeAddr's range that no test binary
// claims, and claims it as another binary would: lock holds the claim.
func unclaimedPort(t *testing.T) (port int, lock *os.File) {
	t.Helper()
	low, high := freePortRange()
	if low == high {
		t.Skip("no port range here: FreeAddr takes the kernel's choice")
	}
	for port = high - 1; port >= low; port-- {
		f, err := lockPortFile(port)
		if err != nil {
			t.Fatal(err)
		}
		if f != nil {
			return port, f
		}
	}
	t.Fatalf("every port of %d-%d is claimed", low, high-1)
	return 0, nil
}

// The claims' folder must be this user's alone: one another user made
// first (its name is predictable), or a link put in its place, or one
// others may write in, is refused, naming what to do, where claims were
// taken in it (that user holding every claim, or its links making the
// claims create files where this user can write).
func TestClaimsAreTakenOnlyInAFolderOfTheUsersOwn(t *testing.T) {
	folder := func(tmp string) string { return filepath.Join(tmp, "testenv-ports-"+strconv.Itoa(os.Getuid())) }
	for name, prepare := range map[string]func(dir string) error{
		"a link to another folder": func(dir string) error { return os.Symlink(t.TempDir(), dir) },
		"a folder others may write in": func(dir string) error {
			if err := os.Mkdir(dir, 0o700); err != nil {
				return err
			}
			return os.Chmod(dir, 0o777)
		},
	} {
		tmp := t.TempDir()
		if err := prepare(folder(tmp)); err != nil {
			t.Fatal(err)
		}
		t.Setenv("TMPDIR", tmp)
		if f, err := lockPortFile(24999); f != nil || err == nil || !strings.Contains(err.Error(), "not a folder of this user's alone") {
			f.Close()
			t.Errorf("%s: lockPortFile = %v, %v; want it refused", name, f, err)
		}
	}
	t.Setenv("TMPDIR", t.TempDir())
	f, err := lockPortFile(24999)
	if f == nil || err != nil {
		t.Fatalf("a fresh folder of its own: lockPortFile = %v, %v; want the claim", f, err)
	}
	f.Close()
}

// WaitFor returns once another goroutine has written the text, which may
// come in pieces.
func TestOutputWaitForSeesTextWrittenLater(t *testing.T) {
	var out Output
	go func() {
		time.Sleep(50 * time.Millisecond)
		out.Write([]byte("PostgreSQL not "))
		out.Write([]byte("reached\n"))
	}()
	out.WaitFor(t, "PostgreSQL not reached")
	if !strings.Contains(out.String(), "PostgreSQL not reached") {
		t.Fatalf("WaitFor returned before the text was written: %q", out.String())
	}
}
