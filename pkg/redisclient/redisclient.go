// Package redisclient opens go-redis clients that fail fast: a rate-limit
// decision must never wait seconds for a Redis that is slow or gone.
package redisclient

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/extra/redisotel/v9"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	"go.opentelemetry.io/otel"
)

// Describe shows where a Redis URL points (network, address, database),
// for logs: never the user or the password. A URL whose password holds an
// unescaped "#", "?" or "/" parses with part of the password elsewhere (in
// the port, the database, the query), so it is "(unparsable)", as is one
// go-redis refuses.
func Describe(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil || u.Fragment != "" || strings.Contains(u.RawQuery, "@") || strings.Contains(u.Path, "@") {
		return "(unparsable)"
	}
	opts, err := redis.ParseURL(rawURL)
	if err != nil {
		return "(unparsable)"
	}
	return fmt.Sprintf("%s %s db %d", opts.Network, opts.Addr, opts.DB)
}

// URLProblem says what is wrong with a Redis URL, "" when nothing is, for
// a binary's configuration to name the variable that holds a bad one with
// its other problems, before anything starts: it is not a Redis URL
// (redis://, rediss:// or unix://), or its TCP port is not one from 1 to
// 65535 (go-redis takes any digits, and redis://redis:99999 only failed
// each dial, every rate limit falling back in-process, while the
// configuration had been accepted). It never quotes the URL, nor its port:
// a password with an unescaped "#", "?" or "/" puts part of itself there.
func URLProblem(url string) string {
	opts, err := redis.ParseURL(url)
	if err != nil {
		return "must be a redis://, rediss:// or unix:// URL"
	}
	if opts.Network != "tcp" {
		return ""
	}
	_, port, err := net.SplitHostPort(opts.Addr)
	n, perr := strconv.ParseUint(port, 10, 16)
	if err != nil || perr != nil || n == 0 {
		return "must have a port from 1 to 65535"
	}
	return ""
}

// Open parses url (redis://, rediss:// or unix://) and returns a client with
// no retries, one dial attempt per connection and context deadlines
// honoured, traced with redisotel (spans only under a span: the gateway,
// its one user, sends its rate-limit round trips under a span of their
// own for the traced requests they decide, "rate limit batch", and its
// health pings under none: gateway README, "Request id and traces").
// The commands are not recorded (no db.statement): a round trip of the
// gateway's carries the keys of every request it decides, sampled or not,
// up to 512 of them (60 kB), into the trace of the one it is under; nor
// formatted for a pipeline under no span (pipelinesUnderSpans).
//
// ioTimeout bounds each dial, each socket read and write and each wait for
// a pooled connection: a call's own context deadline wins where it is
// shorter (a call waits for a dial no longer than its deadline; the dial
// goes on, and its connection serves the next call), so give the longest
// deadline the caller's calls carry (the gateway's: its rate-limit round
// trip or its health ping, whichever is longer). A shorter one would cut
// those calls short whatever they were given: at a fixed 100 ms,
// RATE_LIMIT_REDIS_TIMEOUT=300ms fell back in-process after 100 ms all the
// same; with dials cut at a fixed 200 ms, a rediss:// Redis 70 ms away
// (the TCP and TLS 1.2 handshakes: three round trips) was never connected
// to.
func Open(url string, ioTimeout time.Duration) (*redis.Client, error) {
	opts, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("redisclient: invalid REDIS_URL")
	}
	opts.ContextTimeoutEnabled = true
	opts.DialTimeout = ioTimeout
	opts.ReadTimeout = ioTimeout
	opts.WriteTimeout = ioTimeout
	opts.MaxRetries = -1
	opts.DialerRetries = 1
	opts.PoolTimeout = ioTimeout
	// go-redis sends two commands of its own on each new connection that
	// the Redis servers this runs on refuse, each refusal a span with an
	// exception under the first rate-limit batch of the connection (an
	// error in a trace that means nothing to whoever reads it) and a
	// round trip more before the first call: CLIENT SETINFO, which only
	// names the library in CLIENT LIST, and which a Redis before 7.2
	// (Debian 12's 7.0) does not know; and CLIENT MAINT_NOTIFICATIONS,
	// Redis Enterprise's hand-off of connections during its maintenance,
	// which the gateway has no need of: its limiter decides in-process
	// while Redis is away.
	opts.DisableIdentity = true
	opts.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	client := redis.NewClient(opts)
	gate := &pipelinesUnderSpans{}
	client.AddHook(gate) // before redisotel's, which it tells what to skip
	if err := redisotel.InstrumentTracing(client, redisotel.WithCallerEnabled(false), redisotel.WithDBStatement(false),
		redisotel.WithCommandsFilter(gate.skip),
		redisotel.WithTracerProvider(childSpansOnly{provider: otel.GetTracerProvider()})); err != nil {
		client.Close()
		return nil, fmt.Errorf("redisclient: tracing: %w", err)
	}
	return client, nil
}
