// Package upstream sends requests to the instances of one service: one
// reused fasthttp client per instance with connect/read/write timeouts,
// round-robin balancing (or rendezvous hashing where a request asks for
// affinity), failed instances skipped for a while and probed back, and a
// retry only where it is safe.
package upstream

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/coinexport/export/gateway/lazydeadline"
	"github.com/coinexport/export/gateway/monotime"
	"github.com/coinexport/export/pkg/acceptretry"
	"github.com/coinexport/export/pkg/rawio"
	"github.com/valyala/fasthttp"
)

// Error kinds, as the gateway maps them to statuses.
var (
	// ErrUnavailable: every instance is marked down; nothing was sent.
	ErrUnavailable = errors.New("upstream: no instance available")
	// ErrUnreachable: the connection could not be made.
	ErrUnreachable = errors.New("upstream: unreachable")
	// ErrShortage comes with ErrUnreachable when the gateway itself could
	// not open the connection, out of file descriptors or memory: nothing
	// was sent, and the instance is not to blame (shortageError).
	ErrShortage = errors.New("upstream: the gateway is out of file descriptors or memory")
	// ErrTimeout: the instance did not answer in time.
	ErrTimeout = errors.New("upstream: timeout")
	// ErrClosed: the instance closed the connection before the first byte
	// of an answer, typically a kept-alive connection it had already
	// dropped (a restart); the request may or may not have been read.
	ErrClosed = errors.New("upstream: connection closed")
	// ErrBadResponse: the connection broke or the answer was not HTTP.
	ErrBadResponse = errors.New("upstream: bad response")
)

// Options tune every instance's client.
type Options struct {
	ConnectTimeout time.Duration
	ReadTimeout    time.Duration
	WriteTimeout   time.Duration
	// DownFor is how long an instance that refused a connection (or did
	// not accept one within ConnectTimeout) is skipped before it is tried
	// again.
	DownFor time.Duration
	// MaxConns bounds the connections to one instance.
	MaxConns int
	// OnStateChange, if set, hears of an instance marked down (it refused a
	// connection, or its health probe failed) and of one whose probe
	// answers again: once per change, in the order of the changes, on the
	// goroutine that saw it and under the instance's state lock, so it
	// must return quickly.
	OnStateChange func(StateChange)
	// SignProbe, if set, adds headers to each health probe: the gateway
	// signs its identity there, so that an instance that would refuse
	// every request's identity (another IDENTITY_SECRET) fails its probe
	// and is taken out, instead of looking healthy.
	SignProbe func(h *fasthttp.RequestHeader)
	// ReadWholeUpTo, when above zero, makes every answer be read whole
	// before the first byte goes to the client, and bounds it: an instance
	// that fails halfway through an answer, or sends more, then gets the
	// client a 502 envelope instead of an answer cut short. Zero streams
	// answers of any size through. A caller may ask for one answer as a
	// stream all the same (Response.StreamBody set before Do, kept for a
	// repeat): the bound does not apply to it.
	ReadWholeUpTo int
}

// StateChange is an instance marked down, or up again.
type StateChange struct {
	Upstream string
	Instance string // scheme://host:port, for operators only
	Up       bool
	Reason   string
}

