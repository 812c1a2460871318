// Package edge is the public gateway: the routing table, API keys and
// scopes, request ids and tracing, rate limits, and the proxy hop to the
// services, served by Fiber.
package edge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coinexport/export/gateway/conncap"
	"github.com/coinexport/export/gateway/keystore"
	"github.com/coinexport/export/gateway/lazydeadline"
	"github.com/coinexport/export/gateway/lingerclose"
	"github.com/coinexport/export/gateway/ratelimit"
	"github.com/coinexport/export/gateway/upstream"
	"github.com/coinexport/export/pkg/acceptretry"
	"github.com/coinexport/export/pkg/httpserver"
	"github.com/coinexport/export/pkg/identity"
	"github.com/coinexport/export/pkg/logging"
	"github.com/coinexport/export/pkg/postgres"
	"github.com/coinexport/export/pkg/postgres/poolmetrics"
	"github.com/coinexport/export/pkg/redisclient"
	redispool "github.com/coinexport/export/pkg/redisclient/poolmetrics"
	"github.com/coinexport/export/pkg/telemetry"
	"github.com/gofiber/fiber/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/ulule/limiter/v3"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
)

// keyLookup resolves an API key; keystore.Store is the real one.
type keyLookup interface {
	Lookup(ctx context.Context, secret string, mayFetch func() bool) (keystore.Key, error)
	// Known names a key from the cache alone, for the log (nameKnownKey).
	Known(secret string) (keystore.Key, bool)
}

// Gateway is a running gateway.
type Gateway struct {
	cfg Config
	log *slog.Logger
	// inFlight counts the requests in the handler, for the shutdown's log
	// lines: how many a drain waits for, and how many it cut off.
	inFlight atomic.Int64
	// requests names them, for the lines of those a drain cuts off.
	requests inFlightRequests
	draining atomic.Bool // Drain was called: /v1/health answers 503, every answer Connection: close
	// shopSlots bounds each client address's shop schema calls in flight;
	// shopSlotDecisions counts what it decided.
	shopSlots         *inFlightSlots
	shopSlotDecisions slotDecisions
	// heldAnswers counts the bytes of list pages and items held whole
	// until their clients have taken them (proxyUntilRelayed).
	heldAnswers *byteBudget
	// ownerSlots bounds each owner's requests in flight on the keyed
	// routes, its slots split between their two upstreams, each share
	// counting its own decisions (nil when RATE_LIMIT_OWNER_IN_FLIGHT is
	// 0; read only once built).
	ownerSlots map[string]*ownerShare
	// guessLookups bounds each client address's uncached keys in lookup
	// at once by what its guess budget has left (authBudgetLeft);
	// guessLookupDecisions counts what it decided.
	guessLookups         guessLookups
	guessLookupDecisions slotDecisions
	tracer               trace.Tracer
	metrics              *metrics
	signer               *identity.Signer // signs the identity sent to export-reader and sales-writer
	shopSchemaSigner     *identity.Signer // signs the one sent to shop-schema (Config.ShopSchemaSigningSecret)
	pool                 *pgxpool.Pool
	redis                *redis.Client
	keys                 keyLookup
	limiter              *ratelimit.Limiter // nil when rate limiting is off
	rates                map[string]limiter.Rate
	upstreams            map[string]*upstream.Upstream
	// clientAddr reads the client IP (GATEWAY_PROXY_HEADER, only from
	// GATEWAY_TRUSTED_PROXIES).
	clientAddr clientAddress
	// notAnAddressLog lets through one warning of a proxy header entry
	// that is no address (warnNotAnAddress) every notAnAddressLogInterval:
	// a header that never holds one would have it said on every request,
	// and one said once per process was used up by the first trusted
	// client that sent junk, leaving a later misconfiguration unsaid.
	notAnAddressLog logging.Throttle
	// repeatLog lets through one "sent again" warning per upstream and
	// kind every repeatLogInterval: a saturated or slow instance makes
	// every request repeat, when the gateway is busiest.
	repeatLog logging.Throttle
	health    healthState
	// connections counts the client connections open, and refuses those
	// past GATEWAY_MAX_CONNECTIONS (refuseConnection); refusals are those
	// refused waiting for their request, and refusedLog lets through one
	// line of them every refusedLogInterval.
	connections *conncap.Listener
	refusals    *refusals
	refusedLog  logging.Throttle
	// linger bounds the draining of a closed client connection
	// (lingerclose.Defaults; tests lower it); refusalsLingering are the
	// places refused connections linger on, apart from the others'.
	linger            lingerclose.Options
	refusalsLingering *lingerclose.Budget
	// refusalWait is how long a refused connection waits for its request
	// (the constant refusalWait; tests raise it).
	refusalWait time.Duration

	unroutedMetrics *routeMetrics
	// routeMetrics are the series of every name a request is given
	// (routeNames), made at start.
	routeMetrics    map[string]*routeMetrics
	decisionMetrics decisionMetrics

	app      *fiber.App
	listener net.Listener
	admin    *http.Server
	adminLn  net.Listener
	// failed carries the error of a listener that stopped serving on its
	// own (Failed), with room for both listeners'.
	failed chan error
	// stopBg ends the background work (the revocation listener, the
	// upstream probes and lookups, the health watch, the rate limiter's
	// batching), and bg waits for it: after the drain, before the pools
	// it uses are closed.
	stopBg     context.CancelFunc
	bg         sync.WaitGroup
	shutdownTP func(context.Context) error
	stopOnce   sync.Once
	stopErr    error
}

