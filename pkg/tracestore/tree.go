package tracestore

import (
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"unicode"
)

// WriteTree prints spans as an indented tree, children under their parent.
// A span's links follow it, each as the span it links to, with that span's
// children when it is of another trace: found among linked (see
// LinkTargets), else named by its ids alone.
func WriteTree(w io.Writer, spans, linked []Span) {
	children := map[string][]Span{}
	ids := map[string]bool{}
	byID := map[string]Span{}
	for _, sp := range spans {
		ids[sp.SpanID] = true
		byID[sp.SpanID] = sp
	}
	for _, sp := range linked {
		if !ids[sp.SpanID] {
			byID[sp.SpanID] = sp
			children[sp.ParentID] = append(children[sp.ParentID], sp)
		}
	}
	var roots []Span
	for _, sp := range spans {
		if sp.ParentID == "" || !ids[sp.ParentID] {
			roots = append(roots, sp)
			continue
		}
		children[sp.ParentID] = append(children[sp.ParentID], sp)
	}
	// Each span is shown once, then named: two decisions of a request can
	// link to one round trip, and a link's target is walked from, not from
	// a root, so spans that are each other's parent (sent so: the file
	// takes any OTLP sender's) would loop forever.
	shown := map[string]bool{}
	var walk func(sp Span, depth int)
	walk = func(sp Span, depth int) {
		if shown[sp.SpanID] {
			fmt.Fprintf(w, "%s%s (span %s, shown above)\n", strings.Repeat("  ", depth), sp.Name, sp.SpanID)
			return
		}
		shown[sp.SpanID] = true
		fmt.Fprintf(w, "%s%-*s %-14s %-8s %8.2f ms %s\n", strings.Repeat("  ", depth), 48-2*depth, sp.Name,
			sp.Service, strings.TrimPrefix(sp.Kind, "SPAN_KIND_"), sp.DurationMS, interesting(sp))
		for _, ev := range sp.Events {
			fmt.Fprintf(w, "%s  · %s %s\n", strings.Repeat("  ", depth), ev.Name, allAttrs(ev.Attributes))
		}
		for _, l := range sp.Links {
			if ids[sp.SpanID] { // a span shown under a link: its own links are not followed
				writeLink(w, sp, l, byID, depth, walk)
			}
		}
		kids := children[sp.SpanID]
		sort.SliceStable(kids, func(i, j int) bool { return kids[i].Start.Before(kids[j].Start) })
		for _, k := range kids {
			walk(k, depth+1)
		}
	}
	for _, r := range roots {
		walk(r, 0)
	}
}

// writeLink prints sp's link l: the span it links to, with its children
// (walk), when that is an operation in another trace (the Redis round
// trip a request waited on); one line for a request of another trace (a
// round trip's links to the requests it decided: their ids) or for a span
// of sp's own trace, printed in its place; its ids when not found.
func writeLink(w io.Writer, sp Span, l Link, byID map[string]Span, depth int, walk func(Span, int)) {
	indent := strings.Repeat("  ", depth)
	target, ok := byID[l.SpanID]
	switch {
	case !ok || target.TraceID != l.TraceID:
		fmt.Fprintf(w, "%s  ↪ links to span %s of trace %s (not found)\n", indent, l.SpanID, l.TraceID)
	case l.TraceID == sp.TraceID:
		fmt.Fprintf(w, "%s  ↪ links to %q (span %s) of this trace\n", indent, target.Name, target.SpanID)
	case target.ParentID == "":
		fmt.Fprintf(w, "%s  ↪ links to request %s: %s %.2f ms %s\n", indent, l.TraceID, target.Name, target.DurationMS, interesting(target))
	default:
		fmt.Fprintf(w, "%s  ↪ links to (trace %s):\n", indent, l.TraceID)
		walk(target, depth+2)
	}
}

