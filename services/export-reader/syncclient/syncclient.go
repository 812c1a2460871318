// Package syncclient is the reference client of spec 4.8: a full sync, then
// incremental syncs with updated_after, each upserting items by id into a
// destination. It re-reads a small overlap before its checkpoint, which
// covers a write that committed a little after the updated_at it stamped
// and a client clock a little ahead of the server's (see the README's sync
// guide). Upserts by id are idempotent, so the overlap costs only re-reads.
package syncclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// DefaultOverlap is how far before its checkpoint an incremental sync starts.
const DefaultOverlap = 2 * time.Minute

// Item is what the client reads of an ExportItem; Raw is the whole object.
type Item struct {
	ID            string          `json:"id"`
	Status        string          `json:"status"`
	StockQuantity int             `json:"stock_quantity"`
	UpdatedAt     time.Time       `json:"updated_at"`
	Raw           json.RawMessage `json:"-"`
}

// Client syncs one owner's export items.
type Client struct {
	// BaseURL is the service address including /v1, e.g. https://api.example/v1.
	BaseURL string
	// HTTP sends the requests (http.DefaultClient when nil), its redirect
	// policy aside: no redirect is followed (noRedirects).
	HTTP *http.Client
	// Prepare sets the credentials of each request (X-API-Key through the
	// gateway; signed identity headers in tests of a service alone).
	Prepare func(*http.Request)
	Lang    string        // default ENG
	Limit   int           // default 100
	Overlap time.Duration // default DefaultOverlap; negative means none
	// PageTimeout bounds one attempt at a page, its body read included:
	// past it the page is asked for again, as after a network error.
	// Default DefaultPageTimeout; negative means none.
	PageTimeout time.Duration
	Now         func() time.Time
	// Retries is how many times one page is asked for again after a 5xx,
	// a 408 or a network error, before the sync gives up. A 429 is asked
	// for again once its Retry-After has passed, as often as it comes, and
	// counts against none: a sync of a large catalog meets the rate limit
	// (10,000 pages for 1,000,000 items), and starting it over would meet
	// it again. Default DefaultRetries; negative means none (no 429 is
	// waited out either).
	Retries int
	// Wait sleeps for d, or until ctx ends; nil sleeps for real (tests
	// record the waits instead).
	Wait func(ctx context.Context, d time.Duration) error
}

// DefaultRetries is Client.Retries when unset.
const DefaultRetries = 8

// DefaultPageTimeout is Client.PageTimeout when unset. Without a bound an
// answer that never comes (a connection dropped without a word) holds the
// run for ever: http.DefaultClient has no timeout. Well above the 5 s the
// sync guide asks for (a first page may wait 2 s for the owner's writes)
// and the gateway's own 504 at UPSTREAM_READ_TIMEOUT (30 s), leaving time
// to read a 4 MiB page over a slow link.
const DefaultPageTimeout = 60 * time.Second

// The waits between attempts: a 429's Retry-After when it has one, else
// doubling from firstBackoff to longestBackoff, and never less than a 5xx's
// Retry-After. maxRetryAfter only guards against a nonsensical header: the
// gateway's longest limit window is a day (RATE_LIMIT_* "N-D"), and a sync
// held by a daily or hourly limit must wait its Retry-After out rather than
// give up and start over into the same limit.
const (
	firstBackoff   = 500 * time.Millisecond
	longestBackoff = 30 * time.Second
	maxRetryAfter  = 25 * time.Hour
)

// Sync reads every item updated after checkpoint (all items when checkpoint
// is zero) and passes each to upsert, following meta.next_cursor. On success
// it returns the next checkpoint: the time the sync started (spec 4.8 step
// 1). A page that fails for a reason that passes (429, 5xx, the network) is
// asked for again, with the same cursor (Retries). On any other failure,
// or once the retries are spent, the caller keeps its previous checkpoint
// and repeats the run.
func (c *Client) Sync(ctx context.Context, checkpoint time.Time, upsert func(Item) error) (time.Time, int, error) {
	now := time.Now
	if c.Now != nil {
		now = c.Now
	}
	start := now()
	q := url.Values{"limit": {strconv.Itoa(c.limit())}, "lang": {c.lang()}}
	if !checkpoint.IsZero() {
		q.Set("updated_after", checkpoint.Add(-c.overlap()).UTC().Format(time.RFC3339Nano))
	}
	n := 0
	for {
		page, err := c.pageWithRetries(ctx, q)
		if err != nil {
			return time.Time{}, n, err
		}
		for _, raw := range page.Data {
			var it Item
			if err := json.Unmarshal(raw, &it); err != nil {
				return time.Time{}, n, fmt.Errorf("syncclient: item: %w", err)
			}
			it.Raw = raw
			if err := upsert(it); err != nil {
				return time.Time{}, n, err
			}
			n++
		}
		if page.Meta.NextCursor == nil {
			return start, n, nil
		}
		q.Set("cursor", *page.Meta.NextCursor)
	}
}

