// Package envconfig reads a binary's settings from its environment: each
// value with its default, parsed and range-checked, every problem collected
// so that one start-up error names every bad variable at once. Error
// messages name the variable and what it must be; they quote the value
// only of a setting that is a number, a duration, a boolean, a word or an
// address, and only when short (Shown): a string, a URL or a list may hold
// a secret.
package envconfig

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Reader reads variables through getenv and collects their problems.
type Reader struct {
	getenv func(string) string
	errs   []error
	names  []string // every variable read, for Misspelt
}

// New returns a Reader over getenv (os.Getenv, or a map in tests).
func New(getenv func(string) string) *Reader {
	r := &Reader{}
	r.getenv = func(name string) string {
		r.names = append(r.names, name)
		return getenv(name)
	}
	return r
}

// Names is every variable read so far, sorted, each once.
func (r *Reader) Names() []string {
	return slices.Compact(slices.Sorted(slices.Values(r.names)))
}

// String returns the variable, trimmed, or def when it is unset or blank.
func (r *Reader) String(name, def string) string {
	if v := strings.TrimSpace(r.getenv(name)); v != "" {
		return v
	}
	return def
}

// OneOf returns the variable, lower-cased, if it is one of allowed (in any
// case), def when unset.
func (r *Reader) OneOf(name, def string, allowed ...string) string {
	raw := r.String(name, def)
	v := strings.ToLower(raw)
	if !slices.Contains(allowed, v) {
		r.Failf("%s must be one of %s (got %s)", name, strings.Join(allowed, ", "), Shown(raw))
	}
	return v
}

// LogLevel reads LOG_LEVEL, which every binary has.
func (r *Reader) LogLevel() string {
	return r.OneOf("LOG_LEVEL", "info", "debug", "info", "warn", "error")
}

// Int returns the variable as an integer from min to max, def when unset.
func (r *Reader) Int(name string, def, min, max int) int {
	v := r.String(name, strconv.Itoa(def))
	n, err := strconv.Atoi(v)
	if err != nil || n < min || n > max {
		r.Failf("%s must be an integer from %d to %d (got %s)", name, min, max, Shown(v))
	}
	return n
}

// Duration returns the variable as a duration from min to max (such as
// "10s"), def when unset.
func (r *Reader) Duration(name string, def, min, max time.Duration) time.Duration {
	v := r.String(name, def.String())
	d, err := time.ParseDuration(v)
	if err != nil || d < min || d > max {
		r.Failf("%s must be a duration from %s to %s, such as %s (got %s)", name, short(min), short(max), short(def), Shown(v))
	}
	return d
}