// LinkTargets returns the ids of the spans that spans link to in other
// traces: WriteTree shows those spans, and their children, under the link.
func LinkTargets(spans []Span) map[string]bool {
	targets := map[string]bool{}
	for _, sp := range spans {
		for _, l := range sp.Links {
			if l.TraceID != sp.TraceID {
				targets[l.SpanID] = true
			}
		}
	}
	return targets
}

// interestingAttrs are the attributes an SRE reads first, in the order
// shown: the outcome and why (a 401's auth failure, the part of a request
// the gateway could not read), who called (and the ids it gave the call
// itself: an X-Request-Id of its own, its traceparent's trace id), what the call was about (item,
// order, key, replay, whether a failed sale was applied), which limit
// refused it, how many calls a sale's commit group held, whether a list
// page was read ahead and, on a request that waited for its read, how the
// read ended, which instance answered (server.*, on proxy and client
// spans) and, on a client span, the URL it called (never secret: the
// shop's key goes in a header).
var interestingAttrs = []string{"http.response.status_code", "http.status_code", "app.error_code", "app.auth_failure",
	"app.unread_reason", "error.type", "app.cancel_reason", "app.cancel_cause", "app.rate_limit.class",
	"app.rate_limit.batch.decisions", "app.rate_limit.batch.traced_requests", "app.commit_group.calls",
	"app.commit_group.traced_calls", "owner.id", "api_key.id", "platform.id",
	"app.client_request_id", "app.client_trace_id", "app.item_id",
	"app.external_order_id", "app.idempotency_key", "app.idempotent_replay", "app.sale_applied", "server.address", "server.port",
	"url.full", "db.operation.name", "export.read_ahead", "export.read_ahead.result"}

// interesting picks sp's status, when one was set, then its
// interestingAttrs, and the path of a server span that matched no route: a
// service's has no http.route then, the gateway's a placeholder
// ("unmatched", "unrouted") that names no path; every real route is a path
// pattern.
func interesting(sp Span) string {
	var parts []string
	if st := status(sp); st != "" {
		parts = append(parts, st)
	}
	_, database := sp.Attributes["db.system.name"]
	for _, k := range interestingAttrs {
		if database && (k == "server.address" || k == "server.port") {
			continue // the one database of every SQL span: noise
		}
		if v, ok := sp.Attributes[k]; ok {
			parts = append(parts, k+"="+shown(v))
		}
	}
	routed := strings.Contains(sp.Attributes["http.route"], "/")
	if path := sp.Attributes["url.path"]; sp.Kind == "SPAN_KIND_SERVER" && !routed && path != "" {
		parts = append(parts, "url.path="+shown(path))
	}
	return strings.Join(parts, " ")
}

// status is sp's status as the tree prints it, first on its line: a
// proxy span whose answer broke off after its head carries that head's
// 200, and only its error status (with how the call failed: closed,
// timeout) says the request failed there. Unset, the SDK's default, is
// left out.
func status(sp Span) string {
	code := strings.TrimPrefix(sp.StatusCode, "STATUS_CODE_")
	switch {
	case code == "" || code == "UNSET":
		return ""
	case sp.StatusMessage == "":
		return "status=" + code
	}
	return "status=" + code + "(" + shown(sp.StatusMessage) + ")"
}

// allAttrs shows an event's attributes, sorted by key.
func allAttrs(attrs map[string]string) string {
	keys := make([]string, 0, len(attrs))
	for k := range attrs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + shown(attrs[k])
	}
	return strings.Join(parts, " ")
}

// shown is an attribute's value as the tree prints it: quoted, with its
// control characters escaped, when it holds any, since a client
// chooses some values (an item id decoded from %0A or %1B) and the tree is
// read on an operator's terminal, where a raw newline would forge a line
// and an escape sequence would drive the terminal.
func shown(v string) string {
	for _, r := range v {
		if !unicode.IsPrint(r) {
			return strconv.Quote(v)
		}
	}
	return v
}
