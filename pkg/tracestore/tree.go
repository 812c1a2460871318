package tracestore

import (
	"fmt"
	"io"
	"sort"
	"strings"
)

// WriteTree prints spans as an indented tree, children under their parent.
func WriteTree(w io.Writer, spans []Span) {
	children := map[string][]Span{}
	ids := map[string]bool{}
	for _, sp := range spans {
		ids[sp.SpanID] = true
	}
	var roots []Span
	for _, sp := range spans {
		if sp.ParentID == "" || !ids[sp.ParentID] {
			roots = append(roots, sp)
			continue
		}
		children[sp.ParentID] = append(children[sp.ParentID], sp)
	}
	var walk func(sp Span, depth int)
	walk = func(sp Span, depth int) {
		fmt.Fprintf(w, "%s%-*s %-14s %-8s %8.2f ms %s\n", strings.Repeat("  ", depth), 48-2*depth, sp.Name,
			sp.Service, strings.TrimPrefix(sp.Kind, "SPAN_KIND_"), sp.DurationMS, interesting(sp.Attributes))
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

// interesting picks the attributes an SRE reads first.
func interesting(attrs map[string]string) string {
	var parts []string
	for _, k := range []string{"http.response.status_code", "http.status_code", "owner.id", "platform.id", "item.id", "error.code", "db.operation.name", "export.read_ahead"} {
		if v, ok := attrs[k]; ok {
			parts = append(parts, k+"="+v)
		}
	}
	return strings.Join(parts, " ")
}