// Instance is one address of a service.
type Instance struct {
	base   string // scheme://host:port, never shown to clients
	host   string // base's host and port, apart, for spans (server.address, server.port)
	port   int
	client *fasthttp.HostClient
	// probe is the health probe's own client: the probe must not queue
	// behind a saturated proxy pool, nor draw a kept-alive connection the
	// instance dropped when it restarted, or a healthy instance would be
	// taken out under load or for long after a restart.
	probe     *fasthttp.HostClient
	signProbe func(h *fasthttp.RequestHeader) // Options.SignProbe
	// downUntil is the monotime.Instant the instance is out until (0 =
	// up), read by pick without a lock: on the monotonic clock, so that a
	// step of the wall clock neither keeps an instance out for as long as
	// the clock went back (a probe left unanswered does not put it back)
	// nor brings one that answers 5xx back at once.
	downUntil atomic.Int64
	// stateMu orders the changes of downUntil that are told with the
	// telling, so that the last change told is the state in force: a
	// request that saw a refusal and the prober that saw an answer may
	// race. Only failures and the prober take it.
	stateMu sync.Mutex
	// toldDown is whether the last change told (OnStateChange) was a
	// down: a dead instance is marked down again on every probe and every
	// refused connection, and told once.
	toldDown   bool
	toldReason string // why, when toldDown
	// unansweredProbes counts the probes in a row the instance left
	// unanswered (touched only by the instance's probe under way), and
	// nextProbe is when an instance that is up is probed next (touched
	// only by the prober's loop); probing is set while a probe is under
	// way, so that there is at most one.
	unansweredProbes int
	nextProbe        time.Time
	probing          atomic.Bool
	// seed is the instance's own hash for rendezvous hashing: derived from
	// its address, so every gateway ranks the instances alike.
	seed uint64
}

// Upstream is a service with one or more instances.
type Upstream struct {
	Name string
	// sources are the configured URLs; with discovery (Discover) each one
	// whose host is a name stands for every address the name resolves to.
	sources []*url.URL
	// resolved holds, per source, the bases it stood for after the last
	// round of discovery (the source itself before any): a source that
	// fails to resolve keeps them. discoverMu serializes the rounds.
	resolved   [][]string
	discoverMu sync.Mutex
	// instances is replaced whole when discovery changes the set, so a
	// request reads one consistent set without a lock.
	instances atomic.Pointer[[]*Instance]
	next      atomic.Uint64
	opts      Options
}

// New parses urls (http:// or https://, no path) into an Upstream.
func New(name string, urls []string, opts Options) (*Upstream, error) {
	if len(urls) == 0 {
		return nil, fmt.Errorf("upstream %s: no instance URL", name)
	}
	u := &Upstream{Name: name, opts: opts}
	instances := make([]*Instance, 0, len(urls))
	for _, raw := range urls {
		p, err := ParseInstanceURL(raw)
		if err != nil {
			return nil, fmt.Errorf("upstream %s: %w", name, err)
		}
		u.sources = append(u.sources, p)
		u.resolved = append(u.resolved, []string{Base(p)})
		instances = append(instances, newInstance(p, opts))
	}
	u.instances.Store(&instances)
	return u, nil
}

// ErrInstanceURL is a malformed instance URL. Its text never quotes the
// URL, which may hold credentials.
var ErrInstanceURL = errors.New("upstream: an instance URL must be http(s)://host[:port], without credentials, path or query")

// ParseInstanceURL reads http(s)://host[:port]: no user info (the services
// authenticate the gateway by the signed identity, and a password here
// would reach logs), no path, no query. A port written is one from 1 to
// 65535: url.Parse takes any digits, and an instance was then dialled on
// its scheme's port (http://reader:80810 reached reader:80), as it was for
// an empty one (http://reader:, what http://reader:${PORT} leaves when
// PORT is unset).
func ParseInstanceURL(raw string) (*url.URL, error) {
	p, err := url.Parse(strings.TrimSpace(raw))
	if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" || p.User != nil ||
		(p.Path != "" && p.Path != "/") || p.RawQuery != "" || p.Fragment != "" || !validPort(p) {
		return nil, ErrInstanceURL
	}
	return p, nil
}

// validPort reports whether p has no port or one from 1 to 65535.
func validPort(p *url.URL) bool {
	if !strings.HasSuffix(p.Host, ":") && p.Port() == "" {
		return true
	}
	n, err := strconv.ParseUint(p.Port(), 10, 16)
	return err == nil && n > 0
}

// current is the set of instances requests are sent to now.
func (u *Upstream) current() []*Instance { return *u.instances.Load() }

