package api_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/identity"
	"github.com/coinexport/export/pkg/postgres"
	"github.com/coinexport/export/pkg/testenv"
	"github.com/coinexport/export/services/export-reader/internal/export"
)

// With PostgreSQL out of connection slots (here the role's CONNECTION
// LIMIT; in production max_connections, taken by a rollout's extra reader
// pods), a read that finds the pool's one connection busy is refused the
// new one the pool asks for (53300). It waits for the pool's own and is
// answered 200, the list's first page (its sync barrier, then its query)
// and the item alike; it was answered 503 unavailable though the
// connection came free a moment later. The pool does not grow. Once the
// pool has no connection left, a read is 503 unavailable at once, its
// line naming the cause.
func TestAReadWaitsForThePoolsConnectionWhenNoSlotIsLeft(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	signer, err := identity.NewSigner(identitySecret)
	if err != nil {
		t.Fatal(err)
	}
	url := testenv.PostgresURL(t)
	seeding := serve(t, testenv.Pool(t, url), signer)
	owner := seeding.owner(t)
	seeding.importLines(t, owner, itemLine("coin-1", "active", "Coin"))
	dsn, limit := testenv.SlotLimitedRole(t, url)
	pool, err := postgres.Open(ctx, dsn+" pool_max_conns=4")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	e := serveWith(t, pool, signer, export.ReadAhead{}) // off: no read of its own takes the connection
	limit(1)                                            // the pool's one session holds the role's one slot
	for _, path := range []string{"/v1/export/items", "/v1/export/items/coin-1"} {
		before, _ := postgres.SlotWaits(pool)
		held, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		req, err := http.NewRequest(http.MethodGet, e.srv.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		e.sign(owner)(req)
		answer := testenv.AnswerLater(func() (*http.Response, error) { return http.DefaultClient.Do(req) })
		// Until the read waits for the connection held, or is answered.
		for waits := before; waits == before && len(answer) == 0; waits, _ = postgres.SlotWaits(pool) {
			time.Sleep(time.Millisecond)
		}
		held.Release()
		got := <-answer
		if got.Err != nil || got.Status != http.StatusOK {
			t.Errorf("GET %s while the pool's connection was busy and no slot left = %d %+v (%v), want 200", path, got.Status, got.Body.Error, got.Err)
		}
	}
	if n := pool.Stat().TotalConns(); n != 1 {
		t.Errorf("the pool holds %d connections, want 1 (it cannot grow)", n)
	}
	pool.Reset() // its connection ends: none left to wait for
	limit(0)
	wantUnavailable(t, e.get(t, owner, "/v1/export/items/coin-1"), "GET with no connection in the pool and no slot left")
	if logs := e.logs.String(); !strings.Contains(logs, "53300") || !strings.Contains(logs, `"cause":"PostgreSQL has no connection slot left`) {
		t.Errorf("the log does not name the refusal and its cause:\n%s", logs)
	}
}
