package main

import (
	"fmt"
	"testing"
)

// planReplay gives each platform exactly its budget of calls: a confirm of
// every shared item, and on items of its own alone runs that alternate
// confirm and cancel, a cancel naming its confirm's order, each call with
// a key of its own.
func TestPlanReplay(t *testing.T) {
	items := make([]string, 120)
	for i := range items {
		items[i] = fmt.Sprintf("it-%d", i)
	}
	plan, err := planReplay(items, 4, 50, 5, 1)
	if err != nil {
		t.Fatal(err)
	}
	ownedBy := map[string]int{}
	keys := map[string]bool{}
	for p, platform := range plan {
		calls, shared := 0, 0
		for _, ri := range platform {
			calls += len(ri.ops)
			if ri.shared {
				shared++
				continue
			}
			if q, ok := ownedBy[ri.item]; ok {
				t.Errorf("item %s in the backlogs of platforms %d and %d", ri.item, q, p)
			}
			ownedBy[ri.item] = p
			for n, op := range ri.ops {
				want := "confirm"
				if n%2 == 1 {
					want = "cancel"
					if op.order != ri.ops[n-1].order {
						t.Errorf("cancel of %s names order %s, its confirm %s", ri.item, op.order, ri.ops[n-1].order)
					}
				}
				if op.action != want || op.item != ri.item {
					t.Errorf("call %d on %s = %s of %s, want %s", n, ri.item, op.action, op.item, want)
				}
			}
		}
		for _, ri := range platform {
			for _, op := range ri.ops {
				if keys[op.key] {
					t.Errorf("Idempotency-Key %s used twice", op.key)
				}
				keys[op.key] = true
			}
		}
		if calls != 50 || shared != 5 {
			t.Errorf("platform %d: %d calls, %d shared items, want 50 and 5", p, calls, shared)
		}
	}
}
