package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// The replay scenario: sales platforms replaying a backlog of confirms and
// cancels at once, as after an outage, each client doing what the README's
// "Sales guide" says (one Idempotency-Key per call, the same key on every
// retry, Retry-After on 429 and 503, backoff on other 5xx and timeouts, an
// order's cancel only once its confirm is settled). At the end every item's
// state is checked against what the backlogs imply, through the API and in
// the database.

// replayOp is one call of a platform's backlog.
type replayOp struct {
	item, action, order, key string
}

// replayItem is the ordered calls of one platform on one item.
type replayItem struct {
	platform int
	item     string
	ops      []replayOp
	shared   bool
}

// replayOutcome is the final answer of one call.
type replayOutcome struct {
	status int
	code   string
	replay bool
}

type replayStats struct {
	mu         sync.Mutex
	sends      []time.Duration // offset of every request sent, from the start
	answers    map[string]int  // "status code" → count, every answer (retries included)
	retryAfter map[string]int  // Retry-After values seen on 429/503
	outcomes   map[string]replayOutcome
	start      time.Time
}

func (s *replayStats) sent() {
	s.mu.Lock()
	s.sends = append(s.sends, time.Since(s.start))
	s.mu.Unlock()
}

func (s *replayStats) answered(status int, code, retryAfter string) {
	s.mu.Lock()
	s.answers[fmt.Sprintf("%d %s", status, code)]++
	if status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable {
		s.retryAfter[fmt.Sprintf("%d %s ra=%s", status, code, retryAfter)]++
	}
	s.mu.Unlock()
}

func runReplay(ctx context.Context, cfg Config, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("replay", flag.ContinueOnError)
	base := fs.String("base", "http://127.0.0.1:18080/v1", "base URL including /v1")
	itemsFile := fs.String("items", "", "file of active item ids of the owner, one per line")
	perPlatform := fs.Int("ops", 1000, "calls in each platform's backlog")
	conc := fs.Int("concurrency", 8, "items a platform replays at once")
	shared := fs.Int("shared", 20, "items every platform's backlog confirms (only one can win each)")
	seed := fs.Uint64("seed", 1, "backlog seed")
	jitter := fs.Bool("jitter", false, "add a random 0-1 s to every Retry-After wait and draw each backoff at random below its bound (without: the waits exactly as told)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if len(cfg.WriteKeys) == 0 || cfg.ReadKey == "" || cfg.DatabaseURL == "" || cfg.OwnerID == "" {
		return errUsagef("replay needs LOADGEN_WRITE_KEYS, LOADGEN_READ_KEY, LOADGEN_OWNER_ID and DATABASE_URL")
	}
	raw, err := os.ReadFile(*itemsFile)
	if err != nil {
		return err
	}
	items := strings.Fields(string(raw))
	plan, err := planReplay(items, len(cfg.WriteKeys), *perPlatform, *shared, *seed)
	if err != nil {
		return err
	}
	stats := &replayStats{answers: map[string]int{}, retryAfter: map[string]int{}, outcomes: map[string]replayOutcome{}, start: time.Now()}
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: *conc}}
	var wg sync.WaitGroup
	for p, key := range cfg.WriteKeys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			replayPlatform(ctx, client, *base, key, plan[p], *conc, *jitter, stats)
		}()
	}
	wg.Wait()
	elapsed := time.Since(stats.start)
	fmt.Fprintf(stdout, "replayed %d platforms in %.1fs\n", len(cfg.WriteKeys), elapsed.Seconds())
	printReplayStats(stdout, stats)
	return checkReplay(ctx, client, cfg, *base, plan, stats, stdout)
}

// planReplay gives each platform its own items, each with an alternating
// run of confirm/cancel calls (a new order per confirm), and a confirm of
// every shared item. seed fixes the backlog's shape; the orders and
// Idempotency-Keys are new each run (a random run id): drawn from the
// seed, a second run with the same one sent the first run's keys again,
// answered as replays of it with nothing executed, and its check passed.
func planReplay(items []string, platforms, perPlatform, shared int, seed uint64) ([][]replayItem, error) {
	rng := rand.New(rand.NewPCG(seed, 7))
	if platforms < 1 || shared < 0 || perPlatform < shared || len(items) < shared+platforms {
		return nil, errUsagef("replay needs --ops at least --shared (%d), and at least --shared + one item per platform (%d) in --items, got %d calls and %d items",
			shared, shared+platforms, perPlatform, len(items))
	}
	sharedItems, own := items[:shared], items[shared:]
	perOwn := len(own) / platforms
	plan := make([][]replayItem, platforms)
	run := randomHex(8)
	for p := range platforms {
		mine := own[p*perOwn : (p+1)*perOwn]
		budget := perPlatform - shared
		if budget < len(mine) {
			mine = mine[:budget]
		}
		lengths := make([]int, len(mine))
		for i := range lengths {
			lengths[i] = 1
		}
		for left := budget - len(mine); left > 0; left-- {
			lengths[rng.IntN(len(mine))]++
		}
		for i, item := range mine {
			ri := replayItem{platform: p, item: item}
			for n := range lengths[i] {
				order := fmt.Sprintf("%s-p%d-%s-o%d", run, p, item, n/2)
				action := "confirm"
				if n%2 == 1 {
					action = "cancel"
				}
				ri.ops = append(ri.ops, replayOp{item, action, order, fmt.Sprintf("%s-p%d-%s-%d", run, p, item, n)})
			}
			plan[p] = append(plan[p], ri)
		}
		for _, item := range sharedItems {
			order := fmt.Sprintf("%s-p%d-%s-shared", run, p, item)
			plan[p] = append(plan[p], replayItem{platform: p, item: item, shared: true,
				ops: []replayOp{{item, "confirm", order, order}}})
		}
		rng.Shuffle(len(plan[p]), func(i, j int) { plan[p][i], plan[p][j] = plan[p][j], plan[p][i] })
	}
	return plan, nil
}

