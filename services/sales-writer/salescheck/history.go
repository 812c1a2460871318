package salescheck

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
)

// History records calls as they are sent and answered, from any number of
// goroutines.
type History struct {
	mu    sync.Mutex
	start time.Time
	ops   []porcupine.Operation
}

// NewHistory starts an empty history.
func NewHistory() *History { return &History{start: time.Now()} }

// Call is one call in flight; Done records its answer.
type Call struct {
	h      *History
	client int
	in     Input
	call   int64
}

// Begin records in being sent by client (a number from 0, for the
// visualization) and returns the call to finish with Done.
func (h *History) Begin(client int, in Input) *Call {
	return &Call{h: h, client: client, in: in, call: h.now()}
}

// Done records the call's answer.
func (c *Call) Done(out Output) {
	ret := c.h.now()
	if out.Unknown {
		// It may take effect at any later instant: its interval never
		// ends (Check gives it an end past every other).
		ret = math.MaxInt64
	}
	c.h.mu.Lock()
	defer c.h.mu.Unlock()
	c.h.ops = append(c.h.ops, porcupine.Operation{ClientId: c.client, Input: c.in, Call: c.call, Output: out, Return: ret})
}

func (h *History) now() int64 { return int64(time.Since(h.start)) }

// clockStep is how far the wall clock has been stepped since the history
// began (the instants are read on the monotonic clock, which a step does
// not move; both are slewed alike).
func (h *History) clockStep() time.Duration {
	now := time.Now()
	return now.Round(0).Sub(h.start.Round(0)) - now.Sub(h.start)
}

// Calls returns the calls recorded so far, each attempt as it was sent
// and answered.
func (h *History) Calls() []porcupine.Operation {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.ops)
}

// Operations returns the calls recorded so far for the check, those of unknown outcome
// bounded as follows.
//
// A call of unknown outcome may take effect at any instant after its
// sending, so its interval has no end; but once an identical request under
// its key has been answered, any effect of its own came before that answer
// or is none (its key is bound by then: it could only be answered again),
// so its interval ends there. And of the attempts of one request under one
// key, at most one has an effect (the first to bind the key): those of
// unknown outcome sent before its first answer are one call, from the
// first sending to that answer, and those sent after it are none. Without
// these bounds the checker would have to place each attempt at every
// later point, and the tens of attempts a client makes through an outage
// would make a history of a minute impossible to check. A read of unknown
// outcome changes nothing and is left out, and so is an attempt answered
// that nothing was applied (Output.NothingApplied): it is taken at its
// word, a no-op, so the request's one call starts at the first sending
// of an attempt that did not say so, and a history whose effect came
// earlier (a read, or another request's answer, saw it) fails the check.
// Calls never answered end after every other.
func (h *History) Operations() []porcupine.Operation {
	recorded := h.Calls()
	var last int64
	answered := map[Input]int64{} // the first answer that bound each request's key
	for _, op := range recorded {
		in, out := op.Input.(Input), op.Output.(Output)
		last = max(last, op.Call)
		if out.Unknown {
			continue
		}
		last = max(last, op.Return)
		if first, ok := answered[in]; in.Op != Read && out.Code != codeInProgress && (!ok || op.Return < first) {
			answered[in] = op.Return
		}
	}
	var ops []porcupine.Operation
	merged := map[Input]int{} // index in ops of a request's unknown attempts
	for _, op := range recorded {
		in, out := op.Input.(Input), op.Output.(Output)
		if !out.Unknown {
			ops = append(ops, op)
			continue
		}
		end, told := answered[in]
		switch {
		case in.Op == Read, out.NothingApplied, told && op.Call > end:
			continue
		case !told:
			end = last + 1
		}
		if i, ok := merged[in]; ok {
			ops[i].Call = min(ops[i].Call, op.Call)
			continue
		}
		op.Return = end
		merged[in] = len(ops)
		ops = append(ops, op)
	}
	return ops
}

// record is one call as WriteJSON writes it.
type record struct {
	Client int    `json:"client"`
	Input  Input  `json:"input"`
	Output Output `json:"output"`
	Call   int64  `json:"call"`
	Return int64  `json:"return"`
}

// WriteJSON writes the calls recorded, one JSON object a line, for a
// person to read (salesdrill -history).
func (h *History) WriteJSON(w io.Writer) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	enc := json.NewEncoder(w)
	for _, op := range h.ops {
		if err := enc.Encode(record{op.ClientId, op.Input.(Input), op.Output.(Output), op.Call, op.Return}); err != nil {
			return err
		}
	}
	return nil
}

