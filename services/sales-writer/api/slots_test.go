package api

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/postgres"
	"github.com/coinexport/export/pkg/testenv"
)

// With PostgreSQL out of connection slots (here the role's CONNECTION
// LIMIT; in production max_connections, taken by a rollout's extra pods),
// a sale that finds the writer's one connection busy is refused the new
// one the pool asks for (53300). It waits for the pool's own, within its
// bound, and sells the item: 200. It was answered 503 "nothing was
// applied" though the connection came free a moment later, and the
// platform had to retry.
func TestASaleWaitsForThePoolsConnectionWhenNoSlotIsLeft(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	f.addItem(t, f.owner, "coin-1", true)
	dsn, limit := testenv.SlotLimitedRole(t, f.url)
	pool, err := postgres.Open(ctx, dsn+" pool_max_conns=4")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	handler := newHandler(t, pool, defaultRetention)
	limit(1) // the pool's one session holds the role's one slot
	held, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Released once the sale waits for it, or has been answered (at once,
	// without the wait).
	answered, released := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(released)
		defer held.Release()
		for waits := int64(0); waits == 0; waits, _ = postgres.SlotWaits(pool) {
			select {
			case <-answered:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	rec, env := serve(t, handler, f.signer, call{id: f.writer("market-a"), op: "confirm", item: "coin-1", key: "k1", body: order1})
	close(answered)
	<-released
	if rec.Code != http.StatusOK {
		t.Fatalf("confirm while the pool's connection was busy and no slot left = %d %+v, want 200", rec.Code, env.Error)
	}
	if s := f.item(t, f.owner, "coin-1"); !s.Sold {
		t.Errorf("item after the confirm = %+v, want sold", s)
	}
}
