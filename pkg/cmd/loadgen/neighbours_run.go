package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/url"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// neighbourClient sends one request and reads its answer, bounded by the
// run's timeout. Each call takes its own request and response from
// fasthttp's pools: B's requests overlap, and A's clients are many.
type neighbourClient struct {
	http    *httpClient
	timeout time.Duration
}

// answer is what a client acts on in an answer.
type answer struct {
	status     int
	retryAfter string
	inProgress bool // a 409 request_in_progress: the call's first attempt still runs, retried alike
}

// send sends method to uri with key (and, for a sale, the Idempotency-Key
// and body) and returns the answer and the time taken.
func (c neighbourClient) send(method, uri, key, idemKey string, body []byte) (answer, time.Duration, error) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod(method)
	req.SetRequestURI(uri)
	req.Header.Set("X-API-Key", key)
	if idemKey != "" {
		req.Header.Set("Idempotency-Key", idemKey)
		req.Header.SetContentType("application/json")
		req.SetBody(body)
	}
	t0 := time.Now()
	err := c.http.hc.DoTimeout(req, resp, c.timeout)
	d := time.Since(t0)
	if err != nil {
		return answer{}, d, err
	}
	a := answer{status: resp.StatusCode(), retryAfter: string(resp.Header.Peek("Retry-After"))}
	a.inProgress = a.status == fasthttp.StatusConflict && bytes.Contains(resp.Body(), []byte(`"request_in_progress"`))
	return a, d, nil
}

// neighbour is owner B: requests at their due times, each in a goroutine
// of its own, so a slow answer does not hold back the next.
type neighbour struct {
	c         neighbourClient
	base      string
	readKey   string
	writeKeys []string
	getIDs    []string
	listURL   string
	free      chan string // B's items not in a pair, nor left sold
	run       string      // prefix of order ids and Idempotency-Keys
	stats     *neighbourStats
	inFlight  sync.WaitGroup
}

func (n *neighbour) get(i int) {
	uri := n.base + "/export/items/" + url.PathEscape(n.getIDs[i%len(n.getIDs)])
	n.inFlight.Go(func() {
		n.stats.exportInFlight.enter()
		ans, d, err := n.c.send(fasthttp.MethodGet, uri, n.readKey, "", nil)
		n.stats.exportInFlight.leave()
		n.stats.add(kindGet, ans.status, d, err)
	})
}

func (n *neighbour) list(int) {
	n.inFlight.Go(func() {
		n.stats.exportInFlight.enter()
		ans, d, err := n.c.send(fasthttp.MethodGet, n.listURL, n.readKey, "", nil)
		n.stats.exportInFlight.leave()
		n.stats.add(kindList, ans.status, d, err)
	})
}

// sale sends pair i: a confirm of a free item and, once it is answered
// 200, its cancel. The item is free again only after a cancel answered
// 200, or a confirm refused before it could apply (429); otherwise it may
// be sold and is left out. No free item: the pair is skipped, and counted.
func (n *neighbour) sale(i int) {
	var item string
	select {
	case item = <-n.free:
	default:
		n.stats.mu.Lock()
		n.stats.skipped++
		n.stats.mu.Unlock()
		return
	}
	key := n.writeKeys[i%len(n.writeKeys)]
	prefix := n.base + "/export/items/" + url.PathEscape(item) + "/sales/"
	order := fmt.Sprintf("nb-%s-%d", n.run, i)
	body := appendSalesBody(nil, []byte(order))
	n.inFlight.Go(func() {
		n.stats.saleInFlight.enter()
		ans, d, err := n.c.send(fasthttp.MethodPost, prefix+"confirm", key, order+"-c", body)
		n.stats.saleInFlight.leave()
		n.stats.add(kindSale, ans.status, d, err)
		if err != nil || ans.status != fasthttp.StatusOK {
			if err == nil && ans.status == fasthttp.StatusTooManyRequests {
				n.free <- item
			}
			return
		}
		n.stats.saleInFlight.enter()
		ans, d, err = n.c.send(fasthttp.MethodPost, prefix+"cancel", key, order+"-x", body)
		n.stats.saleInFlight.leave()
		n.stats.add(kindSale, ans.status, d, err)
		if err == nil && ans.status == fasthttp.StatusOK {
			n.free <- item
		}
	})
}

