package envconfig

import (
	"bufio"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestDefaultsAndValues(t *testing.T) {
	r := New(env(map[string]string{"N": " 7 ", "D": "3s", "L": " a, ,b ,", "S": " x ", "LOG_LEVEL": "WARN"}))
	got := []any{r.String("S", "d"), r.String("UNSET", "d"), r.Int("N", 1, 0, 10), r.Int("UNSET", 1, 0, 10),
		r.Duration("D", time.Second, 0, time.Minute), r.Duration("UNSET", time.Second, 0, time.Minute),
		r.List("L", ""), r.List("UNSET", "p,q"), r.Bool("UNSET", true), r.LogLevel(), r.OneOf("UNSET", "b", "a", "b")}
	want := []any{"x", "d", 7, 1, 3 * time.Second, time.Second, []string{"a", "b"}, []string{"p", "q"}, true, "warn", "b"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("values (-want +got):\n%s", diff)
	}
	if err := r.Err(); err != nil {
		t.Errorf("Err() = %v, want nil", err)
	}
}

// Every problem names its variable and what it must be, with the value
// quoted when short (what the eye misses shows: a missing unit, a
// zero-width space); a long value, which may be a secret set in the wrong
// variable, only by its length.
func TestEveryProblemNamedWithItsShortValue(t *testing.T) {
	long := strings.Repeat("s", 32)
	r := New(env(map[string]string{"N": long, "BIG": "11", "D": "30", "NEG": "-1s", "B": "yes", "LOG_LEVEL": "verbose",
		"Z": "5\u200b", "A": "8080"}))
	r.Bool("B", false)
	r.LogLevel()
	r.Int("N", 1, 0, 10)
	r.Int("BIG", 1, 0, 10)
	r.Int("Z", 1, 0, 10)
	r.Duration("D", time.Second, time.Millisecond, time.Minute)
	r.Duration("NEG", time.Second, time.Millisecond, time.Minute)
	r.Addr("A", "127.0.0.1:1")
	r.Check(false, "X is required")
	r.Check(true, "never reported")
	err := r.Err()
	if err == nil {
		t.Fatal("Err() = nil, want every problem")
	}
	for _, want := range []string{
		`B must be true or false (got "yes")`, `LOG_LEVEL must be one of debug, info, warn, error (got "verbose")`,
		`N must be an integer from 0 to 10 (got a value of 32 bytes, not shown)`, `BIG must be an integer from 0 to 10 (got "11")`,
		`Z must be an integer from 0 to 10 (got "5\u200b")`, `D must be a duration from 1ms to 1m, such as 1s (got "30")`,
		`NEG must`, `A must be host:port, such as 127.0.0.1:1 (got "8080")`, "X is required",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Err() = %q, lacks %q", err, want)
		}
	}
	if strings.Contains(err.Error(), long) || strings.Contains(err.Error(), "never reported") {
		t.Errorf("Err() = %q, quotes a long value or a passed check", err)
	}
}

func TestSecret(t *testing.T) {
	long := "0123456789abcdef0123456789abcdef"
	r := New(env(map[string]string{"K": long, "K_PREVIOUS": " " + long + "1 , " + long + "2 "}))
	current, previous := r.Secret("K")
	if current != long || !cmp.Equal(previous, []string{long + "1", long + "2"}) || r.Err() != nil {
		t.Errorf("Secret(K) = %q, %q, %v; want the secret, both previous ones, no error", current, previous, r.Err())
	}
	r = New(env(map[string]string{"K": "short-secret", "K_PREVIOUS": long + ",short-previous"}))
	r.Secret("K")
	err := r.Err()
	for _, want := range []string{"K must be at least 32 bytes", "every secret in K_PREVIOUS must be at least 32 bytes"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Err() = %v, lacks %q", err, want)
		}
	}
	if err != nil && strings.Contains(err.Error(), "short-") {
		t.Errorf("Err() = %q quotes a secret", err)
	}
	// A value that would read differently once moved to K_PREVIOUS.
	for _, bad := range []string{long + "\n", " " + long, long[:16] + "," + long[16:]} {
		r = New(env(map[string]string{"K": bad}))
		r.Secret("K")
		if err := r.Err(); err == nil || !strings.Contains(err.Error(), "K must not begin or end with whitespace nor hold a comma") {
			t.Errorf("Secret(K=%q): Err() = %v, want the value refused", bad, err)
		}
	}
	// What is accepted as K reads the same as an entry of K_PREVIOUS.
	r = New(env(map[string]string{"K": long + "-new", "K_PREVIOUS": long}))
	_, previous = r.Secret("K")
	moved := New(env(map[string]string{"K": previous[0], "K_PREVIOUS": long + "-new"}))
	current, previous = moved.Secret("K")
	if current != long || previous[0] != long+"-new" || moved.Err() != nil {
		t.Errorf("after the swap: K = %q, K_PREVIOUS = %q, %v; want the two values unchanged", current, previous, moved.Err())
	}
}