func newInstance(p *url.URL, opts Options) *Instance {
	addr := net.JoinHostPort(p.Hostname(), strconv.Itoa(int(portOf(p))))
	isTLS := p.Scheme == "https"
	dial := dialer(opts.ConnectTimeout)
	dialLazy := requestDialer(dial, opts, isTLS)
	base := Base(p)
	return &Instance{
		base:      base,
		host:      p.Hostname(),
		port:      int(portOf(p)),
		seed:      xxhash.Sum64String(base),
		signProbe: opts.SignProbe,
		probe: &fasthttp.HostClient{
			Addr:                      addr,
			IsTLS:                     isTLS,
			Dial:                      dial,
			MaxConns:                  1,
			MaxIdemponentCallAttempts: 1,
			NoDefaultUserAgentHeader:  true,
		},
		client: &fasthttp.HostClient{
			Addr:                      addr,
			IsTLS:                     isTLS,
			Dial:                      dialLazy,
			ReadTimeout:               opts.ReadTimeout,
			WriteTimeout:              opts.WriteTimeout,
			MaxConns:                  opts.MaxConns,
			MaxIdleConnDuration:       30 * time.Second,
			MaxConnWaitTimeout:        opts.ConnectTimeout,
			MaxIdemponentCallAttempts: 1, // retries are decided here, not by fasthttp
			RetryIfErr:                func(*fasthttp.Request, int, error) (bool, bool) { return false, false },
			StreamResponseBody:        opts.ReadWholeUpTo <= 0,
			MaxResponseBodySize:       max(opts.ReadWholeUpTo, 0),
			DisablePathNormalizing:    true,
			NoDefaultUserAgentHeader:  true,
		},
	}
}

// dialer connects to an instance within connect, over IPv6 too
// (fasthttp.Dial is IPv4 only), and marks why a connection was not made:
// the gateway's own shortage of descriptors or memory (shortageError), or
// the connect step (dialError).
func dialer(connect time.Duration) fasthttp.DialFunc {
	return func(addr string) (net.Conn, error) {
		c, err := fasthttp.DialDualStackTimeout(addr, connect)
		if acceptretry.Shortage(err) {
			return nil, shortageError{err}
		}
		if err != nil {
			return nil, dialError{err}
		}
		return rawio.Wrap(c), nil // reads and writes without waking the runtime's monitor
	}
}

// requestDialer is dial for the connections requests are sent on: their
// per-request write and read deadlines are set lazily (lazydeadline), and
// a plain connection's answers are watched (watch). The probe dials with
// dial alone, so that its short timeouts are kept exact.
func requestDialer(dial fasthttp.DialFunc, opts Options, isTLS bool) fasthttp.DialFunc {
	tick := lazydeadline.TickFor(opts.ReadTimeout, opts.WriteTimeout)
	return func(addr string) (net.Conn, error) {
		c, err := dial(addr)
		if err != nil {
			return nil, err
		}
		if isTLS {
			// fasthttp puts TLS over the connection Dial returns: under
			// it, the watch would read ciphertext, and take a few of
			// its bytes for a status to refuse.
			return lazydeadline.Wrap(c, tick), nil
		}
		return watch(lazydeadline.Wrap(c, tick)), nil
	}
}

// dialError marks an error of the connect step: the request never left.
type dialError struct{ err error }

func (e dialError) Error() string { return e.err.Error() }
func (e dialError) Unwrap() error { return e.err }

// reason is why an instance whose connect step failed is taken out: it
// refused the connection (its process is gone), or did not accept it
// within ConnectTimeout (its host is gone, or the network drops packets),
// which is another place to look.
func (e dialError) reason() string {
	var ne net.Error
	if errors.Is(e.err, fasthttp.ErrDialTimeout) || (errors.As(e.err, &ne) && ne.Timeout()) {
		return reasonNotAccepted
	}
	return reasonRefused
}

// shortageError is a connection the gateway could not even try: it is out
// of file descriptors or memory (EMFILE from socket()). Nothing was sent,
// as for a refusal, but the instance is not to blame: taken for a refusal,
// every instance of every upstream was marked down with "it refused a
// connection", and on-call was sent to services that were fine.
type shortageError struct{ err error }

