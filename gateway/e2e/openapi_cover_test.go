package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/coinexport/export/pkg/testenv"
)

// answersMet is the documented answers the exchanges got: per operation
// (or component response of no operation: RouteNotFound,
// MethodNotAllowed), each status, and each error code of a status, as
// answerName names them; and the error messages each code came with.
type answersMet struct {
	mu       sync.Mutex
	met      map[string]bool
	messages map[string]map[string]bool // by answerName with a code
}

// answerName is "operationId status", or "operationId status code" for an
// answer that carries an error code.
func answerName(op string, status int, code string) string {
	name := op + " " + strconv.Itoa(status)
	if code != "" {
		name += " " + code
	}
	return name
}

// add counts a (its status, its code if any, and its message) as met for
// op unless checking it failed (err), and returns err.
func (m *answersMet) add(op string, a answer, err error) error {
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.met == nil {
		m.met, m.messages = map[string]bool{}, map[string]map[string]bool{}
	}
	m.met[answerName(op, a.status, "")] = true
	code := a.header.Get("X-Error-Code")
	if code == "" {
		return nil
	}
	name := answerName(op, a.status, code)
	m.met[name] = true
	if message := errorMessage(a.body); message != "" { // a HEAD answer has none
		if m.messages[name] == nil {
			m.messages[name] = map[string]bool{}
		}
		m.messages[name][message] = true
	}
	return nil
}

// errorMessage is the error.message of an error envelope, "" if body is
// none.
func errorMessage(body []byte) string {
	var env struct{ Error struct{ Message string } }
	_ = json.Unmarshal(body, &env)
	return env.Error.Message
}

func (m *answersMet) has(name string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.met[name]
}

// hasMessage reports whether an answer named name (with a code) came with
// message, or with the same for another of the fake shop's resources:
// shop-schema reads them at once and names the first to fail, which
// varies from run to run.
func (m *answersMet) hasMessage(name, message string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for met := range m.messages[name] {
		if withoutResource(met) == withoutResource(message) {
			return true
		}
	}
	return false
}

// withoutResource is a shop failure's message without the resource it
// names first ("languages: the shop rejected the key"), any other message
// as it is.
func withoutResource(message string) string {
	for resource := range shopRows {
		if reason, ok := strings.CutPrefix(message, resource+": "); ok {
			return reason
		}
	}
	return message
}

// unroutedStatus is the status of each component response of no
// operation.
var unroutedStatus = map[string]int{"RouteNotFound": http.StatusNotFound, "MethodNotAllowed": http.StatusMethodNotAllowed}

// wantExamplesMet fails the test for each example of an error response
// (components.responses) that no exchange got: its code and message from
// an operation that answers with that response. A client reads the
// example as an answer the stack gives; edge.TestOpenAPIErrorExamplesAreTheirResponses
// holds its code to the response's x-error-codes.
func (c contract) wantExamplesMet(t *testing.T) {
	t.Helper()
	answering := map[string][]string{} // response name -> "operationId status" of the answers it is
	for name, status := range unroutedStatus {
		answering[name] = []string{answerName(name, status, "")}
	}
	for _, item := range c.doc.Paths.Map() {
		for _, op := range item.Operations() {
			for status, ref := range op.Responses.Map() {
				name := strings.TrimPrefix(ref.Ref, "#/components/responses/")
				answering[name] = append(answering[name], op.OperationID+" "+status)
			}
		}
	}
	for name, ref := range c.doc.Components.Responses {
		media := ref.Value.Content.Get("application/json")
		if media == nil {
			continue
		}
		for _, ex := range exampleAnswers(media) {
			if !slices.ContainsFunc(answering[name], func(answer string) bool { return c.met.hasMessage(answer+" "+ex.code, ex.message) }) {
				t.Errorf("components.responses.%s: no exchange got its example %s %q from an operation it answers (%v): copy a message the stack sends with that code",
					name, ex.code, ex.message, answering[name])
			}
		}
	}
}

// exampleAnswer is the error code and message of an example.
type exampleAnswer struct{ code, message string }