// A secret long enough but of few different bytes (a word repeated to the
// length) is refused, naming the setting and the rule, never the value;
// random values of every usual shape pass.
func TestSecretOfFewDifferentBytes(t *testing.T) {
	for _, weak := range []string{strings.Repeat("s", 32), "changemechangemechangemechangeme", strings.Repeat("password", 4),
		strings.Repeat("ab", 40)} {
		r := New(env(map[string]string{"K": weak, "K_PREVIOUS": weak + weak[:1]}))
		r.Secret("K")
		err := r.Err()
		for _, want := range []string{"K must hold at least 8 different bytes (make one with openssl rand -base64 32)",
			"every secret in K_PREVIOUS must hold at least 8 different bytes"} {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("Secret(K=%q): Err() = %v, lacks %q", weak, err, want)
			}
		}
		if err != nil && strings.Contains(err.Error(), weak[:8]) {
			t.Errorf("Err() = %q quotes the secret", err)
		}
		gw := New(env(map[string]string{"K": weak}))
		gw.SigningSecret("K")
		if err := gw.Err(); err == nil || !strings.Contains(err.Error(), "K must hold at least 8 different bytes") {
			t.Errorf("SigningSecret(K=%q): Err() = %v, want it refused", weak, err)
		}
	}
	for _, random := range []string{"3f9a1c0e7b2d4f6a8c1e3b5d7f9a0c2e", // openssl rand -hex 16
		"q0m3Zk8rX1vY7pL2sW9tB4nE6hJ5cD0aF8gU3iO7yR2=",   // openssl rand -base64 32
		"kG9vQ2xW7mZ4pR8tY1nB6cF3hJ5dL0sA-_uE2iO7yT4wXq", // make run's random_secret
	} {
		r := New(env(map[string]string{"K": random}))
		r.Secret("K")
		if err := r.Err(); err != nil {
			t.Errorf("Secret(a random value) = %v, want it accepted", err)
		}
	}
}

// A listening address is checked when read, and a bad one named.
func TestAddr(t *testing.T) {
	r := New(env(map[string]string{"OK": "0.0.0.0:8080", "ANY": ":9000", "V6": "[::1]:80",
		"NOPORT": "notanaddr", "BADPORT": "127.0.0.1:http", "BIG": "127.0.0.1:70000"}))
	for name, want := range map[string]string{"OK": "0.0.0.0:8080", "ANY": ":9000", "V6": "[::1]:80", "UNSET": "127.0.0.1:1"} {
		if got := r.Addr(name, "127.0.0.1:1"); got != want {
			t.Errorf("Addr(%s) = %q, want %q", name, got, want)
		}
	}
	if err := r.Err(); err != nil {
		t.Fatalf("Err() after good addresses = %v", err)
	}
	for _, name := range []string{"NOPORT", "BADPORT", "BIG"} {
		r.Addr(name, "127.0.0.1:1")
	}
	err := r.Err()
	for _, name := range []string{"NOPORT", "BADPORT", "BIG"} {
		if err == nil || !strings.Contains(err.Error(), name+" must be host:port") {
			t.Errorf("Err() = %v, want %s named", err, name)
		}
	}
}

// A duration in a problem reads as an operator writes it.
func TestShortDurations(t *testing.T) {
	for d, want := range map[time.Duration]string{time.Hour: "1h", 24 * time.Hour: "24h", 10 * time.Minute: "10m",
		90 * time.Second: "1m30s", 90 * time.Minute: "1h30m", 10 * time.Second: "10s", time.Millisecond: "1ms", 0: "0s",
		time.Hour + time.Second: "1h0m1s"} {
		if got := short(d); got != want {
			t.Errorf("short(%v) = %q, want %q", d, got, want)
		}
	}
}