// Start connects to the dependencies (telemetry, PostgreSQL, Redis, the
// upstreams), starts the listeners and the background work, and returns at
// once; the binary's run and the tests share it. getenv feeds the OTEL_*
// variables.
func Start(ctx context.Context, cfg Config, log *slog.Logger, getenv func(string) string) (*Gateway, error) {
	return start(ctx, cfg, log, getenv, nil)
}

// start is Start with a hook tests use to replace parts before serving.
func start(ctx context.Context, cfg Config, log *slog.Logger, getenv func(string) string, hook func(*Gateway)) (_ *Gateway, err error) {
	g := newGateway(cfg, log)
	cleanup := []func(){}
	defer func() {
		if err != nil {
			for i := len(cleanup) - 1; i >= 0; i-- {
				cleanup[i]()
			}
		}
	}()

	if g.shutdownTP, err = telemetry.Setup(ctx, getenv, "gateway", log); err != nil {
		return nil, err
	}
	cleanup = append(cleanup, func() { _ = g.shutdownTP(context.Background()) })
	// Keep this provider's tracer even if another Setup replaces the global.
	g.tracer = otel.GetTracerProvider().Tracer("github.com/coinexport/export/gateway")
	if g.signer, err = identity.NewSigner(cfg.IdentitySecret); err != nil {
		return nil, err
	}
	if g.shopSchemaSigner, err = identity.NewSigner(cfg.ShopSchemaSigningSecret()); err != nil {
		return nil, err
	}
	if err = g.buildUpstreams(); err != nil {
		return nil, err
	}
	closeStores, err := g.openStores(ctx)
	if err != nil {
		return nil, err
	}
	cleanup = append(cleanup, closeStores)
	store := keystore.New(g.pool, keystore.Options{
		TTL: cfg.KeyCacheTTL, UnheardTTL: cfg.KeyCacheUnheardTTL, MaxEntries: cfg.KeyCacheSize, LookupTimeout: cfg.KeyLookupTimeout,
		OnLookup: g.metrics.countKeyLookup(),
	})
	g.keys = store
	g.rates = rateClasses(cfg)
	if cfg.RateLimitEnabled {
		g.limiter = ratelimit.New(ratelimit.NewSlidingStore(g.redis, cfg.RateLimitKeyPrefix), ratelimit.Options{
			Timeout: cfg.RateLimitRedisTimeout, OnDegraded: g.onRedisState,
		})
	}
	g.metrics.watchHeld(store, cfg.KeyCacheSize, g.limiter, g.heldAnswers)
	g.resolveSeries()
	g.app = g.newApp()
	if hook != nil {
		hook(g)
	}

	if err = g.listen(ctx); err != nil {
		return nil, err
	}
	g.warnCapPastDescriptors()
	g.startBackground(store)
	g.startServing()
	g.log.Info("serving", "addr", g.Addr(), "admin_addr", g.AdminAddr())
	return g, nil
}

// openStores opens the key store's PostgreSQL pool and the limiter's
// Redis client, and registers their pools' series; closeStores closes
// both.
func (g *Gateway) openStores(ctx context.Context) (closeStores func(), err error) {
	// Serving while PostgreSQL is out of reach, as when it goes away later:
	// keys answer 503 and /v1/health says postgres down (OpenServing).
	if g.pool, err = postgres.OpenServing(ctx, postgres.WithPoolSize(g.cfg.DatabaseURL, keyStorePoolSize), g.log,
		postgres.ApplicationName("gateway")); err != nil {
		return nil, err
	}
	// The pool's series are the services' (and the dashboard's panels'):
	// key-cache misses waiting for a connection show here first.
	poolmetrics.Register(g.metrics.registry, "postgres", g.pool)
	// The I/O bound is the longer of the two deadlines its calls carry, so
	// that each call is held to its own (see redisclient.Open).
	if g.redis, err = redisclient.Open(g.cfg.RedisURL, max(g.cfg.RateLimitRedisTimeout, healthPingTimeout)); err != nil {
		postgres.Close(g.pool)
		return nil, err
	}
	// Its pool's series beside PostgreSQL's: a Redis slow to accept
	// connections shows as dials (misses) and waits before decisions fall
	// back in-process.
	redispool.Register(g.metrics.registry, "redis", g.redis)
	return func() {
		g.redis.Close()
		postgres.Close(g.pool)
	}, nil
}