// exampleAnswers are the error codes and messages of a media type's example
// and examples.
func exampleAnswers(media *openapi3.MediaType) []exampleAnswer {
	var values []any
	if media.Example != nil {
		values = append(values, media.Example)
	}
	for _, ex := range media.Examples {
		values = append(values, ex.Value.Value)
	}
	var answers []exampleAnswer
	for _, v := range values {
		env, _ := v.(map[string]any)
		e, _ := env["error"].(map[string]any)
		code, _ := e["code"].(string)
		message, _ := e["message"].(string)
		answers = append(answers, exampleAnswer{code, message})
	}
	return answers
}

// unproducible are the documented answers ("operationId status", or
// "operationId status code" for one error code of a status) no exchange
// of TestOpenAPIDescribesTheStack can get, each with why. Every other
// documented answer, and every code listed in its x-error-codes, must be
// produced: a document that promises an answer nothing makes may describe
// it wrong.
var unproducible = map[string]string{
	// The gateway answers /health itself, from background checks: its
	// only 500 is a panic turned into the envelope (edge.guardedServe),
	// and no request makes one (edge's tests panic a route of their own).
	"getHealth 500":  "only a panic of the gateway's, which no request causes",
	"headHealth 500": "only a panic of the gateway's, which no request causes",
	// shop-schema answers 500 only for an error that is neither the
	// caller's, nor the shop's (every failure of a shop has its 502 or 504
	// code), nor a cut-off drain: none a shop or a request can cause.
	"readPrestaShopSchema 500": "only an error of shop-schema's own code, which no shop or request causes",
	// The gateway's own 503 unavailable is its health's while it stops,
	// and a key it could not check: this route has neither. shop-schema's
	// is a read cut off by its drain, which outlasts every read
	// (drainTime: SHOP_SCHEMA_TIMEOUT and 2 s to write the answer), so a
	// read ends first, answered (shop_timeout at worst).
	"readPrestaShopSchema 503 unavailable": "only a read cut off by shop-schema's drain, which outlasts every read",
	// api_keys' check constraint sales_write_needs_platform keeps every
	// sales:write key bound to a platform, so the gateway's check of the
	// same rule (spec 4.5 and 5: "a platform-bound key") refuses no key the
	// database can hold. It stays as the contract's rule at the edge,
	// tested in edge (TestErrorAnswersAreEnvelopes, "sales key without
	// platform", with the constraint dropped).
	"confirmSale 403 platform_required": "every sales:write key has a platform (constraint sales_write_needs_platform)",
	"cancelSale 403 platform_required":  "every sales:write key has a platform (constraint sales_write_needs_platform)",
}

// wantEveryAnswerMet fails the test for each documented answer of an
// operation, status or error code of a status, that no exchange got,
// unless unproducible says why none can, and for each unproducible entry
// that an exchange got after all or that the document no longer has.
func (c contract) wantEveryAnswerMet(t *testing.T) {
	t.Helper()
	documented := map[string]bool{}
	var missing []string
	want := func(name, statusName string) {
		documented[name] = true
		_, exempt := unproducible[name]
		if _, all := unproducible[statusName]; all { // none of the status's codes either
			exempt = true
		}
		switch met := c.met.has(name); {
		case !met && !exempt:
			missing = append(missing, name)
		case met && exempt:
			t.Errorf("%s is in unproducible, but an exchange got it: take it out of the list", name)
		}
	}
	wantResponse := func(op string, status int, r *openapi3.Response) {
		statusName := answerName(op, status, "")
		want(statusName, statusName)
		for _, code := range errorCodes(r) {
			want(answerName(op, status, code), statusName)
		}
	}
	for _, item := range c.doc.Paths.Map() {
		for _, op := range item.Operations() {
			for code, ref := range op.Responses.Map() {
				status, err := strconv.Atoi(code)
				if err != nil {
					t.Errorf("%s: response %q is not a status: list each status", op.OperationID, code)
					continue
				}
				wantResponse(op.OperationID, status, ref.Value)
			}
		}
	}
	for name, status := range unroutedStatus {
		ref := c.doc.Components.Responses[name]
		if ref == nil {
			t.Errorf("no components.responses.%s", name)
			continue
		}
		wantResponse(name, status, ref.Value)
	}
	for name := range unproducible {
		if !documented[name] {
			t.Errorf("unproducible lists %s, which openapi.yaml does not document", name)
		}
	}
	slices.Sort(missing)
	for _, name := range missing {
		t.Errorf("openapi.yaml documents %s, and no exchange produced it: add one (or say in unproducible why none can)", name)
	}
}

