// Package tracestore is a small OTLP/HTTP trace receiver: it accepts the
// spans every binary exports (POST /v1/traces, protobuf or JSON), keeps them
// in memory and optionally appends them to a JSON Lines file, and finds the
// spans of one trace. `make run` uses it as the local trace view (a request
// id is a trace id), and tests use it to check a request's whole trace.
package tracestore

import (
	"bytes"
	"compress/gzip"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coinexport/export/pkg/envelope"
	"github.com/coinexport/export/pkg/httpserver"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// Span is one received span, flattened.
type Span struct {
	TraceID       string            `json:"trace_id"`
	SpanID        string            `json:"span_id"`
	ParentID      string            `json:"parent_span_id,omitempty"`
	Service       string            `json:"service"`
	Name          string            `json:"name"`
	Kind          string            `json:"kind"`
	Start         time.Time         `json:"start"`
	DurationMS    float64           `json:"duration_ms"`
	StatusCode    string            `json:"status,omitempty"`
	StatusMessage string            `json:"status_message,omitempty"` // an error status's description: how the call failed
	Attributes    map[string]string `json:"attributes,omitempty"`
	Events        []Event           `json:"events,omitempty"`
	Links         []Link            `json:"links,omitempty"`
}

// Link is a span's link to another span, often of another trace: the
// gateway's "rate limit" span links to the Redis round trip it waited on,
// which another request's trace may hold.
type Link struct {
	TraceID string `json:"trace_id"`
	SpanID  string `json:"span_id"`
}

// Event is one event of a span (the gateway's "sent again", an error
// recorded), flattened.
type Event struct {
	Name       string            `json:"name"`
	Attributes map[string]string `json:"attributes,omitempty"`
}

// Store receives and keeps spans.
type Store struct {
	mu    sync.Mutex
	spans []Span
	out   io.Writer // JSON Lines sink; nil keeps spans in memory only
	limit int
}

// New returns a store that keeps at most limit spans in memory (0: 100,000)
// and appends every span to out when out is not nil.
func New(out io.Writer, limit int) *Store {
	if limit <= 0 {
		limit = 100_000
	}
	return &Store{out: out, limit: limit}
}

// maxExportBytes bounds one export request (the SDKs' batches are far
// smaller).
const maxExportBytes = 32 << 20

// ServeHTTP implements the OTLP/HTTP traces endpoint: protobuf, or JSON
// (Content-Type application/json, with or without parameters), as sent or
// gzip-compressed.
func (s *Store) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/traces" {
		writeError(w, http.StatusNotFound, "not_found", "OTLP/HTTP traces only: POST /v1/traces")
		return
	}
	req, refused := readExport(w, r)
	if refused != nil {
		writeError(w, refused.status, refused.code, refused.message)
		return
	}
	if err := s.add(flatten(req)); err != nil {
		// Not a 200: the exporter reports it in its process's log, where a
		// span lost without a word left make trace saying "retry".
		writeError(w, http.StatusInternalServerError, "internal_error", err.Error())
		return
	}
	resp, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(resp)
}

// refusal is an export refused as it was sent: the status, code and
// message it is answered with.
type refusal struct {
	status        int
	code, message string
}

// readExport reads r's export request: its body, decompressed, decoded as
// its Content-Type says.
func readExport(w http.ResponseWriter, r *http.Request) (*collectortrace.ExportTraceServiceRequest, *refusal) {
	body, err := httpserver.ReadBody(w, r, maxExportBytes)
	if errors.Is(err, httpserver.ErrBodyTooLarge) {
		return nil, &refusal{http.StatusRequestEntityTooLarge, "payload_too_large", "an export over 32 MiB: send smaller batches"}
	}
	if err != nil {
		return nil, &refusal{http.StatusBadRequest, "bad_request", "the body could not be read"}
	}
	body, err = decoded(body, r.Header.Get("Content-Encoding"))
	switch {
	case errors.Is(err, errUnknownEncoding):
		return nil, &refusal{http.StatusUnsupportedMediaType, "unsupported_content_encoding", "send the export uncompressed or gzip-compressed"}
	case errors.Is(err, httpserver.ErrBodyTooLarge):
		return nil, &refusal{http.StatusRequestEntityTooLarge, "payload_too_large", "an export over 32 MiB once decompressed: send smaller batches"}
	case err != nil:
		return nil, &refusal{http.StatusBadRequest, "bad_request", "the body is not valid gzip"}
	}
	var req collectortrace.ExportTraceServiceRequest
	if mediaType, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mediaType == "application/json" {
		err = protojson.Unmarshal(body, &req)
	} else {
		err = proto.Unmarshal(body, &req)
	}
	if err != nil {
		return nil, &refusal{http.StatusBadRequest, "bad_request", "not an OTLP ExportTraceServiceRequest (protobuf, or JSON with Content-Type application/json)"}
	}
	return &req, nil
}

