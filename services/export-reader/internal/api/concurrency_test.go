package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/catalog"
	"github.com/coinexport/export/pkg/catalog/catalogtest"
	"github.com/coinexport/export/pkg/envelope"
	"github.com/coinexport/export/pkg/identity"
	"github.com/coinexport/export/pkg/testenv"
	"github.com/coinexport/export/services/export-reader/internal/export"
	"github.com/coinexport/export/services/export-reader/syncclient"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Many syncs of two owners at once, with and without a status filter, plain
// and gzipped, changing language and page size between pages, share one
// reader's read-ahead: each page must hold only its own owner's items in its
// own language, and each sync every item of its filter exactly once. Both
// owners have the same item ids, so only the texts tell their items apart.
// Run with -race, this also checks the pooled buffers (pages read ahead,
// response bodies, gzip) for reuse while in use: copying a page read ahead
// after its buffer went back to the pool fails it. Read-ahead runs with room
// for every chain, with few pages (entries are evicted while read), and with
// a TTL every page outlives (every page read again, chains replaced).
func TestConcurrentSyncsGetOnlyTheirOwnPages(t *testing.T) {
	t.Parallel()
	for name, ahead := range map[string]export.ReadAhead{
		"ample":     {Pages: 256, TTL: time.Minute, Reads: 3, Timeout: 10 * time.Second},
		"few pages": {Pages: 6, TTL: time.Minute, Reads: 2, Timeout: 10 * time.Second},
		"stale":     {Pages: 64, TTL: time.Nanosecond, Reads: 2, Timeout: 10 * time.Second},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			signer, err := identity.NewSigner(identitySecret)
			if err != nil {
				t.Fatal(err)
			}
			e := serveWith(t, testenv.Postgres(t), signer, ahead)
			const items = 120
			tags := []string{"A", "B"} // each owner's tag in its texts
			owners := make([]string, len(tags))
			active := make([]int, len(tags)) // each owner's active items
			for o, tag := range tags {
				owner := e.owner(t)
				owners[o] = owner
				lines := make([]string, items)
				for i := range lines {
					status := "active"
					if (i%3 == 0) == (tag == "A") { // the owners differ in status too
						status = "inactive"
					}
					if status == "active" {
						active[o]++
					}
					lines[i] = taggedLine(fmt.Sprintf("item-%03d", i), status, tag)
				}
				e.importLines(t, owner, lines...)
			}

			var wg sync.WaitGroup
			for c := range 12 {
				wg.Go(func() {
					rnd := rand.New(rand.NewPCG(uint64(c), 7))
					for range 3 {
						o := rnd.IntN(len(owners))
						s := syncSpec{
							status: []string{"", catalog.StatusActive}[rnd.IntN(2)],
							gzip:   rnd.IntN(2) == 0,
							rnd:    rnd,
						}
						want := items
						if s.status != "" {
							want = active[o]
						}
						e.checkSync(t, owners[o], tags[o], s, want)
					}
				})
			}
			wg.Wait()
		})
	}
}

// syncSpec is one sync's parameters: its status filter, and how pages ask
// for gzip and choose their language and size (both may change between
// pages).
type syncSpec struct {
	status string
	gzip   bool
	rnd    *rand.Rand
}

var pageLimits = []int{1, 7, 10, 25, 100}

// checkSync runs one full sync of owner and checks that it holds want items,
// each once, each owner's own (its texts carry tag) in its page's language.
// A quarter of the pages change language, and a quarter their size.
func (e *env) checkSync(t *testing.T, owner, tag string, s syncSpec, want int) {
	seen := map[string]int{}
	lang, limit := catalog.Languages[s.rnd.IntN(len(catalog.Languages))], pageLimits[s.rnd.IntN(len(pageLimits))]
	q := url.Values{}
	if s.status != "" {
		q.Set("status", s.status)
	}
	for {
		if s.rnd.IntN(4) == 0 {
			lang = catalog.Languages[s.rnd.IntN(len(catalog.Languages))]
		}
		if s.rnd.IntN(4) == 0 {
			limit = pageLimits[s.rnd.IntN(len(pageLimits))]
		}
		q.Set("lang", lang)
		q.Set("limit", strconv.Itoa(limit))
		page, err := e.page(owner, q, s.gzip)
		if err != nil {
			t.Errorf("sync of %s (%+v), page in %s of %d: %v", tag, q, lang, limit, err)
			return
		}
		var got []struct{ ID, Title, Status string }
		if err := json.Unmarshal(page.Data, &got); err != nil {
			t.Errorf("sync of %s (%+v): data %s: %v", tag, q, page.Data, err)
			return
		}
		if len(got) > limit {
			t.Errorf("sync of %s (%+v): a page of %d items", tag, q, len(got))
		}
		for _, it := range got {
			seen[it.ID]++
			if title := itemTitle(tag, lang, it.ID); it.Title != title {
				t.Errorf("sync of %s (%+v): item %s has title %q, want %q", tag, q, it.ID, it.Title, title)
			}
			if s.status != "" && it.Status != s.status {
				t.Errorf("sync of %s (%+v): item %s is %s", tag, q, it.ID, it.Status)
			}
		}
		if page.Meta.NextCursor == nil {
			break
		}
		q.Set("cursor", *page.Meta.NextCursor)
	}
	if len(seen) != want {
		t.Errorf("sync of %s (status %q): %d distinct items, want %d", tag, s.status, len(seen), want)
	}
	for id, n := range seen {
		if n != 1 {
			t.Errorf("sync of %s (status %q): item %s came %d times, want once", tag, s.status, id, n)
		}
	}
}

