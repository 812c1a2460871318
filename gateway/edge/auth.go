package edge

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/coinexport/export/gateway/keystore"
	"github.com/coinexport/export/pkg/apikey"
	"github.com/gofiber/fiber/v2"
	"github.com/ulule/limiter/v3"
)

// APIKeyHeader carries the key (spec 5); nothing else does.
const APIKeyHeader = "X-API-Key"

// authenticate resolves the key and checks it against the route. Failed
// authentications count against the client IP's budget; past it, the
// client gets 429 and unknown keys are not even looked up.
func (g *Gateway) authenticate(c *fiber.Ctx, rq *request, rt route) error {
	ctx, span := g.tracer.Start(rq.ctx, "authenticate")
	defer span.End()
	secret := c.Get(APIKeyHeader)
	if !apikey.WellFormed(secret) {
		return g.authFailed(c, rq)
	}
	key, err := g.keys.Lookup(ctx, secret, func() bool { return g.authBudgetLeft(c, rq) })
	switch {
	case errors.Is(err, keystore.ErrThrottled) && rq.rate != nil:
		return errRateLimited(rq.rate.RetryAfter)
	case errors.Is(err, keystore.ErrUnauthenticated):
		return g.authFailed(c, rq)
	case err != nil:
		return fmt.Errorf("%w: %w", errKeyLookup, err)
	}
	rq.key = key
	rq.span.SetAttributes(attrOwnerID.String(key.OwnerID), attrKeyID.String(key.ID), attrPlatformID.String(key.PlatformID))
	if !slices.Contains(key.Scopes, rt.Scope) {
		return errForbidden
	}
	if rt.NeedsPlatform && key.PlatformID == "" {
		return errPlatformRequired
	}
	return nil
}

// authFailed records a failed authentication against the client IP and
// answers 401, or 429 once the IP has failed too often.
func (g *Gateway) authFailed(c *fiber.Ctx, rq *request) error {
	if g.limiter == nil {
		return errUnauthenticated
	}
	d := g.limiter.Take(classAuthFailures+":ip:"+c.IP(), g.rates[classAuthFailures])
	g.recordDecision(rq, classAuthFailures, d)
	if !d.Allowed {
		return errRateLimited(d.RetryAfter)
	}
	return errUnauthenticated
}

// authBudgetLeft reports whether the client IP may still fail to
// authenticate; asked before a database lookup of an uncached key.
func (g *Gateway) authBudgetLeft(c *fiber.Ctx, rq *request) bool {
	if g.limiter == nil {
		return true
	}
	d := g.limiter.Peek(classAuthFailures+":ip:"+c.IP(), g.rates[classAuthFailures])
	if !d.Allowed {
		g.recordDecision(rq, classAuthFailures, d)
	}
	return d.Allowed
}

// keyInQuery reports a query parameter that looks like it carries an API
// key: by name, or by a value of a key's shape.
func keyInQuery(c *fiber.Ctx) bool {
	found := false
	c.Request().URI().QueryArgs().VisitAll(func(k, v []byte) {
		switch strings.ToLower(string(k)) {
		case "api_key", "apikey", "x-api-key", "x_api_key", "key":
			found = true
		}
		if len(v) == apikey.Len && apikey.WellFormed(string(v)) {
			found = true
		}
	})
	return found
}

func rateClasses(cfg Config) map[string]limiter.Rate {
	return map[string]limiter.Rate{
		classExportRead:   cfg.RateExportRead,
		classSalesWrite:   cfg.RateSalesWrite,
		classAnonymous:    cfg.RateAnonymous,
		classShopSchema:   cfg.RateShopSchema,
		classAuthFailures: cfg.RateAuthFailures,
	}
}