func (e shortageError) Error() string {
	return "the gateway is out of file descriptors or memory: " + e.err.Error()
}
func (e shortageError) Unwrap() error { return e.err }

// Is makes a shortage ErrShortage, so callers outside the package can
// tell it from the instance's refusal.
func (e shortageError) Is(target error) bool { return target == ErrShortage }

// Repeat says when a request may be sent a second time, to another
// instance (after a closed connection, to a lone one again, on a new
// connection: Do), after a failure that happened once it may have arrived.
type Repeat struct {
	// Always: repeating is harmless (an Idempotency-Key makes a sale safe
	// to repeat), whatever the failure.
	Always bool
	// IfClosed: the request is safe (GET) and may be repeated when the
	// connection was found closed before any answer, the usual fate of a
	// kept-alive connection to a restarted instance. A timeout is never
	// repeated, so a slow service is not sent twice the load.
	IfClosed bool
	// Renew, if set, is called on the request's headers, with the
	// request's path and query as sent (Do's requestURI), before it is sent
	// again, for what must not age: the gateway signs the identity with
	// the time, and a repeat may come a whole UPSTREAM_READ_TIMEOUT later.
	Renew func(h *fasthttp.RequestHeader, requestURI string)
}

// Outcome is what Do did, besides the answer it put in resp.
type Outcome struct {
	// Instance is the base (scheme://host:port) of the instance whose
	// answer or failure is the outcome, "" if none was tried; Host and
	// Port are its parts. For operators (logs, spans) only.
	Instance string
	Host     string
	Port     int
	// Repeated is the first attempt's failure when the request was sent
	// again (nil otherwise), so that a failure the repeat covered is still
	// counted, and tied to the instance that failed.
	Repeated *FailedAttempt
}

func (o *Outcome) from(inst *Instance) { o.Instance, o.Host, o.Port = inst.base, inst.host, inst.port }

// Do sends req to one instance and fills resp (its body read whole or
// streamed, as Options.ReadWholeUpTo says). A request that never reached
// an instance (refused, no free connection) is sent once more to another
// one; one that may have reached one only as repeat allows. requestURI is
// the original path and query. err is the outcome's error, naming the
// instance that failed.
//
// affinity, when not empty, chooses the instance by rendezvous hashing of
// it instead of round-robin: requests with the same affinity go to the
// same instance while it is up, and to the same next one when it is not.
func (u *Upstream) Do(req *fasthttp.Request, resp *fasthttp.Response, requestURI string, repeat Repeat, affinity string) (out Outcome, err error) {
	first, firstOut := u.pickOrRefused(nil, affinity)
	if first == nil {
		return out, u.allOut()
	}
	out.from(first)
	err = u.send(first, req, resp, requestURI)
	if err == nil {
		return out, nil
	}
	// An instance out for a refusal that refuses again is still gone, as
	// known: no failure of its own, nor a repeat, counted against it (a
	// dead upstream would have every request counted as a repeat after an
	// unreachable failure, the kind ExportUpstreamRetries warns of, and
	// failed as unreachable, not as every instance out).
	stillGone := firstOut && refusedAgain(err)
	again := errors.Is(err, ErrUnreachable) || repeat.Always || (repeat.IfClosed && errors.Is(err, ErrClosed))
	if !again {
		return out, err
	}
	second, secondOut := u.pickOrRefused(first, affinity)
	if second == nil {
		if stillGone {
			return Outcome{}, u.allOut()
		}
		// A lone instance that dropped a kept-alive connection (it
		// restarted) is asked again, on a new connection: send has
		// already closed the idle ones from before the restart.
		if !errors.Is(err, ErrClosed) {
			return out, err
		}
		second = first
	}
	if !stillGone {
		out.Repeated = &FailedAttempt{Err: err, At: time.Now(), Instance: first.base}
	}
	err2 := u.resend(second, req, resp, requestURI, repeat)
	if stillGone && secondOut && refusedAgain(err2) {
		return Outcome{}, u.allOut()
	}
	if errors.Is(err2, ErrUnreachable) && errors.Is(err, ErrClosed) && second != first {
		// The other instance refused the repeat (it is restarting in
		// turn), but the first one is up: it only dropped a kept-alive
		// connection, as after a restart no probe saw. It is asked again,
		// as a lone instance is; the repeat that never left sent nothing.
		second = first
		err2 = u.resend(first, req, resp, requestURI, repeat)
	}
	if errors.Is(err2, ErrUnreachable) && !errors.Is(err, ErrUnreachable) && repeat.Always {
		// The repeat never left, but the first attempt of a sale was sent
		// and may have been applied: the outcome is the first's (a 504 or
		// 502 says so), not "nothing was sent". A safe request (IfClosed)
		// applied nothing either way: its outcome is the repeat's, the
		// instance gone with nothing to take its place, which the client
		// is told to retry later (503 with Retry-After), not that the
		// service failed to answer (502), as when its only reader is
		// killed under it.
		return out, fmt.Errorf("%w; sent again: %v", err, err2)
	}
	out.from(second)
	return out, err2
}

