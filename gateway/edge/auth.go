package edge

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/coinexport/export/gateway/keystore"
	"github.com/coinexport/export/pkg/apikey"
	"github.com/gofiber/fiber/v2"
	"github.com/ulule/limiter/v3"
	"github.com/valyala/fasthttp"
)

// APIKeyHeader carries the key (spec 5); nothing else does.
const APIKeyHeader = "X-API-Key"

// authenticate resolves the key and checks it against the route. Failed
// authentications count against the client IP's budget; past it, the
// client gets 429. Guesses (unknown or malformed keys) also count against
// a budget of their own, and past that one uncached keys are not even
// looked up.
//
// It has no span of its own: nearly every lookup is a cache hit in memory,
// and a miss shows in the trace as the key store's SQL span.
func (g *Gateway) authenticate(c *fiber.Ctx, rq *request, rt route) error {
	if len(c.Request().Header.PeekAll(APIKeyHeader)) > 1 {
		// Which one would count is anybody's guess (proxies keep the first
		// or the last); the caller has to send one.
		rq.authFailure = authFailureSeveralKeys
		return g.authFailed(rq, errSeveralKeys)
	}
	// The key store checks the key's form (and checksum) itself, on a cache
	// miss only: a cached key is one that was well formed.
	secret := c.Get(APIKeyHeader)
	// Deferred before the lookup, so that a panic gives its place back too.
	defer g.endGuessLookup(rq, secret)
	key, err := g.keys.Lookup(rq.ctx, secret, func() bool { return g.authBudgetLeft(rq, secret) })
	switch {
	case errors.Is(err, keystore.ErrThrottled) && rq.hasRate:
		rq.authFailure = authFailureThrottled
		if rq.limitedBy == classGuessesInLookup {
			return errGuessesInLookup
		}
		return errAuthThrottled(rq.rate.RetryAfter)
	case errors.Is(err, keystore.ErrUnauthenticated):
		rq.authFailure = authFailureOf(err)
		if errors.Is(err, keystore.ErrRevokedKey) {
			rq.key = key // names the revoked key in the access line and the span
		}
		return g.authFailed(rq, errUnauthenticated)
	case err != nil && isIdempotentSale(c, rt):
		// Sent nowhere: its answer and access line say nothing was
		// applied, as the gateway's other 503s of such a sale do.
		return fmt.Errorf("%w: %w: %w", errSaleNothingApplied, errKeyLookup, err)
	case err != nil:
		return fmt.Errorf("%w: %w", errKeyLookup, err)
	}
	rq.key = key // also the server span's owner, key and platform attributes (endSpan)
	if !slices.Contains(key.Scopes, rt.Scope) {
		return errMissingScope(rt.Scope, key.Scopes)
	}
	// api_keys' constraint sales_write_needs_platform holds every key
	// with sales:write to a platform, so no stored key fails this today.
	// The check stays: the contract's rule (spec 5) is the gateway's to
	// enforce, not only the schema's, and a key without a platform would
	// otherwise reach sales-writer with none (TestErrorAnswersAreEnvelopes
	// drops the constraint to test it; the e2e lists the code unproducible).
	if rt.NeedsPlatform && key.PlatformID == "" {
		return errPlatformRequired
	}
	return nil
}

// nameKnownKey names, on the access line and the span of a request refused
// before its key is read (a body over the limit), the key its head
// carries if the key cache knows it: the refusal happens before
// authentication, and without a key id an operator cannot tell which
// tenant sends such bodies. Only the cache is asked, never the database:
// a client can provoke this refusal at will, and an unknown key must not
// cost a query. The key is named, not authenticated; nothing else is
// decided from it. Several keys name none (as authenticate refuses them).
func (g *Gateway) nameKnownKey(c *fiber.Ctx, rq *request) {
	secrets := c.Request().Header.PeekAll(APIKeyHeader)
	if len(secrets) != 1 {
		return
	}
	if key, ok := g.keys.Known(string(secrets[0])); ok {
		rq.key = key
	}
}

// Why a key did not pass (request.authFailure).
const (
	authFailureMissing     = "missing"
	authFailureMalformed   = "malformed"
	authFailureUnknown     = "unknown"
	authFailureRevoked     = "revoked"
	authFailureSeveralKeys = "several_keys"
	authFailureKeyInURL    = "key_in_url"
	// authFailureThrottled: not looked up, the client's address being over
	// its guess budget, or holding as many keys in lookup as that budget
	// has left (authBudgetLeft); the key itself may be valid.
	authFailureThrottled = "throttled"
)

