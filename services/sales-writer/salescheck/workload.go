package salescheck

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"
)

// Sender sends one call and reports its answer; Output.Unknown when ctx
// ended first or the answer does not tell the outcome.
type Sender func(ctx context.Context, in Input) Output

// Workload is a history's clients: each sends Calls calls, one after the
// other, on a few items so that they collide: confirms under new keys,
// cancels of orders confirmed before (mostly by the confirming platform),
// identical retries of earlier calls, a different request under an
// earlier call's key, and reads. A call left unknown is mostly sent again
// with its key until an answer tells its outcome (at once after a client's
// own short timeout, racing the first attempt, which may still run).
type Workload struct {
	Items     []string
	Platforms []string
	Clients   int
	Calls     int // per client
	Seed      uint64
	// Timeout bounds a call. A ShortShare of the calls get a timeout
	// drawn from (0, ShortTimeout] instead, shorter than many calls take.
	Timeout      time.Duration
	ShortTimeout time.Duration
	ShortShare   float64
	// Pause is how long a client waits between two calls, at most
	// (drawn from [0, Pause]).
	Pause time.Duration
	// Until, when set, ends every client's calls early once it returns true.
	Until func() bool
}

// pool holds the sale requests sent so far, per item.
type pool struct {
	mu       sync.Mutex
	requests map[string][]Input // by item
	confirms map[string][]Input // by item: confirms, for the cancels
	sold     map[string]Input   // by item: the last confirm first answered 200
	told     map[Input]bool     // requests answered 200 before
}

// add records in, answered out. Only a request's first 200 changes what
// the clients take for sold: a later one is its replay, sent again on
// purpose (Workload.next), which tells of a sale made then, not now.
// Taken for a new sale, the replay of a confirm long canceled put that
// order in the place of the one the item was sold to; the cancels went
// to it and were refused, and the item stayed sold: in a drill, 125 sales
// were executed in its first 40 s and none in the 110 s after.
func (p *pool) add(in Input, out Output) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.requests[in.Item] = append(p.requests[in.Item], in)
	first := out.Status == 200 && !p.told[in]
	if out.Status == 200 {
		p.told[in] = true
	}
	switch {
	case in.Op == Confirm:
		p.confirms[in.Item] = append(p.confirms[in.Item], in)
		if first {
			p.sold[in.Item] = in
		}
	case first && p.sold[in.Item].Order == in.Order:
		delete(p.sold, in.Item)
	}
}

func newPool() *pool {
	return &pool{requests: map[string][]Input{}, confirms: map[string][]Input{}, sold: map[string]Input{}, told: map[Input]bool{}}
}

// lastSold is the last confirm of item first answered 200, if any.
func (p *pool) lastSold(item string) (Input, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	in, ok := p.sold[item]
	return in, ok
}

func (p *pool) pick(rng *rand.Rand, item string, confirmsOnly bool) (Input, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	list := p.requests[item]
	if confirmsOnly {
		list = p.confirms[item]
	}
	if len(list) == 0 {
		return Input{}, false
	}
	// Recent requests more often: their items are in the state they left.
	n := len(list)
	window := min(n, 20)
	if rng.IntN(4) == 0 {
		return list[rng.IntN(n)], true
	}
	return list[n-1-rng.IntN(window)], true
}

// Run runs the workload's clients through send, recording every call in h.
func (w Workload) Run(ctx context.Context, send Sender, h *History) {
	p := newPool()
	var wg sync.WaitGroup
	for c := range w.Clients {
		wg.Go(func() { w.client(ctx, c, send, h, p) })
	}
	wg.Wait()
}

func (w Workload) client(ctx context.Context, c int, send Sender, h *History, p *pool) {
	rng := rand.New(rand.NewPCG(w.Seed, uint64(c)))
	for n := 0; n < w.Calls && ctx.Err() == nil && (w.Until == nil || !w.Until()); n++ {
		in := w.next(rng, p, c, n)
		out := w.call(ctx, rng, send, h, c, in)
		// Sent again until an answer tells the outcome, as a platform
		// must: this also ends the call's interval in the history there
		// (History.Operations), which keeps the check tractable.
		for out.Unknown && in.Op != Read && ctx.Err() == nil {
			w.backOff(ctx, rng, out)
			out = w.call(ctx, rng, send, h, c, in)
		}
		if in.Op != Read {
			p.add(in, out)
		}
		w.backOff(ctx, rng, out)
		if w.Pause > 0 {
			w.sleep(ctx, time.Duration(rng.Int64N(int64(w.Pause))))
		}
	}
}

// backOff waits after an answer that was a failure: as a client should,
// and so that an outage is not a flood of calls that fail at once. A
// call cut off by its own short timeout is sent again at once, to race
// the first attempt.
func (w Workload) backOff(ctx context.Context, rng *rand.Rand, out Output) {
	if !out.Unknown || out.Status == 0 && strings.Contains(out.RequestID, context.DeadlineExceeded.Error()) {
		return
	}
	w.sleep(ctx, time.Duration(50+rng.IntN(200))*time.Millisecond)
}