func replayPlatform(ctx context.Context, client *http.Client, base, key string, items []replayItem, conc int, jitter bool, stats *replayStats) {
	next := make(chan replayItem)
	var wg sync.WaitGroup
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ri := range next {
				for _, op := range ri.ops {
					out := replayCall(ctx, client, base, key, op, jitter, stats)
					stats.mu.Lock()
					stats.outcomes[op.key] = out
					stats.mu.Unlock()
				}
			}
		}()
	}
	for _, ri := range items {
		next <- ri
	}
	close(next)
	wg.Wait()
}

// replayCall sends one call until it is answered 2xx or a final 4xx, as the
// sales guide says.
func replayCall(ctx context.Context, client *http.Client, base, key string, op replayOp, jitter bool, stats *replayStats) replayOutcome {
	body, _ := json.Marshal(map[string]string{"external_order_id": op.order})
	uri := base + "/export/items/" + url.PathEscape(op.item) + "/sales/" + op.action
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, uri, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-API-Key", key)
		req.Header.Set("Idempotency-Key", op.key)
		stats.sent()
		resp, err := client.Do(req)
		wait := backoff
		if jitter {
			wait = rand.N(backoff) + time.Millisecond
		}
		backoff = min(2*backoff, 5*time.Second)
		if err == nil {
			var env struct {
				Data struct {
					IdempotentReplay bool `json:"idempotent_replay"`
				} `json:"data"`
				Error struct{ Code string } `json:"error"`
			}
			raw, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			_ = json.Unmarshal(raw, &env)
			ra := resp.Header.Get("Retry-After")
			stats.answered(resp.StatusCode, env.Error.Code, ra)
			secs, _ := strconv.Atoi(ra)
			switch s := resp.StatusCode; {
			case s < 300:
				return replayOutcome{s, "", env.Data.IdempotentReplay}
			case s == http.StatusTooManyRequests:
				wait = time.Duration(secs) * time.Second
			case s == http.StatusServiceUnavailable:
				wait = max(wait, time.Duration(secs)*time.Second)
			case s >= 500 || env.Error.Code == "request_in_progress":
			default:
				return replayOutcome{s, env.Error.Code, false}
			}
			if jitter && (resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable) {
				wait += rand.N(time.Second)
			}
		} else {
			stats.answered(0, "transport", "")
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
	return replayOutcome{0, "interrupted", false}
}

func printReplayStats(w io.Writer, s *replayStats) {
	fmt.Fprintln(w, "answers (every attempt):")
	printCounts(w, s.answers)
	fmt.Fprintln(w, "429/503 Retry-After:")
	printCounts(w, s.retryAfter)
	// Requests sent per 100 ms slot, to see whether retries come in waves.
	slots := map[int]int{}
	last := 0
	for _, d := range s.sends {
		slot := int(d / (100 * time.Millisecond))
		slots[slot]++
		last = max(last, slot)
	}
	fmt.Fprintf(w, "requests sent: %d; per second (and the busiest 100 ms slot of it):\n", len(s.sends))
	peaks := 0
	for sec := 0; sec*10 <= last; sec++ {
		total, peak := 0, 0
		for i := sec * 10; i < sec*10+10; i++ {
			total += slots[i]
			peak = max(peak, slots[i])
		}
		fmt.Fprintf(w, "  %3ds %5d (peak %d)\n", sec, total, peak)
		peaks += peak
	}
	// Evenly spread, a second's busiest tenth holds a little over 10 % of it.
	fmt.Fprintf(w, "sent in the busiest 100 ms of their second: %.1f %%\n", 100*float64(peaks)/float64(max(1, len(s.sends))))
}

func printCounts(w io.Writer, m map[string]int) {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(w, "  %-60s %d\n", k, m[k])
	}
}