// newGateway is the gateway's own state, before anything is connected:
// its metrics, log throttles and in-flight bounds.
func newGateway(cfg Config, log *slog.Logger) *Gateway {
	g := &Gateway{cfg: cfg, log: log, metrics: newMetrics(), repeatLog: logging.Throttle{Interval: repeatLogInterval},
		notAnAddressLog: logging.Throttle{Interval: notAnAddressLogInterval},
		refusedLog:      logging.Throttle{Interval: refusedLogInterval},
		shopSlots:       newInFlightSlots(cfg.ShopSchemaInFlight),
		heldAnswers:     &byteBudget{limit: heldAnswersLimit},
		clientAddr:      clientAddress{header: cfg.ProxyHeader, trusted: cfg.TrustedProxies},
		linger:          lingerclose.Defaults,
		refusalWait:     refusalWait,
		failed:          make(chan error, 2)}
	g.refusals, g.refusalsLingering = newRefusals(), lingerclose.NewBudget(maxRefusalsLingering)
	if cfg.OwnerInFlight > 0 {
		g.ownerSlots = newOwnerSlots(g.metrics, cfg.OwnerInFlight, cfg.OwnerSaleInFlight)
	}
	return g
}

// listen opens the public listener and the admin one; neither is left
// open if the other fails.
//
// fasthttp sets three deadlines per request on a client's connection:
// lazydeadline applies only those that change by a tick. fasthttp also
// closes a connection at once, even while the client is still sending a
// request it refused: lingerclose closes in stages, so that the client
// reads the refusal instead of a reset. conncap counts the connections
// open and answers those past GATEWAY_MAX_CONNECTIONS itself (a lingering
// one no longer counts: lingerclose bounds those). answerListener knows the answer
// each connection writes, to log and count one cut short. acceptretry waits out a shortage
// of descriptors: fasthttp would take EMFILE for the listener's end, and
// the gateway would exit.
func (g *Gateway) listen(ctx context.Context) error {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", g.cfg.Addr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", g.cfg.Addr, err)
	}
	lingering := lingerclose.NewListener(acceptretry.New(ln, acceptretry.LogRetries(g.log)), g.linger)
	g.connections = conncap.NewListener(lingering, connectionsCap(g.cfg.MaxConnections), g.refuseConnection)
	g.metrics.watchConnections(g.connections, g.cfg.MaxConnections)
	g.metrics.watchLingering(map[string]*lingerclose.Budget{"closes": lingering.Budget(), "refusals": g.refusalsLingering})
	g.listener = &answerListener{Listener: lazydeadline.NewListener(g.connections,
		lazydeadline.TickFor(g.cfg.ReadTimeout, g.cfg.WriteTimeout, g.cfg.IdleTimeout)), cut: g.cutAnswer}
	if g.adminLn, err = lc.Listen(ctx, "tcp", g.cfg.AdminAddr); err != nil {
		g.listener.Close()
		return fmt.Errorf("listen %s: %w", g.cfg.AdminAddr, err)
	}
	return nil
}

// connectionsCap is the bound of GATEWAY_MAX_CONNECTIONS: 0 is none, and
// the connections are still counted.
func connectionsCap(maxConnections int) int {
	if maxConnections == 0 {
		return math.MaxInt
	}
	return maxConnections
}

// keyStorePoolSize is the gateway's PostgreSQL pool: only key-cache misses
// and health checks use it (the revocation listener has a connection of
// its own), and pgx's default (one per CPU of the node) would count against
// max_connections for nothing (deploy/k8s sums the connections).
const keyStorePoolSize = 4