// Two listeners of one binary that would take the same port are refused
// by name at start, not left to the second bind's "address already in
// use", which named neither setting.
func TestSeparateListeners(t *testing.T) {
	tests := []struct {
		a, b    string
		collide bool
	}{
		{"127.0.0.1:8080", "127.0.0.1:8080", true},
		{":8080", "127.0.0.1:8080", true},
		{"0.0.0.0:8080", "127.0.0.1:8080", true},
		{"0.0.0.0:8080", "[::]:8080", true}, // [::] is dual-stack on Linux
		{"[::]:8080", "127.0.0.1:8080", true},
		{"[::]:8080", "[::1]:8080", true},
		{"127.0.0.1:8080", "127.0.0.1:08080", true},
		{"[::ffff:127.0.0.1]:8080", "127.0.0.1:8080", true},
		{"[0:0::1]:8080", "[::1]:8080", true},
		{"LocalHost:8080", "localhost:8080", true},
		{"127.0.0.1:8080", "127.0.0.1:9080", false},
		{"127.0.0.1:8080", "127.0.0.2:8080", false},
		{"0.0.0.0:8080", "[::1]:8080", true}, // Go listens on [::] for 0.0.0.0
		{"[::1]:8080", "[::ffff:0.0.0.0]:8080", true},
		{"127.0.0.1:8080", "[::1]:8080", false},
		{"127.0.0.1:0", "127.0.0.1:0", false}, // the system picks two ports
		// localhost is 127.0.0.1: Go's listener takes its IPv4 address
		// (binding 127.0.0.1:8080 after it failed "address already in
		// use"), never ::1 where it has one, so [::1] beside it listens
		// (TestSeparateListenersAgreesWithTheListener binds them).
		{"localhost:8080", "127.0.0.1:8080", true},
		{"[::1]:8080", "LOCALHOST:8080", false},
		{"[::ffff:127.0.0.1]:8080", "localhost:8080", true},
		{"localhost:8080", ":8080", true},
		{"localhost:8080", "127.0.0.2:8080", false},
		{"localhost:8080", "localhost:9080", false},
		{"myhost:8080", "127.0.0.1:8080", false}, // other names are not resolved (DNS)
	}
	for _, tt := range tests {
		r := New(env(nil))
		r.SeparateListeners("A_ADDR", tt.a, "A_ADMIN_ADDR", tt.b)
		err := r.Err()
		if (err != nil) != tt.collide {
			t.Errorf("SeparateListeners(%q, %q): Err() = %v, want a problem: %v", tt.a, tt.b, err, tt.collide)
		}
		if err != nil && !strings.Contains(err.Error(), "A_ADDR and A_ADMIN_ADDR must be different listening addresses") {
			t.Errorf("SeparateListeners(%q, %q): Err() = %q, want both settings named", tt.a, tt.b, err)
		}
	}
}

// What SeparateListeners says of localhost beside a loopback address is
// what binding them does on this machine: localhost:P and [::1]:P both
// listen (they were refused), localhost:P and 127.0.0.1:P do not. The
// name is looked up only where /etc/hosts holds it, which Go reads before
// DNS (nsswitch's "files dns"): nothing leaves the machine.
func TestSeparateListenersAgreesWithTheListener(t *testing.T) {
	if !hostsFileNames("localhost") {
		t.Skip("/etc/hosts does not name localhost: resolving it could ask DNS")
	}
	for _, other := range []string{"127.0.0.1", "[::1]", "LocalHost"} {
		first, err := net.Listen("tcp", "localhost:0")
		if err != nil {
			t.Fatal(err)
		}
		port := strconv.Itoa(first.Addr().(*net.TCPAddr).Port)
		a, b := "localhost:"+port, other+":"+port
		second, err := net.Listen("tcp", b)
		if err != nil && other == "[::1]" && !strings.Contains(err.Error(), "address already in use") {
			first.Close()
			t.Logf("no IPv6 loopback here (%v): [::1] not checked", err)
			continue
		}
		binds := err == nil
		if binds {
			second.Close()
		}
		first.Close()
		r := New(env(nil))
		r.SeparateListeners("A_ADDR", a, "A_ADMIN_ADDR", b)
		if refused := r.Err() != nil; refused == binds {
			t.Errorf("SeparateListeners(%q, %q) refused: %v, but binding both here succeeded: %v (%v)", a, b, refused, binds, err)
		}
	}
}

// hostsFileNames reports whether /etc/hosts gives name an address.
func hostsFileNames(name string) bool {
	f, err := os.Open("/etc/hosts")
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line, _, _ := strings.Cut(sc.Text(), "#")
		if fields := strings.Fields(line); len(fields) > 1 && slices.ContainsFunc(fields[1:], func(f string) bool { return strings.EqualFold(f, name) }) {
			return true
		}
	}
	return false
}
