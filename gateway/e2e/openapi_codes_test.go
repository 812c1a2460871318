package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"log"
	bignum "math/big"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/coinexport/export/pkg/testenv"
)

// The shop schema route's failures of a shop, each made by a fake shop
// of its own kind: the paths below the fake shop (startShop) that answer
// as a failing PrestaShop does, a TLS server whose certificate shop-schema
// does not trust, and an address that refuses connections.
const (
	shopDisabledPath = "/disabled" // 503 with PrestaShop's code 22: the webservice is switched off
	shopErrorPath    = "/error"    // 500: the shop's server failed
	shopHTMLPath     = "/html"     // 200 with an HTML page: not the webservice's JSON
	shopHugePath     = "/huge"     // an answer over SHOP_SCHEMA_MAX_RESPONSE_BYTES
	shopSlowPath     = "/slow"     // no answer until SHOP_SCHEMA_TIMEOUT ends the call
)

// shopMaxResponseBytes is the stack's SHOP_SCHEMA_MAX_RESPONSE_BYTES, and
// shopTimeout its SHOP_SCHEMA_TIMEOUT: short, so that shopHugePath and
// shopSlowPath meet them at little cost.
const (
	shopMaxResponseBytes = 64 << 10
	shopTimeout          = 2 * time.Second
)