// readWholeUpTo is, per upstream, the size up to which its answers are read
// whole before they are relayed (upstream.Options.ReadWholeUpTo): far above
// a sale's answer, so only a broken instance reaches it. export-reader's
// answers (a list page ends at 4 MiB of items, MaxPageBytes, plus the one
// item that passed it; an item is at most about 2 MiB) are asked for as
// streams instead, and read whole at once up to smallAnswerBytes, past it
// within heldAnswersLimit (proxyUntilRelayed); the bound here is for a
// route that does not stream. shop-schema's answers stream: by
// configuration (SHOP_SCHEMA_MAX_ROWS, up to 10 million rows per resource)
// they may be larger than the gateway should hold.
var readWholeUpTo = map[string]int{
	upstreamExportReader: 64 << 20,
	upstreamSalesWriter:  1 << 20,
}

func (g *Gateway) buildUpstreams() error {
	opts := upstream.Options{
		ConnectTimeout: g.cfg.UpstreamConnectTimeout, ReadTimeout: g.cfg.UpstreamReadTimeout,
		WriteTimeout: g.cfg.UpstreamWriteTimeout, DownFor: g.cfg.UpstreamDownFor, MaxConns: g.cfg.UpstreamMaxConns,
		OnStateChange: g.logInstanceState,
	}
	g.upstreams = map[string]*upstream.Upstream{}
	for name, urls := range map[string][]string{
		upstreamExportReader: g.cfg.ExportReaderURLs,
		upstreamSalesWriter:  g.cfg.SalesWriterURLs,
		upstreamShopSchema:   g.cfg.ShopSchemaURLs,
	} {
		opts.ReadWholeUpTo = readWholeUpTo[name]
		opts.SignProbe = probeSigner(g.signerFor(name))
		u, err := upstream.New(name, urls, opts)
		if err != nil {
			return err
		}
		g.upstreams[name] = u
		g.metrics.watchInstances(u)
	}
	return nil
}

// lookupIP resolves a host name with the system's resolver.
func lookupIP(ctx context.Context, host string) ([]netip.Addr, error) {
	return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
}

// onDiscovery logs a change in an upstream's instances, or a name that did
// not resolve, and makes the upstream's per-instance series follow the
// change.
func (g *Gateway) onDiscovery(ev upstream.DiscoveryEvent) {
	g.logDiscovery(ev)
	if ev.Added+ev.Removed > 0 {
		g.metrics.followInstances(ev.Upstream, ev.Instances)
	}
}

// logDiscovery logs a change in an upstream's instances, or a name that
// did not resolve (its instances are kept).
func (g *Gateway) logDiscovery(ev upstream.DiscoveryEvent) {
	if ev.Err != nil {
		g.log.Warn("upstream name did not resolve; its instances are kept", "upstream", ev.Upstream,
			"hosts", ev.Failed, "error", ev.Err)
	}
	if ev.Added+ev.Removed > 0 {
		g.log.Info("upstream instances changed", "upstream", ev.Upstream, "instances", ev.Instances,
			"added", ev.Added, "removed", ev.Removed)
	}
}

// logInstanceState logs an instance taken out or put back, naming it: the
// health endpoint says only that some instance of the upstream is down.
func (g *Gateway) logInstanceState(ch upstream.StateChange) {
	if ch.Up {
		g.log.Info("upstream instance up again", "upstream", ch.Upstream, "instance", ch.Instance, "reason", ch.Reason)
		return
	}
	g.log.Warn("upstream instance marked down", "upstream", ch.Upstream, "instance", ch.Instance, "reason", ch.Reason)
}

func (g *Gateway) onRedisState(err error) {
	if err != nil {
		g.metrics.rateDegraded.Set(1)
		g.metrics.rateRedisErrors.Inc()
		g.log.Warn("redis unusable; rate limits decided in-process", "error", err)
		return
	}
	g.metrics.rateDegraded.Set(0)
	g.log.Info("redis answers again; rate limits shared")
}

func (g *Gateway) startBackground(store *keystore.Store) {
	bgCtx, stop := context.WithCancel(context.Background())
	g.stopBg = stop
	g.goBg(func() { store.Listen(bgCtx, g.log) })
	for _, u := range g.upstreams {
		g.goBg(func() { u.Probe(bgCtx, g.cfg.UpstreamProbeInterval) })
		if g.cfg.UpstreamResolveInterval > 0 {
			g.goBg(func() {
				u.Discover(bgCtx, g.cfg.UpstreamResolveInterval, lookupIP, g.onDiscovery)
			})
		}
	}
	g.health.check(bgCtx, g.pool, g.redis)
	g.goBg(func() { g.health.watch(bgCtx, g.pool, g.redis) })
	if g.limiter != nil {
		// Stopped, it answers what is still queued in-process, and every
		// later call too (a request the drain cut off).
		g.goBg(func() { g.limiter.Run(bgCtx) })
	}
}

func (g *Gateway) goBg(f func()) {
	g.bg.Add(1)
	go func() {
		defer g.bg.Done()
		f()
	}()
}