// transportHeaders are the headers of HTTP's own framing, which no
// response needs to declare. Any other header an answer carries must be
// declared in its response: a generated client reads only those.
var transportHeaders = []string{"Content-Type", "Content-Length", "Date", "Connection", "Transfer-Encoding"}

// headersDeclared fails for a header of h that r does not declare.
func headersDeclared(r *openapi3.Response, h http.Header) error {
	var undeclared []string
	for name := range h {
		if slices.Contains(transportHeaders, name) {
			continue
		}
		if !slices.ContainsFunc(slices.Collect(maps.Keys(r.Headers)), func(d string) bool { return http.CanonicalHeaderKey(d) == name }) {
			undeclared = append(undeclared, name)
		}
	}
	if len(undeclared) > 0 {
		slices.Sort(undeclared)
		return fmt.Errorf("the answer carries headers its response does not declare: %v", undeclared)
	}
	return nil
}

// rawFault is how a raw exchange's request is malformed.
type rawFault string

const (
	rawNone       rawFault = ""
	rawFolded     rawFault = "a folded header line"         // obs-fold: 400 bad_request
	rawUnfinished rawFault = "a head that never ends"       // 408 request_timeout once the read times out
	rawVersion    rawFault = "HTTP/2.0 in the request line" // 400 http_version_not_supported
	rawEscape     rawFault = "a % without two hex digits"   // in the path: 400 invalid_path
)

// sendRaw writes x's request, malformed as x.raw says, on a connection of
// its own and reads the answer.
func (x exchange) sendRaw(s *stack) (answer, error) {
	base, err := url.Parse(s.baseURL)
	if err != nil {
		return answer{}, err
	}
	conn, err := net.DialTimeout("tcp", base.Host, 10*time.Second)
	if err != nil {
		return answer{}, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	version := "HTTP/1.1"
	if x.raw == rawVersion {
		version = "HTTP/2.0"
	}
	var head strings.Builder
	fmt.Fprintf(&head, "%s %s%s %s\r\nHost: %s\r\n", x.method, base.Path, x.path, version, base.Host)
	if x.key != "" {
		fmt.Fprintf(&head, "X-API-Key: %s\r\n", x.key)
	}
	for k, v := range x.header {
		fmt.Fprintf(&head, "%s: %s\r\n", k, v)
	}
	if x.body != "" {
		fmt.Fprintf(&head, "Content-Type: application/json\r\nContent-Length: %d\r\n", len(x.body))
	}
	switch x.raw {
	case rawFolded:
		head.WriteString("X-Note: a\r\n folded\r\n\r\n")
	case rawUnfinished: // no empty line: the gateway waits for the rest
	default:
		head.WriteString("\r\n")
	}
	if x.raw != rawUnfinished {
		head.WriteString(x.body)
	}
	if _, err := io.WriteString(conn, head.String()); err != nil {
		return answer{}, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), &http.Request{Method: x.method})
	if err != nil {
		return answer{}, fmt.Errorf("reading the answer: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{}, fmt.Errorf("reading the answer: %w", err)
	}
	return answer{status: resp.StatusCode, header: resp.Header, body: body}, nil
}

// doAll sends the exchanges at once: those that wait for a timeout wait
// together (parallel subtests would wait by twos, as many as GOMAXPROCS).
func (c contract) doAll(t *testing.T, s *stack, xs []exchange) {
	t.Helper()
	var wg sync.WaitGroup
	for _, x := range xs {
		wg.Go(func() { c.do(t, s, x) })
	}
	wg.Wait()
}

// spend sends x until the rate limit that counts it is spent, as its
// answer's X-RateLimit-Remaining tells: the next request it counts is
// refused 429.
func spend(t *testing.T, s *stack, x exchange) {
	t.Helper()
	for range 10_000 {
		a, err := x.send(t, s)
		if err != nil {
			t.Fatal(err)
		}
		if a.status == http.StatusTooManyRequests {
			t.Fatalf("%s %s: 429 before its X-RateLimit-Remaining said 0", x.method, x.path)
		}
		left, err := strconv.Atoi(a.header.Get("X-RateLimit-Remaining"))
		if err != nil {
			t.Fatalf("%s %s = %d without X-RateLimit-Remaining: it spends no limit", x.method, x.path, a.status)
		}
		if left == 0 {
			return
		}
	}
	t.Fatalf("%s %s: its limit still not spent after 10,000 requests", x.method, x.path)
}

// startGateway starts another gateway in front of the stack's database and
// Redis (its limits counted apart), with settings added, and waits until
// it answers. stop ends it at once.
func startGateway(t *testing.T, s *stack, settings ...string) (g *stack, stop func()) {
	t.Helper()
	addr := testenv.FreeAddr(t)
	cmd := exec.Command(filepath.Join(s.bin, "gateway"))
	cmd.Env = append(append(slices.Clone(s.common),
		"GATEWAY_ADDR="+addr, "GATEWAY_ADMIN_ADDR="+testenv.FreeAddr(t),
		"RATE_LIMIT_KEY_PREFIX="+testenv.KeyPrefix(t)), settings...)
	logs := &testenv.Output{}
	cmd.Stdout, cmd.Stderr = logs, logs
	testenv.DiesWithTest(cmd)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	stop = sync.OnceFunc(func() { _ = cmd.Process.Kill(); <-done })
	t.Cleanup(stop)
	g = &stack{baseURL: "http://" + addr + "/v1", common: s.common, bin: s.bin, logs: map[string]*testenv.Output{"gateway": logs}}
	for deadline := time.Now().Add(30 * time.Second); ; {
		if resp, err := healthClient.Get(g.baseURL + "/health"); err == nil {
			resp.Body.Close()
			break
		}
		select {
		case <-done:
			t.Fatalf("gateway exited before it answered:\n%s", logs.String())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("gateway did not answer within 30 s:\n%s", logs.String())
		}
	}
	g.sigterm = func() { _ = cmd.Process.Signal(syscall.SIGTERM) }
	return g, stop
}

// faultyService is a service instance on loopback that answers its health
// probe and fails every other request: a request whose URI or body says
// "slow" is never answered (the gateway's upstream timeout ends it), any
// other has its connection closed unanswered.
func faultyService(t *testing.T) string {
	t.Helper()
	release := make(chan struct{})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			return
		}
		body, _ := io.ReadAll(r.Body)
		if strings.Contains(r.URL.RequestURI()+string(body), "slow") {
			select {
			case <-r.Context().Done():
			case <-release:
			}
			return
		}
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
	})}
	ln := loopbackListener(t)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { close(release); srv.Close() })
	return "http://" + ln.Addr().String()
}