func (w Workload) sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// call sends in with a timeout and records it.
func (w Workload) call(ctx context.Context, rng *rand.Rand, send Sender, h *History, c int, in Input) Output {
	timeout := w.Timeout
	if w.ShortTimeout > 0 && rng.Float64() < w.ShortShare {
		timeout = time.Duration(1 + rng.Int64N(int64(w.ShortTimeout)))
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	rec := h.Begin(c, in)
	out := send(ctx, in)
	rec.Done(out)
	return out
}

// next draws client c's n-th call.
func (w Workload) next(rng *rand.Rand, p *pool, c, n int) Input {
	item := w.Items[rng.IntN(len(w.Items))]
	key := fmt.Sprintf("k%d-%d", c, n)
	platform := w.Platforms[rng.IntN(len(w.Platforms))]
	newConfirm := Input{Op: Confirm, Platform: platform, Key: key, Item: item, Order: fmt.Sprintf("o%d-%d", c, n)}
	switch r := rng.IntN(100); {
	case r < 30:
		return newConfirm
	case r < 55: // cancel an order confirmed before (mostly the last sold), mostly by its platform
		confirm, ok := p.lastSold(item)
		if !ok && rng.IntN(10) < 8 {
			return newConfirm // most likely not sold
		}
		if !ok || rng.IntN(10) < 2 {
			confirm, ok = p.pick(rng, item, true)
		}
		if !ok {
			return newConfirm
		}
		in := Input{Op: Cancel, Platform: confirm.Platform, Key: key, Item: item, Order: confirm.Order}
		if rng.IntN(100) < 10 {
			in.Platform = platform
		}
		return in
	case r < 75: // the identical request again, under its key
		if earlier, ok := p.pick(rng, item, false); ok {
			return earlier
		}
		return newConfirm
	case r < 85: // a different request under an earlier key
		earlier, ok := p.pick(rng, item, false)
		if !ok {
			return newConfirm
		}
		if rng.IntN(2) == 0 {
			earlier.Order = fmt.Sprintf("o%d-%d", c, n)
		} else if earlier.Op == Confirm {
			earlier.Op = Cancel
		} else {
			earlier.Op = Confirm
		}
		return earlier
	}
	return Input{Op: Read, Item: item}
}

// Settle ends a history: every sale call whose outcome is unknown is sent
// again with its key until an answer tells it (a replay, a conflict, a
// refusal or its first execution), within ctx; then, for each item, every
// order that may hold its sale cancels it under a new key, the item is
// read, sold and restored once more under new keys, and read again. The
// model checks all of these with the rest; Settle returns an error for a
// call it could not settle and for an item still not sellable at the end
// (a stuck state).
func (w Workload) Settle(ctx context.Context, send Sender, h *History, retryEvery time.Duration) error {
	client := w.Clients // the settling client's number
	ask := func(in Input) Output {
		for {
			callCtx, cancel := context.WithTimeout(ctx, w.Timeout)
			rec := h.Begin(client, in)
			out := send(callCtx, in)
			rec.Done(out)
			cancel()
			if !out.Unknown || ctx.Err() != nil {
				return out
			}
			select {
			case <-ctx.Done():
				return out
			case <-time.After(retryEvery):
			}
		}
	}
	pending, _ := w.unsettled(h)
	for _, in := range pending {
		if out := ask(in); out.Unknown {
			return fmt.Errorf("settling %s: still %s when the time ran out", in, out)
		}
	}
	_, owners := w.unsettled(h)
	for n, item := range w.Items {
		// The newest sale first: it is the one that holds the item, unless
		// a cancel of it was answered 200 too.
		for i, o := range owners[item] {
			if out := ask(Input{Op: Read, Item: item}); out.View.Status == "active" {
				break
			}
			ask(Input{Op: Cancel, Platform: o.Platform, Key: fmt.Sprintf("restore-%d-%d", n, i), Item: item, Order: o.Order})
		}
		if out := ask(Input{Op: Read, Item: item}); out.View.Status != "active" {
			return fmt.Errorf("item %s is %s after every order that may hold it canceled: stuck", item, out)
		}
		order := fmt.Sprintf("final-%d", n)
		confirm := Input{Op: Confirm, Platform: w.Platforms[0], Key: "final-confirm-" + order, Item: item, Order: order}
		cancel := Input{Op: Cancel, Platform: w.Platforms[0], Key: "final-cancel-" + order, Item: item, Order: order}
		for _, in := range []Input{confirm, cancel} {
			if out := ask(in); out.Status != 200 {
				return fmt.Errorf("item %s: %s = %s after the history, want 200", item, in, out)
			}
		}
		ask(Input{Op: Read, Item: item})
	}
	return ctx.Err()
}

// unsettled returns the sale calls of h whose outcome no answer to their
// key's identical request told, and, per item, the confirms that executed
// (a 200 told it), newest first: one of them holds the item if it is sold,
// since every call of unknown outcome has been told by then.
func (w Workload) unsettled(h *History) (pending []Input, owners map[string][]Input) {
	told := map[Input]bool{}
	var unknown []Input
	owners = map[string][]Input{}
	ownerSeen := map[[3]string]bool{}
	for _, op := range h.Calls() {
		in, out := op.Input.(Input), op.Output.(Output)
		switch {
		case in.Op == Read:
			continue
		case out.Unknown:
			unknown = append(unknown, in)
		default:
			told[in] = true
		}
		if o := [3]string{in.Item, in.Platform, in.Order}; in.Op == Confirm && out.Status == 200 && !ownerSeen[o] {
			ownerSeen[o] = true
			owners[in.Item] = append(owners[in.Item], in)
		}
	}
	for item := range owners {
		slices.Reverse(owners[item])
	}
	seen := map[Input]bool{}
	for _, in := range unknown {
		if !told[in] && !seen[in] {
			seen[in] = true
			pending = append(pending, in)
		}
	}
	return pending, owners
}
