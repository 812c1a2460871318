package edge

import (
	"bytes"
	"errors"
	"time"

	"github.com/coinexport/export/gateway/ratelimit"
	"github.com/coinexport/export/gateway/upstream"
	"github.com/coinexport/export/pkg/identity"
	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// limit takes one request from the class's budget for who.
func (g *Gateway) limit(rq *request, class, who string) error {
	if g.limiter == nil {
		return nil
	}
	_, span := g.tracer.Start(rq.ctx, "rate limit")
	d := g.limiter.Take(class+":"+who, g.rates[class])
	span.End()
	g.recordDecision(rq, class, d)
	if !d.Allowed {
		return errRateLimited(d.RetryAfter)
	}
	return nil
}

// recordDecision counts d and makes it the one the answer's headers show.
func (g *Gateway) recordDecision(rq *request, class string, d ratelimit.Decision) {
	decision, backend := "allowed", "redis"
	if !d.Allowed {
		decision = "limited"
	}
	if d.Local {
		backend = "local"
	}
	g.metrics.rateDecisions.WithLabelValues(class, decision, backend).Inc()
	rq.rate = &d
}

// forwardedHeaders are the only client headers a service receives; every
// other one (the API key, identity or internal headers, hop-by-hop headers,
// cookies, forwarding headers) is dropped, so nothing a client sends can
// pose as something the gateway vouches for.
var forwardedHeaders = map[string]bool{
	"accept": true, "accept-encoding": true, "accept-language": true,
	"content-type": true, "content-length": true, "idempotency-key": true,
	"user-agent": true, "if-none-match": true, "if-modified-since": true,
	"host": true, // replaced with the instance's address
}

// proxy sends the request to the route's upstream with the signed identity
// and the trace context, and streams the answer back.
func (g *Gateway) proxy(c *fiber.Ctx, rq *request, rt route) error {
	up := g.upstreams[rt.Upstream]
	req := c.Request()
	uri := string(req.RequestURI()) // original path and query, copied
	repeat := upstream.Repeat{
		Always:   rt.RepeatWithIdempotencyKey && len(req.Header.Peek("Idempotency-Key")) > 0,
		IfClosed: rt.Method == fiber.MethodGet,
	}
	scrubHeaders(&req.Header)
	req.Header.Set(fiber.HeaderXForwardedFor, c.IP())
	id := identity.Identity{OwnerID: rq.key.OwnerID, PlatformID: rq.key.PlatformID, KeyID: rq.key.ID,
		Scopes: rq.key.Scopes, RequestID: rq.id}
	for _, h := range g.signer.Sign(id, time.Now()) {
		req.Header.Set(h.Name, h.Value)
	}

	ctx, span := g.tracer.Start(rq.ctx, "proxy "+rt.Upstream, trace.WithSpanKind(trace.SpanKindClient))
	defer span.End()
	otel.GetTextMapPropagator().Inject(ctx, headerCarrier{&req.Header})
	affinity := ""
	if rt.StickyByKey {
		affinity = rq.key.ID
	}
	retried, err := up.Do(req, c.Response(), uri, repeat, affinity)
	if retried {
		g.metrics.upstreamRetries.WithLabelValues(rt.Upstream).Inc()
	}
	if err != nil {
		g.metrics.upstreamErrors.WithLabelValues(rt.Upstream, errorKind(err)).Inc()
		span.SetStatus(codes.Error, errorKind(err))
		return err
	}
	c.Response().Header.Del(fiber.HeaderConnection)
	return nil
}

func scrubHeaders(h *fasthttp.RequestHeader) {
	var drop [][]byte
	h.VisitAll(func(k, _ []byte) {
		if !forwardedHeaders[string(bytes.ToLower(k))] {
			drop = append(drop, bytes.Clone(k))
		}
	})
	for _, k := range drop {
		h.DelBytes(k)
	}
	// Cookies are kept apart from the other headers by fasthttp.
	h.DelAllCookies()
}

func errorKind(err error) string {
	switch {
	case errors.Is(err, upstream.ErrUnavailable):
		return "unavailable"
	case errors.Is(err, upstream.ErrUnreachable):
		return "unreachable"
	case errors.Is(err, upstream.ErrTimeout):
		return "timeout"
	case errors.Is(err, upstream.ErrClosed):
		return "closed"
	default:
		return "bad_response"
	}
}