// authFailureOf names the cause of a keystore.ErrUnauthenticated.
func authFailureOf(err error) string {
	switch {
	case errors.Is(err, keystore.ErrMissingKey):
		return authFailureMissing
	case errors.Is(err, keystore.ErrMalformedKey):
		return authFailureMalformed
	case errors.Is(err, keystore.ErrRevokedKey):
		return authFailureRevoked
	}
	return authFailureUnknown
}

// authFailed records a failed authentication against the client IP and
// answers answer (a 401), or 429 once the IP has failed too often. Every
// failure answers alike, whatever its cause (keystore.ErrUnauthenticated):
// the same headers, the same budget. A guess (an unknown or malformed key)
// is also taken from the address's guess budget (authBudgetLeft).
func (g *Gateway) authFailed(rq *request, answer *apiError) error {
	if g.limiter == nil {
		return answer
	}
	if rq.authFailure == authFailureUnknown || rq.authFailure == authFailureMalformed {
		g.take(rq, guessBudgetKey(rq), g.rates[classAuthFailures], guessBudget)
	}
	d := g.take(rq, classAuthFailures+":ip:"+addressBucket(rq.clientIP), g.rates[classAuthFailures], classAuthFailures)
	g.recordDecision(rq, classAuthFailures, d)
	if !d.Allowed {
		return errRateLimited(d.RetryAfter)
	}
	return answer
}

// refuseKeyInURL answers a request with an API key in its URL, so that a
// key never travels on in one. On a route that takes a key it is a failed
// login (401, counted against the address's budget) whose message tells the
// owner to revoke the key. On the routes that take none (spec 5: health,
// shop schema) it is no login attempt, and counting it would let a monitor
// behind a shared address lock real clients out: health reads no query and
// is served (nil), the shop schema route, which reads none either, is
// answered the 400 it would give.
func (g *Gateway) refuseKeyInURL(rq *request, rt route) error {
	switch {
	case rt.Scope != "":
		rq.authFailure = authFailureKeyInURL
		return g.authFailed(rq, errKeyInURL)
	case rt.Upstream != "":
		return errKeyInQueryOfKeylessRoute
	}
	return nil
}

// authBudgetLeft reports whether the client IP may still guess keys;
// asked before a database lookup of an uncached key. Only guesses spend
// this budget (authFailed): a revoked key is no guess, and after a
// rotation a platform's workers still on the old key spent the address's
// whole failure budget in seconds, so that the new key's first call from
// that address, and every other tenant's behind it, was refused 429 for
// up to a minute (a probe: 10 stale workers). Nor does a request without
// any key (a monitor's).
//
// A guess is taken from the budget only once its lookup has failed, so
// the budget alone let through every guess sent at once: 600 unknown keys
// sent together from one address were all looked up in PostgreSQL against
// a budget of 60. So the address may also have no more keys in lookup at
// once than the budget has left (guessLookups); a request that holds one
// of them says so in rq.lookingUp, and gives it back (endGuessLookup).
func (g *Gateway) authBudgetLeft(rq *request, secret string) bool {
	if g.limiter == nil {
		return true
	}
	address := addressBucket(rq.clientIP)
	since := g.guessLookups.peeking(address)
	start := time.Now()
	d := g.limiter.Peek(rq.ctx, guessBudgetKey(rq), g.rates[classAuthFailures])
	g.traceRedisWait(rq, start, d, guessBudget)
	rq.lookingUp = g.guessLookups.acquire(address, secret, since, d)
	switch {
	case !d.Allowed:
		g.recordDecision(rq, guessBudget, d)
	case !rq.lookingUp:
		// What the budget has left is being looked up already: a second
		// is far longer than any of those lookups takes. Named apart from
		// the budget, whose Retry-After may be a minute: the SRE tells the
		// two from the request id alone.
		g.guessLookupDecisions.limited.Inc()
		d.Allowed, d.Remaining, d.RetryAfter = false, 0, time.Second
		rq.rate, rq.hasRate, rq.limitedBy = d, true, classGuessesInLookup
	default:
		g.guessLookupDecisions.allowed.Inc()
	}
	return rq.lookingUp
}

// endGuessLookup gives back the place rq holds among its address's keys in
// lookup, if it holds one, once authenticate is done: after authFailed has
// taken a failed guess from the budget, which it still stands for until
// then.
func (g *Gateway) endGuessLookup(rq *request, secret string) {
	if rq.lookingUp {
		rq.lookingUp = false
		g.guessLookups.release(addressBucket(rq.clientIP), secret)
	}
}

// keyInQuery reports a query parameter that looks like it carries an API
// key: by its name, or by a value or a name that holds one.
func keyInQuery(c *fiber.Ctx) bool {
	for k, v := range c.Request().URI().QueryArgs().All() {
		if keyParamName(k) || apikey.ContainsKey(v) || apikey.ContainsKey(k) { // "?<key>" is a name alone
			return true
		}
	}
	return false
}

// keyInUserInfo reports an API key in the user info of an absolute-form
// request target (GET http://user:<key>@host/v1/...), %-decoded: fasthttp
// keeps it apart from the path and query, which are all the other checks
// read, but the key travelled in a URL all the same, seen by every proxy in
// front. A Host header with user info, which fasthttp reads as the URL's
// authority beside an origin-form target, is refused before
// (errHostUserInfo).
func keyInUserInfo(c *fiber.Ctx) bool {
	u := c.Request().URI()
	return apikey.ContainsKey(u.Username()) || apikey.ContainsKey(u.Password())
}

// keyLikeUserInfo reports whether the user info of authority (a Host
// header's value, a request target's authority, or a header value
// fasthttp refused: what comes before its last '@', as sent or
// %-decoded, as fasthttp reads a URL's user info) looks like it holds an
// API key: whole, mistyped (its checksum fails, a '-' for its '_') or cut
// short (apikey.ContainsKeyLike), or whole as a host name spells it, with
// a '.' or nothing for its '_' (apikey.HostHoldsKeySecret): user info is
// typed into an authority, beside a host, and "cxr.<secret>@gateway" is
// what a key pasted as a host's first label looks like. Such user info is
// refused whatever it holds; this says whether a key may have gone with
// it, which its owner is to revoke, so that the access line says
// key_in_url. Only a refused request pays for it.
func keyLikeUserInfo(authority []byte) bool {
	at := bytes.LastIndexByte(authority, '@')
	if at < 0 {
		return false
	}
	userinfo := authority[:at]
	if keyLikeText(userinfo) {
		return true
	}
	return bytes.IndexByte(userinfo, '%') >= 0 && keyLikeText(fasthttp.AppendUnquotedArg(nil, userinfo))
}

// keyLikeText is keyLikeUserInfo's test of user info, as sent or decoded.
func keyLikeText(userinfo []byte) bool {
	return apikey.ContainsKeyLike(userinfo) || apikey.HostHoldsKeySecret(string(userinfo))
}

// refuseTargetUserInfo refuses a request target whose authority holds
// user info without a key (a key there was refused before, keyInUserInfo):
// GET http://user:pw@gateway/v1/... RFC 9110 4.2.4 has a recipient treat
// user info in an http(s) URI as an error, as it is used to mislead; the
// Host header's is refused alike (errHostUserInfo). curl and Python
// requests send a URL's as Authorization, and Go's net/http writes a
// proxy's absolute-form target without it; urllib3's ProxyManager, given
// the gateway as its HTTP proxy, writes it into the target, and is told
// (Python's urllib.request writes it into the Host as well). The access
// line says key_in_url when the user info looks like it held a key anyway
// (keyLikeUserInfo: mistyped, cut short). userInfoSent looks at the
// target's authority: the Host's was refused before (misreadHead).
func refuseTargetUserInfo(c *fiber.Ctx, rq *request) error {
	authority, sent := userInfoSent(&c.Request().Header)
	if !sent {
		return nil
	}
	if keyLikeUserInfo(authority) {
		rq.authFailure = authFailureKeyInURL
	}
	return errTargetUserInfo
}

// keyParamNames are the parameter names refused as carrying a key.
var keyParamNames = []string{"api_key", "apikey", "x-api-key", "x_api_key", "key"}

// keyParamName reports whether k is one of keyParamNames in any case.
func keyParamName(k []byte) bool {
	for _, name := range keyParamNames {
		if len(k) == len(name) && strings.EqualFold(string(k), name) {
			return true
		}
	}
	return false
}

func rateClasses(cfg Config) map[string]limiter.Rate {
	return map[string]limiter.Rate{
		classExportRead:   cfg.RateExportRead,
		classSalesWrite:   cfg.RateSalesWrite,
		classAnonymous:    cfg.RateAnonymous,
		classShopSchema:   cfg.RateShopSchema,
		classAuthFailures: cfg.RateAuthFailures,
	}
}

// guessBudget names the address's key-guessing budget on its spans, and
// the refusals it decides (rate_limit_class, decisions metric), which are
// not the failure budget's: another budget, and a key not looked up.
const guessBudget = "auth_guesses"

// guessBudgetKey is the limiter key of the client address's guesses: the
// same rate as its failures (RATE_LIMIT_AUTH_FAILURES), counted apart.
func guessBudgetKey(rq *request) string {
	return classAuthFailures + ":guesses:ip:" + addressBucket(rq.clientIP)
}
