// Package prestashop reads categories, product features, feature values and
// languages from a merchant's PrestaShop webservice (1.7, 8 and 9), through
// an HTTP client that only reaches addresses the guard allows.
package prestashop

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"regexp"
	"strconv"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/coinexport/export/services/shop-schema/internal/guard"
	"github.com/coinexport/export/services/shop-schema/internal/shoplimit"
)

// Config configures a Client.
type Config struct {
	Guard          *guard.Guard
	Resolver       guard.Resolver       // DNS; nil means net.DefaultResolver
	RootCAs        *x509.CertPool       // trusted roots; nil means the system roots
	ConnectTimeout time.Duration        // per TCP connect
	MaxBytes       int64                // cap on one answer's body
	MaxCallBytes   int64                // cap on all answers of one schema read together
	PageSize       int                  // rows per page
	MaxRows        int                  // cap on rows of one resource
	TracerProvider trace.TracerProvider // nil means the global one
}

// Client reads a shop's schema. It is safe for concurrent use; each call
// carries its own base URL and key, and nothing of them is kept.
type Client struct {
	http         *http.Client
	maxBytes     int64
	maxCallBytes int64
	pageSize     int
	maxRows      int
}

// NewClient builds the client: no proxy from the environment (through a
// proxy only the proxy's address would be checked), the guard's dialer and
// redirect check, TLS verified against RootCAs, and a client span for each
// hop of a shop request (spans.go).
func NewClient(cfg Config) *Client {
	resolver := cfg.Resolver
	if resolver == nil {
		resolver = net.DefaultResolver
	}
	dialer := guard.NewDialer(cfg.Guard, resolver, cfg.ConnectTimeout)
	transport := &http.Transport{
		Proxy:                  nil,
		DialContext:            dialer.DialContext,
		TLSClientConfig:        &tls.Config{RootCAs: cfg.RootCAs, MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout:    cfg.ConnectTimeout,
		ForceAttemptHTTP2:      true,
		MaxIdleConns:           32,
		MaxIdleConnsPerHost:    4,
		IdleConnTimeout:        30 * time.Second,
		MaxResponseHeaderBytes: 64 << 10,
	}
	tp := cfg.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	return &Client{
		http: &http.Client{
			Transport:     tracingTransport{next: transport, tracer: tp.Tracer("github.com/coinexport/export/services/shop-schema/internal/prestashop")},
			CheckRedirect: cfg.Guard.CheckRedirect,
		},
		maxBytes:     cfg.MaxBytes,
		maxCallBytes: cfg.MaxCallBytes,
		pageSize:     cfg.PageSize,
		maxRows:      cfg.MaxRows,
	}
}

// call is the state of one schema read: where the shop is and which of its
// quirks have been found so far. All fetches of a call share it.
type call struct {
	base       *url.URL
	key        string
	dispatcher atomic.Bool // the shop has no /api rewrite rule
	fullFields atomic.Bool // the shop refused a display=[...] field list
	version    atomic.Value
	// bytesLeft is what the shop may still send in this call: the rows
	// read are held until the answer is written, so the per-answer cap
	// alone would let a shop that pages slowly fill the memory of the
	// process (MaxRows allows 100,000 rows of every resource).
	bytesLeft atomic.Int64
}

// resourceURL builds the address of one list request. The query is written
// by hand, brackets unescaped, the way PrestaShop's documentation writes it.
func (c *call) resourceURL(resource, query string, dispatcher bool) string {
	u := *c.base
	if dispatcher {
		u = *u.JoinPath("webservice", "dispatcher.php")
		u.RawQuery = "url=" + resource + "&" + query
	} else {
		u = *u.JoinPath("api", resource)
		u.RawQuery = query
	}
	return u.String()
}

// fetch GETs one page. When /api/ is not the webservice (no rewrite rule:
// the front office answers 404 or HTML), it switches the whole call to
// webservice/dispatcher.php, which needs no rewriting, once dispatcher.php
// has answered as the webservice.
func (cl *Client) fetch(ctx context.Context, c *call, resource, query string) ([]byte, error) {
	dispatcher := c.dispatcher.Load()
	body, err := cl.get(ctx, c, resource, c.resourceURL(resource, query, dispatcher))
	if err == nil || dispatcher || !notWebservice(err) {
		return body, err
	}
	body, dispatcherErr := cl.get(ctx, c, resource, c.resourceURL(resource, query, true))
	if dispatcherErr != nil && notWebservice(dispatcherErr) {
		return nil, moreTelling(err, dispatcherErr)
	}
	c.dispatcher.Store(true)
	return body, dispatcherErr
}

// moreTelling picks what to answer when neither /api nor dispatcher.php
// answered as the webservice: /api's refusal (a 403 or 5xx page: a
// firewall, the server down), which was answered so before dispatcher.php
// was tried on such pages, over dispatcher.php's 404 or page where a host
// blocks it; else dispatcher.php's, so that 404 at both is shop_not_found.
func moreTelling(apiErr, dispatcherErr error) error {
	if e, ok := apiErr.(*Error); ok && e.Kind != KindNotFound && (e.Status < 200 || e.Status > 299) {
		return apiErr
	}
	return dispatcherErr
}

// notWebservice reports whether err is an answer that the webservice did
// not write: a 404, or a page that is neither JSON nor a PrestaShop error
// body with a status the front office may give it (without the rewrite
// rule /api/ is a front-office page: 200, or 503 in maintenance mode, 403
// to a country the shop restricts, which the webservice ignores).
func notWebservice(err error) bool {
	e, ok := err.(*Error)
	return ok && (e.Kind == KindNotFound || e.foreign && mayBeFrontOffice(e.Status))
}

// mayBeFrontOffice reports whether a page of this status at /api may be
// the front office's. Not a 401: the webservice's own answer to a request
// without a key is a plain-text page, and dispatcher.php would not get the
// key either. Of the 5xx, only 503: another (a gateway's 502 or 504,
// Cloudflare's 52x) is a server failing, which dispatcher.php behind it
// meets too; asked, it cost one more request and, after a page that came
// slowly, the rest of the call's budget (shop_timeout for
// shop_unavailable).
func mayBeFrontOffice(status int) bool {
	return status != http.StatusUnauthorized && (status < 500 || status == http.StatusServiceUnavailable)
}

// notJSON names what an answer that is not JSON is, so that the merchant
// knows what to fix: the webservice's XML, a message PHP printed before
// the JSON, or a page; the shop's words themselves are never repeated.
func notJSON(body []byte) string {
	head := bytes.TrimSpace(bytes.TrimPrefix(body[:min(len(body), 1024)], utf8BOM))
	switch {
	case phpMessage.Match(head):
		return "PHP printed an error message into the shop's answer: turn display_errors (and the shop's debug mode) off"
	case bytes.Contains(head, []byte("<prestashop")):
		return "the shop's webservice answered XML, not the JSON asked for (output_format=JSON): a PrestaShop too old to answer JSON (the service reads 1.7, 8 and 9)"
	case bytes.HasPrefix(head, []byte("<")):
		return "the shop answered an HTML page, not the webservice's JSON (a maintenance, error or front-office page)"
	}
	return "the shop's answer is not JSON"
}

// phpMessage matches the start of what PHP prints with display_errors on,
// with html_errors ("<br />\n<b>Warning</b>:  ...") or without. An
// E_RECOVERABLE_ERROR is a "Recoverable fatal error" (PHP 7, 8) or a
// "Catchable fatal error" (PHP 5, which PrestaShop 1.7 ran on).
var phpMessage = regexp.MustCompile(`^(<br\s*/?>\s*)?(<b>)?(PHP )?(Warning|Notice|Deprecated|Fatal error|Parse error|Strict Standards|Recoverable fatal error|Catchable fatal error)(</b>)?:`)

// reasonEmpty names a 2xx answer without a body: PrestaShop's when PHP's
// json_encode fails, which it does on a text that is not valid UTF-8.
const reasonEmpty = "the shop's answer is empty (PrestaShop sends none when it cannot encode its data as JSON: a text in the shop that is not valid UTF-8)"

// reasonNotUTF8 names a JSON answer that is not UTF-8 text, which
// PrestaShop never writes: its json_encode writes UTF-8 or nothing.
const reasonNotUTF8 = "the shop's answer is not UTF-8 (PrestaShop writes UTF-8: a server or proxy in front of the webservice re-encoded it, in windows-1251 or another charset)"

// get performs one request and classifies the answer, and names a failure
// in the request's span.
func (cl *Client) get(ctx context.Context, c *call, resource, target string) ([]byte, error) {
	body, err := cl.do(ctx, c, resource, target)
	if err != nil {
		spanScopeOf(ctx).fail(ctx, err)
	}
	return body, err
}

// UserAgent names the caller to the shop: some hosts' firewalls refuse
// Go's default ("Go-http-client/1.1") as a bot's, and a merchant reading
// the shop's access log sees who reads its webservice.
const UserAgent = "coinexport-shop-schema/1 (PrestaShop webservice schema reader)"

func (cl *Client) do(ctx context.Context, c *call, resource, target string) ([]byte, error) {
	reqCtx, stopCounting := countedPerShop(withKey(ctx, c.key))
	defer stopCounting(nil)
	req, err := http.NewRequestWithContext(reqCtx, http.MethodGet, target, nil)
	if err != nil {
		return nil, &Error{Kind: KindBadResponse, Resource: resource, Reason: "cannot build the request"}
	}
	// The key travels only as the Basic user name: never in the URL, where
	// it would end up in the shop's access log and in our spans.
	req.SetBasicAuth(c.key, "")
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", UserAgent)
	resp, err := cl.http.Do(req)
	if errors.Is(err, shoplimit.ErrBusy) || errors.Is(context.Cause(reqCtx), shoplimit.ErrBusy) {
		if err == nil { // an answer that beat the cancel is dropped, its connection with it
			resp.Body.Close()
		}
		return nil, shoplimit.ErrBusy // not the shop's failure: the caller's 429
	}
	if err != nil {
		return nil, transportError(ctx, resource, keyFree(err, c.key))
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(chargedReader{resp.Body, &c.bytesLeft}, cl.maxBytes+1))
	if errors.Is(err, errCallBytesSpent) {
		return nil, &Error{Kind: KindTooLarge, Resource: resource, Status: resp.StatusCode,
			Reason: fmt.Sprintf("the shop's answers together are larger than %d bytes", cl.maxCallBytes)}
	}
	if err != nil {
		return nil, bodyError(ctx, resource, resp.StatusCode, keyFree(err, c.key))
	}
	if int64(len(body)) > cl.maxBytes {
		return nil, &Error{Kind: KindTooLarge, Resource: resource, Status: resp.StatusCode,
			Reason: fmt.Sprintf("the shop's answer is larger than %d bytes", cl.maxBytes)}
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		e := statusError(resource, resp.StatusCode, body)
		if e.Kind == KindUnauthorized && keyDropped(resp) {
			// net/http sends Authorization on a redirect only to the same
			// host or a subdomain of it: a shop whose address redirects to
			// another host (www. to the bare domain, another domain) got no
			// key at the last hop. It is not the server dropping the header.
			e.Reason = "the shop redirected to another host name, which is not sent the key: set base_url to the shop's address after its redirects"
		}
		return nil, e
	}
	if len(bytes.TrimSpace(bytes.TrimPrefix(body, utf8BOM))) == 0 {
		// The webservice's own answer when json_encode fails: not a page
		// of the front office, so no switch to dispatcher.php, whose answer
		// (a 404 or 403 where hosts block it) would be taken for the shop's.
		return nil, &Error{Kind: KindBadResponse, Resource: resource, Status: resp.StatusCode, Reason: reasonEmpty}
	}
	// Judged by the body, not Content-Type: a front-office page starts with
	// "<", while some hosts relabel the webservice's JSON.
	if !looksLikeJSON(body) {
		return nil, &Error{Kind: KindBadResponse, Resource: resource, Status: resp.StatusCode, Reason: notJSON(body), foreign: true}
	}
	if !utf8.Valid(body) {
		// encoding/json reads each byte that is not UTF-8 as U+FFFD: every
		// Cyrillic name of a shop whose server re-encodes the answer
		// (windows-1251, say) came back as a row of them, answered 200.
		return nil, &Error{Kind: KindBadResponse, Resource: resource, Status: resp.StatusCode, Reason: reasonNotUTF8}
	}
	if v := shopVersion(resp.Header.Get("PSWS-Version"), c.key); v != "" {
		c.version.Store(v)
	}
	return body, nil
}

// countedPerShop returns ctx tracing the connection its request gets, to
// count the read against that connection's shop (shoplimit.Take), and the
// function that ends the request's context: the dialer counts a new
// connection, but a request on a connection kept alive, or multiplexed
// over HTTP/2 with other reads', dials nothing. Over the shop's cap, the
// request is cancelled with shoplimit.ErrBusy as its cause, which do
// answers as the refusal it is. GotConn cannot veto the connection:
// net/http may have the request on its way already (HTTP/1 writes it, then
// closes the connection on the cancel; HTTP/2 may send it, then resets the
// stream), so the shop can see it, never its answer. A read without a
// claim (SHOP_SCHEMA_MAX_CONCURRENT_PER_SHOP=0, the default) gets ctx as
// it is: no trace, no context of its own, nothing to count.
func countedPerShop(ctx context.Context) (context.Context, context.CancelCauseFunc) {
	if !shoplimit.Claimed(ctx) {
		return ctx, func(error) {}
	}
	ctx, cancel := context.WithCancelCause(ctx)
	return httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) {
		addr, ok := info.Conn.RemoteAddr().(*net.TCPAddr)
		if !ok {
			return
		}
		if err := shoplimit.Take(ctx, addr.AddrPort().Addr()); err != nil {
			cancel(err)
		}
	}}), cancel
}

