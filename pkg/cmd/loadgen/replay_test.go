package main

import (
	"errors"
	"fmt"
	"testing"
)

// planReplay gives each platform exactly its budget of calls: a confirm of
// every shared item, and on items of its own alone runs that alternate
// confirm and cancel, a cancel naming its confirm's order, each call with
// a key of its own.
func TestPlanReplay(t *testing.T) {
	items := itemIDs(120)
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

// Two runs of one seed replay backlogs of the same shape under keys and
// orders of their own: with the run's keys drawn from the seed, a second
// run sent the first's keys again, was answered with replays of its
// answers, executed nothing, and its check passed.
func TestEachReplayHasKeysOfItsOwn(t *testing.T) {
	items := itemIDs(120)
	first, err := planReplay(items, 4, 50, 5, 1)
	if err != nil {
		t.Fatal(err)
	}
	second, err := planReplay(items, 4, 50, 5, 1)
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	for _, platform := range first {
		for _, ri := range platform {
			for _, op := range ri.ops {
				used[op.key], used[op.order] = true, true
			}
		}
	}
	for p, platform := range second {
		for i, ri := range platform {
			if ri.item != first[p][i].item || len(ri.ops) != len(first[p][i].ops) {
				t.Errorf("platform %d, item %d: %s with %d calls, the seed's first run %s with %d", p, i, ri.item, len(ri.ops),
					first[p][i].item, len(first[p][i].ops))
			}
			for _, op := range ri.ops {
				if used[op.key] || used[op.order] {
					t.Fatalf("the second run sends key %s, order %s of the first", op.key, op.order)
				}
			}
		}
	}
}

// A backlog that cannot be planned is a usage error, not a panic (fewer
// items than the shared ones and one per platform; fewer calls than the
// shared confirms).
func TestPlanReplayRefusesWhatItCannotPlan(t *testing.T) {
	items := itemIDs(10)
	for _, c := range []struct{ platforms, ops, shared int }{{4, 50, 8}, {2, 3, 5}, {0, 50, 5}} {
		if _, err := planReplay(items, c.platforms, c.ops, c.shared, 1); !errors.Is(err, errUsage) {
			t.Errorf("planReplay(10 items, %d platforms, %d calls, %d shared) error %v, want a usage error", c.platforms, c.ops, c.shared, err)
		}
	}
}

// itemIDs names n items it-0, it-1, ….
func itemIDs(n int) []string {
	items := make([]string, n)
	for i := range items {
		items[i] = fmt.Sprintf("it-%d", i)
	}
	return items
}
