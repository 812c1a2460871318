// Package api is the HTTP layer of the shop-schema service: it decodes the
// body, calls shopschema, and encodes the envelope. All routes are in Routes;
// all errors become HTTP answers in writeError.
package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/coinexport/export/pkg/envelope"
	"github.com/coinexport/export/pkg/httpserver"
	"github.com/coinexport/export/pkg/logging"
	"github.com/coinexport/export/pkg/strictjson"
	"github.com/prometheus/client_golang/prometheus"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/coinexport/export/services/shop-schema/internal/prestashop"
	"github.com/coinexport/export/services/shop-schema/internal/shoplimit"
	"github.com/coinexport/export/services/shop-schema/internal/shopschema"
)

// maxBodyBytes bounds the request body: two short strings.
const maxBodyBytes = 16 << 10

// Handler serves the shop schema route.
type Handler struct {
	svc   *shopschema.Service
	log   *slog.Logger
	reads *prometheus.CounterVec
	// slots bounds the reads in flight: each may hold several connections
	// for up to the whole-call timeout, so a burst past the gateway's rate
	// limit (or many gateway instances) gets 429 instead of piling up.
	slots *slots
	// shops bounds the reads in flight per shop (nil: no cap), so that one
	// slow shop, called from however many client addresses, holds a few
	// slots and leaves the rest to other merchants' shops.
	shops *shoplimit.Limiter
	// shopRefusals counts the reads refused by the per-shop cap, which are
	// answered rate_limited too.
	shopRefusals prometheus.Counter
	// busyLines throttles the WARN of a read refused for want of a slot:
	// at the limit, every call may be refused.
	busyLines *logging.Throttle
}

// busyLineInterval is the least time between two WARNs of reads refused
// for want of a slot; each counts the refusals since the one before.
const busyLineInterval = 10 * time.Second

// errBusy refuses a read while every slot is taken
// (SHOP_SCHEMA_MAX_CONCURRENT reads in flight).
var errBusy = errors.New("api: too many shop schema reads in progress")

// busyCode is errBusy's error code; the gateway's own rate limit answers
// the same one.
const busyCode = "rate_limited"

// NewHandler returns the handler and registers its metrics on reg. At most
// maxConcurrent shop reads run at once, at most maxPerShop of them of one
// shop (shoplimit; 0: no cap per shop).
func NewHandler(svc *shopschema.Service, log *slog.Logger, reg prometheus.Registerer, maxConcurrent, maxPerShop int) *Handler {
	h := &Handler{svc: svc, log: log, slots: newSlots(maxConcurrent), shops: shoplimit.New(maxPerShop),
		busyLines: &logging.Throttle{Interval: busyLineInterval}}
	h.reads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "shop_schema_reads_total",
		Help: "Shop schema reads, by outcome (ok or the error code answered).",
	}, []string{"outcome"})
	h.shopRefusals = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "shop_schema_shop_busy_total",
		Help: "Shop schema reads refused because their shop already had SHOP_SCHEMA_MAX_CONCURRENT_PER_SHOP reads in flight (answered rate_limited).",
	})
	reg.MustRegister(h.reads, h.shopRefusals,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "shop_schema_slots_held",
			Help: "Shop schema reads holding a slot now (of SHOP_SCHEMA_MAX_CONCURRENT).",
		}, func() float64 { return float64(h.slots.inUse()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "shop_schema_shop_counts_held",
			Help: "Reads counted against their shops now, summed over shops (a read reaching two shops counts twice); 0 with SHOP_SCHEMA_MAX_CONCURRENT_PER_SHOP=0.",
		}, func() float64 { return float64(h.shops.Total()) }))
	// The refusal for every slot taken shows at 0 from the start: an alert
	// on its rate needs the series before the first one.
	h.reads.WithLabelValues(busyCode)
	return h
}

// Routes registers every route of the service.
func Routes(mux *http.ServeMux, h *Handler) {
	mux.HandleFunc("POST /v1/sync/prestashop/schema", h.schema)
}