// shopVersion returns v, a PSWS-Version header, when it reads as a
// version ("8.2.1", "9.0.0-beta.1"), else "". The header is the shop's to
// write and goes into the answer and the "shop schema read" line, so
// nothing else gets through: not the key, which a shop can write back
// there (in another letter case, after "8."), nor a part of it, and not
// free text.
func shopVersion(v, key string) string {
	if v == "" || len(v) > 31 || v[0] < '0' || v[0] > '9' || HoldsKey(v, key) || holdsPartOfKey(v, key) {
		return ""
	}
	for _, c := range v {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '.' || c == '-' || c == '+') {
			return ""
		}
	}
	return v
}

// keyDropped reports whether the answer is to a redirected request that no
// longer carried the key.
func keyDropped(resp *http.Response) bool {
	return resp.Request != nil && resp.Request.Response != nil && resp.Request.Header.Get("Authorization") == ""
}

// chargedReader charges every byte read to the call's budget as it comes,
// and fails once the budget is spent: the resources are fetched at once,
// and charged only after each whole answer they could together hold four
// answers beyond it.
type chargedReader struct {
	r    io.Reader
	left *atomic.Int64
}

var errCallBytesSpent = errors.New("prestashop: the call's byte budget is spent")

func (cr chargedReader) Read(p []byte) (int, error) {
	n, err := cr.r.Read(p)
	if cr.left.Add(-int64(n)) < 0 {
		return n, errCallBytesSpent
	}
	return n, err
}