// flood is owner A: list-page connections and sale workers, each sending
// back to back until the run's end, and waiting as told between refusals.
type flood struct {
	c         neighbourClient
	base      string
	listURL   string
	readKeys  []string
	writeKeys []string
	items     [][]string
	run       string
	stats     *floodStats
}

func (a *flood) lists(ctx context.Context, conn int) {
	key := a.readKeys[conn%len(a.readKeys)]
	for ctx.Err() == nil {
		ans, _, err := a.c.send(fasthttp.MethodGet, a.listURL, key, "", nil)
		a.stats.add(kindList, ans.status, err)
		sleepCtx(ctx, retryWait(ans, err, 100*time.Millisecond, randomBelow))
	}
}

// sales is worker w: a confirm + cancel pair on each of its items in turn,
// each call sent until it is answered 2xx or a final 4xx, with the same
// Idempotency-Key on every attempt (the README's sales guide); a confirm
// refused 409 moves on to the next item. A confirm answered 200 is
// canceled even once the run has ended (settle, not ctx, bounds that
// cancel): a run used to leave the items whose confirms were answered
// as it ended sold, each one fewer for A's next run, and a sale in the
// catalog that nobody made. So is a confirm the run's end left in doubt
// (sent, and being retried after a 5xx, a timeout or a 409
// request_in_progress): sent again under settle with its key, it replays
// what it did, and is canceled if it sold.
func (a *flood) sales(ctx, settle context.Context, w int) {
	key, ids := a.writeKeys[w], newIDSource(a.run, w)
	for i := 0; ctx.Err() == nil; i++ {
		item := a.items[w][i%len(a.items[w])]
		prefix := a.base + "/export/items/" + url.PathEscape(item) + "/sales/"
		order := string(ids.appendNext([]byte("flood-")))
		body := appendSalesBody(nil, []byte(order))
		status, sent := a.call(ctx, prefix+"confirm", key, order+"-c", body)
		if status == 0 && sent {
			status, _ = a.call(settle, prefix+"confirm", key, order+"-c", body)
		}
		if status == fasthttp.StatusOK {
			a.call(settle, prefix+"cancel", key, order+"-x", body)
		}
	}
}

// call sends one sale call until it is settled (2xx or a 4xx other than
// 429 and a 409 request_in_progress) or ctx ends, and returns its last
// status (0: none settled it) and whether it was sent at all.
func (a *flood) call(ctx context.Context, uri, key, idemKey string, body []byte) (status int, sent bool) {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		a.stats.salesInFlight.enter()
		ans, _, err := a.c.send(fasthttp.MethodPost, uri, key, idemKey, body)
		a.stats.salesInFlight.leave()
		sent = true
		a.stats.add(kindSale, ans.status, err)
		wait := retryWait(ans, err, backoff, randomBelow)
		if wait == 0 {
			return ans.status, true
		}
		backoff = min(2*backoff, 5*time.Second)
		sleepCtx(ctx, wait)
	}
	return 0, sent
}