type pageBody struct {
	Data  []json.RawMessage `json:"data"`
	Error *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
	Meta struct {
		RequestID  string  `json:"request_id"`
		NextCursor *string `json:"next_cursor"` // null or absent on the last page (spec 2.1)
	} `json:"meta"`
}

// errNotAPage is a 200 whose body is JSON but no list page: no data, or no
// meta.request_id, which spec 2.1 puts in every answer (a proxy's or a
// portal's page, a BaseURL naming another API). Read as a last page it
// ended the run a success with what it had, and its checkpoint skipped
// the rest for good. A missing meta.next_cursor alone does not tell one:
// spec 2.1 lets the last page leave it out.
var errNotAPage = errors.New("the answer is not a list page (no data or no meta.request_id)")

// pageWithRetries asks for the page of q until it comes, a failure that
// will not pass by waiting comes, or the retries are spent. A 429 spends
// none: it says when to come back, and a key whose budget other requests
// spend too (its product pages, a parallel run) meets it page after page;
// giving up would start the run over into the same limit (a marketplace
// probe sharing its sync key saw 12 in a row for one page).
func (c *Client) pageWithRetries(ctx context.Context, q url.Values) (pageBody, error) {
	failures := 0
	for attempt := 0; ; attempt++ {
		page, err := c.page(ctx, q)
		if err == nil {
			return page, nil
		}
		if !rateLimited(err) {
			failures++
		}
		delay, passes := retryDelay(err, attempt)
		if !passes || c.retries() == 0 || failures > c.retries() || ctx.Err() != nil {
			return pageBody{}, err
		}
		if werr := c.wait(ctx, delay); werr != nil {
			return pageBody{}, err
		}
	}
}

// statusError is an answer other than 200.
type statusError struct {
	status     int
	retryAfter time.Duration // from Retry-After; 0 when absent
	detail     string
}

func (e *statusError) Error() string { return e.detail }

// rateLimited reports whether err is a 429.
func rateLimited(err error) bool {
	se, ok := err.(*statusError)
	return ok && se.status == http.StatusTooManyRequests
}

// retryDelay says whether err may pass by waiting, and how long to wait
// before attempt+1: a 429, a 408 (the request was not received in time:
// the network), a 5xx, or no answer at all (the network, an answer cut
// short). Any other 4xx will not pass: the request is wrong (a cursor
// refused, a key revoked).
func retryDelay(err error, attempt int) (time.Duration, bool) {
	backoff := min(firstBackoff<<min(attempt, 16), longestBackoff)
	if errors.As(err, new(transientError)) {
		return backoff, true
	}
	se, ok := err.(*statusError)
	switch {
	case !ok:
		return 0, false // no answer for a reason of the caller's (a malformed BaseURL, a scheme not spoken)
	case se.status == http.StatusTooManyRequests && se.retryAfter > 0:
		return min(se.retryAfter, maxRetryAfter), true
	case se.status == http.StatusTooManyRequests, se.status == http.StatusRequestTimeout:
		return backoff, true
	case se.status >= 500:
		// An outage's Retry-After (1 s from this service) is the least
		// wait, not the wait: the backoff grows past it.
		return max(backoff, min(se.retryAfter, maxRetryAfter)), true
	}
	return 0, false
}