// Model is the sale state machine as a porcupine model, partitioned by item.
func Model() porcupine.Model {
	return porcupine.Model{
		Partition: partitionByItem,
		Init:      func() any { return state{} },
		Step: func(s, in, out any) (bool, any) {
			return step(s.(state), in.(Input), out.(Output))
		},
		Equal: func(a, b any) bool { return a.(state).equal(b.(state)) },
		Hash:  func(s any) uint64 { return s.(state).hash() },
		DescribeOperation: func(in, out any) string {
			return in.(Input).String() + " → " + out.(Output).String()
		},
		DescribeState: func(s any) string { return describeState(s.(state)) },
	}
}

func partitionByItem(ops []porcupine.Operation) [][]porcupine.Operation {
	byItem := map[string][]porcupine.Operation{}
	var items []string
	for _, op := range ops {
		item := op.Input.(Input).Item
		if _, seen := byItem[item]; !seen {
			items = append(items, item)
		}
		byItem[item] = append(byItem[item], op)
	}
	parts := make([][]porcupine.Operation, 0, len(items))
	for _, item := range items {
		parts = append(parts, byItem[item])
	}
	return parts
}

// ErrNotLinearizable is Linearizable's error for a history no order of
// its calls explains.
var ErrNotLinearizable = errors.New("the history is not linearizable")

// Linearizable checks ops against Model within timeout. On a violation it
// returns an error describing, for each item whose history cannot be
// linearized, the longest order of its calls the model accepts and the
// calls none of which can come next; and the checker's information, for a
// visualization (porcupine.VisualizePath with Model()).
func Linearizable(ops []porcupine.Operation, timeout time.Duration) (porcupine.LinearizationInfo, error) {
	result, info := porcupine.CheckOperationsVerbose(Model(), ops, timeout)
	switch result {
	case porcupine.Ok:
		return info, nil
	case porcupine.Unknown:
		return info, fmt.Errorf("the check of %d calls did not finish within %v", len(ops), timeout)
	}
	return info, fmt.Errorf("%w:\n%s", ErrNotLinearizable, describeViolation(ops, info))
}

// describeViolation tells, for each partition that failed, where the
// longest linearization found stops.
func describeViolation(ops []porcupine.Operation, info porcupine.LinearizationInfo) string {
	var b strings.Builder
	parts := partitionByItem(ops)
	for p, lins := range info.PartialLinearizations() {
		// None: not even the item's first call can be linearized.
		var longest []int
		if len(lins) > 0 {
			longest = slices.MaxFunc(lins, func(a, b []int) int { return len(a) - len(b) })
		}
		if len(longest) == len(parts[p]) {
			continue
		}
		part := parts[p]
		done := map[int]bool{}
		s := state{}
		for _, id := range longest {
			done[id] = true
			_, s = step(s, part[id].Input.(Input), part[id].Output.(Output))
		}
		fmt.Fprintf(&b, "item %s: %d of %d calls linearized; state then: %s\n",
			part[0].Input.(Input).Item, len(longest), len(part), s)
		const shown = 8
		tail := longest[max(0, len(longest)-shown):]
		for _, id := range tail {
			fmt.Fprintf(&b, "  ok   %s\n", describeOp(part[id]))
		}
		// The calls that could come next: those not linearized whose
		// sending came before the earliest answer among them.
		var rest []porcupine.Operation
		for id, op := range part {
			if !done[id] {
				rest = append(rest, op)
			}
		}
		slices.SortFunc(rest, func(a, b porcupine.Operation) int { return int(a.Call - b.Call) })
		firstReturn := int64(math.MaxInt64)
		for _, op := range rest {
			firstReturn = min(firstReturn, op.Return)
		}
		for _, op := range rest {
			if op.Call > firstReturn {
				break
			}
			fmt.Fprintf(&b, "  next %s\n", describeOp(op))
		}
	}
	return b.String()
}

func describeOp(op porcupine.Operation) string {
	return fmt.Sprintf("[%s, %s] client %d: %s → %s", ms(op.Call), ms(op.Return), op.ClientId,
		op.Input.(Input), op.Output.(Output))
}

func ms(ns int64) string { return fmt.Sprintf("%.3fs", float64(ns)/1e9) }
