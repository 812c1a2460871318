package salescheck

import (
	"cmp"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"

	"github.com/anishathalye/porcupine"
)

// Counts tells how the calls of ops were answered: "200", "409
// item_already_sold", "503 unavailable", "503 unavailable, nothing
// applied" (its message said so), "no answer", … with their number.
func Counts(ops []porcupine.Operation) string {
	n := map[string]int{}
	for _, op := range ops {
		n[answerKind(op.Input.(Input), op.Output.(Output))]++
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(n)) {
		parts = append(parts, fmt.Sprintf("%s: %d", k, n[k]))
	}
	return strings.Join(parts, ", ")
}

func answerKind(in Input, out Output) string {
	switch {
	case out.Status == 0:
		return "no answer"
	case out.Status == http.StatusOK && in.Op == Read:
		return "200 read"
	case out.Status == http.StatusOK && out.Result.Replay:
		return "200 replay"
	case out.Status == http.StatusOK:
		return "200"
	}
	if out.NothingApplied {
		return fmt.Sprintf("%d %s, nothing applied", out.Status, out.Code)
	}
	return fmt.Sprintf("%d %s", out.Status, out.Code)
}

// Unexpected lists the answers no fault excuses: a 500 (the spec's
// "temporary internal error", which the writer keeps for bugs), or any
// status other than 200, 404, 409, 429, 502, 503 and 504.
func Unexpected(ops []porcupine.Operation) []string {
	var found []string
	for _, op := range ops {
		out := op.Output.(Output)
		switch out.Status {
		case 0, http.StatusOK, http.StatusNotFound, http.StatusConflict, http.StatusTooManyRequests,
			http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
			continue
		}
		found = append(found, describeOp(op))
	}
	return found
}

// MostInFlight is the largest number of calls of one item whose
// intervals hold one instant in common: the checker's work on an item
// grows with it (each subset of the calls in flight is a state it may
// try), so a test's history keeps it small enough to check in seconds.
func MostInFlight(ops []porcupine.Operation) int {
	most := 0
	for _, part := range partitionByItem(ops) {
		type edge struct {
			at    int64
			delta int
		}
		edges := make([]edge, 0, 2*len(part))
		for _, op := range part {
			edges = append(edges, edge{op.Call, 1}, edge{op.Return, -1})
		}
		// An interval that ends where another starts does not overlap
		// it: at one instant, ends come before starts.
		slices.SortFunc(edges, func(a, b edge) int {
			if a.at != b.at {
				return cmp.Compare(a.at, b.at)
			}
			return a.delta - b.delta
		})
		n := 0
		for _, e := range edges {
			n += e.delta
			most = max(most, n)
		}
	}
	return most
}
