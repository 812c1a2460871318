// Package salescheck checks a concurrent history of sale calls against the
// sale state machine of spec 3 and the idempotency rules of spec 4.7, with a
// linearizability checker (github.com/anishathalye/porcupine): a history
// passes if its calls, each taking effect at one instant between its
// sending and its answer, explain every answer and every read of an item.
//
// The model, per item (calls of one item never touch another's state, so
// the check is partitioned by item):
//   - the item is sold to one platform and external order, or not;
//   - each (platform, Idempotency-Key) is bound to the first request sent
//     with it (operation and external order; the key is used with one item)
//     and to its answer: the stored result of a 200, or the refusal (404,
//     409) it got, which the writer keeps too (README, "What is stored");
//   - a request under a bound key: the identical one gets the bound answer
//     again (a 200 with idempotent_replay true and the same result, or the
//     same refusal), a different one 409 idempotency_conflict;
//   - a request under a new key: confirm sells an unsold item (200) or is
//     refused item_already_sold; cancel restores an item sold to this
//     platform and order (200) or is refused sale_not_cancelable;
//   - a read (GET /v1/export/items/{id}) sees inactive with stock 0 while
//     the item is sold, active with stock 1 otherwise.
//
// An answer that says nothing of the outcome (no answer, a 5xx) is unknown:
// the call may take effect at any later instant or never. A 5xx that says
// nothing was applied speaks of its own attempt: that attempt took no
// effect, though another attempt of the same request may have
// (History.Operations, NothingAppliedHolds).
package salescheck

import (
	"fmt"
	"hash/maphash"
	"net/http"
	"sort"
	"strings"
)

// The operations of a history.
const (
	Confirm = "confirm"
	Cancel  = "cancel"
	Read    = "read"
)

// The error codes the model knows.
const (
	codeAlreadySold   = "item_already_sold"
	codeNotCancelable = "sale_not_cancelable"
	codeConflict      = "idempotency_conflict"
	codeInProgress    = "request_in_progress"
)

// Input is one call: a sale (Confirm, Cancel) sent by Platform with Key, or
// a Read of Item.
type Input struct {
	Op       string
	Platform string
	Key      string
	Item     string
	Order    string
}

func (in Input) String() string {
	if in.Op == Read {
		return "read " + in.Item
	}
	return fmt.Sprintf("%s %s by %s/%s key %s", in.Op, in.Item, in.Platform, in.Order, in.Key)
}

// Output is what a call was answered.
type Output struct {
	Unknown bool   // no answer, or one that does not say whether the call took effect (5xx)
	Status  int    // HTTP status
	Code    string // error.code of an error answer
	// NothingApplied marks an unknown answer that says this attempt
	// applied nothing (a 5xx "nothing was applied"; the gateway's 503
	// upstream_unavailable): the check holds it to that (History.Operations,
	// NothingAppliedHolds).
	NothingApplied bool   `json:",omitempty"`
	Result         Result // data of a sale's 200
	View           View   // data of a read's 200
	// RequestID is meta.request_id, or what the client saw instead
	// (a transport error), for the report.
	RequestID string
}

func (out Output) String() string {
	switch {
	case out.Unknown && out.Status == 0:
		return "unknown (" + out.RequestID + ")"
	case out.Unknown && out.NothingApplied:
		return fmt.Sprintf("nothing applied: %d %s (%s)", out.Status, out.Code, out.RequestID)
	case out.Unknown:
		return fmt.Sprintf("unknown: %d %s (%s)", out.Status, out.Code, out.RequestID)
	case out.Status == http.StatusOK && out.View != (View{}):
		return fmt.Sprintf("200 %s stock %d", out.View.Status, out.View.Stock)
	case out.Status == http.StatusOK:
		return "200 " + out.Result.String()
	}
	return fmt.Sprintf("%d %s (%s)", out.Status, out.Code, out.RequestID)
}

// Result is a SaleWriteResult (spec 2.4) as sent: timestamps as strings.
type Result struct {
	Status      string `json:"status"`
	Stock       int    `json:"stock_quantity"`
	Item        string `json:"item_id"`
	Platform    string `json:"platform_id"`
	Order       string `json:"external_order_id"`
	ConfirmedAt string `json:"confirmed_at"`
	CanceledAt  string `json:"canceled_at"`
	Replay      bool   `json:"idempotent_replay"`
}

