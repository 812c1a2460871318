package sales

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/testenv"
)

// BenchmarkSaleCallAlone measures confirm+cancel pairs of one caller at a
// time, so that every call commits alone: in a group of one (the writer's
// default, SALES_WRITER_COMMIT_GROUPS=1) or without groups (0). It is the
// path of a call on a quiet writer, whose round trip groups cannot share
// (api's BenchmarkConfirmCancelPair measures the busy one).
func BenchmarkSaleCallAlone(b *testing.B) {
	for _, groups := range []int{0, 1} {
		b.Run(fmt.Sprintf("groups=%d", groups), func(b *testing.B) {
			ctx := context.Background()
			dsn := testenv.PostgresURL(b)
			owner := saleFixture(b, testenv.Pool(b, dsn), "item")
			w := NewGroupingWriter(openRecording(b, dsn+" pool_max_conns=1"), time.Hour, groups, GroupStats{})
			b.ResetTimer()
			for i := range b.N {
				for _, op := range []Operation{Confirm, Cancel} {
					req := Request{Operation: op, OwnerID: owner, PlatformID: "p", IdempotencyKey: fmt.Sprintf("%s-%d", op, i),
						ItemID: "item", ExternalOrderID: fmt.Sprintf("o-%d", i)}
					if _, err := w.Execute(ctx, req); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}
