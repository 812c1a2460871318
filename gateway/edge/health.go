package edge

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coinexport/export/gateway/upstream"
	"github.com/coinexport/export/pkg/envelope"
	"github.com/coinexport/export/pkg/identity"
	"github.com/gofiber/fiber/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/valyala/fasthttp"
)

// ContractVersion is the API contract version the gateway serves.
const ContractVersion = "1.3.1"

// Health check states.
const (
	stateOK       = "ok"
	stateDegraded = "degraded"
	stateDown     = "down"
)

// healthState holds the latest background checks, so /v1/health answers at
// once whatever is down.
type healthState struct {
	postgresOK atomic.Bool
	redisOK    atomic.Bool
}

// healthInterval is how often PostgreSQL and Redis are pinged.
const healthInterval = time.Second

func (h *healthState) watch(ctx context.Context, pool *pgxpool.Pool, rdb *redis.Client) {
	tick := time.NewTicker(healthInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		h.check(ctx, pool, rdb)
	}
}

// healthPingTimeout bounds each ping of a check.
const healthPingTimeout = 500 * time.Millisecond

// check pings PostgreSQL and Redis at once, each within its own
// healthPingTimeout. With one deadline for both, one after the other, a
// PostgreSQL that stalled (frozen, partitioned away) used it up and a
// healthy Redis was reported degraded too, sending an SRE after the wrong
// store.
func (h *healthState) check(ctx context.Context, pool *pgxpool.Pool, rdb *redis.Client) {
	var wg sync.WaitGroup
	wg.Go(func() { h.postgresOK.Store(pingWithin(ctx, pool.Ping) == nil) })
	wg.Go(func() {
		h.redisOK.Store(pingWithin(ctx, func(ctx context.Context) error { return rdb.Ping(ctx).Err() }) == nil)
	})
	wg.Wait()
}

// pingWithin runs ping with healthPingTimeout.
func pingWithin(ctx context.Context, ping func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, healthPingTimeout)
	defer cancel()
	return ping(ctx)
}

// healthData is the data of GET /v1/health.
type healthData struct {
	Status  string            `json:"status"`
	Version string            `json:"version"`
	Checks  map[string]string `json:"checks"`
}

func (g *Gateway) healthReport() healthData {
	checks := map[string]string{"postgres": stateDown, "redis": stateOK}
	if g.health.postgresOK.Load() {
		checks["postgres"] = stateOK
	}
	// Without Redis the gateway still serves, with in-process limits.
	if !g.health.redisOK.Load() || (g.limiter != nil && g.limiter.Degraded()) {
		checks["redis"] = stateDegraded
	}
	for name, u := range g.upstreams {
		checks[name] = u.State()
	}
	status := stateOK
	for _, s := range checks {
		if s != stateOK {
			status = stateDegraded
		}
	}
	return healthData{Status: status, Version: ContractVersion, Checks: checks}
}

// probeSigner signs with signer an anonymous identity for each health
// probe of an upstream's instances: a service whose IDENTITY_SECRET
// differs answers it 503, and is taken out and shown down in /v1/health,
// rather than refusing every request while it looks healthy.
func probeSigner(signer *identity.Signer) func(h *fasthttp.RequestHeader) {
	return func(h *fasthttp.RequestHeader) {
		signer.SignInto(h.SetBytesV, identity.Identity{RequestID: "health-probe"},
			identity.Request{Method: fasthttp.MethodGet, Target: upstream.HealthPath}, time.Now())
	}
}

func (g *Gateway) serveHealth(c *fiber.Ctx, rq *request) error {
	if g.draining.Load() {
		return errDraining
	}
	body, err := envelope.DataBytes(g.healthReport(), envelope.Meta{RequestID: rq.id})
	if err != nil {
		return err
	}
	c.Set(fiber.HeaderContentType, envelope.ContentType)
	c.Set(fiber.HeaderCacheControl, "no-store")
	return c.Status(fiber.StatusOK).Send(body)
}

// Drain makes /v1/health answer 503 while the gateway serves on: called at
// the stop signal, before GATEWAY_SHUTDOWN_DELAY, so that a load balancer
// whose health check reads /v1/health (Kubernetes' readiness probe, or any
// other) stops sending here during the delay, as the delay means it to.
func (g *Gateway) Drain() { g.draining.Store(true) }