// serveFailingShop answers the requests of the paths above, and reports
// whether r was one of them.
func serveFailingShop(w http.ResponseWriter, r *http.Request) bool {
	prefix, _, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/")
	switch "/" + prefix {
	case shopDisabledPath:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, `{"errors":[{"code":22,"message":"The PrestaShop webservice is disabled. Please activate it in the PrestaShop Back Office"}]}`)
	case shopErrorPath:
		w.WriteHeader(http.StatusInternalServerError)
		io.WriteString(w, "<html><body>Internal Server Error</body></html>")
	case shopHTMLPath:
		w.Header().Set("Content-Type", "text/html")
		io.WriteString(w, "<html><body>Welcome to our shop</body></html>")
	case shopHugePath:
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"languages":[`+strings.Repeat(`{"id":"1","name":"English","iso_code":"en"},`, shopMaxResponseBytes/40)+`{"id":"1"}]}`)
	case shopSlowPath:
		<-r.Context().Done() // shop-schema gives up at SHOP_SCHEMA_TIMEOUT
	default:
		return false
	}
	return true
}

// untrustedShop is an HTTPS server on loopback whose certificate, made
// here and self-signed, is in no pool shop-schema trusts.
func untrustedShop(t *testing.T) string {
	t.Helper()
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: bignum.NewInt(1), Subject: pkix.Name{CommonName: "untrusted shop"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &priv.PublicKey, priv)
	if err != nil {
		t.Fatal(err)
	}
	srv := testenv.LoopbackServer(t, http.HandlerFunc(serveShop))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // each handshake it fails is the point, not news
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: priv}}}
	srv.StartTLS()
	return srv.URL
}

// checkShopFailing: each way a shop fails has its code, 502, or 504 when
// it is too slow. The slow shop's exchange waits for SHOP_SCHEMA_TIMEOUT
// beside the others, which are sent one at a time: the route lets an
// address have 4 calls in flight.
func checkShopFailing(t *testing.T, c contract, s *stack, shop fakeShop) {
	const path = "/sync/prestashop/schema"
	body := func(base string) string { return `{"base_url":"` + base + `","ws_key":"` + shopKey + `"}` }
	var slow sync.WaitGroup
	slow.Go(func() {
		c.do(t, s, exchange{method: "POST", path: path, body: body(shop.url + shopSlowPath), status: 504, code: "shop_timeout"})
	})
	for _, x := range []exchange{
		{method: "POST", path: path, body: body(shop.url + shopDisabledPath), status: 502, code: "shop_webservice_disabled"},
		{method: "POST", path: path, body: body(shop.url + shopErrorPath), status: 502, code: "shop_unavailable"},
		{method: "POST", path: path, body: body(shop.url + shopHTMLPath), status: 502, code: "shop_bad_response"},
		{method: "POST", path: path, body: body(shop.url + shopHugePath), status: 502, code: "shop_too_large"},
		{method: "POST", path: path, body: body(untrustedShop(t)), status: 502, code: "shop_tls_error"},
		{method: "POST", path: path, body: body("https://" + testenv.RefusingAddr(t)), status: 502, code: "shop_unreachable"},
	} {
		c.do(t, s, x)
	}
	slow.Wait()
}

// checkInProgress: a sale call whose every run finds its Idempotency-Key
// held by a record it can neither read as live nor drop (here an expired
// record that a trigger keeps: as if each run lost its key to another
// request committed meanwhile) answers 409 request_in_progress, and
// writes nothing.
func checkInProgress(t *testing.T, c contract, s *stack, fx fixture, pool *pgxpool.Pool) {
	ctx := context.Background()
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql, args...); err != nil {
			t.Fatal(err)
		}
	}
	exec(`CREATE FUNCTION e2e_keep_stuck_keys() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN IF OLD.idempotency_key LIKE 'oa-stuck-%' THEN RETURN NULL; END IF; RETURN OLD; END $$`)
	defer exec(`DROP FUNCTION e2e_keep_stuck_keys() CASCADE`)
	exec(`CREATE TRIGGER e2e_keep_stuck_keys BEFORE DELETE ON idempotency_records FOR EACH ROW EXECUTE FUNCTION e2e_keep_stuck_keys()`)
	for _, key := range []string{"oa-stuck-confirm", "oa-stuck-cancel"} {
		exec(`INSERT INTO idempotency_records (owner_id, platform_id, idempotency_key, fingerprint, response, expires_at)
			VALUES ($1, 'e2e-market', $2, '\x00', '{}', now() - interval '1 hour')`, fx.owner, key)
	}
	// A key of its own: the fixture's write key has spent most of the
	// sale routes' limit (saleLimit) by now.
	writeKey := addKey(t, pool, fx.owner, ptr("e2e-market"), "sales:write")
	item := "/export/items/" + itemOfStatus(t, s, fx, "active")
	idem := func(k string) map[string]string { return map[string]string{"Idempotency-Key": k} }
	for _, x := range []exchange{
		{method: "POST", path: item + "/sales/confirm", key: writeKey, header: idem("oa-stuck-confirm"),
			body: `{"external_order_id":"oa-stuck"}`, status: 409, code: "request_in_progress"},
		// a cancel that would pass: the sale to cancel is there
		{method: "POST", path: item + "/sales/confirm", key: writeKey, header: idem("oa-held-confirm"),
			body: `{"external_order_id":"oa-held"}`, status: 200},
		{method: "POST", path: item + "/sales/cancel", key: writeKey, header: idem("oa-stuck-cancel"),
			body: `{"external_order_id":"oa-held"}`, status: 409, code: "request_in_progress"},
	} {
		c.do(t, s, x)
	}
	var stuckSold, heldOpen bool
	err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM sales WHERE external_order_id = 'oa-stuck'),
		EXISTS (SELECT 1 FROM sales WHERE external_order_id = 'oa-held' AND canceled_at IS NULL)`).Scan(&stuckSold, &heldOpen)
	if err != nil || stuckSold || !heldOpen {
		t.Errorf("sale oa-stuck written %v, sale oa-held open %v (%v): a call answered request_in_progress must write nothing", stuckSold, heldOpen, err)
	}
}

// checkStoreLocked: a service whose database does not answer within its
// query timeout (EXPORT_READER_QUERY_TIMEOUT, SALES_WRITER_QUERY_TIMEOUT:
// here the items' table locked by a migration's transaction) answers 503
// unavailable, on every keyed operation.
func checkStoreLocked(t *testing.T, c contract, s *stack, fx fixture, pool *pgxpool.Pool) {
	item := itemOfStatus(t, s, fx, "active")
	fx.writeKey = addKey(t, pool, fx.owner, ptr("e2e-market"), "sales:write") // the fixture's has spent most of saleLimit
	ctx := context.Background()
	tx := testenv.InTransaction(t, pool, "LOCK TABLE export_items IN ACCESS EXCLUSIVE MODE")
	defer tx.Rollback(ctx)
	plain := func(method, path, key, body string, header map[string]string) exchange {
		return exchange{method: method, path: path, key: key, body: body, header: header}
	}
	var xs []exchange
	for _, x := range proxied(everyOperation(fx, item, 503, "unavailable", plain)) {
		if !strings.HasPrefix(x.path, "/sync/") { // shop-schema reads no database
			xs = append(xs, x)
		}
	}
	c.doAll(t, s, xs)
}