// allOut is the error of a request that found every instance out (those
// out for a refusal asked, pickRefused, and refusing still): nothing was
// sent. It says why each one is out, as its "marked down" line did, so
// that the request's own line tells the SRE holding its request id the
// fault (a process gone, a database unready) without that line found by
// its time. Only requests failing so pay for reading the reasons.
func (u *Upstream) allOut() error {
	var why []string
	for _, inst := range u.current() {
		inst.stateMu.Lock()
		down, reason := inst.toldDown, inst.toldReason
		inst.stateMu.Unlock()
		if down { // one put back meanwhile has no reason to give
			why = append(why, inst.base+": "+reason)
		}
	}
	if len(why) == 0 {
		return fmt.Errorf("%w: every instance of %s is out", ErrUnavailable, u.Name)
	}
	return fmt.Errorf("%w: every instance of %s is out (%s)", ErrUnavailable, u.Name, strings.Join(why, "; "))
}

// refusedAgain reports whether err is a refused connection (dialError):
// nothing was sent.
func refusedAgain(err error) bool {
	var dial dialError
	return errors.As(err, &dial) && dial.reason() == reasonRefused
}

// resend sends a request again, to inst, on a new connection. A repeat is
// the request's last chance, and its first attempt failed most often
// because an instance is restarting: in a rolling restart inst may have
// restarted just before, unseen by any probe, and a connection kept alive
// from before fails whatever is sent on it.
func (u *Upstream) resend(inst *Instance, req *fasthttp.Request, resp *fasthttp.Response, requestURI string, repeat Repeat) error {
	inst.client.CloseIdleConnections()
	stream := resp.StreamBody // the caller's choice for this answer, which Reset clears
	resp.Reset()
	resp.StreamBody = stream
	if repeat.Renew != nil {
		repeat.Renew(&req.Header, requestURI)
	}
	return u.send(inst, req, resp, requestURI)
}

// FailedAttempt is the first attempt's failure of a request that was sent
// again, when it failed and on which instance: Do returns once the repeat
// is done, maybe a whole read timeout later, and whoever logs or traces
// the failure then can still place it in time, and tie the time it cost
// to the instance that failed (the outcome names the one that answered).
type FailedAttempt struct {
	Err error
	At  time.Time
	// Instance is the base (scheme://host:port) of the instance that
	// failed, as Outcome.Instance writes it. For operators only.
	Instance string
}

func (f *FailedAttempt) Error() string { return f.Err.Error() }
func (f *FailedAttempt) Unwrap() error { return f.Err }