// everyOperation is one request to each operation of the document, the
// exchange made by x for it, with its status and code set.
func everyOperation(fx fixture, item string, status int, code string, x func(method, path, key, body string, header map[string]string) exchange) []exchange {
	sale := `{"external_order_id":"oa-x"}`
	idem := func(k string) map[string]string { return map[string]string{"Idempotency-Key": k} }
	xs := []exchange{
		x("GET", "/health", "", "", nil),
		x("HEAD", "/health", "", "", nil),
		x("POST", "/sync/prestashop/schema", "", `{"base_url":"https://shop.example.com","ws_key":"k"}`, nil),
		x("GET", "/export/items", fx.readKey, "", nil),
		x("HEAD", "/export/items", fx.readKey, "", nil),
		x("GET", "/export/items/"+item, fx.readKey, "", nil),
		x("HEAD", "/export/items/"+item, fx.readKey, "", nil),
		x("POST", "/export/items/"+item+"/sales/confirm", fx.writeKey, sale, idem("oa-x-confirm-"+code)),
		x("POST", "/export/items/"+item+"/sales/cancel", fx.writeKey, sale, idem("oa-x-cancel-"+code)),
	}
	for i := range xs {
		xs[i].status, xs[i].code = status, code
	}
	return xs
}

// proxied are the exchanges of everyOperation that reach a service.
func proxied(xs []exchange) []exchange {
	return slices.DeleteFunc(xs, func(x exchange) bool { return strings.HasPrefix(x.path, "/health") })
}

// checkUnread: a request whose head cannot be trusted is refused before
// any route is taken (400 bad_request), on every operation alike, as is
// another HTTP version (400 http_version_not_supported).
func checkUnread(t *testing.T, c contract, s *stack, fx fixture) {
	folded := func(method, path, key, body string, header map[string]string) exchange {
		return exchange{method: method, path: path, key: key, body: body, header: header, raw: rawFolded}
	}
	c.doAll(t, s, everyOperation(fx, "s1-0", 400, "bad_request", folded))
	versioned := func(method, path, key, body string, header map[string]string) exchange {
		return exchange{method: method, path: path, key: key, body: body, header: header, raw: rawVersion}
	}
	c.doAll(t, s, everyOperation(fx, "s1-0", 400, "http_version_not_supported", versioned))
}