// page asks for one list page as owner; gzipped lets the transport ask for
// gzip and decompress it.
func (e *env) page(owner string, q url.Values, gzipped bool) (envelope.Parsed, error) {
	req, err := http.NewRequest(http.MethodGet, e.srv.URL+"/v1/export/items?"+q.Encode(), nil)
	if err != nil {
		return envelope.Parsed{}, err
	}
	e.sign(owner)(req)
	if !gzipped {
		req.Header.Set("Accept-Encoding", "identity")
	}
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		return envelope.Parsed{}, err
	}
	defer resp.Body.Close()
	var p envelope.Parsed
	if err := json.NewDecoder(resp.Body).Decode(&p); err != nil {
		return envelope.Parsed{}, fmt.Errorf("status %d: %w", resp.StatusCode, err)
	}
	if resp.StatusCode != http.StatusOK {
		return envelope.Parsed{}, fmt.Errorf("status %d: %+v", resp.StatusCode, p.Error)
	}
	return p, nil
}

// taggedLine is an import line whose title in each language names the
// owner's tag, the language and the id.
func taggedLine(id, status, tag string) string {
	texts := make([]string, len(catalog.Languages))
	for i, lang := range catalog.Languages {
		texts[i] = fmt.Sprintf(`%q:{"title":%q}`, lang, itemTitle(tag, lang, id))
	}
	return fmt.Sprintf(`{"id":%q,"status":%q,"currency":"EUR","texts":{%s}}`, id, status, strings.Join(texts, ","))
}

func itemTitle(tag, lang, id string) string { return tag + " " + lang + " " + id }

// Spec 4.8's recipe to the letter (no overlap) misses nothing, with several
// clients per owner syncing at once through one read-ahead while sales and
// imports change both owners' items: every writer takes the owner's sync
// lock, and a sync's first page waits for the writers in flight. The
// client's clock is the database's (same host), the one condition of the
// recipe. After the writes stop and one last incremental sync, every
// client's mirror must equal the database in its language.
func TestConcurrentSyncsWithoutOverlapConverge(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	signer, err := identity.NewSigner(identitySecret)
	if err != nil {
		t.Fatal(err)
	}
	e := serveWith(t, testenv.Postgres(t), signer,
		export.ReadAhead{Pages: 8, TTL: 50 * time.Millisecond, Reads: 2, Timeout: 10 * time.Second})
	if _, err := e.pool.Exec(ctx, `INSERT INTO platforms (id) VALUES ('market')`); err != nil {
		t.Fatal(err)
	}
	const items = 60
	owners := []string{e.owner(t), e.owner(t)}
	for i, owner := range owners {
		lines := make([]string, items)
		for j := range lines {
			lines[j] = taggedLine(fmt.Sprintf("item-%03d", j), "active", fmt.Sprintf("%c v0", 'A'+i))
		}
		e.importLines(t, owner, lines...)
	}

	stop := make(chan struct{})
	var writers sync.WaitGroup
	writes := make([]int, len(owners))
	written := make([]atomic.Int64, len(owners))
	for i, owner := range owners {
		writers.Go(func() { writes[i] = writeLocked(t, e.pool, owner, items, uint64(i), stop, &written[i]) })
	}
	stopWrites := sync.OnceFunc(func() { close(stop); writers.Wait() })
	defer stopWrites() // before the pool closes, also when a sync fails

	type client struct {
		owner  string
		sync   *syncclient.Client
		mirror syncclient.Mirror
		next   time.Time
	}
	var clients []*client
	for i, owner := range owners {
		for j, lang := range catalog.Languages {
			clients = append(clients, &client{owner: owner, mirror: syncclient.Mirror{}, sync: &syncclient.Client{
				BaseURL: e.srv.URL + "/v1", HTTP: e.srv.Client(), Prepare: e.sign(owner),
				Lang: lang, Limit: 3 + 4*i + j, Overlap: -1, Retries: -1,
			}})
		}
	}
	var syncs sync.WaitGroup
	// The syncs run 2 s, and on until each owner's items were written
	// minWrites times meanwhile (30 s at most): on a loaded machine one
	// owner's writer once wrote once in the 2 s.
	const minWrites = 10
	started := time.Now()
	running := func() bool {
		if since := time.Since(started); since < 2*time.Second || since > 30*time.Second {
			return since < 2*time.Second
		}
		for i := range written {
			if written[i].Load() < minWrites {
				return true
			}
		}
		return false
	}
	for _, c := range clients {
		syncs.Go(func() {
			for running() {
				next, _, err := c.sync.Sync(ctx, c.next, c.mirror.Upsert)
				if err != nil {
					t.Errorf("sync of %s in %s: %v", c.owner, c.sync.Lang, err)
					return
				}
				c.next = next
			}
		})
	}
	syncs.Wait()
	stopWrites()
	for i, n := range writes {
		if n < minWrites {
			t.Fatalf("only %d writes of owner %d ran; the test proves nothing", n, i)
		}
	}
	for _, c := range clients {
		if _, _, err := c.sync.Sync(ctx, c.next, c.mirror.Upsert); err != nil {
			t.Fatalf("final sync of %s in %s: %v", c.owner, c.sync.Lang, err)
		}
		want := catalogtest.ComposedItems(t, e.pool, c.owner, c.sync.Lang)
		if len(c.mirror) != len(want) {
			t.Errorf("%s in %s: mirror holds %d items, database %d", c.owner, c.sync.Lang, len(c.mirror), len(want))
		}
		for id, doc := range want {
			if got := string(c.mirror[id].Raw); got != doc {
				t.Errorf("%s in %s: mirror[%s] = %s\nwant %s", c.owner, c.sync.Lang, id, got, doc)
			}
		}
	}
}