// checkReplay compares every item's state with what the backlogs imply: an
// own item is sold iff its run ends with a confirm, every call of it
// answered 200; a shared item is sold to exactly one platform, the others
// refused item_already_sold.
func checkReplay(ctx context.Context, client *http.Client, cfg Config, base string, plan [][]replayItem, stats *replayStats, w io.Writer) error {
	sales, err := salesOfOrders(ctx, cfg.DatabaseURL, cfg.OwnerID, ordersOf(plan))
	if err != nil {
		return err
	}
	problems := 0
	bad := func(format string, args ...any) {
		problems++
		if problems <= 20 {
			fmt.Fprintf(w, "  MISMATCH "+format+"\n", args...)
		}
	}
	sharedWins := map[string][]int{}
	replays := 0
	for p, items := range plan {
		for _, ri := range items {
			for _, op := range ri.ops {
				out := stats.outcomes[op.key]
				if out.replay {
					replays++
				}
				switch {
				case ri.shared && out.status == 200:
					sharedWins[ri.item] = append(sharedWins[ri.item], p)
				case ri.shared && out.code == "item_already_sold":
				case ri.shared || out.status != 200:
					bad("platform %d item %s %s: %d %s", p, ri.item, op.action, out.status, out.code)
				}
			}
			if ri.shared {
				continue
			}
			wantSold := len(ri.ops)%2 == 1
			s := sales[ri.item]
			if s.total != (len(ri.ops)+1)/2 || (s.open == 1) != wantSold {
				bad("platform %d item %s: %d calls, database has %d sales, %d open", p, ri.item, len(ri.ops), s.total, s.open)
			}
			checkStatus(ctx, client, base, cfg.ReadKey, ri.item, wantSold, bad)
		}
	}
	// Each shared item, won or not: one no platform won (every confirm
	// refused) is a mismatch too.
	for _, item := range sharedItems(plan) {
		wins := sharedWins[item]
		if len(wins) != 1 || sales[item].open != 1 || sales[item].total != 1 {
			bad("shared item %s: won by %v, database %+v", item, wins, sales[item])
		}
		checkStatus(ctx, client, base, cfg.ReadKey, item, true, bad)
	}
	fmt.Fprintf(w, "shared items sold: %d; calls answered idempotent_replay: %d; mismatches: %d\n", len(sharedWins), replays, problems)
	if problems > 0 {
		return fmt.Errorf("%d mismatches", problems)
	}
	return nil
}

// ordersOf is every order of the plan's calls.
func ordersOf(plan [][]replayItem) []string {
	var orders []string
	for _, items := range plan {
		for _, ri := range items {
			for _, op := range ri.ops {
				orders = append(orders, op.order)
			}
		}
	}
	return orders
}

// sharedItems is the items every platform's backlog confirms (the first
// platform's list them all).
func sharedItems(plan [][]replayItem) []string {
	var shared []string
	for _, ri := range plan[0] {
		if ri.shared {
			shared = append(shared, ri.item)
		}
	}
	return shared
}

// itemSales is what the database holds of one item's sales: those not
// canceled, all of them, and the platform of one not canceled.
type itemSales struct {
	open, total int
	platform    string
}

// salesOfOrders reads owner's sales of orders, by item. Only the run's own
// orders count: an item the replay sold and canceled before, active again
// and in the next run's --items, read as a mismatch with its earlier sales
// counted.
func salesOfOrders(ctx context.Context, databaseURL, owner string, orders []string) (map[string]itemSales, error) {
	conn, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT item_id, count(*) FILTER (WHERE canceled_at IS NULL), count(*),
		coalesce(max(platform_id) FILTER (WHERE canceled_at IS NULL), '') FROM sales
		WHERE owner_id = $1 AND external_order_id = ANY($2) GROUP BY item_id`, owner, orders)
	if err != nil {
		return nil, err
	}
	sales := map[string]itemSales{}
	var id string
	var s itemSales
	_, err = pgx.ForEachRow(rows, []any{&id, &s.open, &s.total, &s.platform}, func() error {
		sales[id] = s
		return nil
	})
	return sales, err
}

func checkStatus(ctx context.Context, client *http.Client, base, key, item string, wantSold bool, bad func(string, ...any)) {
	for ctx.Err() == nil {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/export/items/"+url.PathEscape(item), nil)
		req.Header.Set("X-API-Key", key)
		resp, err := client.Do(req)
		if err != nil {
			bad("GET %s: %v", item, err)
			return
		}
		var env struct{ Data struct{ Status string } }
		_ = json.NewDecoder(resp.Body).Decode(&env)
		resp.Body.Close()
		if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable {
			time.Sleep(time.Second)
			continue
		}
		want := "active"
		if wantSold {
			want = "inactive"
		}
		if env.Data.Status != want {
			bad("GET %s: %d status %q, want %q", item, resp.StatusCode, env.Data.Status, want)
		}
		return
	}
}
