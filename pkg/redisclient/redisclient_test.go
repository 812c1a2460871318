package redisclient

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/testenv"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

// tracedClient opens a client on the test Redis with the global tracer
// provider recording every span (the one Open's redisotel takes), both
// undone when the test ends.
func tracedClient(t *testing.T) (*tracetest.SpanRecorder, *redis.Client) {
	t.Helper()
	_, rec := testenv.RecordGlobalSpans(t)
	client, err := Open(testenv.RedisURL(t), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	return rec, client
}

func TestCommandsAreTracedOnlyInsideARequest(t *testing.T) {
	rec, client := tracedClient(t)
	ctx := context.Background()
	if err := client.Ping(ctx).Err(); err != nil {
		t.Fatalf("Ping = %v", err)
	}
	if n := len(rec.Ended()); n != 0 {
		t.Errorf("Ping outside a request made %d spans, want 0", n)
	}

	ctx, parent := otel.Tracer("test").Start(ctx, "request")
	if err := client.Ping(ctx).Err(); err != nil {
		t.Fatalf("Ping = %v", err)
	}
	parent.End()
	children := 0
	for _, sp := range rec.Ended() {
		if sp.Parent().SpanID() == parent.SpanContext().SpanID() {
			children++
		}
		for _, a := range sp.Attributes() {
			if a.Key == "db.statement" || a.Key == "db.query.text" {
				t.Errorf("span %q records the command (%s = %q): a pipeline's holds every request's key", sp.Name(), a.Key, a.Value.String())
			}
		}
	}
	if children == 0 {
		t.Errorf("Ping inside a request made no child span of it; spans: %d", len(rec.Ended()))
	}
}

// A call is held to its own context deadline, not to a shorter I/O bound
// of the client's: Redis paused for 300 ms still answers a call given 5 s
// (a rate-limit timeout set above the old fixed 100 ms was cut to it), and
// a call given 50 ms gives up on Redis paused for 2 s.
func TestACallIsHeldToItsOwnDeadline(t *testing.T) {
	srv := testenv.StartRedis(t) // its own: a pause stalls every client
	client, err := Open(srv.URL, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	ping := func(pauseMillis int, deadline time.Duration) error {
		t.Helper()
		ctx := context.Background()
		if err := client.Do(ctx, "CLIENT", "PAUSE", pauseMillis).Err(); err != nil {
			t.Fatalf("CLIENT PAUSE: %v", err)
		}
		ctx, cancel := context.WithTimeout(ctx, deadline)
		defer cancel()
		return client.Ping(ctx).Err()
	}
	if err := ping(300, 5*time.Second); err != nil {
		t.Errorf("a ping given 5 s while Redis is paused for 300 ms: %v, want PONG", err)
	}
	if err := ping(2000, 50*time.Millisecond); err == nil {
		t.Error("a ping given 50 ms while Redis is paused for 2 s succeeded, want a timeout")
	}
}

// A Redis further away is reached within the deadline a call carries:
// over rediss://, a dial is the TCP and the TLS handshakes, several round
// trips. One whose handshake takes 300 ms answers a call given 5 s, where
// a dial cut at a fixed 200 ms never connected, whatever deadline the
// calls were given (RATE_LIMIT_REDIS_TIMEOUT=1s, Redis 70 ms away).
func TestAFarRedisIsReachedWithinTheCallsDeadline(t *testing.T) {
	srv := testenv.StartRedis(t)
	client, err := Open(slowTLSFront(t, srv.URL, 300*time.Millisecond), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := client.Ping(ctx).Err(); err != nil {
		t.Errorf("a ping given 5 s to a Redis whose TLS handshake takes 300 ms: %v, want PONG", err)
	}
}

// slowTLSFront returns a rediss:// URL (its certificate not checked) of a
// TLS front for the Redis at redisURL that begins each handshake only
// after delay: that Redis, as far away as delay makes it.
func slowTLSFront(t *testing.T, redisURL string, delay time.Duration) string {
	t.Helper()
	opts, err := redis.ParseURL(redisURL)
	if err != nil {
		t.Fatal(err)
	}
	// httptest's server certificate, for 127.0.0.1.
	certified := httptest.NewUnstartedServer(nil)
	certified.StartTLS()
	certified.Close()
	config := &tls.Config{Certificates: certified.TLS.Certificates}
	addr := testenv.ServeConns(t, func(conn net.Conn) {
		time.Sleep(delay)
		back, err := net.Dial(opts.Network, opts.Addr)
		if err != nil {
			return
		}
		front := tls.Server(conn, config)
		go func() { io.Copy(back, front); back.Close() }()
		io.Copy(front, back)
	})
	return "rediss://" + addr + "/0?skip_verify=true"
}

func TestOpenRefusesABadURLWithoutQuotingIt(t *testing.T) {
	const secretURL = "redis://:s3cret@[bad"
	_, err := Open(secretURL, time.Second)
	if err == nil {
		t.Fatal("Open(bad URL) = nil error, want one")
	}
	if got := err.Error(); got == "" || strings.Contains(got, "s3cret") {
		t.Errorf("Open error %q: want a message without the password", got)
	}
}

// A URL of another kind and a redis:// URL whose port cannot be are told
// apart: the latter read "must be a redis://, rediss:// or unix:// URL",
// and the operator looked at a redis:// URL.
func TestURLProblem(t *testing.T) {
	const notRedis, badPort = "must be a redis://, rediss:// or unix:// URL", "must have a port from 1 to 65535"
	for url, want := range map[string]string{
		"redis://127.0.0.1:6379/0": "", "rediss://user:pw@redis:6380/1": "", "unix:///run/redis.sock": "",
		"redis-host:6379": notRedis, "http://redis:6379": notRedis, "redis://:s3cret@[bad": notRedis, "": notRedis,
		"redis://redis": "", "redis://[::1]:6379": "",
		"redis://redis:99999": badPort, "redis://redis:0": badPort, "rediss://[::1]:70000/0": badPort,
	} {
		if got := URLProblem(url); got != want {
			t.Errorf("URLProblem(%q) = %q, want %q", url, got, want)
		}
	}
}

// Describe says where Redis is and never any part of a password, also when
// an unescaped character moved part of the password elsewhere in the URL.
func TestDescribe(t *testing.T) {
	tests := []struct{ url, want string }{
		{"redis://127.0.0.1:6379/0", "tcp 127.0.0.1:6379 db 0"},
		{"redis://default:s3cret@redis:6379/2", "tcp redis:6379 db 2"},
		{"rediss://:s3cret@redis.example.com:6380", "tcp redis.example.com:6380 db 0"},
		{"unix:///run/redis/redis.sock?db=1", "unix /run/redis/redis.sock db 1"},
		{"redis://:1234#s3cret@redis:6379/0", "(unparsable)"},
		{"redis://default:2024/s3cret@redis:6379/0", "(unparsable)"},
		{"redis://default:12?s3cret@redis:6379/0", "(unparsable)"},
		{"not a url s3cret", "(unparsable)"},
	}
	for _, tt := range tests {
		got := Describe(tt.url)
		if got != tt.want {
			t.Errorf("Describe(%q) = %q, want %q", tt.url, got, tt.want)
		}
		if strings.Contains(got, "s3cret") || strings.Contains(got, "1234") || strings.Contains(got, "2024") {
			t.Errorf("Describe(%q) = %q shows part of the password", tt.url, got)
		}
	}
}

// formatCounter is a command argument that counts how often it is
// formatted as text (redisotel's rediscmd formats an argument of a type it
// does not know with fmt.Sprint); Redis is sent its binary form.
type formatCounter struct{ formatted *atomic.Int64 }

func (f formatCounter) MarshalBinary() ([]byte, error) { return []byte("v"), nil }
func (f formatCounter) String() string                 { f.formatted.Add(1); return "v" }

// A pipeline sent under no span (the gateway's limiter's batch with no
// sampled request in it, nearly all of them) has none of its commands
// formatted: redisotel formatted every one, some 440 B a decision, for a
// span that was never recorded. Under a request's span, it is traced as
// before.
func TestAPipelineUnderNoSpanIsNotFormatted(t *testing.T) {
	rec, client := tracedClient(t)
	key := testenv.KeyPrefix(t) + "k"
	var formatted atomic.Int64
	send := func(ctx context.Context) {
		t.Helper()
		if _, err := client.Pipelined(ctx, func(p redis.Pipeliner) error {
			p.Set(ctx, key, formatCounter{&formatted}, time.Minute)
			p.Get(ctx, key)
			return nil
		}); err != nil {
			t.Fatalf("pipeline: %v", err)
		}
	}

	send(context.Background())
	if n := formatted.Load(); n != 0 {
		t.Errorf("a pipeline under no span had its argument formatted %d times, want 0", n)
	}
	if n := len(rec.Ended()); n != 0 {
		t.Errorf("a pipeline under no span made %d spans, want 0", n)
	}

	ctx, parent := otel.Tracer("test").Start(context.Background(), "request")
	send(ctx)
	parent.End()
	var names []string
	for _, sp := range rec.Ended() {
		if sp.Parent().SpanID() == parent.SpanContext().SpanID() {
			names = append(names, sp.Name())
		}
	}
	if !slices.Contains(names, "redis.pipeline set get") {
		t.Errorf("a pipeline under a request's span made children %q, want one named \"redis.pipeline set get\"", names)
	}
	if formatted.Load() == 0 {
		t.Error("a pipeline under a span was not formatted either: this test cannot tell the two apart")
	}
}

// A new connection's first traced call leaves no failed span: go-redis
// names itself to Redis with CLIENT SETINFO on connect, which a Redis
// before 7.2 (Debian's 7.0) refuses, "ERR unknown subcommand 'setinfo'";
// the refusal was a span with an exception under the first rate-limit
// batch of each connection, an error in a trace that meant nothing to
// whoever read it.
func TestANewConnectionLeavesNoFailedSpan(t *testing.T) {
	rec, client := tracedClient(t)
	ctx, parent := otel.Tracer("test").Start(context.Background(), "request")
	if err := client.Ping(ctx).Err(); err != nil {
		t.Fatalf("Ping = %v", err)
	}
	parent.End()
	for _, sp := range rec.Ended() {
		if sp.Status().Code == codes.Error || len(sp.Events()) > 0 {
			t.Errorf("span %q: status %v %q, %d events", sp.Name(), sp.Status().Code, sp.Status().Description, len(sp.Events()))
		}
	}
}