func (h *Handler) schema(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	requestID := httpserver.RequestID(r)
	held := h.slots.take(requestID)
	if held == nil {
		// Refused before the body is read: not a "shop schema refused"
		// line, which is about a shop, but what holds the slots.
		h.reads.WithLabelValues(h.writeError(w, r, errBusy, requestID, "")).Inc()
		h.logSlotsHeld(r)
		return
	}
	defer h.slots.release(held)
	req, err := decode(w, r)
	keepKeyOutOfUserAgent(r, req.WSKey)
	if err != nil {
		h.refuse(w, r, req, err, start)
		return
	}
	h.slots.aim(held, h.svc.Host(req))
	claim := h.shops.Claim()
	defer claim.Release()
	result, err := h.svc.Read(shoplimit.With(r.Context(), claim), req)
	if err != nil {
		if errors.Is(err, shoplimit.ErrBusy) {
			h.shopRefusals.Inc()
			h.logShopBusy(r, req, claim)
		}
		h.refuse(w, r, req, err, start)
		return
	}
	// Encoded before the read counts as ok: a failure is answered, logged
	// and counted once, by writeError, as any other.
	answer, err := envelope.DataBytes(result, envelope.Meta{RequestID: requestID})
	if err != nil {
		h.refuse(w, r, req, fmt.Errorf("encode the schema: %w", err), start)
		return
	}
	h.reads.WithLabelValues("ok").Inc()
	h.log.InfoContext(r.Context(), "shop schema read", "shop_host", h.svc.Host(req),
		"shop_version", result.ShopVersion, "categories", len(result.Categories),
		"features", len(result.Features), "duration_ms", time.Since(start).Milliseconds())
	writeSchema(w, r, answer, requestID)
}

// keepKeyOutOfUserAgent replaces the server span's user_agent.original
// when the client's User-Agent holds the request's ws_key
// (prestashop.HoldsKey: in any case, as its Basic credential, %-encoded),
// trimmed as the shop gets it. pkg/httpserver records the header as the
// gateway forwards it, before the body, and so the key, is read: a sale
// module that writes its key there would have it in every trace.
func keepKeyOutOfUserAgent(r *http.Request, key string) {
	span := trace.SpanFromContext(r.Context())
	if span.IsRecording() && prestashop.HoldsKey(r.UserAgent(), strings.TrimSpace(key)) {
		span.SetAttributes(semconv.UserAgentOriginal("[holds the ws_key]"))
	}
}

// logSlotsHeld writes, at most once per busyLineInterval, a WARN of what
// holds every slot: the oldest read (its request id, for its own lines and
// trace), the shop holding the most, how many shops and how many reads
// still reading their body, the answer to "one slow shop, slow callers, or
// too few instances?" that the 429's access line left open.
func (h *Handler) logSlotsHeld(r *http.Request) {
	ok, skipped := h.busyLines.Allow("busy")
	if !ok {
		return
	}
	held := h.slots.holders()
	attrs := []any{"slots", h.slots.max, "refused_since_last", skipped, "shop_hosts", held.hosts,
		"reading_body", held.readingBody, "busiest_shop_host", held.busiestHost, "busiest_shop_slots", held.busiest}
	// The reads that held the slots may all have ended since this one was
	// refused: no oldest then (a zero one would read as held since year
	// 1, oldest_held_ms 9223372036854).
	if !held.oldest.since.IsZero() {
		attrs = append(attrs, "oldest_request_id", held.oldest.requestID, "oldest_shop_host", held.oldest.host,
			"oldest_since", held.oldest.since, "oldest_held_ms", time.Since(held.oldest.since).Milliseconds())
	}
	h.log.WarnContext(r.Context(), "shop schema read refused: every slot taken", attrs...)
}

// logShopBusy writes, at most once per busyLineInterval, a WARN of a read
// refused by the per-shop cap: the shop (its address, or its IPv6 /64, as
// counted), the host the read was for, and the cap. Not a secret: the
// address is the one the shop's own name resolves to, and the line is the
// operator's, never the caller's.
func (h *Handler) logShopBusy(r *http.Request, req shopschema.Request, claim *shoplimit.Claim) {
	ok, skipped := h.busyLines.Allow("shop")
	if !ok {
		return
	}
	shop, _ := claim.Refused()
	h.log.WarnContext(r.Context(), "shop schema read refused: too many reads of this shop in progress",
		"shop", shop.String(), "shop_host", h.svc.Host(req), "per_shop_max", h.shops.Max(),
		"shop_reads", h.shops.InFlight(shop), "refused_since_last", skipped)
}