func (r Result) String() string {
	s := fmt.Sprintf("%s stock %d %s/%s confirmed %s", r.Status, r.Stock, r.Platform, r.Order, r.ConfirmedAt)
	if r.CanceledAt != "" {
		s += " canceled " + r.CanceledAt
	}
	if r.Replay {
		s += " (replay)"
	}
	return s
}

// sameAs reports whether r and first are one stored result (a replay is
// the first answer with idempotent_replay true).
func (r Result) sameAs(first Result) bool {
	r.Replay, first.Replay = false, false
	return r == first
}

// View is what a read shows of an item.
type View struct {
	Status string `json:"status"`
	Stock  int    `json:"stock_quantity"`
}

// keyID names a key in its scope: keys are scoped by platform (and owner,
// which a history has one of).
type keyID struct{ platform, key string }

// binding is what a key holds: the request it was first used for and its
// answer.
type binding struct {
	op, order string
	refusal   string // the code of a refused request; "" for an executed one
	result    Result // of an executed one, once an answer showed it
	known     bool   // result is known
}

// sale is an item's open sale.
type sale struct {
	platform, order string
	confirmedAt     string // "" until an answer showed it
}

// state is one item's state. It is never changed once made: a step that
// changes something returns a new one, sharing what it keeps.
type state struct {
	sold     *sale
	bindings *bindings
}

// bindings are the keys bound, in buckets by the key's hash, each never
// changed once made: binding one more key copies one bucket, not all of
// them. A history of a few minutes binds thousands of keys per item, and
// the checker steps through every call, often more than once.
type bindings struct {
	buckets [bucketCount]map[keyID]binding
	n       int
	hash    uint64 // of every key and binding, kept up to date by with
}

const bucketCount = 128

var hashSeed = maphash.MakeSeed()

func bucketOf(k keyID) int { return int(maphash.Comparable(hashSeed, k) % bucketCount) }

func bindingHash(k keyID, b binding) uint64 {
	return maphash.Comparable(hashSeed, struct {
		k keyID
		b binding
	}{k, b})
}

// lookup returns what k is bound to, if anything.
func (s state) lookup(k keyID) (binding, bool) {
	if s.bindings == nil {
		return binding{}, false
	}
	b, ok := s.bindings.buckets[bucketOf(k)][k]
	return b, ok
}

func (s state) bound() int {
	if s.bindings == nil {
		return 0
	}
	return s.bindings.n
}

func (s state) hash() uint64 {
	var h uint64
	if s.bindings != nil {
		h = s.bindings.hash ^ uint64(s.bindings.n)
	}
	if s.sold != nil {
		h ^= maphash.Comparable(hashSeed, *s.sold)
	}
	return h
}

func (s state) equal(o state) bool {
	if (s.sold == nil) != (o.sold == nil) || s.sold != nil && *s.sold != *o.sold || s.bound() != o.bound() {
		return false
	}
	if s.bindings == o.bindings || s.bound() == 0 {
		return true
	}
	if s.bindings.hash != o.bindings.hash {
		return false
	}
	for i, bucket := range s.bindings.buckets {
		other := o.bindings.buckets[i]
		if len(bucket) != len(other) {
			return false
		}
		for k, b := range bucket {
			if ob, ok := other[k]; !ok || ob != b {
				return false
			}
		}
	}
	return true
}

// with returns s with k bound to b.
func (s state) with(k keyID, b binding) state {
	next := &bindings{}
	if s.bindings != nil {
		*next = *s.bindings
	}
	i := bucketOf(k)
	bucket := make(map[keyID]binding, len(next.buckets[i])+1)
	for k, b := range next.buckets[i] {
		bucket[k] = b
	}
	if old, ok := bucket[k]; ok {
		next.hash ^= bindingHash(k, old)
		next.n--
	}
	bucket[k] = b
	next.buckets[i] = bucket
	next.hash ^= bindingHash(k, b)
	next.n++
	return state{sold: s.sold, bindings: next}
}

func (s state) String() string {
	var b strings.Builder
	if s.sold == nil {
		b.WriteString("not sold")
	} else {
		fmt.Fprintf(&b, "sold to %s/%s", s.sold.platform, s.sold.order)
	}
	fmt.Fprintf(&b, "; %d keys bound", s.bound())
	return b.String()
}

// step is the model: whether out is an answer in to could get in s, and
// the state after it.
func step(s state, in Input, out Output) (bool, state) {
	if in.Op == Read {
		return readStep(s, out), s
	}
	k := keyID{in.Platform, in.Key}
	if b, bound := s.lookup(k); bound {
		return boundStep(s, k, b, in, out)
	}
	if !out.Unknown && out.Status == http.StatusConflict && out.Code == codeInProgress {
		return true, s // documented, rare: nothing done, nothing bound
	}
	if in.Op == Confirm {
		return confirmStep(s, k, in, out)
	}
	return cancelStep(s, k, in, out)
}