// listAll reads every row of a resource, page by page, sorted by id so that
// pages neither overlap nor skip. It stops at a short or empty page, and
// also when a page brings no new id (a shop that ignores limit= answers the
// same rows again), so it always ends.
func listAll[T row](ctx context.Context, cl *Client, c *call, resource, fields, extra string, id func(T) Int) ([]T, error) {
	var out []T
	seen := map[Int]bool{}
	for offset := 0; ; offset += cl.pageSize {
		page, err := listPage[T](ctx, cl, c, resource, fields, extra, offset)
		if err != nil {
			return nil, err
		}
		added := 0
		for _, row := range page {
			if k := id(row); !seen[k] {
				seen[k] = true
				out = append(out, row)
				added++
			}
		}
		if len(out) > cl.maxRows {
			return nil, &Error{Kind: KindTooLarge, Resource: resource,
				Reason: fmt.Sprintf("the shop has more than %d %s", cl.maxRows, resource)}
		}
		// A page longer than asked for means the shop ignored limit= and sent
		// everything.
		if len(page) != cl.pageSize || added == 0 {
			return out, nil
		}
	}
}

// listPage reads one page. It asks for the fields the service uses; a shop
// that rejects the field list (400) is asked for display=full instead, for
// this and every later request of the call. The client spans of its
// requests end when it returns, each with its outcome named.
func listPage[T row](ctx context.Context, cl *Client, c *call, resource, fields, extra string, offset int) ([]T, error) {
	ctx, spans := withSpanScope(ctx)
	defer spans.end()
	limit := "&sort=[id_ASC]&limit=" + strconv.Itoa(offset) + "," + strconv.Itoa(cl.pageSize) + extra
	display := fields
	if c.fullFields.Load() || fields == "" {
		display = "full"
	}
	body, err := cl.fetch(ctx, c, resource, "output_format=JSON&display="+display+limit)
	if e, ok := err.(*Error); ok && e.Kind == KindBadResponse && e.Status == http.StatusBadRequest && display != "full" {
		c.fullFields.Store(true)
		body, err = cl.fetch(ctx, c, resource, "output_format=JSON&display=full"+limit)
	}
	if err != nil {
		return nil, err
	}
	rows, err := decodeList[T](body, resource, &c.bytesLeft)
	if errors.Is(err, errCallBytesSpent) {
		err := &Error{Kind: KindTooLarge, Resource: resource,
			Reason: fmt.Sprintf("the shop's answers together, with the rows decoded from them, are larger than %d bytes", cl.maxCallBytes)}
		spans.fail(ctx, err)
		return nil, err
	}
	if err != nil {
		// The decoder's words go to the log only, so that the line says
		// what the shape lacked. They can quote the body (a string where an
		// integer belongs), where a shop could write back the key it
		// received: freed of it as a transport error is.
		err := &Error{Kind: KindBadResponse, Resource: resource, Reason: "the shop's answer has an unexpected shape", err: keyFree(err, c.key)}
		spans.fail(ctx, err)
		return nil, err
	}
	return rows, nil
}