// refuse answers err (writeError), counts the read under the code answered
// and logs the refusal with the shop's host as the log may name it.
func (h *Handler) refuse(w http.ResponseWriter, r *http.Request, req shopschema.Request, err error, start time.Time) {
	host := h.svc.Host(req)
	code := h.writeError(w, r, err, httpserver.RequestID(r), host)
	h.reads.WithLabelValues(code).Inc()
	h.log.InfoContext(r.Context(), "shop schema refused", "shop_host", host,
		"code", code, "duration_ms", time.Since(start).Milliseconds())
}

// decode reads the body strictly: one JSON object, only base_url and
// ws_key (names matched exactly, unlike encoding/json's default), each at
// most once, nothing after it. Any Content-Type is accepted: spec 4.2 names
// none for this route (README, "Request").
func decode(w http.ResponseWriter, r *http.Request) (shopschema.Request, error) {
	if r.URL.RawQuery != "" {
		// Read by no one, a parameter would be ignored, and a ws_key sent
		// there (and so in every URL log on the way) would be answered
		// missing_ws_key without a word on where it belongs.
		return shopschema.Request{}, &shopschema.InputError{Code: shopschema.CodeInvalidParam,
			Message: "this route reads no query parameters; base_url and ws_key go in the JSON body, never in a URL"}
	}
	raw, err := httpserver.ReadBody(w, r, maxBodyBytes)
	switch {
	case errors.Is(err, httpserver.ErrBodyTooLarge), errors.Is(err, httpserver.ErrBodyAbandoned):
		return shopschema.Request{}, err // writeError answers 413 or 499
	case err != nil:
		return shopschema.Request{}, invalidBody("the body could not be read")
	}
	fields, err := parseObject(raw)
	if err != nil {
		return shopschema.Request{}, err
	}
	// The key is read first: a body refused for another property still
	// returns it, for the span's User-Agent to be kept free of it
	// (keepKeyOutOfUserAgent). A ws_key that is not a string counts as
	// missing, and is reported as such after base_url's checks
	// (shopschema.Service.Read), in the same order as an absent one.
	var req shopschema.Request
	if !stringField(fields["ws_key"], &req.WSKey) {
		req.WSKey = ""
	}
	for name := range fields {
		if name != "base_url" && name != "ws_key" {
			return req, invalidBody("unknown property in the body; allowed: base_url, ws_key")
		}
	}
	if !stringField(fields["base_url"], &req.BaseURL) {
		return req, &shopschema.InputError{Code: shopschema.CodeInvalidBaseURL, Message: "base_url must be a string"}
	}
	return req, nil
}

// parseObject returns the properties of the body's one JSON object.
func parseObject(raw []byte) (map[string]json.RawMessage, error) {
	// encoding/json keeps the last of two equal names, and reads invalid
	// UTF-8 and lone surrogate escapes as U+FFFD, so the shop would get
	// another key or address than the one sent. strictjson refuses all three.
	if fault := strictjson.CheckObject(raw); fault != nil {
		// Fixed phrases only: a property name may be anything, the key
		// included, so a repeated one is not named.
		return nil, invalidBody(fault.Message)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil || fields == nil { // a guard: CheckObject refused all but objects
		return nil, invalidBody("the body must be a JSON object")
	}
	return fields, nil
}

// stringField decodes an optional string; absent and null give "".
func stringField(raw json.RawMessage, dst *string) bool {
	if raw == nil || bytes.Equal(raw, []byte("null")) {
		return true
	}
	return json.Unmarshal(raw, dst) == nil
}

func invalidBody(msg string) error {
	return &shopschema.InputError{Code: shopschema.CodeInvalidBody, Message: msg}
}
