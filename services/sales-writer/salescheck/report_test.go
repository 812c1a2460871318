package salescheck

import (
	"testing"

	"github.com/anishathalye/porcupine"
)

// MostInFlight counts, per item, the calls whose intervals share an
// instant: a call that ends where another starts does not overlap it, and
// calls of other items do not count.
func TestMostInFlight(t *testing.T) {
	on := func(item string, call, ret int64) porcupine.Operation {
		return porcupine.Operation{Input: Input{Op: Read, Item: item}, Output: Output{}, Call: call, Return: ret}
	}
	for _, tc := range []struct {
		name string
		ops  []porcupine.Operation
		want int
	}{
		{"none", nil, 0},
		{"one after the other", []porcupine.Operation{on("a", 0, 10), on("a", 10, 20), on("a", 20, 30)}, 1},
		{"nested and crossing", []porcupine.Operation{on("a", 0, 100), on("a", 10, 20), on("a", 15, 50), on("a", 40, 60)}, 3},
		{"other items apart", []porcupine.Operation{on("a", 0, 10), on("b", 0, 10), on("c", 5, 15), on("a", 5, 8)}, 2},
	} {
		if got := MostInFlight(tc.ops); got != tc.want {
			t.Errorf("MostInFlight(%s) = %d, want %d", tc.name, got, tc.want)
		}
	}
}