// writeLocked changes random items of owner until stop, as the real writers
// do, under the owner's sync lock (catalog.WriterLock): sales confirmed and
// canceled in one statement each, and re-imports with new texts and status.
func writeLocked(t *testing.T, pool *pgxpool.Pool, owner string, items int, seed uint64, stop <-chan struct{}, written *atomic.Int64) int {
	ctx := context.Background()
	rnd := rand.New(rand.NewPCG(seed, 3))
	for n := 0; ; n++ {
		select {
		case <-stop:
			return n
		default:
		}
		id := fmt.Sprintf("item-%03d", rnd.IntN(items))
		var err error
		switch rnd.IntN(3) {
		case 0:
			_, err = pool.Exec(ctx, lockedConfirm, owner, id, fmt.Sprintf("order-%d", n))
		case 1:
			_, err = pool.Exec(ctx, lockedCancel, owner, id)
		default:
			status := []string{"active", "inactive"}[rnd.IntN(2)]
			var parsed []catalog.Item
			parsed, err = catalog.ParseJSONL(strings.NewReader(taggedLine(id, status, fmt.Sprintf("v%d", n))))
			if err == nil {
				_, err = catalog.Import(ctx, pool, owner, parsed)
			}
		}
		if err != nil {
			t.Errorf("write %d of %s: %v", n, owner, err)
			return n
		}
		written.Add(1)
	}
}

// lockedConfirm and lockedCancel change a sale as sales-writer does: the
// owner's sync lock first, then the sale row and the item, stamped last, in
// one statement committed as it ends.
var (
	lockedConfirm = `WITH barrier AS (SELECT ` + catalog.WriterLock("$1::uuid") + `), sale AS (
		INSERT INTO sales (owner_id, item_id, platform_id, external_order_id, confirmed_at)
		SELECT $1, $2, 'market', $3, clock_timestamp() WHERE EXISTS (SELECT FROM barrier) AND NOT EXISTS
			(SELECT 1 FROM sales WHERE owner_id = $1 AND item_id = $2 AND canceled_at IS NULL)
		RETURNING item_id)
		UPDATE export_items SET sold = true, updated_at = ` + catalog.NextUpdatedAt("export_items") + `
		WHERE owner_id = $1 AND id IN (SELECT item_id FROM sale)`
	lockedCancel = `WITH barrier AS (SELECT ` + catalog.WriterLock("$1::uuid") + `), sale AS (
		UPDATE sales SET canceled_at = clock_timestamp()
		WHERE owner_id = $1 AND item_id = $2 AND canceled_at IS NULL AND EXISTS (SELECT FROM barrier)
		RETURNING item_id)
		UPDATE export_items SET sold = false, updated_at = ` + catalog.NextUpdatedAt("export_items") + `
		WHERE owner_id = $1 AND id IN (SELECT item_id FROM sale)`
)