func (c *Client) page(ctx context.Context, q url.Values) (pageBody, error) {
	if d := c.pageTimeout(); d > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.BaseURL+"/export/items?"+q.Encode(), nil)
	if err != nil {
		return pageBody{}, err
	}
	if c.Prepare != nil {
		c.Prepare(req)
	}
	resp, err := c.noRedirects().Do(req)
	if err != nil {
		if noAnswer(err) {
			err = transientError{err}
		}
		return pageBody{}, fmt.Errorf("syncclient: %w", err)
	}
	defer resp.Body.Close()
	if isRedirect(resp.StatusCode) {
		return pageBody{}, &statusError{status: resp.StatusCode,
			detail: fmt.Sprintf("syncclient: status %d: a redirect, not followed "+
				"(the API does not redirect: set BaseURL to the service's own https address)", resp.StatusCode)}
	}
	var page pageBody
	decodeErr := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&page)
	if resp.StatusCode != http.StatusOK {
		code := ""
		if page.Error != nil {
			code = page.Error.Code + ": " + page.Error.Message
		}
		retryAfter, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
		return pageBody{}, &statusError{status: resp.StatusCode, retryAfter: time.Duration(retryAfter) * time.Second,
			detail: fmt.Sprintf("syncclient: status %d %s (request %s)", resp.StatusCode, code, page.Meta.RequestID)}
	}
	if decodeErr != nil { // an answer cut short, most likely
		return pageBody{}, fmt.Errorf("syncclient: status 200: %w", transientError{decodeErr})
	}
	if page.Data == nil || page.Meta.RequestID == "" { // asked for again, as an answer cut short
		return pageBody{}, fmt.Errorf("syncclient: status 200 (request %s): %w", page.Meta.RequestID, transientError{errNotAPage})
	}
	return page, nil
}

// noRedirects is c.HTTP, or http.DefaultClient, without following
// redirects. The API does not redirect (only an ingress sends plain http
// on to https, after the key has crossed in clear), and net/http would send every
// header Prepare set, the API key among them, to wherever a redirect
// points: it keeps back only Authorization and cookies from another host,
// and follows a redirect from https to plain http alike. A copy of the
// client, so the caller's own is left as it was.
func (c *Client) noRedirects() *http.Client {
	hc := http.DefaultClient
	if c.HTTP != nil {
		hc = c.HTTP
	}
	copied := *hc
	copied.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &copied
}

// isRedirect reports a status net/http would follow.
func isRedirect(status int) bool {
	switch status {
	case http.StatusMovedPermanently, http.StatusFound, http.StatusSeeOther,
		http.StatusTemporaryRedirect, http.StatusPermanentRedirect:
		return true
	}
	return false
}

// transientError is a failure that may pass by asking again: no answer
// from the network, or an answer cut short.
type transientError struct{ error }

func (e transientError) Unwrap() error { return e.error }

// noAnswer reports whether err from http.Client.Do is the network's: a
// connection refused, reset or timed out, or closed before an answer.
func noAnswer(err error) bool {
	var ue *url.Error // a net.Error itself, whatever it wraps: look inside
	if errors.As(err, &ue) {
		err = ue.Err
	}
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

func (c *Client) retries() int { return setting(c.Retries, DefaultRetries) }

func (c *Client) wait(ctx context.Context, d time.Duration) error {
	if c.Wait != nil {
		return c.Wait(ctx, d)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func (c *Client) lang() string {
	if c.Lang == "" {
		return "ENG"
	}
	return c.Lang
}

func (c *Client) limit() int {
	if c.Limit == 0 {
		return 100
	}
	return c.Limit
}

func (c *Client) overlap() time.Duration { return setting(c.Overlap, DefaultOverlap) }

func (c *Client) pageTimeout() time.Duration { return setting(c.PageTimeout, DefaultPageTimeout) }

// setting is a Client field's value in force: def when unset (zero), none
// (zero) when negative.
func setting[T int | time.Duration](v, def T) T {
	switch {
	case v < 0:
		return 0
	case v == 0:
		return def
	}
	return v
}

// Mirror is an in-memory destination: the newest version of each item. It
// keeps every item's JSON, for tests and small catalogs: 1,004,800 items
// took 1.17 GB of heap (README, sync guide, "At a million items").
type Mirror map[string]Item

// Upsert keeps it unless the mirror already holds a newer version, so
// deliveries in any order (retries, parallel syncs) converge.
func (m Mirror) Upsert(it Item) error {
	if old, ok := m[it.ID]; ok && old.UpdatedAt.After(it.UpdatedAt) {
		return nil
	}
	m[it.ID] = it
	return nil
}