// checkInternalError: a service that meets a database error it has no
// better answer for (here its table gone, as under a migration that
// renamed it before the binaries that read the new name were deployed)
// answers 500 internal_error.
func checkInternalError(t *testing.T, c contract, s *stack, fx fixture, pool *pgxpool.Pool) {
	item := itemOfStatus(t, s, fx, "active")
	rename := func(from, to string) {
		if _, err := pool.Exec(context.Background(), "ALTER TABLE "+from+" RENAME TO "+to); err != nil {
			t.Fatal(err)
		}
	}
	rename("export_items", "export_items_away")
	defer rename("export_items_away", "export_items")
	plain := func(method, path, key, body string, header map[string]string) exchange {
		return exchange{method: method, path: path, key: key, body: body, header: header}
	}
	for _, x := range proxied(everyOperation(fx, item, 500, "internal_error", plain)) {
		if !strings.HasPrefix(x.path, "/sync/") {
			c.do(t, s, x)
		}
	}
}

// checkServicesFailing sends every operation through a gateway of its own
// whose services fail: the request's head never ends (408), the service
// closes the connection unanswered (502) or never answers (504).
func checkServicesFailing(t *testing.T, c contract, s *stack, fx fixture) {
	faulty := faultyService(t)
	g, _ := startGateway(t, s, "EXPORT_READER_URLS="+faulty, "SALES_WRITER_URLS="+faulty, "SHOP_SCHEMA_URLS="+faulty,
		"GATEWAY_READ_TIMEOUT=1s", "UPSTREAM_READ_TIMEOUT=500ms")
	unfinished := func(method, path, key, body string, header map[string]string) exchange {
		return exchange{method: method, path: path, key: key, body: body, header: header, raw: rawUnfinished}
	}
	plain := func(method, path, key, body string, header map[string]string) exchange {
		return exchange{method: method, path: path, key: key, body: body, header: header}
	}
	xs := everyOperation(fx, "slow", 408, "request_timeout", unfinished)
	// shop-schema's other 502s are the shop's: checkShopFailing.
	xs = append(xs, proxied(everyOperation(fx, "dropped", 502, "bad_gateway", plain))...)
	for _, x := range proxied(everyOperation(fx, "slow", 504, "upstream_timeout", plain)) {
		if x.path == "/export/items" {
			x.path += "?cursor=slow"
		}
		if strings.HasPrefix(x.path, "/sync/") {
			x.body = `{"base_url":"https://slow.example.com","ws_key":"k"}`
		}
		xs = append(xs, x)
	}
	c.doAll(t, g, xs)
}

// checkServicesDown sends every operation through a gateway of its own
// whose services refuse connections (503 upstream_unavailable), then stops
// that gateway: while it serves on for GATEWAY_SHUTDOWN_DELAY, its health
// answers 503 unavailable.
func checkServicesDown(t *testing.T, c contract, s *stack, fx fixture) {
	down := "http://" + testenv.RefusingAddr(t)
	g, stop := startGateway(t, s, "EXPORT_READER_URLS="+down, "SALES_WRITER_URLS="+down, "SHOP_SCHEMA_URLS="+down,
		"GATEWAY_SHUTDOWN_DELAY=1m")
	defer stop()
	plain := func(method, path, key, body string, header map[string]string) exchange {
		return exchange{method: method, path: path, key: key, body: body, header: header}
	}
	c.doAll(t, g, proxied(everyOperation(fx, "s1-0", 503, "upstream_unavailable", plain)))
	g.sigterm()
	for deadline := time.Now().Add(30 * time.Second); ; {
		resp, err := healthClient.Get(g.baseURL + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusServiceUnavailable {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the stopping gateway's health did not answer 503 within 30 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	c.do(t, g, exchange{method: "GET", path: "/health", status: 503, code: "unavailable"})
	c.do(t, g, exchange{method: "HEAD", path: "/health", status: 503, code: "unavailable"})
}
