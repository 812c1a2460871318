package salescheck

import "testing"

// The clients take an item for sold to the order of its last confirm
// first answered 200: the replay of an older confirm, whose sale a cancel
// has closed since, leaves it so, and the cancel of the order that holds
// the sale clears it; a confirm whose first told answer is a replay (the
// gateway's repeat of an attempt whose answer was lost) is a sale.
func TestClientsTakeOnlyAFirst200ForASale(t *testing.T) {
	p := newPool()
	old := Input{Op: Confirm, Platform: "a", Key: "k0-0", Item: "i", Order: "o0-0"}
	cancelOld := Input{Op: Cancel, Platform: "a", Key: "k0-1", Item: "i", Order: "o0-0"}
	current := Input{Op: Confirm, Platform: "b", Key: "k1-0", Item: "i", Order: "o1-0"}
	ok := Output{Status: 200}
	p.add(old, ok)
	p.add(cancelOld, ok)
	p.add(current, Output{Status: 200, Result: Result{Replay: true}})
	if got, sold := p.lastSold("i"); !sold || got != current {
		t.Fatalf("after a confirm first told by a replay: lastSold = %v, %v; want %v", got, sold, current)
	}
	p.add(old, ok)       // the old confirm sent again under its key: replayed
	p.add(cancelOld, ok) // and its cancel
	if got, sold := p.lastSold("i"); !sold || got != current {
		t.Errorf("after replays of an older confirm and its cancel: lastSold = %v, %v; want %v", got, sold, current)
	}
	p.add(Input{Op: Cancel, Platform: "b", Key: "k1-1", Item: "i", Order: "o1-0"}, ok)
	if got, sold := p.lastSold("i"); sold {
		t.Errorf("after the cancel of the order that held the sale: lastSold = %v, want none", got)
	}
}