// neighbours runs both owners for f.duration and returns B's figures and
// A's answers (the pool waits are the caller's).
func neighbours(ctx context.Context, cfg Config, f neighboursFlags, items neighbourItemSets, stdout io.Writer) (neighboursReport, error) {
	conns := f.floodListConns + f.floodSaleWorkers
	aHTTP, err := newHTTPClient(f.base, conns)
	if err != nil {
		return neighboursReport{}, err
	}
	bHTTP, err := newHTTPClient(f.base, 512) // B's requests overlap when answers are slow: none waits for a connection
	if err != nil {
		return neighboursReport{}, err
	}
	listURL := fmt.Sprintf("%s/export/items?limit=%d", bHTTP.base, f.listLimit)
	run := randomHex(8)
	b := &neighbour{c: neighbourClient{bHTTP, f.timeout}, base: bHTTP.base, readKey: cfg.ReadKey, writeKeys: cfg.WriteKeys,
		getIDs: items.get, listURL: listURL, free: make(chan string, len(items.sale)), run: run, stats: newNeighbourStats()}
	for _, item := range items.sale {
		b.free <- item
	}
	start := time.Now()
	stop := start.Add(f.duration)
	a := &flood{c: neighbourClient{aHTTP, f.timeout}, base: aHTTP.base, listURL: listURL, readKeys: cfg.FloodReadKeys,
		writeKeys: cfg.FloodWriteKeys, items: items.flood, run: run, stats: newFloodStats(stop)}
	runCtx, cancel := context.WithDeadline(ctx, stop)
	defer cancel()
	// A's cancels of sales confirmed as the run ended: a request's bound,
	// and as long again for the retries a refusal asks for.
	settleCtx, cancelSettle := context.WithDeadline(ctx, stop.Add(2*f.timeout))
	defer cancelSettle()

	var flooders sync.WaitGroup
	for c := range f.floodListConns {
		flooders.Go(func() { a.lists(runCtx, c) })
	}
	for w := range f.floodSaleWorkers {
		flooders.Go(func() { a.sales(runCtx, settleCtx, w) })
	}
	if f.every > 0 {
		flooders.Go(func() { timeline(runCtx, stdout, start, f.every, a.stats, b.stats) })
	}
	var pacers sync.WaitGroup
	paced := map[string]*pacing{}
	for _, k := range []struct {
		kind string
		rate float64
		send func(int)
	}{{kindGet, f.getRate, b.get}, {kindList, f.listRate, b.list}, {kindSale, f.saleRate, b.sale}} {
		p := &pacing{}
		paced[k.kind] = p
		// ctx, not runCtx: a request due within the run but sent after
		// its end (late) is still sent, and counted late.
		pacers.Go(func() { *p = pace(ctx, realClock{}, start, k.rate, f.duration, f.tolerance, k.send) })
	}
	pacers.Wait()
	b.inFlight.Wait() // each within f.timeout
	flooders.Wait()
	if err := ctx.Err(); err != nil {
		return neighboursReport{}, err // an interrupted run has no figures
	}
	return newNeighboursReport(f, b.stats, paced, a.stats), nil
}

// timeline prints, every so often, what A's answers and B's did since the
// last line, and A's sale calls in flight at that moment: a sales-writer
// frozen shows as list pages still answered 200 while the sales in flight
// stay put.
func timeline(ctx context.Context, w io.Writer, start time.Time, every time.Duration, a *floodStats, b *neighbourStats) {
	last := a.snapshot()
	lastB := map[string]int{}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		now := a.snapshot()
		b.mu.Lock()
		answeredB := map[string]int{}
		for kind, k := range b.kinds {
			answeredB[kind] = k.latencies.Count()
		}
		b.mu.Unlock()
		fmt.Fprintf(w, "%5.1fs  A list 200 %d 429 %d  A sale 200 %d 429 %d, in flight %d  B answered get %d list %d sale %d\n",
			time.Since(start).Seconds(),
			now[kindList]["200"]-last[kindList]["200"], now[kindList]["429"]-last[kindList]["429"],
			now[kindSale]["200"]-last[kindSale]["200"], now[kindSale]["429"]-last[kindSale]["429"], a.salesInFlight.now.Load(),
			answeredB[kindGet]-lastB[kindGet], answeredB[kindList]-lastB[kindList], answeredB[kindSale]-lastB[kindSale])
		last, lastB = now, answeredB
	}
}
