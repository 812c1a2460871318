package main

import (
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/coinexport/export/pkg/identity"
)

// requestTimeout bounds one request from sending to the last body byte, so
// a stuck stack fails the scenario instead of hanging the bench.
const requestTimeout = time.Minute

// httpClient is the keep-alive HTTP client of the sync and sales scenarios.
// It is fasthttp's HostClient rather than net/http's: the load generator
// shares the machine's two cores with the stack it measures, and every
// microsecond of CPU it spends per request is taken from the gateway, the
// services and PostgreSQL. Callers reuse one fasthttp.Request and Response
// each, so a request allocates next to nothing.
//
// Compression stays off: fasthttp sends no Accept-Encoding unless told to,
// and the figures measure the service's own work, not gzip's.
type httpClient struct {
	hc   *fasthttp.HostClient
	base string // scheme://host:port/prefix, no trailing slash; request URIs start with it
}

// newHTTPClient returns a client for base (e.g. http://127.0.0.1:18080/v1)
// with up to conns connections, one per concurrent caller.
func newHTTPClient(base string, conns int) (*httpClient, error) {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, errUsagef("base URL %q: want http(s)://host[:port][/prefix]", base)
	}
	isTLS := u.Scheme == "https"
	hc := &fasthttp.HostClient{
		Addr:                fasthttp.AddMissingPort(u.Host, isTLS),
		IsTLS:               isTLS,
		Name:                "coinexport-loadgen",
		MaxConns:            max(conns, 1),
		MaxConnWaitTimeout:  requestTimeout,
		MaxIdleConnDuration: 90 * time.Second,
		// Item ids are path-escaped by us; normalizing would unescape them
		// (a %2F would become a path separator).
		DisablePathNormalizing: true,
		RetryIfErr:             retryIfSafe,
	}
	return &httpClient{hc: hc, base: strings.TrimSuffix(base, "/")}, nil
}

// do sends req and reads the whole response into resp.
func (c *httpClient) do(req *fasthttp.Request, resp *fasthttp.Response) error {
	return c.hc.DoTimeout(req, resp, requestTimeout)
}

// retryIfSafe resends a request that failed on a kept-alive connection the
// server had closed, as net/http does: only when repeating it cannot change
// the outcome, i.e. a GET, or a write carrying an Idempotency-Key (the
// service answers a repeat with the first answer).
// The whole-request timeout keeps running across attempts.
func retryIfSafe(req *fasthttp.Request, _ int, _ error) (resetTimeout, retry bool) {
	return false, req.Header.IsGet() || len(req.Header.Peek("Idempotency-Key")) > 0
}

// authenticator puts credentials on a request whose method and URI are set.
type authenticator func(req *fasthttp.Request)

// byAPIKey authenticates like a real client, through the gateway.
func byAPIKey(key string) authenticator {
	return func(req *fasthttp.Request) { req.Header.Set("X-API-Key", key) }
}

// bySignedIdentity signs the identity the gateway would send, for calls that
// bypass it (direct to a service, or through the nginx baseline proxy), for
// the request as the client will send it (the signature binds method,
// request-target and Idempotency-Key). Each request gets its own request
// id, unique within the run and across runs.
func bySignedIdentity(signer *identity.Signer, id identity.Identity) authenticator {
	prefix := "lg-" + randomHex(8) + "-"
	var n atomic.Uint64
	return func(req *fasthttp.Request) {
		id := id
		id.RequestID = prefix + strconv.FormatUint(n.Add(1), 10)
		uri := req.URI()
		uri.DisablePathNormalizing = true // as newHTTPClient sends it: ids are escaped by us
		signed := identity.Request{Method: string(req.Header.Method()), Target: string(uri.RequestURI()),
			IdempotencyKey: string(req.Header.Peek("Idempotency-Key"))}
		signer.SignInto(req.Header.SetBytesV, id, signed, time.Now())
	}
}

// readIdentity is the identity of the bench's read key.
func readIdentity(cfg Config) identity.Identity {
	return identity.Identity{OwnerID: cfg.OwnerID, KeyID: cfg.ReadKeyID, Scopes: []string{identity.ScopeExportRead}}
}

// authFor returns the authenticator for mode "key" or "signed".
func authFor(cfg Config, mode string) (authenticator, error) {
	switch mode {
	case "key":
		if err := cfg.need("LOADGEN_READ_KEY"); err != nil {
			return nil, err
		}
		return byAPIKey(cfg.ReadKey), nil
	case "signed":
		if err := cfg.need("IDENTITY_SECRET", "LOADGEN_OWNER_ID"); err != nil {
			return nil, err
		}
		signer, err := identity.NewSigner(cfg.IdentitySecret)
		if err != nil {
			return nil, err
		}
		return bySignedIdentity(signer, readIdentity(cfg)), nil
	}
	return nil, errUsagef("--auth must be key or signed, got %q", mode)
}

// idSource hands out ids that are unique within a run (a per-worker prefix
// and a counter) and across runs (the prefix starts with a random run id),
// so the idempotency records and orders a run leaves in the database never
// collide with the next run's. It costs an append per id, where crypto/rand
// and hex per request cost the load generator measurable CPU.
type idSource struct {
	prefix []byte
	n      uint64
}

// newIDSource returns the source of worker within the run identified by run.
func newIDSource(run string, worker int) *idSource {
	p := append([]byte(run), '-')
	p = strconv.AppendInt(p, int64(worker), 10)
	return &idSource{prefix: append(p, '-')}
}

// appendNext appends the next id to dst.
func (s *idSource) appendNext(dst []byte) []byte {
	s.n++
	return strconv.AppendUint(append(dst, s.prefix...), s.n, 10)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