// short writes d as an operator would, without zero minutes or seconds
// after a larger unit: 1h, 24h, 10m, 1m30s (time.Duration's own String
// gives 1h0m0s, 24h0m0s, 10m0s).
func short(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// Addr returns the variable as a listening address, host:port (the host
// may be empty: every interface), checked here so that a typo is reported
// by name with the other problems, not by the listener after the start.
func (r *Reader) Addr(name, def string) string {
	addr := r.String(name, def)
	_, port, err := net.SplitHostPort(addr)
	if n, perr := strconv.Atoi(port); err != nil || perr != nil || n < 0 || n > 65535 {
		r.Failf("%s must be host:port, such as %s (got %s)", name, def, Shown(addr))
	}
	return addr
}

// SeparateListeners records a problem if two listening addresses read
// from nameA and nameB (by Addr) would take the same port of the same
// host: the second listener would otherwise fail at start, after the
// database was reached, with the system's "address already in use" naming
// neither setting. ":8080", "0.0.0.0:8080" and "[::]:8080" take every
// address's port 8080, IPv4's and IPv6's alike, so each collides with
// 127.0.0.1:8080 and [::1]:8080: Go's net.Listen("tcp", …) opens one
// dual-stack socket on [::] for either wildcard, 0.0.0.0 included
// (golang/go#9334). Port 0 (the system picks one) never collides.
// "localhost" counts as 127.0.0.1: Go's listener takes the first IPv4
// address a name has (net.ListenConfig.Listen, addrs.first(isIPv4)), and
// every hosts file in use gives localhost 127.0.0.1 (many ::1 too, which
// the listener passes over), so localhost:8080 beside [::1]:8080 both
// listen. A host whose localhost has ::1 alone would take [::1]: there
// the second bind's own error says so. Other host names are compared as
// written, not resolved: looking them up at start could ask DNS.
func (r *Reader) SeparateListeners(nameA, addrA, nameB, addrB string) {
	if listenersCollide(addrA, addrB) {
		r.Failf("%s and %s must be different listening addresses (got %s and %s: the same port of the same host)",
			nameA, nameB, Shown(addrA), Shown(addrB))
	}
}

// listenersCollide reports whether listening on a and on b (host:port)
// would take one port twice.
func listenersCollide(a, b string) bool {
	hostA, portA, errA := net.SplitHostPort(a)
	hostB, portB, errB := net.SplitHostPort(b)
	if errA != nil || errB != nil {
		return false // Addr reported it
	}
	pa, errA := strconv.Atoi(portA)
	pb, errB := strconv.Atoi(portB)
	if errA != nil || errB != nil || pa != pb || pa == 0 {
		return false
	}
	ka, kb := listenHost(hostA), listenHost(hostB)
	return ka.everyAddress || kb.everyAddress || ka.host == kb.host
}

// listenKind is what a listening address's host takes.
type listenKind struct {
	everyAddress bool   // "", "0.0.0.0", "::": every address, IPv4 and IPv6
	host         string // the address in canonical form, or the name in lower case
}

func listenHost(host string) listenKind {
	if host == "" {
		return listenKind{everyAddress: true}
	}
	if strings.EqualFold(host, "localhost") { // the one name read: Go listens on its IPv4 address
		return listenKind{host: "127.0.0.1"}
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return listenKind{host: strings.ToLower(host)}
	}
	ip = ip.Unmap()
	if ip.IsUnspecified() { // 0.0.0.0 too: Go listens on [::] for it
		return listenKind{everyAddress: true}
	}
	return listenKind{host: ip.String()}
}

// List returns the comma-separated variable's non-blank items, trimmed;
// def is used when the variable is unset.
func (r *Reader) List(name, def string) []string {
	var out []string
	for part := range strings.SplitSeq(r.String(name, def), ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}

// Secret reads the required secret name (at least MinSecretBytes, of which
// minSecretDistinct differ) and name_PREVIOUS, the comma-separated secrets
// accepted besides it while it is rotated (each held to the same rule):
// what they signed is still read, and what is signed uses name alone.
//
// A rotation moves a value from one variable to the other, so a value must
// read the same in both: the list's entries are trimmed, and the current
// secret, read as it is (an older release did so), is refused if it would
// not survive that (surrounding whitespace, such as the newline a secret
// made from a file may end with, or a comma).
func (r *Reader) Secret(name string) (current string, previous []string) {
	current = r.SigningSecret(name)
	previous = r.List(name+"_PREVIOUS", "")
	for _, p := range previous {
		if len(p) < MinSecretBytes {
			r.Failf("every secret in %s_PREVIOUS must be at least %d bytes", name, MinSecretBytes)
			break
		}
		if !variedSecret(p) {
			r.Failf("every secret in %s_PREVIOUS must hold at least %d different bytes%s", name, minSecretDistinct, makeSecret)
			break
		}
	}
	return current, previous
}

// SigningSecret reads the required secret name alone, for a binary that
// only signs with it (the gateway): at least MinSecretBytes, of which at
// least minSecretDistinct differ, and, by Secret's rule, a value that
// reads the same once listed in name_PREVIOUS.
func (r *Reader) SigningSecret(name string) string {
	secret := r.getenv(name)
	r.Check(len(secret) >= MinSecretBytes, fmt.Sprintf("%s must be at least %d bytes%s", name, MinSecretBytes, makeSecret))
	r.Check(len(secret) < MinSecretBytes || variedSecret(secret),
		fmt.Sprintf("%s must hold at least %d different bytes%s", name, minSecretDistinct, makeSecret))
	r.Check(len(secret) < MinSecretBytes || (secret == strings.TrimSpace(secret) && !strings.Contains(secret, ",")),
		name+" must not begin or end with whitespace nor hold a comma: moved to "+name+"_PREVIOUS when rotated, it would read differently")
	return secret
}

// MinSecretBytes is the shortest HMAC secret accepted: SHA-256's output,
// below which RFC 2104 (section 3) discourages an HMAC key; 32 random
// characters of hex are 128 bits.
const MinSecretBytes = 32

// minSecretDistinct is how many different bytes a secret must hold at
// least. Length alone let a word repeated to 32 bytes pass
// ("changemechangemechangemechangeme", 32 "s": 7 and 1 different bytes);
// Django's deployment check likewise wants 5 different characters of its
// SECRET_KEY. A random value never fails it in practice: 32 hex
// characters hold fewer than 8 different ones once in 28 million.
const minSecretDistinct = 8

// makeSecret ends a refusal of a secret with how to make one.
const makeSecret = " (make one with openssl rand -base64 32)"

// variedSecret reports whether secret holds at least minSecretDistinct
// different bytes.
func variedSecret(secret string) bool {
	var seen [256]bool
	distinct := 0
	for i := 0; i < len(secret) && distinct < minSecretDistinct; i++ {
		if !seen[secret[i]] {
			seen[secret[i]] = true
			distinct++
		}
	}
	return distinct >= minSecretDistinct
}

// Check records msg as a problem unless ok: for rules across variables or
// beyond a type's range (required values, secret lengths).
func (r *Reader) Check(ok bool, msg string) {
	if !ok {
		r.errs = append(r.errs, errors.New(msg))
	}
}

// Failf records a problem.
func (r *Reader) Failf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Errorf(format, args...))
}

// Err is every problem recorded, or nil.
func (r *Reader) Err() error {
	if err := errors.Join(r.errs...); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	return nil
}

// Bool returns the variable as a boolean (1, t, true, 0, f, false, …), def
// when unset.
func (r *Reader) Bool(name string, def bool) bool {
	v := r.String(name, strconv.FormatBool(def))
	b, err := strconv.ParseBool(v)
	if err != nil {
		r.Failf("%s must be true or false (got %s)", name, Shown(v))
	}
	return b
}

// maxShown is the longest value a problem quotes. A number, a duration, a
// boolean, a word or an address is shorter; a longer value may be a secret
// set in the wrong variable (the project's secrets are at least 32 bytes).
const maxShown = 24

// Shown is a value as a problem names it: quoted, so that what the eye
// misses shows ("30" for 30s, "5\u200b"), or only its length when longer
// than maxShown. For the values of settings that hold no secret only.
func Shown(v string) string {
	if len(v) > maxShown {
		return fmt.Sprintf("a value of %d bytes, not shown", len(v))
	}
	return strconv.Quote(v)
}