func (u *Upstream) send(inst *Instance, req *fasthttp.Request, resp *fasthttp.Response, requestURI string) error {
	var uri [512]byte // longer ones spill to the heap
	req.SetRequestURIBytes(append(append(uri[:0], inst.base...), requestURI...))
	req.URI().DisablePathNormalizing = true
	err := inst.client.Do(req, resp)
	if err == nil {
		return nil
	}
	kind := classify(err)
	var dial dialError
	switch {
	case errors.As(err, &dial):
		u.markDown(inst, u.opts.DownFor, dial.reason())
	case errors.Is(kind, ErrClosed):
		// One dropped kept-alive connection means the others idle since
		// the same moment are dead too; reusing them would fail one
		// request each.
		inst.client.CloseIdleConnections()
	}
	// The instance's address is for the gateway's log; no client sees
	// an error's text.
	return fmt.Errorf("%w: %s: %w", kind, inst.base, err)
}

// classify names the kind of a client error.
func classify(err error) error {
	var dial dialError
	switch {
	case errors.As(err, &dial), errors.As(err, new(shortageError)), errors.Is(err, fasthttp.ErrNoFreeConns):
		return ErrUnreachable
	case errors.Is(err, fasthttp.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
		return ErrTimeout
	case errors.Is(err, fasthttp.ErrConnectionClosed):
		return ErrClosed
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return ErrTimeout
	}
	return ErrBadResponse
}

// pick returns an instance that is up, other than not; nil if none. Without
// affinity it is the next one round-robin, with it the highest-ranked one
// for affinity.
func (u *Upstream) pick(not *Instance, affinity string) *Instance {
	if affinity != "" {
		return u.rendezvous(not, affinity)
	}
	now := monotime.Now()
	instances := u.current()
	n := uint64(len(instances))
	// A repeat (not set) looks on from the first attempt's turn without
	// taking one: taking it would hand the next request the same first
	// instance, so one that answers its probe but drops requests would be
	// every request's first attempt.
	var start uint64
	if not == nil {
		start = u.next.Add(1)
	} else {
		start = u.next.Load()
	}
	for i := uint64(0); i < n; i++ {
		inst := instances[(start+i)%n]
		if inst != not && inst.upAt(now) {
			return inst
		}
	}
	return nil
}

// pickOrRefused is pick, or, with no instance up, pickRefused; out says
// it is an instance out for a refusal.
func (u *Upstream) pickOrRefused(not *Instance, affinity string) (inst *Instance, out bool) {
	if inst = u.pick(not, affinity); inst != nil {
		return inst, false
	}
	return u.pickRefused(not), true
}

// pickRefused returns an instance other than not that is out only because
// it refused a connection, nil if none: what a request is sent to when no
// instance is up. A refusal is the one evidence that goes stale unseen: an
// instance that refused while it restarted is out until its next probe
// (up to 250 ms after it listens again), and in a rolling restart the
// next instance stopped in that window: every instance was out, and a
// drill's sales got 503 upstream_unavailable, or 502 when a repeat found
// none (20 of 12,738). Asking it costs one connection attempt, refused at
// once while it is still gone, and sends nothing then; an instance out
// for any other reason (not accepting in time, a 5xx readiness, silence)
// is never asked, as that would cost a timeout or ignore its readiness.
func (u *Upstream) pickRefused(not *Instance) *Instance {
	for _, inst := range u.current() {
		if inst != not && inst.outForRefusal() {
			return inst
		}
	}
	return nil
}

// outForRefusal reports whether inst is out, and for a refused
// connection.
func (inst *Instance) outForRefusal() bool {
	inst.stateMu.Lock()
	defer inst.stateMu.Unlock()
	return inst.toldDown && inst.toldReason == reasonRefused
}

// rendezvous returns the instance that is up, other than not, with the
// highest weight for affinity (highest-random-weight hashing): a value
// always maps to the same instance, different values spread evenly, and
// when an instance goes down only the values that ranked it first move,
// each to its own second choice, and they come back when it is up again.
// go-rendezvous (the one go-redis uses) looks up over a fixed set of nodes
// only; here the set changes with every probe, so the ranking is done
// over the live instances directly, with the same hash mixing.
func (u *Upstream) rendezvous(not *Instance, affinity string) *Instance {
	now := monotime.Now()
	h := xxhash.Sum64String(affinity)
	var best *Instance
	var bestWeight uint64
	for _, inst := range u.current() {
		if inst == not || !inst.upAt(now) {
			continue
		}
		if w := mix64(h ^ inst.seed); best == nil || w > bestWeight {
			best, bestWeight = inst, w
		}
	}
	return best
}

// mix64 is the xorshift-multiply finaliser of go-rendezvous: it spreads
// the XOR of two hashes over all 64 bits, so the weights of one value on
// different instances are independent.
func mix64(x uint64) uint64 {
	x ^= x >> 12
	x ^= x << 25
	x ^= x >> 27
	return x * 2685821657736338717
}

// upAt reports whether the instance is not marked down at now.
func (inst *Instance) upAt(now monotime.Instant) bool {
	return monotime.Instant(inst.downUntil.Load()) <= now
}

// reasonRefused and reasonNotAccepted are why an instance that failed a
// connection's first step, to a request or a probe alike, was taken out
// (dialError.reason).
const (
	reasonRefused     = "it refused a connection"
	reasonNotAccepted = "it did not accept a connection in time"
)

// markDown skips inst for d, and tells of it if it was up, or out for
// another reason (a killed instance restarted with the wrong secret goes
// from refusing connections to answering 503 identity_refused, and that
// change is what on-call needs to see). Its idle connections are closed:
// an instance out for a refusal is still asked when none is up
// (pickRefused), and a connection kept alive from before it stopped,
// closed by it long since, failed that request as closed; its repeat,
// refused, left a sale "may have been applied" (502) though nothing was
// sent on a live connection (1 of 65,194 calls while a lone writer was
// restarted 20 times). Closed here, the request dials, is refused, and
// sent nothing. An instance out for a 5xx (a writer stopping) closes its
// connections itself.
func (u *Upstream) markDown(inst *Instance, d time.Duration, reason string) {
	inst.stateMu.Lock()
	defer inst.stateMu.Unlock()
	inst.downUntil.Store(int64(monotime.Now().Add(d)))
	inst.client.CloseIdleConnections()
	if !inst.toldDown || inst.toldReason != reason {
		inst.toldDown, inst.toldReason = true, reason
		u.tell(inst, false, reason)
	}
}

// markUp takes inst back at once, and tells of it if it was down. An
// instance back from down is most often a process started again (a
// rolling restart): the connections kept alive to the one that stopped
// are dead, and the first request sent on one would fail and be repeated,
// so they are closed first.
func (u *Upstream) markUp(inst *Instance) {
	inst.stateMu.Lock()
	defer inst.stateMu.Unlock()
	inst.downUntil.Store(0)
	if inst.toldDown {
		inst.toldDown, inst.toldReason = false, ""
		inst.client.CloseIdleConnections()
		u.tell(inst, true, "its health probe answers")
	}
}

func (u *Upstream) tell(inst *Instance, up bool, reason string) {
	if u.opts.OnStateChange != nil {
		u.opts.OnStateChange(StateChange{Upstream: u.Name, Instance: inst.base, Up: up, Reason: reason})
	}
}

// Instances counts the upstream's instances, and those of them that are up
// (not marked down), now.
func (u *Upstream) Instances() (up, all int) {
	now := monotime.Now()
	instances := u.current()
	for _, inst := range instances {
		if inst.upAt(now) {
			up++
		}
	}
	return up, len(instances)
}

// Bases returns the base (scheme://host:port, as Outcome.Instance writes
// it) of each instance requests are sent to now. For operators only.
func (u *Upstream) Bases() []string {
	instances := u.current()
	bases := make([]string, len(instances))
	for i, inst := range instances {
		bases[i] = inst.base
	}
	return bases
}

// State is the health of an upstream as /v1/health reports it.
func (u *Upstream) State() string {
	switch up, all := u.Instances(); up {
	case 0: // first: no instance at all is down too
		return "down"
	case all:
		return "ok"
	default:
		return "degraded"
	}
}