// errUnknownEncoding is decoded's error for a Content-Encoding other than
// gzip or identity.
var errUnknownEncoding = errors.New("tracestore: unknown Content-Encoding")

// decoded returns body without its Content-Encoding. OTLP/HTTP lets an
// exporter gzip its export, and the SDKs do when OTEL_EXPORTER_OTLP_COMPRESSION
// is gzip (set for make run, it reaches every binary): refused 400 as not
// OTLP, every span of such a stack was lost. Decompressed, it is held to the same
// size as an export sent as it is.
func decoded(body []byte, encoding string) ([]byte, error) {
	switch strings.ToLower(strings.TrimSpace(encoding)) {
	case "", "identity":
		return body, nil
	case "gzip":
		zr, err := gzip.NewReader(bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		plain, err := io.ReadAll(io.LimitReader(zr, maxExportBytes+1))
		if err != nil {
			return nil, err
		}
		if len(plain) > maxExportBytes {
			return nil, httpserver.ErrBodyTooLarge
		}
		return plain, nil
	}
	return nil, errUnknownEncoding
}

// writeError answers with the envelope, as every process of the stack does;
// a request to the collector has no request id of the stack's, so it gets
// one of its own.
func writeError(w http.ResponseWriter, status int, code, message string) {
	envelope.WriteError(w, status, code, message, httpserver.RandomRequestID())
}

// add keeps spans and appends them to the file, if any; the error is the
// file's (a full disk), said without a span's content.
func (s *Store) add(spans []Span) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.spans = append(s.spans, spans...)
	if over := len(s.spans) - s.limit; over > 0 {
		s.spans = append([]Span(nil), s.spans[over:]...)
	}
	if s.out == nil {
		return nil
	}
	enc := json.NewEncoder(s.out)
	for _, sp := range spans {
		if err := enc.Encode(sp); err != nil {
			return fmt.Errorf("the spans could not be written to the span file: %w", err)
		}
	}
	return nil
}

// Trace returns the spans of one trace, earliest first.
func (s *Store) Trace(traceID string) []Span {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Span
	for _, sp := range s.spans {
		if sp.TraceID == traceID {
			out = append(out, sp)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Start.Before(out[j].Start) })
	return out
}

// All returns every span received.
func (s *Store) All() []Span {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Span(nil), s.spans...)
}

func flatten(req *collectortrace.ExportTraceServiceRequest) []Span {
	var out []Span
	for _, rs := range req.GetResourceSpans() {
		service := attrValue(rs.GetResource().GetAttributes(), "service.name")
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				attrs := flattenAttrs(sp.GetAttributes())
				var events []Event
				for _, ev := range sp.GetEvents() {
					events = append(events, Event{Name: ev.GetName(), Attributes: flattenAttrs(ev.GetAttributes())})
				}
				var links []Link
				for _, l := range sp.GetLinks() {
					links = append(links, Link{TraceID: hex.EncodeToString(l.GetTraceId()), SpanID: hex.EncodeToString(l.GetSpanId())})
				}
				start := time.Unix(0, int64(sp.GetStartTimeUnixNano()))
				out = append(out, Span{
					TraceID:       hex.EncodeToString(sp.GetTraceId()),
					SpanID:        hex.EncodeToString(sp.GetSpanId()),
					ParentID:      hex.EncodeToString(sp.GetParentSpanId()),
					Service:       service,
					Name:          sp.GetName(),
					Kind:          sp.GetKind().String(),
					Start:         start,
					DurationMS:    float64(sp.GetEndTimeUnixNano()-sp.GetStartTimeUnixNano()) / 1e6,
					StatusCode:    sp.GetStatus().GetCode().String(),
					StatusMessage: sp.GetStatus().GetMessage(),
					Attributes:    attrs,
					Events:        events,
					Links:         links,
				})
			}
		}
	}
	return out
}

func flattenAttrs(kvs []*commonpb.KeyValue) map[string]string {
	attrs := map[string]string{}
	for _, kv := range kvs {
		attrs[kv.GetKey()] = anyString(kv.GetValue())
	}
	return attrs
}

func attrValue(kvs []*commonpb.KeyValue, key string) string {
	for _, kv := range kvs {
		if kv.GetKey() == key {
			return anyString(kv.GetValue())
		}
	}
	return ""
}

func anyString(v *commonpb.AnyValue) string {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return strconv.FormatInt(x.IntValue, 10)
	case *commonpb.AnyValue_BoolValue:
		return strconv.FormatBool(x.BoolValue)
	case *commonpb.AnyValue_DoubleValue:
		return strconv.FormatFloat(x.DoubleValue, 'g', -1, 64)
	default:
		b, _ := protojson.Marshal(v)
		return string(b)
	}
}
