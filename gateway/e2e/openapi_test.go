package e2e

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/coinexport/export/pkg/apikey"
	"github.com/coinexport/export/pkg/testenv"
)

// contract is gateway/openapi.yaml, validated, with a router over it, and
// the documented answers the exchanges have produced so far.
type contract struct {
	doc    *openapi3.T
	router routers.Router
	met    *answersMet
}

// The document's `format: uri` (Image.url) is checked as a validator
// with formats on checks it: kin-openapi ignores a format it has no
// validator for, so without this the test checked only Image.url's
// ^https:// pattern. url.Parse alone takes a space, a '"' or an 'é' in a
// path, which ajv-formats (a Node client's validator) refuses: a URI is
// made of RFC 3986's characters only.
func init() {
	openapi3.DefineStringFormatValidator("uri", openapi3.NewCallbackValidator(func(s string) error {
		if u, err := url.Parse(s); err != nil || !u.IsAbs() || u.Host == "" || !uriChars.MatchString(s) {
			return fmt.Errorf("not an absolute URI with a host, of RFC 3986's characters")
		}
		return nil
	}))
}

// uriChars are RFC 3986's unreserved and reserved characters, and '%'.
var uriChars = regexp.MustCompile(`^[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=%]+$`)

func loadContract(t *testing.T) contract {
	t.Helper()
	doc, err := openapi3.NewLoader().LoadFromFile("../openapi.yaml")
	if err != nil {
		t.Fatalf("load ../openapi.yaml: %v", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("../openapi.yaml is not a valid OpenAPI document: %v", err)
	}
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		t.Fatalf("router over ../openapi.yaml: %v", err)
	}
	return contract{doc: doc, router: router, met: &answersMet{}}
}

// exchange is one request to send, and what the test means it to get.
type exchange struct {
	method, path string // path below the base URL, query included
	key          string // X-API-Key, none when empty
	header       map[string]string
	body         string
	// status and code are the answer the request is made to get: the
	// test's own premise, checked before the document is.
	status int
	code   string
	// docRefuses: the document's own constraints refuse the request (a
	// parameter outside its schema, a missing header). A request the stack
	// refuses for a reason the document cannot express (an unknown query
	// parameter, a bad cursor) is accepted by it.
	docRefuses bool
	// raw, when set, sends the request as bytes on a connection of its
	// own, malformed as no HTTP client would write it (sendRaw); the
	// document still sees it as method, path, key, header and body.
	raw rawFault
}

// answer is what the stack answered.
type answer struct {
	status int
	header http.Header
	body   []byte
}

// noRedirects: the API answers none, and a redirect followed would hide it.
var noRedirects = &http.Client{
	Timeout:       30 * time.Second,
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
}

func (x exchange) request(t *testing.T, baseURL string) *http.Request {
	t.Helper()
	path := x.path
	if x.raw == rawEscape { // the document sees the % as sent, which no URL can hold unescaped
		path = strings.ReplaceAll(path, "%", "%25")
	}
	req, err := http.NewRequest(x.method, baseURL+path, strings.NewReader(x.body))
	if err != nil {
		t.Fatal(err)
	}
	if x.key != "" {
		req.Header.Set("X-API-Key", x.key)
	}
	if x.body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range x.header {
		req.Header.Set(k, v)
	}
	return req
}

// do sends x to the stack, checks that it got the answer it was made for,
// then that the document describes the request and the answer. It may be
// called from several goroutines at once.
func (c contract) do(t *testing.T, s *stack, x exchange) answer {
	t.Helper()
	name := x.method + " " + x.path
	if x.raw != rawNone {
		name += " (" + string(x.raw) + ")"
	}
	a, err := x.send(t, s)
	if err != nil { // Errorf, not Fatalf: doAll calls do from goroutines of its own
		t.Errorf("%s: %v", name, err)
		return a
	}
	if a.status != x.status || a.header.Get("X-Error-Code") != x.code {
		t.Errorf("%s = %d %q (%s), want %d %q: the case does not test what it means to", name,
			a.status, a.header.Get("X-Error-Code"), a.body, x.status, x.code)
		return a
	}
	if err := c.check(x.request(t, s.baseURL), x, a); err != nil {
		t.Errorf("%s (%d %s): openapi.yaml disagrees with the stack: %v", name, a.status, x.code, err)
	}
	return a
}

// send sends x to the stack and reads its answer whole.
func (x exchange) send(t *testing.T, s *stack) (answer, error) {
	if x.raw != rawNone {
		return x.sendRaw(s)
	}
	resp, err := noRedirects.Do(x.request(t, s.baseURL))
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{}, fmt.Errorf("reading the answer: %w", err)
	}
	if body, err = decoded(resp.Header, body); err != nil {
		return answer{}, err
	}
	return answer{status: resp.StatusCode, header: resp.Header, body: body}, nil
}

// decoded is body without its gzip coding. Go's transport decodes an
// answer itself, and drops its Content-Encoding, only when it asked for
// gzip on its own; an exchange that asks for it (acceptGzip) gets the
// answer as a client in another language sees it, header included.
func decoded(h http.Header, body []byte) ([]byte, error) {
	if h.Get("Content-Encoding") != "gzip" || len(body) == 0 {
		return body, nil
	}
	zr, err := gzip.NewReader(bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("a gzip answer that is not gzip: %w", err)
	}
	return io.ReadAll(zr)
}

// check validates the request x and the stack's answer a against the
// document, and counts the answer as met when the document describes it.
func (c contract) check(req *http.Request, x exchange, a answer) error {
	route, params, err := c.router.FindRoute(req)
	switch {
	case errors.Is(err, routers.ErrPathNotFound):
		return c.met.add("RouteNotFound", a, c.checkUnrouted(req, "RouteNotFound", a))
	case errors.Is(err, routers.ErrMethodNotAllowed):
		return c.met.add("MethodNotAllowed", a, c.checkUnrouted(req, "MethodNotAllowed", a))
	case err != nil:
		return fmt.Errorf("finding the operation: %w", err)
	}
	in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route, Options: &openapi3filter.Options{
		AuthenticationFunc:  keyPresent,
		SkipSettingDefaults: true,
	}}
	reqErr := openapi3filter.ValidateRequest(context.Background(), in)
	switch {
	case x.docRefuses && reqErr == nil:
		return errors.New("the document accepts the request, which should break its constraints")
	case !x.docRefuses && reqErr != nil:
		return fmt.Errorf("the document refuses the request: %w", reqErr)
	}
	return c.met.add(route.Operation.OperationID, a, checkAnswer(in, route.Operation.Responses, a))
}

// checkUnrouted checks the answer to a request no operation has against
// the component response named (RouteNotFound, MethodNotAllowed), as if it
// were the one answer of an operation.
func (c contract) checkUnrouted(req *http.Request, name string, a answer) error {
	ref := c.doc.Components.Responses[name]
	if ref == nil {
		return fmt.Errorf("no components.responses.%s", name)
	}
	responses := openapi3.NewResponses(openapi3.WithStatus(a.status, ref))
	route := &routers.Route{Spec: c.doc, Operation: &openapi3.Operation{Responses: responses}}
	in := &openapi3filter.RequestValidationInput{Request: req, Route: route}
	return checkAnswer(in, responses, a)
}

// checkAnswer validates a against the operation's responses: its status
// is documented, its headers and body match, its error code is among the
// response's x-error-codes, and meta.request_id is X-Request-Id.
func checkAnswer(in *openapi3filter.RequestValidationInput, responses *openapi3.Responses, a answer) error {
	ref := responses.Status(a.status)
	if ref == nil || ref.Value == nil {
		return fmt.Errorf("status %d is not documented", a.status)
	}
	err := openapi3filter.ValidateResponse(context.Background(), &openapi3filter.ResponseValidationInput{
		RequestValidationInput: in, Status: a.status, Header: a.header,
		Body:    io.NopCloser(bytes.NewReader(a.body)),
		Options: &openapi3filter.Options{IncludeResponseStatus: true},
	})
	if err != nil {
		return err
	}
	if err := headersDeclared(ref.Value, a.header); err != nil {
		return err
	}
	if in.Request.Method == http.MethodHead { // ValidateResponse skips HEAD answers
		return checkHeadAnswer(ref.Value, a)
	}
	var env struct {
		Error *struct{ Code string }
		Meta  struct {
			RequestID string `json:"request_id"`
		}
	}
	if err := json.Unmarshal(a.body, &env); err != nil {
		return fmt.Errorf("answer is not JSON: %w", err)
	}
	if env.Meta.RequestID != a.header.Get("X-Request-Id") {
		return fmt.Errorf("meta.request_id %q, X-Request-Id %q: want them equal", env.Meta.RequestID, a.header.Get("X-Request-Id"))
	}
	if env.Error != nil && env.Error.Code != a.header.Get("X-Error-Code") {
		return fmt.Errorf("error.code %q, X-Error-Code %q: want them equal", env.Error.Code, a.header.Get("X-Error-Code"))
	}
	if env.Error != nil && !slices.Contains(errorCodes(ref.Value), env.Error.Code) {
		return fmt.Errorf("error.code %q is not in the response's x-error-codes %v", env.Error.Code, errorCodes(ref.Value))
	}
	return nil
}

// checkHeadAnswer checks what a HEAD answer has of the GET's: the required
// headers and, on an error, a code the response lists.
func checkHeadAnswer(r *openapi3.Response, a answer) error {
	if len(a.body) != 0 {
		return fmt.Errorf("a HEAD answer has a body: %q", a.body)
	}
	for name, h := range r.Headers {
		if h.Value.Required && a.header.Get(name) == "" {
			return fmt.Errorf("header %s is required and missing", name)
		}
	}
	if code := a.header.Get("X-Error-Code"); code != "" && !slices.Contains(errorCodes(r), code) {
		return fmt.Errorf("X-Error-Code %q is not in the response's x-error-codes %v", code, errorCodes(r))
	}
	return nil
}

func errorCodes(r *openapi3.Response) []string {
	list, _ := r.Extensions["x-error-codes"].([]any)
	var codes []string
	for _, c := range list {
		if s, ok := c.(string); ok {
			codes = append(codes, s)
		}
	}
	return codes
}

// keyPresent is the document's view of the key: the header it names is
// there. Whether the key is valid is the stack's to say.
func keyPresent(_ context.Context, in *openapi3filter.AuthenticationInput) error {
	if in.RequestValidationInput.Request.Header.Get(in.SecurityScheme.Name) == "" {
		return fmt.Errorf("no %s header", in.SecurityScheme.Name)
	}
	return nil
}

// saleLimit is the stack's RATE_LIMIT_SALES_WRITE here: low enough that a
// key of its own meets it in a few quick calls, above what the other
// sale calls of the test spend on the fixture's write key.
const saleLimit = 30

// readLimit is the stack's RATE_LIMIT_EXPORT_READ: a key of its own spends
// it in a few quick calls, above what the fixture's read key spends.
const readLimit = 100

// queryTimeout is the stack's EXPORT_READER_QUERY_TIMEOUT and
// SALES_WRITER_QUERY_TIMEOUT: what checkStoreLocked's calls wait, far
// over what any other query of the test takes.
const queryTimeout = 2 * time.Second

// big is a body over the gateway's 64 KiB.
var big = strings.Repeat("x", 65*1024)

// tooManyHeaders makes a head over the gateway's 8 KiB.
var tooManyHeaders = map[string]string{"X-Padding": strings.Repeat("p", 9000)}

// gzipped says that the body is compressed.
var gzipped = map[string]string{"Content-Encoding": "gzip"}

// acceptGzip asks for a compressed answer, as most HTTP clients do.
var acceptGzip = map[string]string{"Accept-Encoding": "gzip"}

// The document (gateway/openapi.yaml) is true of the running stack: real
// calls covering every operation's success and its main refusals are
// validated, request and answer, against it. The document must refuse the
// requests that break its own constraints, and accept the others; every
// answer's status, headers and body must be as it says, and every error
// code must be among those it lists for that answer. Each error response's
// example must be an answer an exchange got: its code and its message.
func TestOpenAPIDescribesTheStack(t *testing.T) {
	c := loadContract(t)
	pool := testenv.Postgres(t)
	fx := newFixture(t, pool)
	shop := startShop(t)
	s := startStack(t, dsnOf(t, pool), testenv.RedisURL(t),
		"SHOP_SCHEMA_ALLOW_HOSTS=127.0.0.1", "SHOP_SCHEMA_CA_FILE="+shop.caFile,
		"SHOP_SCHEMA_TIMEOUT="+shopTimeout.String(), "SHOP_SCHEMA_CONNECT_TIMEOUT="+shopTimeout.String(),
		fmt.Sprintf("SHOP_SCHEMA_MAX_RESPONSE_BYTES=%d", shopMaxResponseBytes),
		"EXPORT_READER_QUERY_TIMEOUT="+queryTimeout.String(), "SALES_WRITER_QUERY_TIMEOUT="+queryTimeout.String(),
		fmt.Sprintf("RATE_LIMIT_SALES_WRITE=%d-M", saleLimit), fmt.Sprintf("RATE_LIMIT_EXPORT_READ=%d-M", readLimit))

	t.Run("health", func(t *testing.T) { checkHealth(t, c, s) })
	t.Run("export", func(t *testing.T) { checkExport(t, c, s, fx, pool) })
	t.Run("sales", func(t *testing.T) { checkSales(t, c, s, fx, pool) })
	t.Run("waiting for timeouts", func(t *testing.T) { // each waits 2 s, so they wait together
		t.Run("shop failing", func(t *testing.T) { t.Parallel(); checkShopFailing(t, c, s, shop) })
		t.Run("store locked", func(t *testing.T) { t.Parallel(); checkStoreLocked(t, c, s, fx, pool) })
	})
	t.Run("shop schema", func(t *testing.T) { checkShopSchema(t, c, s, shop) }) // after shop failing: it spends the route's limit
	t.Run("sale in progress", func(t *testing.T) { checkInProgress(t, c, s, fx, pool) })
	t.Run("unread requests", func(t *testing.T) { checkUnread(t, c, s, fx) })
	t.Run("internal error", func(t *testing.T) { checkInternalError(t, c, s, fx, pool) })
	t.Run("services failing", func(t *testing.T) { checkServicesFailing(t, c, s, fx) })
	t.Run("services down", func(t *testing.T) { checkServicesDown(t, c, s, fx) })
	c.wantEveryAnswerMet(t)
	c.wantExamplesMet(t)
}

func checkHealth(t *testing.T, c contract, s *stack) {
	for _, x := range []exchange{
		{method: "GET", path: "/health", status: 200},
		{method: "HEAD", path: "/health", status: 200},
		{method: "GET", path: "/health?verbose=1", status: 200}, // read by none, so refused by none
		{method: "POST", path: "/health", status: 405, code: "method_not_allowed"},
		{method: "GET", path: "/nowhere", status: 404, code: "not_found"},
		{method: "GET", path: "/health", header: tooManyHeaders, status: 431, code: "headers_too_large"},
		{method: "HEAD", path: "/health", header: tooManyHeaders, status: 431, code: "headers_too_large"},
		{method: "GET", path: "/health", body: big, status: 413, code: "payload_too_large"},
		{method: "HEAD", path: "/health", body: big, status: 413, code: "payload_too_large"},
	} {
		c.do(t, s, x)
	}
	spend(t, s, exchange{method: "GET", path: "/health"})
	c.do(t, s, exchange{method: "GET", path: "/health", status: 429, code: "rate_limited"})
	c.do(t, s, exchange{method: "HEAD", path: "/health", status: 429, code: "rate_limited"})
}

func checkExport(t *testing.T, c contract, s *stack, fx fixture, pool *pgxpool.Pool) {
	first := c.do(t, s, exchange{method: "GET", path: "/export/items?limit=2&lang=UKR", key: fx.readKey, status: 200})
	var page struct {
		Data []struct{ ID string }
		Meta struct {
			NextCursor string `json:"next_cursor"`
		}
	}
	if err := json.Unmarshal(first.body, &page); err != nil || len(page.Data) == 0 || page.Meta.NextCursor == "" {
		t.Fatalf("first page %s: want items and a next cursor", first.body)
	}
	item := "/export/items/" + page.Data[0].ID
	checkCompressed(t, c, s, fx.readKey, "/export/items?limit=100", item)
	for _, x := range []exchange{
		{method: "GET", path: "/export/items?limit=100&cursor=" + page.Meta.NextCursor, key: fx.readKey, status: 200},
		{method: "GET", path: "/export/items?updated_after=2020-01-01T00:00:00Z&status=inactive", key: fx.readKey, status: 200},
		{method: "HEAD", path: "/export/items", key: fx.readKey, status: 200},
		{method: "GET", path: "/export/items", status: 401, code: "unauthenticated", docRefuses: true},
		{method: "GET", path: "/export/items", key: "cxr_not-a-key", status: 401, code: "unauthenticated"},
		{method: "GET", path: "/export/items", key: fx.writeKey, status: 403, code: "forbidden"},
		{method: "GET", path: "/export/items?limit=0", key: fx.readKey, status: 400, code: "invalid_limit", docRefuses: true},
		{method: "GET", path: "/export/items?limit=101", key: fx.readKey, status: 400, code: "invalid_limit", docRefuses: true},
		{method: "GET", path: "/export/items?lang=eng", key: fx.readKey, status: 400, code: "invalid_lang", docRefuses: true},
		{method: "GET", path: "/export/items?status=sold", key: fx.readKey, status: 400, code: "invalid_status", docRefuses: true},
		{method: "GET", path: "/export/items?updated_after=2026-11-21", key: fx.readKey, status: 400, code: "invalid_updated_after", docRefuses: true},
		{method: "GET", path: "/export/items?cursor=bm90LWEtY3Vyc29y", key: fx.readKey, status: 400, code: "invalid_cursor"},
		{method: "GET", path: "/export/items?updatedAfter=2026-11-21T00:00:00Z", key: fx.readKey, status: 400, code: "invalid_parameter"},
		{method: "GET", path: "/export/items", key: fx.readKey, body: big, status: 413, code: "payload_too_large"},
		{method: "GET", path: "/export/items", key: fx.readKey, header: gzipped, body: "{}", status: 415, code: "unsupported_content_encoding"},
		{method: "GET", path: "/export/items", key: fx.readKey, header: tooManyHeaders, status: 431, code: "headers_too_large"},
		{method: "DELETE", path: "/export/items", key: fx.readKey, status: 405, code: "method_not_allowed"},
		{method: "HEAD", path: "/export/items", status: 401, code: "unauthenticated", docRefuses: true},
		{method: "HEAD", path: "/export/items", key: fx.writeKey, status: 403, code: "forbidden"},
		{method: "HEAD", path: "/export/items?limit=0", key: fx.readKey, status: 400, code: "invalid_limit", docRefuses: true},
		{method: "HEAD", path: "/export/items?lang=eng", key: fx.readKey, status: 400, code: "invalid_lang", docRefuses: true},
		{method: "HEAD", path: "/export/items?status=sold", key: fx.readKey, status: 400, code: "invalid_status", docRefuses: true},
		{method: "HEAD", path: "/export/items?updated_after=2026-11-21", key: fx.readKey, status: 400, code: "invalid_updated_after", docRefuses: true},
		{method: "HEAD", path: "/export/items?cursor=bm90LWEtY3Vyc29y", key: fx.readKey, status: 400, code: "invalid_cursor"},
		{method: "HEAD", path: "/export/items?updatedAfter=2026-11-21T00:00:00Z", key: fx.readKey, status: 400, code: "invalid_parameter"},
		{method: "HEAD", path: "/export/items", key: fx.readKey, body: big, status: 413, code: "payload_too_large"},
		{method: "HEAD", path: "/export/items", key: fx.readKey, header: gzipped, body: "{}", status: 415, code: "unsupported_content_encoding"},
		{method: "HEAD", path: "/export/items", key: fx.readKey, header: tooManyHeaders, status: 431, code: "headers_too_large"},
		{method: "GET", path: item + "?lang=RUS", key: fx.readKey, status: 200},
		{method: "HEAD", path: item, key: fx.readKey, status: 200},
		{method: "GET", path: "/export/items/no-such-item", key: fx.readKey, status: 404, code: "not_found"},
		{method: "HEAD", path: "/export/items/no-such-item", key: fx.readKey, status: 404, code: "not_found"},
		{method: "GET", path: item + "?lang=ukr", key: fx.readKey, status: 400, code: "invalid_lang", docRefuses: true},
		{method: "GET", path: item + "?limit=5", key: fx.readKey, status: 400, code: "invalid_parameter"},
		{method: "GET", path: item, key: fx.writeKey, status: 403, code: "forbidden"},
		{method: "GET", path: item, status: 401, code: "unauthenticated", docRefuses: true},
		{method: "GET", path: item, key: fx.readKey, body: big, status: 413, code: "payload_too_large"},
		{method: "GET", path: item, key: fx.readKey, header: gzipped, body: "{}", status: 415, code: "unsupported_content_encoding"},
		{method: "GET", path: item, key: fx.readKey, header: tooManyHeaders, status: 431, code: "headers_too_large"},
		{method: "PUT", path: item, key: fx.readKey, status: 405, code: "method_not_allowed"},
		{method: "HEAD", path: item + "?limit=5", key: fx.readKey, status: 400, code: "invalid_parameter"},
		{method: "HEAD", path: item + "?lang=ukr", key: fx.readKey, status: 400, code: "invalid_lang", docRefuses: true},
		{method: "GET", path: "/export/items/a%zz", key: fx.readKey, status: 400, code: "invalid_path", raw: rawEscape},
		{method: "HEAD", path: "/export/items/a%zz", key: fx.readKey, status: 400, code: "invalid_path", raw: rawEscape},
		{method: "HEAD", path: item, status: 401, code: "unauthenticated", docRefuses: true},
		{method: "HEAD", path: item, key: fx.writeKey, status: 403, code: "forbidden"},
		{method: "HEAD", path: item, key: fx.readKey, body: big, status: 413, code: "payload_too_large"},
		{method: "HEAD", path: item, key: fx.readKey, header: gzipped, body: "{}", status: 415, code: "unsupported_content_encoding"},
		{method: "HEAD", path: item, key: fx.readKey, header: tooManyHeaders, status: 431, code: "headers_too_large"},
	} {
		c.do(t, s, x)
	}
	limited := addKey(t, pool, fx.owner, nil, "export:read")
	spend(t, s, exchange{method: "GET", path: item, key: limited})
	for _, x := range []exchange{
		{method: "GET", path: "/export/items", key: limited, status: 429, code: "rate_limited"},
		{method: "HEAD", path: "/export/items", key: limited, status: 429, code: "rate_limited"},
		{method: "GET", path: item, key: limited, status: 429, code: "rate_limited"},
		{method: "HEAD", path: item, key: limited, status: 429, code: "rate_limited"},
	} {
		c.do(t, s, x)
	}
}

// checkCompressed checks the answers of paths (GET and HEAD) compressed
// as a client that asks for gzip gets them: Go's own transport takes the
// coding off, so the exchanges above never meet Content-Encoding.
func checkCompressed(t *testing.T, c contract, s *stack, key string, paths ...string) {
	for _, path := range paths {
		for _, method := range []string{"GET", "HEAD"} {
			a := c.do(t, s, exchange{method: method, path: path, key: key, header: acceptGzip, status: 200})
			if a.header.Get("Content-Encoding") != "gzip" {
				t.Errorf("%s %s with Accept-Encoding: gzip: Content-Encoding %q, want gzip: the case does not test what it means to",
					method, path, a.header.Get("Content-Encoding"))
			}
		}
	}
}

func checkSales(t *testing.T, c contract, s *stack, fx fixture, pool *pgxpool.Pool) {
	active, inactive := itemOfStatus(t, s, fx, "active"), itemOfStatus(t, s, fx, "inactive")
	confirm, cancel := "/export/items/"+active+"/sales/confirm", "/export/items/"+active+"/sales/cancel"
	order := func(id string) string { return `{"external_order_id":"` + id + `"}` }
	key := func(k string) map[string]string { return map[string]string{"Idempotency-Key": k} }
	for _, x := range []exchange{
		{method: "POST", path: confirm, key: fx.writeKey, header: key("oa-confirm-1"), body: order("oa-1"), status: 200},
		{method: "POST", path: confirm, key: fx.writeKey, header: key("oa-confirm-1"), body: order("oa-1"), status: 200},
		{method: "POST", path: confirm, key: fx.writeKey, header: key("oa-confirm-1"), body: order("oa-2"), status: 409, code: "idempotency_conflict"},
		{method: "POST", path: confirm, key: fx.writeKey, header: key("oa-confirm-2"), body: `{"external_order_id":"oa-2","quantity":1}`,
			status: 409, code: "item_already_sold"},
		{method: "POST", path: "/export/items/" + inactive + "/sales/confirm", key: fx.writeKey, header: key("oa-confirm-3"), body: order("oa-3"),
			status: 409, code: "item_not_available"},
		{method: "POST", path: "/export/items/no-such-item/sales/confirm", key: fx.writeKey, header: key("oa-confirm-4"), body: order("oa-4"),
			status: 404, code: "not_found"},
		{method: "POST", path: cancel, key: fx.writeKey, header: key("oa-cancel-1"), body: order("oa-1"), status: 200},
		{method: "POST", path: cancel, key: fx.writeKey, header: key("oa-cancel-2"), body: order("oa-1"), status: 409, code: "sale_not_cancelable"},
		{method: "POST", path: confirm, key: fx.writeKey, body: order("oa-5"), status: 400, code: "invalid_idempotency_key", docRefuses: true},
		{method: "POST", path: confirm, key: fx.writeKey, header: key(strings.Repeat("k", 129)), body: order("oa-5"),
			status: 400, code: "invalid_idempotency_key", docRefuses: true},
		{method: "POST", path: confirm, key: fx.writeKey, header: map[string]string{"Idempotency-Key": "oa-5", "Content-Type": "text/plain"},
			body: order("oa-5"), status: 400, code: "invalid_content_type", docRefuses: true},
		{method: "POST", path: confirm, key: fx.writeKey, header: key("oa-5"), body: `{"external_order_id":"oa-5","note":"x"}`,
			status: 400, code: "invalid_body", docRefuses: true},
		{method: "POST", path: confirm, key: fx.writeKey, header: key("oa-5"), body: `{"external_order_id":"oa-5","quantity":2}`,
			status: 400, code: "invalid_body", docRefuses: true},
		{method: "POST", path: confirm, key: fx.writeKey, header: key("oa-5"), body: `{"external_order_id":""}`,
			status: 400, code: "invalid_body", docRefuses: true},
		{method: "POST", path: confirm + "?dry_run=1", key: fx.writeKey, header: key("oa-5"), body: order("oa-5"),
			status: 400, code: "invalid_parameter"},
		{method: "POST", path: confirm, key: fx.writeKey, header: key("oa-5"), body: order(strings.Repeat("o", 20*1024)),
			status: 413, code: "payload_too_large", docRefuses: true},
		{method: "POST", path: confirm, key: fx.writeKey, header: map[string]string{"Idempotency-Key": "oa-5", "Content-Encoding": "gzip"},
			body: order("oa-5"), status: 415, code: "unsupported_content_encoding"},
		{method: "POST", path: confirm, header: key("oa-5"), body: order("oa-5"), status: 401, code: "unauthenticated", docRefuses: true},
		{method: "POST", path: confirm, key: fx.readKey, header: key("oa-5"), body: order("oa-5"), status: 403, code: "forbidden"},
		{method: "GET", path: confirm, key: fx.writeKey, status: 405, code: "method_not_allowed"},
		{method: "POST", path: confirm, key: fx.writeKey, header: withKey(tooManyHeaders, "oa-5"), body: order("oa-5"),
			status: 431, code: "headers_too_large"},
		{method: "POST", path: cancel, key: fx.writeKey, body: order("oa-1"), status: 400, code: "invalid_idempotency_key", docRefuses: true},
		{method: "POST", path: cancel, key: fx.writeKey, header: key("oa-cancel-1"), body: order("oa-9"), status: 409, code: "idempotency_conflict"},
		{method: "POST", path: cancel + "?dry_run=1", key: fx.writeKey, header: key("oa-cancel-3"), body: order("oa-1"),
			status: 400, code: "invalid_parameter"},
		{method: "POST", path: cancel, key: fx.writeKey, header: map[string]string{"Idempotency-Key": "oa-cancel-3", "Content-Type": "text/plain"},
			body: order("oa-1"), status: 400, code: "invalid_content_type", docRefuses: true},
		{method: "POST", path: cancel, key: fx.writeKey, header: key("oa-cancel-3"), body: `{"external_order_id":"oa-1","reason":"x"}`,
			status: 400, code: "invalid_body", docRefuses: true},
		{method: "POST", path: "/export/items/a%zz/sales/confirm", key: fx.writeKey, header: key("oa-5"), body: order("oa-5"),
			status: 400, code: "invalid_path", raw: rawEscape},
		{method: "POST", path: "/export/items/a%zz/sales/cancel", key: fx.writeKey, header: key("oa-cancel-3"), body: order("oa-1"),
			status: 400, code: "invalid_path", raw: rawEscape},
		{method: "POST", path: cancel, header: key("oa-cancel-3"), body: order("oa-1"), status: 401, code: "unauthenticated", docRefuses: true},
		{method: "POST", path: cancel, key: fx.readKey, header: key("oa-cancel-3"), body: order("oa-1"), status: 403, code: "forbidden"},
		{method: "POST", path: "/export/items/no-such-item/sales/cancel", key: fx.writeKey, header: key("oa-cancel-4"), body: order("oa-1"),
			status: 404, code: "not_found"},
		{method: "POST", path: cancel, key: fx.writeKey, header: key("oa-cancel-3"), body: order(strings.Repeat("o", 20*1024)),
			status: 413, code: "payload_too_large", docRefuses: true},
		{method: "POST", path: cancel, key: fx.writeKey, header: withKey(gzipped, "oa-cancel-3"), body: order("oa-1"),
			status: 415, code: "unsupported_content_encoding"},
		{method: "POST", path: cancel, key: fx.writeKey, header: withKey(tooManyHeaders, "oa-cancel-3"), body: order("oa-1"),
			status: 431, code: "headers_too_large"},
	} {
		c.do(t, s, x)
	}
	checkRateLimited(t, c, s, addKey(t, pool, fx.owner, ptr("e2e-market"), "sales:write"), confirm, cancel)
}

// withKey is header with an Idempotency-Key added.
func withKey(header map[string]string, key string) map[string]string {
	h := maps.Clone(header)
	h["Idempotency-Key"] = key
	return h
}

// checkRateLimited spends a key of its own on the sale routes' limit
// (saleLimit) with cheap refused calls, then checks the 429 of each path.
func checkRateLimited(t *testing.T, c contract, s *stack, key string, paths ...string) {
	spend := exchange{method: "POST", path: paths[0], key: key, body: `{}`}
	for range saleLimit {
		resp, err := noRedirects.Do(spend.request(t, s.baseURL))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	for _, path := range paths {
		c.do(t, s, exchange{method: "POST", path: path, key: key, header: map[string]string{"Idempotency-Key": "oa-limited"},
			body: `{"external_order_id":"oa-limited"}`, status: 429, code: "rate_limited"})
	}
}

func checkShopSchema(t *testing.T, c contract, s *stack, shop fakeShop) {
	const path = "/sync/prestashop/schema"
	body := func(base, key string) string { return `{"base_url":"` + base + `","ws_key":"` + key + `"}` }
	for _, x := range []exchange{
		{method: "POST", path: path, body: body(shop.url, shopKey), status: 200},
		{method: "POST", path: path, body: `{"base_url":"` + shop.url + `","ws_key":"k","shop":1}`, status: 400, code: "invalid_body", docRefuses: true},
		{method: "POST", path: path, body: body("not a url", shopKey), status: 400, code: "invalid_base_url"},
		{method: "POST", path: path, body: body("http://shop.example.com", shopKey), status: 400, code: "base_url_must_be_https"},
		{method: "POST", path: path, body: body("https://10.1.2.3", shopKey), status: 400, code: "base_url_not_allowed"},
		{method: "POST", path: path, body: `{"base_url":"` + shop.url + `"}`, status: 400, code: "missing_ws_key", docRefuses: true},
		{method: "POST", path: path, body: body(shop.url, "   "), status: 400, code: "missing_ws_key"},
		{method: "POST", path: path, body: body(shop.url, "WRONGKEYWRONGKEYWRONGKEYWRONGKEY"), status: 400, code: "shop_401"},
		{method: "POST", path: path, body: body(shop.url, shopOtherShopsKey), status: 400, code: "shop_403"},
		{method: "POST", path: path, body: body(shop.url+"/nowhere", shopKey), status: 502, code: "shop_not_found"},
		{method: "POST", path: path + "?base_url=x", body: body(shop.url, shopKey), status: 400, code: "invalid_parameter"},
		{method: "POST", path: path, body: body(shop.url, strings.Repeat("k", 17*1024)), status: 413, code: "payload_too_large", docRefuses: true},
		{method: "GET", path: path, status: 405, code: "method_not_allowed"},
		{method: "POST", path: path, header: gzipped, body: body(shop.url, shopKey), status: 415, code: "unsupported_content_encoding"},
		{method: "POST", path: path, header: tooManyHeaders, body: body(shop.url, shopKey), status: 431, code: "headers_too_large"},
	} {
		c.do(t, s, x)
	}
	spend(t, s, exchange{method: "POST", path: path, body: `{}`})
	c.do(t, s, exchange{method: "POST", path: path, body: body(shop.url, shopKey), status: 429, code: "rate_limited"})
}

// itemOfStatus is the id of one seeded item of the fixture's owner with
// that status.
func itemOfStatus(t *testing.T, s *stack, fx fixture, status string) string {
	t.Helper()
	code, env, _ := call(t, "GET", s.baseURL+"/export/items?limit=1&status="+status, fx.readKey, "", nil)
	var items []struct{ ID string }
	if code != 200 || json.Unmarshal(env.Data, &items) != nil || len(items) == 0 {
		t.Fatalf("GET /export/items?status=%s = %d %s, want an item", status, code, env.Data)
	}
	return items[0].ID
}

// addKey stores a new key of owner with scopes, bound to platform if not nil.
func addKey(t *testing.T, pool *pgxpool.Pool, owner string, platform *string, scopes ...string) string {
	t.Helper()
	secret, prefix, err := apikey.Generate(scopes)
	if err != nil {
		t.Fatal(err)
	}
	hash := apikey.HashOf(secret)
	if _, err := pool.Exec(context.Background(), `INSERT INTO api_keys (owner_id, platform_id, prefix, hash, scopes) VALUES ($1, $2, $3, $4, $5)`,
		owner, platform, prefix, hash[:], scopes); err != nil {
		t.Fatal(err)
	}
	return secret
}

func ptr[T any](v T) *T { return &v }

// The keys the fake shop knows: one that may read everything, one enabled
// for another shop (PrestaShop's 403 code 132). Any other key is refused 401.
const (
	shopKey           = "OPENAPIKEYOPENAPIKEYOPENAPIKEY12"
	shopOtherShopsKey = "OTHERSHOPOTHERSHOPOTHERSHOPOTHER"
)

// fakeShop is a PrestaShop webservice on 127.0.0.1 over HTTPS with a
// one-language schema: what shop-schema reads, and nothing more.
// (shop-schema's own fakeshop is internal to its module.)
type fakeShop struct {
	url    string // base_url
	caFile string // its certificate, for SHOP_SCHEMA_CA_FILE
}

// shopRows are the answers of the resources shop-schema reads, with ids
// and flags as strings, as PrestaShop writes them.
var shopRows = map[string]string{
	"languages": `{"languages":[{"id":"1","name":"English","iso_code":"en","language_code":"en-us","locale":"en-US","active":"1"}]}`,
	"categories": `{"categories":[{"id":"1","id_parent":"0","level_depth":"0","active":"1","position":"0","is_root_category":"0","name":[{"id":"1","value":"Root"}]},` +
		`{"id":"2","id_parent":"1","level_depth":"1","active":"1","position":"0","is_root_category":"1","name":[{"id":"1","value":"Home"}]}]}`,
	"product_features":       `{"product_features":[{"id":"1","position":"0","name":[{"id":"1","value":"Metal"}]}]}`,
	"product_feature_values": `{"product_feature_values":[{"id":"1","id_feature":"1","custom":"0","value":[{"id":"1","value":"Silver"}]}]}`,
}

func startShop(t *testing.T) fakeShop {
	t.Helper()
	srv := testenv.LoopbackServer(t, http.HandlerFunc(serveShop))
	srv.StartTLS()
	caFile := filepath.Join(t.TempDir(), "shop-ca.pem")
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	if err := os.WriteFile(caFile, ca, 0o600); err != nil {
		t.Fatal(err)
	}
	return fakeShop{url: srv.URL, caFile: caFile}
}

func serveShop(w http.ResponseWriter, r *http.Request) {
	if serveFailingShop(w, r) {
		return
	}
	rows, ok := shopRows[strings.TrimPrefix(r.URL.Path, "/api/")]
	if !ok {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	switch shopKeyOf(r) {
	case shopKey:
		w.Header().Set("PSWS-Version", "8.2.1")
		io.WriteString(w, rows)
	case shopOtherShopsKey:
		w.WriteHeader(http.StatusForbidden)
		io.WriteString(w, `{"errors":[{"code":132,"message":"No permission for this key on this shop"}]}`)
	default:
		w.WriteHeader(http.StatusUnauthorized)
		io.WriteString(w, `{"errors":[{"code":20,"message":"Authentification key is not active"}]}`)
	}
}

// shopKeyOf is the HTTP Basic user name, which PrestaShop reads as the key.
func shopKeyOf(r *http.Request) string {
	raw, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(r.Header.Get("Authorization"), "Basic "))
	if err != nil {
		return ""
	}
	user, _, _ := strings.Cut(string(raw), ":")
	return user
}