func readStep(s state, out Output) bool {
	if out.Unknown {
		return true
	}
	want := View{Status: "active", Stock: 1}
	if s.sold != nil {
		want = View{Status: "inactive", Stock: 0}
	}
	return out.Status == http.StatusOK && out.View == want
}

// boundStep answers a request under a key bound before.
func boundStep(s state, k keyID, b binding, in Input, out Output) (bool, state) {
	if out.Unknown {
		return true, s
	}
	switch {
	case b.op != in.Op || b.order != in.Order:
		return out.Status == http.StatusConflict && out.Code == codeConflict, s
	case b.refusal != "":
		return out.Status == http.StatusConflict && out.Code == b.refusal, s
	case out.Status != http.StatusOK || !out.Result.Replay:
		return false, s
	case b.known:
		return out.Result.sameAs(b.result), s
	}
	// The first answer was not seen: this one shows the stored result,
	// which must be one the request could have been given.
	if !plausible(in, out.Result) {
		return false, s
	}
	b.result, b.known = out.Result, true
	next := s.with(k, b)
	if in.Op == Confirm && s.sold != nil && s.sold.platform == in.Platform && s.sold.order == in.Order && s.sold.confirmedAt == "" {
		sold := *s.sold
		sold.confirmedAt = out.Result.ConfirmedAt
		next.sold = &sold
	}
	return true, next
}

// plausible reports whether r is a result of executing in: an item sold
// (confirm) or restored (cancel) to in's platform and order.
func plausible(in Input, r Result) bool {
	if r.Item != in.Item || r.Platform != in.Platform || r.Order != in.Order || r.ConfirmedAt == "" {
		return false
	}
	if in.Op == Confirm {
		return r.Status == "inactive" && r.Stock == 0 && r.CanceledAt == ""
	}
	return r.Status == "active" && r.Stock == 1 && r.CanceledAt >= r.ConfirmedAt
}

// confirmStep is a confirm under a new key.
func confirmStep(s state, k keyID, in Input, out Output) (bool, state) {
	if s.sold != nil {
		return refuse(s, k, in, out, codeAlreadySold)
	}
	b := binding{op: in.Op, order: in.Order}
	sold := sale{platform: in.Platform, order: in.Order}
	if !out.Unknown {
		// idempotent_replay may be true: the gateway sends a sale once
		// more when its first attempt's answer was lost, and the second
		// attempt replays the first (gateway README, "Retries").
		if out.Status != http.StatusOK || !plausible(in, out.Result) {
			return false, s
		}
		b.result, b.known = out.Result, true
		sold.confirmedAt = out.Result.ConfirmedAt
	}
	next := s.with(k, b)
	next.sold = &sold
	return true, next
}

// cancelStep is a cancel under a new key.
func cancelStep(s state, k keyID, in Input, out Output) (bool, state) {
	if s.sold == nil || s.sold.platform != in.Platform || s.sold.order != in.Order {
		return refuse(s, k, in, out, codeNotCancelable)
	}
	b := binding{op: in.Op, order: in.Order}
	if !out.Unknown {
		if out.Status != http.StatusOK || !plausible(in, out.Result) ||
			s.sold.confirmedAt != "" && out.Result.ConfirmedAt != s.sold.confirmedAt {
			return false, s
		}
		b.result, b.known = out.Result, true
	}
	next := s.with(k, b)
	next.sold = nil
	return true, next
}

// refuse is a request under a new key refused with code: the key is bound
// to it and the refusal.
func refuse(s state, k keyID, in Input, out Output, code string) (bool, state) {
	if !out.Unknown && (out.Status != http.StatusConflict || out.Code != code) {
		return false, s
	}
	return true, s.with(k, binding{op: in.Op, order: in.Order, refusal: code})
}

// describeState lists an item's state for the visualization.
func describeState(s state) string {
	var keys []string
	if s.bindings != nil {
		for _, bucket := range s.bindings.buckets {
			for k, b := range bucket {
				answer := "refused " + b.refusal
				if b.refusal == "" {
					answer = "executed"
				}
				keys = append(keys, fmt.Sprintf("%s/%s: %s %s %s", k.platform, k.key, b.op, b.order, answer))
			}
		}
	}
	sort.Strings(keys)
	return s.String() + "\n" + strings.Join(keys, "\n")
}
