package telemetry

import (
	"context"
	"slices"
	"strings"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// validUTF8Exporter passes spans on with every string made valid UTF-8.
//
// Spans carry what clients send: a path segment, a User-Agent. OTLP
// encodes strings as protobuf strings, which must be UTF-8, and the
// exporter refuses the whole batch when one is not ("string field contains
// invalid UTF-8"): one request with %FF in its path erased the spans of
// every other request exported with it, other tenants' included. Each
// invalid byte sequence becomes U+FFFD here, in one place for every
// attribute of every process (strings at any depth of a value), present and future. Spans that are valid
// already (all but a hostile few) are passed on as they are.
type validUTF8Exporter struct {
	sdktrace.SpanExporter
}

func (e validUTF8Exporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	copied := false
	for i, s := range spans {
		if spanIsValidUTF8(s) {
			continue
		}
		if !copied { // the slice is the batcher's
			spans, copied = slices.Clone(spans), true
		}
		spans[i] = validUTF8Span{s}
	}
	return e.SpanExporter.ExportSpans(ctx, spans)
}

func spanIsValidUTF8(s sdktrace.ReadOnlySpan) bool {
	if !utf8.ValidString(s.Name()) || !utf8.ValidString(s.Status().Description) || !attrsAreValidUTF8(s.Attributes()) {
		return false
	}
	for _, ev := range s.Events() {
		if !utf8.ValidString(ev.Name) || !attrsAreValidUTF8(ev.Attributes) {
			return false
		}
	}
	for _, l := range s.Links() {
		if !attrsAreValidUTF8(l.Attributes) {
			return false
		}
	}
	return true
}

func attrsAreValidUTF8(attrs []attribute.KeyValue) bool {
	for _, kv := range attrs {
		if !utf8.ValidString(string(kv.Key)) || !valueIsValidUTF8(kv.Value) {
			return false
		}
	}
	return true
}

// valueIsValidUTF8 looks into every kind of value that holds strings,
// slices and maps of values included.
func valueIsValidUTF8(v attribute.Value) bool {
	switch v.Type() {
	case attribute.STRING:
		return utf8.ValidString(v.AsString())
	case attribute.STRINGSLICE:
		for _, s := range v.AsStringSlice() {
			if !utf8.ValidString(s) {
				return false
			}
		}
	case attribute.SLICE:
		for _, e := range v.AsSlice() {
			if !valueIsValidUTF8(e) {
				return false
			}
		}
	case attribute.MAP:
		return attrsAreValidUTF8(v.AsMap())
	}
	return true
}

// validUTF8Span is a span whose strings are returned made valid; the rest
// is the span's own (the embedded interface also brings its unexported
// method, so this is a ReadOnlySpan).
type validUTF8Span struct {
	sdktrace.ReadOnlySpan
}

func (s validUTF8Span) Name() string { return validString(s.ReadOnlySpan.Name()) }

func (s validUTF8Span) Status() sdktrace.Status {
	st := s.ReadOnlySpan.Status()
	st.Description = validString(st.Description)
	return st
}

func (s validUTF8Span) Attributes() []attribute.KeyValue {
	return validAttrs(s.ReadOnlySpan.Attributes())
}

func (s validUTF8Span) Events() []sdktrace.Event {
	events := append([]sdktrace.Event(nil), s.ReadOnlySpan.Events()...)
	for i := range events {
		events[i].Name = validString(events[i].Name)
		events[i].Attributes = validAttrs(events[i].Attributes)
	}
	return events
}

func (s validUTF8Span) Links() []sdktrace.Link {
	links := append([]sdktrace.Link(nil), s.ReadOnlySpan.Links()...)
	for i := range links {
		links[i].Attributes = validAttrs(links[i].Attributes)
	}
	return links
}

func validAttrs(attrs []attribute.KeyValue) []attribute.KeyValue {
	out := make([]attribute.KeyValue, len(attrs))
	for i, kv := range attrs {
		out[i] = attribute.KeyValue{Key: attribute.Key(validString(string(kv.Key))), Value: validValue(kv.Value)}
	}
	return out
}

func validValue(v attribute.Value) attribute.Value {
	switch v.Type() {
	case attribute.STRING:
		return attribute.StringValue(validString(v.AsString()))
	case attribute.STRINGSLICE:
		ss := slices.Clone(v.AsStringSlice())
		for i := range ss {
			ss[i] = validString(ss[i])
		}
		return attribute.StringSliceValue(ss)
	case attribute.SLICE:
		vs := v.AsSlice()
		out := make([]attribute.Value, len(vs))
		for i, e := range vs {
			out[i] = validValue(e)
		}
		return attribute.SliceValue(out...)
	case attribute.MAP:
		return attribute.MapValue(validAttrs(v.AsMap())...)
	}
	return v
}

func validString(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }
