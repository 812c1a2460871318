package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/catalog"
	"github.com/coinexport/export/pkg/catalog/catalogtest"
	"github.com/coinexport/export/pkg/envelope"
	"github.com/coinexport/export/pkg/testenv"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A marketplace follows the sync guide (a full sync, then incremental runs
// from its recorded start time less the 2-minute overlap) through a gateway
// in front of two export-readers, while a platform confirms and cancels
// sales of the owner's items, the owner re-imports items, and ops restart
// the readers one at a time (SIGTERM, start again: a rolling upgrade). The
// key's pages move to the other reader while its own is down, and back, so
// cursors cross instances and restarts. Every page must be answered 200
// (export-reader README, "Stopping": run two where a restart must not be
// seen), and after the writes stop and one last incremental run the copy
// must equal the database item by item: status, stock, updated_at, texts.
func TestASyncCarriesOnThroughARollingRestartOfTwoReaders(t *testing.T) {
	pool := testenv.Postgres(t)
	fx := newFixture(t, pool) // 50 seeded items and a sale key
	if _, err := catalog.Seed(context.Background(), pool, fx.owner, 550, 2); err != nil {
		t.Fatal(err)
	}
	s := startStack(t, dsnOf(t, pool), testenv.RedisURL(t))
	readers := []*readerProcess{startReaderProcess(t, s), startReaderProcess(t, s)}
	g, _ := startGateway(t, s, slices.Concat(s.upstreams, []string{
		"EXPORT_READER_URLS=" + readers[0].url() + "," + readers[1].url()})...)
	time.Sleep(time.Second) // the gateway's first probes of both readers
	ids := idsInOrder(t, pool, fx.owner, "true")

	stop := make(chan struct{})
	var writers sync.WaitGroup
	var sales, imports int
	writers.Go(func() { sales = sellAndCancel(g, fx.writeKey, ids, stop) })
	writers.Go(func() { imports = reimport(t, pool, fx.owner, ids, stop) })
	stopWrites := sync.OnceFunc(func() { close(stop); writers.Wait() })
	defer stopWrites()

	restarted := make(chan struct{})
	go func() {
		defer close(restarted)
		for _, r := range readers {
			time.Sleep(time.Second) // pages of the runs under way on both sides of each stop
			if err := r.restart(); err != nil {
				t.Error(err)
				return
			}
		}
		time.Sleep(time.Second)
	}()

	c := &guideClient{t: t, baseURL: g.baseURL, key: fx.readKey, copy: map[string]json.RawMessage{}}
	checkpoint, runs := time.Time{}, 0
	for done := false; !done; runs++ {
		select {
		case <-restarted:
			done = true
		default:
		}
		checkpoint = c.run(checkpoint)
	}
	stopWrites()
	c.run(checkpoint)
	t.Logf("%d runs (%d pages) while 2 readers restarted; %d sales and cancels, %d imports", runs+1, c.pages, sales, imports)
	if sales < 10 || imports < 3 {
		t.Fatalf("only %d sale calls and %d imports ran: the runs were not under change", sales, imports)
	}
	if got := listInstances(g); len(got) < 2 {
		t.Errorf("list pages were served by %v only; the key's pages never moved to the other reader", got)
	}
	if len(c.failed) > 0 {
		t.Errorf("%d pages were answered with the gateway's 502, 503 or 504 during the rolling restart (want none: two readers hide a restart):\n%s",
			len(c.failed), strings.Join(c.failed, "\n"))
	}
	want := catalogtest.ComposedItems(t, pool, fx.owner, "ENG")
	if len(c.copy) != len(want) {
		t.Errorf("the copy holds %d items, the database %d", len(c.copy), len(want))
	}
	for id, doc := range want {
		if got := string(c.copy[id]); got != doc {
			t.Errorf("copy[%s] = %s\nwant %s", id, got, doc)
		}
	}
}

// guideClient syncs as the README's sync guide says: limit=100 pages
// followed by next_cursor, incremental runs from the last run's start less
// two minutes, each item upserted by id keeping the later updated_at, a
// page that failed asked for again with its cursor.
type guideClient struct {
	t            *testing.T
	baseURL, key string
	copy         map[string]json.RawMessage
	pages        int
	failed       []string // the pages answered as restartSeen says
}

// run is one run from checkpoint (a full sync when zero); it returns the
// run's start, the next checkpoint.
func (c *guideClient) run(checkpoint time.Time) time.Time {
	c.t.Helper()
	start := time.Now()
	q := url.Values{"limit": {"100"}}
	if !checkpoint.IsZero() {
		q.Set("updated_after", checkpoint.Add(-2*time.Minute).UTC().Format(time.RFC3339Nano))
	}
	for attempts := 0; ; {
		status, env, _ := call(c.t, "GET", c.baseURL+"/export/items?"+q.Encode(), c.key, "", nil)
		if status == http.StatusTooManyRequests { // the key's budget, not a restart: after its Retry-After
			time.Sleep(time.Second)
			continue
		}
		if status != http.StatusOK {
			answer := fmt.Sprintf("  %d %s (request %s)", status, errorCode(env), env.Meta.RequestID)
			if restartSeen[errorCode(env)] {
				c.failed = append(c.failed, answer)
			} else {
				c.t.Logf("a page answered %s, asked for again", answer)
			}
			if attempts++; status < 500 || attempts > 8 {
				c.t.Fatalf("a run ended on %d %s (request %s)", status, errorCode(env), env.Meta.RequestID)
			}
			time.Sleep(time.Second) // a 503's Retry-After
			continue
		}
		attempts = 0
		c.pages++
		c.upsert(env.Data)
		if env.Meta.NextCursor == nil {
			return start
		}
		q.Set("cursor", *env.Meta.NextCursor)
	}
}

// upsert keeps each item of a page unless the copy holds a later version.
func (c *guideClient) upsert(data json.RawMessage) {
	var items []json.RawMessage
	if err := json.Unmarshal(data, &items); err != nil {
		c.t.Fatalf("a page's data is no list: %v", err)
	}
	for _, raw := range items {
		var it struct {
			ID        string    `json:"id"`
			UpdatedAt time.Time `json:"updated_at"`
		}
		if err := json.Unmarshal(raw, &it); err != nil {
			c.t.Fatalf("item %s: %v", raw, err)
		}
		if old, ok := c.copy[it.ID]; ok {
			var held struct {
				UpdatedAt time.Time `json:"updated_at"`
			}
			if json.Unmarshal(old, &held) == nil && held.UpdatedAt.After(it.UpdatedAt) {
				continue
			}
		}
		c.copy[it.ID] = raw
	}
}

// restartSeen are the gateway's answers when the instance it asked failed
// or none was up: what a client sees of a restart. A reader's own 503
// unavailable (a first page behind a write in flight for over 2 s on a
// loaded machine) is retried without counting.
var restartSeen = map[string]bool{"bad_gateway": true, "upstream_unavailable": true, "upstream_timeout": true}

func errorCode(env envelope.Parsed) string {
	if env.Error == nil {
		return ""
	}
	return env.Error.Code
}

// sellAndCancel confirms a sale of a random item and cancels it, again
// and again until stop, through the gateway with a sale key; it returns
// how many calls were answered 200.
func sellAndCancel(g *stack, writeKey string, ids []string, stop <-chan struct{}) int {
	n := 0
	for i := 0; ; i++ {
		select {
		case <-stop:
			return n
		default:
		}
		item := g.baseURL + "/export/items/" + url.PathEscape(ids[rand.IntN(len(ids))]) + "/sales/"
		orderID := fmt.Sprintf("rolling-%d", i)
		if postSale(item+"confirm", writeKey, orderID, orderID+"-confirm") != http.StatusOK {
			continue // an item sold or unlisted already, or the key's limit: another one
		}
		n++
		if postSale(item+"cancel", writeKey, orderID, orderID+"-cancel") == http.StatusOK {
			n++
		}
	}
}

// postSale sends a sale call and returns its status (0: no answer).
func postSale(target, writeKey, orderID, idempotencyKey string) int {
	req, err := http.NewRequest("POST", target, strings.NewReader(order(orderID)))
	if err != nil {
		return 0
	}
	req.Header.Set("X-API-Key", writeKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", idempotencyKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// reimport imports ten random items with a new title every 200 ms until
// stop, and returns how many imports it made.
func reimport(t *testing.T, pool *pgxpool.Pool, owner string, ids []string, stop <-chan struct{}) int {
	for n := 1; ; n++ {
		select {
		case <-stop:
			return n - 1
		case <-time.After(200 * time.Millisecond):
		}
		var lines []string
		for _, i := range rand.Perm(len(ids))[:10] {
			lines = append(lines, fmt.Sprintf(`{"id":%q,"status":"active","currency":"EUR","texts":{"ENG":{"title":"v%d"}}}`, ids[i], n))
		}
		items, err := catalog.ParseJSONL(strings.NewReader(strings.Join(lines, "\n")))
		if err == nil {
			_, err = catalog.Import(context.Background(), pool, owner, items)
		}
		if err != nil {
			t.Errorf("import %d: %v", n, err)
			return n - 1
		}
	}
}

// readerProcess is an export-reader of the stack's settings on an address
// of its own, which restart stops (SIGTERM) and starts again on.
type readerProcess struct {
	s           *stack
	addr, admin string
	logs        *testenv.Output
	cmd         *exec.Cmd
	done        chan struct{}
}

func startReaderProcess(t *testing.T, s *stack) *readerProcess {
	t.Helper()
	r := &readerProcess{s: s, addr: testenv.FreeAddr(t), admin: testenv.FreeAddr(t), logs: &testenv.Output{}}
	if err := r.start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.stop(); err != nil {
			t.Error(err)
		}
	})
	return r
}

func (r *readerProcess) url() string { return "http://" + r.addr }

// start starts the reader and waits until it is ready.
func (r *readerProcess) start() error {
	r.cmd = exec.Command(filepath.Join(r.s.bin, "export-reader"))
	r.cmd.Env = append(slices.Clone(r.s.common), "EXPORT_READER_ADDR="+r.addr, "EXPORT_READER_ADMIN_ADDR="+r.admin)
	r.cmd.Stdout, r.cmd.Stderr = r.logs, r.logs
	testenv.DiesWithTest(r.cmd)
	if err := r.cmd.Start(); err != nil {
		return err
	}
	r.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { _ = cmd.Wait(); close(done) }(r.cmd, r.done)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if resp, err := healthClient.Get(r.url() + "/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("export-reader on %s not ready within 30 s:\n%s", r.addr, r.logs.String())
		}
	}
}

// stop sends SIGTERM and waits for the reader to end (killed after 30 s).
func (r *readerProcess) stop() error {
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.done:
		return nil
	case <-time.After(30 * time.Second):
		_ = r.cmd.Process.Kill()
		<-r.done
		return fmt.Errorf("export-reader on %s did not stop within 30 s of SIGTERM:\n%s", r.addr, r.logs.String())
	}
}

// restart stops the reader and starts it again on its address, then gives
// the gateway's probes time to see it up (an instance out is probed every
// 250 ms).
func (r *readerProcess) restart() error {
	if err := r.stop(); err != nil {
		return err
	}
	if err := r.start(); err != nil {
		return err
	}
	time.Sleep(time.Second)
	return nil
}

// listInstances is the set of export-reader instances the gateway's access
// lines name for list pages.
func listInstances(g *stack) []string {
	seen := map[string]bool{}
	for _, line := range strings.Split(g.logs["gateway"].String(), "\n") {
		var l struct {
			Route    string `json:"route"`
			Instance string `json:"upstream_instance"`
		}
		if json.Unmarshal([]byte(line), &l) == nil && l.Route == "GET /v1/export/items" && l.Instance != "" {
			seen[l.Instance] = true
		}
	}
	return slices.Sorted(maps.Keys(seen))
}
