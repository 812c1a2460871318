package export

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/postgres"
	"github.com/coinexport/export/pkg/testenv"
	"github.com/jackc/pgx/v5/pgxpool"
)

// With PostgreSQL out of connection slots, the pool cannot grow and its
// few connections are the requests': a read ahead that finds them busy
// fails at once with the refusal (53300) rather than waiting for one of
// them (postgres.Acquire's wait), and its request reads the page itself.
// Waiting, up to ReadAhead.Timeout, the reads ahead (Reads of them, a
// quarter of a pool sized at EXPORT_READER_DB_MAX_CONNS) took turns with
// the requests on a pool held at one connection, each query two pages'
// work, while every request for their pages waited on them.
func TestAReadAheadDoesNotWaitForASlotTheRequestsNeed(t *testing.T) {
	ctx := context.Background()
	url := testenv.PostgresURL(t)
	owner := seededOwner(t, testenv.Pool(t, url), 30)
	dsn, limit := testenv.SlotLimitedRole(t, url)
	pool, err := postgres.Open(ctx, dsn+" pool_max_conns=4")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	limit(1) // the pool's one session holds the role's one slot
	// The read ahead's freshness check (its first step) takes the pool's
	// connection, as a request would: the read then finds it busy.
	var checks atomic.Int32
	held := make(chan *pgxpool.Conn, 1)
	fresh := func() error {
		if checks.Add(1) == 2 { // the first is the request's own
			conn, err := pool.Acquire(ctx)
			if err != nil {
				return err
			}
			held <- conn
		}
		return nil
	}
	cursors := newTestReader(t, pool, ReadAhead{}).cursors
	r := NewReader(pool, cursors, readAheadFor(time.Minute), RefuseListsUnless(fresh))
	c := &pageReader{t: t, q: Query{OwnerID: owner, Lang: "ENG", Limit: 10}}
	c.next(r) // page 1, which starts the read ahead of page 2
	conn := <-held
	r.ahead.mu.Lock()
	p, ok := r.ahead.pages[aheadKey{c.q.Cursor, c.q.Lang, c.q.Limit}]
	r.ahead.mu.Unlock()
	if !ok {
		t.Fatal("no page is being read ahead")
	}
	// Until the read ahead has ended, or waits for the connection held.
	for waits := int64(0); waits == 0; waits, _ = postgres.SlotWaits(pool) {
		select {
		case <-p.ready:
		case <-time.After(time.Millisecond):
			continue
		}
		break
	}
	conn.Release()
	if waits, _ := postgres.SlotWaits(pool); waits != 0 {
		t.Errorf("%d reads waited for one of the pool's connections, want none: a read ahead fails at once", waits)
	}
	c.next(r) // page 2, read by its request
	if failed := outcome(r, "failed"); failed != 1 {
		t.Errorf("%d reads ahead failed, want 1", failed)
	}
	if n := pool.Stat().TotalConns(); n != 1 {
		t.Errorf("the pool holds %d connections, want 1 (it cannot grow)", n)
	}
}
