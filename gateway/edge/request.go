package edge

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/coinexport/export/gateway/keystore"
	"github.com/coinexport/export/gateway/ratelimit"
	"github.com/coinexport/export/pkg/envelope"
	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"
)

// request is what the gateway knows about one request while serving it.
type request struct {
	ctx   context.Context
	span  trace.Span
	id    string
	route string
	start time.Time
	key   keystore.Key
	// rate is the decision whose X-RateLimit-* headers the answer carries.
	rate *ratelimit.Decision
}

// Span attribute keys of our own.
const (
	attrRequestID  = attribute.Key("request.id")
	attrOwnerID    = attribute.Key("owner.id")
	attrPlatformID = attribute.Key("platform.id")
	attrKeyID      = attribute.Key("api_key.id")
)

// begin starts the request's server span. The gateway is the root of a new
// trace unless inbound traceparent headers are trusted by configuration:
// an id chosen by an internet client would let it forge request ids.
func (g *Gateway) begin(c *fiber.Ctx, routeName string) *request {
	parent := context.Background()
	opts := []trace.SpanStartOption{
		trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(
			semconv.HTTPRequestMethodKey.String(c.Method()),
			semconv.HTTPRoute(routeName),
			semconv.URLPath(strings.Clone(c.Path())),
			semconv.ClientAddress(c.IP()),
		),
	}
	if g.cfg.TrustTraceparent {
		parent = otel.GetTextMapPropagator().Extract(parent, headerCarrier{&c.Request().Header})
	} else {
		opts = append(opts, trace.WithNewRoot())
	}
	ctx, span := g.tracer.Start(parent, routeName, opts...)
	id := span.SpanContext().TraceID().String()
	if !span.SpanContext().TraceID().IsValid() {
		id = randomID()
	}
	span.SetAttributes(attrRequestID.String(id))
	return &request{ctx: ctx, span: span, id: id, route: routeName, start: time.Now()}
}

// randomID stands in for a trace id if tracing ever yields none.
func randomID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// end sets the headers every answer carries, then records the request.
func (g *Gateway) end(c *fiber.Ctx, rq *request) {
	resp := &c.Response().Header
	resp.Set(envelope.RequestIDHeader, rq.id)
	if d := rq.rate; d != nil {
		resp.Set("X-RateLimit-Limit", strconv.FormatInt(d.Limit, 10))
		resp.Set("X-RateLimit-Remaining", strconv.FormatInt(d.Remaining, 10))
		resp.Set("X-RateLimit-Reset", strconv.FormatInt(ceilUnix(d.Reset), 10))
	}
	status := c.Response().StatusCode()
	elapsed := time.Since(rq.start)
	class := statusClass(status)
	g.metrics.requests.WithLabelValues(rq.route, class).Inc()
	g.metrics.duration.WithLabelValues(rq.route, class).Observe(elapsed.Seconds())

	rq.span.SetAttributes(semconv.HTTPResponseStatusCode(status))
	if status >= 500 {
		rq.span.SetStatus(codes.Error, strconv.Itoa(status))
	}
	attrs := []slog.Attr{
		slog.String("method", c.Method()), slog.String("route", rq.route), slog.Int("status", status),
		slog.Float64("duration_ms", float64(elapsed.Microseconds())/1000), slog.String("client_ip", c.IP()),
	}
	if rq.key.ID != "" {
		attrs = append(attrs, slog.String("owner_id", rq.key.OwnerID), slog.String("key_id", rq.key.ID))
		if rq.key.PlatformID != "" {
			attrs = append(attrs, slog.String("platform_id", rq.key.PlatformID))
		}
	}
	g.log.LogAttrs(rq.ctx, slog.LevelInfo, "request", attrs...)
	rq.span.End()
}

// writeError answers err as an error envelope, dropping whatever an
// upstream may have started to answer.
func (g *Gateway) writeError(c *fiber.Ctx, rq *request, err error) {
	ae, logIt := toAPIError(err)
	if logIt {
		g.log.ErrorContext(rq.ctx, "request failed", "status", ae.Status, "code", ae.Code, "error", err.Error())
		rq.span.RecordError(err)
	}
	resp := c.Response()
	resp.Reset()
	resp.SetStatusCode(ae.Status)
	resp.Header.SetContentType(envelope.ContentType)
	if ae.RetryAfter > 0 {
		resp.Header.Set(fiber.HeaderRetryAfter, strconv.FormatInt(retryAfterSeconds(ae.RetryAfter), 10))
	}
	if ae.Allow != "" {
		resp.Header.Set(fiber.HeaderAllow, ae.Allow)
	}
	resp.SetBody(envelope.ErrorBytes(ae.Code, ae.Message, rq.id))
}

// retryAfterSeconds rounds up, so a client that waits exactly that long is
// never early.
func retryAfterSeconds(d time.Duration) int64 {
	return max(int64(math.Ceil(d.Seconds())), 1)
}

func ceilUnix(t time.Time) int64 {
	s := t.Unix()
	if t.Nanosecond() > 0 {
		s++
	}
	return s
}

// headerCarrier adapts fasthttp request headers to OTel propagation.
type headerCarrier struct{ h *fasthttp.RequestHeader }

func (c headerCarrier) Get(key string) string { return string(c.h.Peek(key)) }
func (c headerCarrier) Set(key, value string) { c.h.Set(key, value) }
func (c headerCarrier) Keys() []string {
	var keys []string
	c.h.VisitAll(func(k, _ []byte) { keys = append(keys, string(k)) })
	return keys
}