func (g *Gateway) startServing() {
	go func() {
		if err := g.app.Listener(g.listener); err != nil {
			g.failed <- fmt.Errorf("public listener %s stopped serving: %w", g.Addr(), err)
		}
	}()
	g.admin = &http.Server{Handler: httpserver.AdminHandler(g.metrics.registry), ReadHeaderTimeout: 5 * time.Second,
		MaxHeaderBytes: 32 << 10,
		// "OPTIONS *" goes to the handler too (an envelope), not to
		// net/http's own empty 200, as on the services' admin ports.
		DisableGeneralOptionsHandler: true}
	adminLn := httpserver.UnreadAsEnvelope(acceptretry.New(g.adminLn, acceptretry.LogRetries(g.log)),
		httpserver.LogUnread(g.log))
	go func() {
		if err := g.admin.Serve(adminLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
			g.failed <- fmt.Errorf("admin listener %s stopped serving: %w", g.AdminAddr(), err)
		}
	}()
}

// Failed delivers the error of a listener that stopped serving on its own,
// naming it; the binary then shuts the gateway down, both listeners.
func (g *Gateway) Failed() <-chan error { return g.failed }

// Addr is the public listener's address.
func (g *Gateway) Addr() string { return g.listener.Addr().String() }

// HearsRevocations reports whether the key store's revocation listener is
// connected. Until it first is, the key cache may be emptied at any moment
// (keystore.Listen), which tests that count on a cached key wait out.
func (g *Gateway) HearsRevocations() bool {
	store, ok := g.keys.(*keystore.Store)
	return ok && store.Listening()
}

// AdminAddr is the metrics listener's address.
func (g *Gateway) AdminAddr() string { return g.adminLn.Addr().String() }

// Shutdown stops accepting, waits for in-flight requests (until ctx ends),
// then stops the background work, closes the connections and flushes the
// last spans (for telemetry.MaxFlushTime at most, past ctx). Calls after
// the first return the first one's result.
func (g *Gateway) Shutdown(ctx context.Context) error {
	g.stopOnce.Do(func() { g.stopErr = g.shutdown(ctx) })
	return g.stopErr
}

func (g *Gateway) shutdown(ctx context.Context) error {
	g.log.Info("draining", "in_flight", g.inFlight.Load())
	g.refusals.end(ctx)
	err := g.app.ShutdownWithContext(ctx)
	lateAtDeadline := g.inFlight.Load()
	// fasthttp closes only the listeners its Serve has taken: a Shutdown
	// right after Start (a stop signal during the start) can come before
	// the serving goroutine got that far, and its Serve would then take
	// the listener afterwards and serve it for good. Closed here, a late
	// Serve returns at once (once fasthttp closed it, this fails: ignored).
	_ = g.listener.Close()
	_ = g.admin.Shutdown(ctx)
	g.stopBg()
	g.bg.Wait()
	g.redis.Close()
	postgres.Close(g.pool)
	// Not ctx: a drain that used its whole deadline left none of it, and
	// the spans still queued, those of the requests around the stop, the
	// ones an SRE looks for, were dropped unsent. The flush is bounded on
	// its own (telemetry.MaxFlushTime, counted in the grace periods).
	drainErr := err
	if terr := g.shutdownTP(context.Background()); terr != nil && err == nil {
		err = terr
	}
	if drainErr != nil {
		g.logCutOff(drainErr, lateAtDeadline)
	}
	g.log.Info("stopped")
	return err
}

// logCutOff names the requests a drain that timed out leaves in flight as
// the gateway stops. Written last, not when the drain timed out: fasthttp
// leaves their connections open then, and a request that ends while the
// gateway closes the rest and flushes its spans is still answered, with
// its access line. Those still in flight now end with the process: their
// clients see the connection close without an answer, and no access line
// will be written for them, so a line apiece names them. When all the
// late ones (lateAtDeadline, in flight at the deadline) ended meanwhile,
// none was cut off: the line says so, not "requests cut off" with a
// cut_off of 0, which sent the reader looking for lines that are not
// there. The drain ran out of its time all the same (the exit status).
func (g *Gateway) logCutOff(drainErr error, lateAtDeadline int64) {
	cutOff := g.inFlight.Load()
	if cutOff == 0 {
		g.log.Warn("drain timed out: the requests still in flight ended as the gateway stopped",
			"late", lateAtDeadline, "cut_off", 0, "error", drainErr)
		return
	}
	g.log.Warn("drain timed out: requests cut off", "cut_off", cutOff, "error", drainErr)
	g.requests.logCutOff(g.log, time.Now())
}
