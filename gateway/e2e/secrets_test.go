package e2e

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/httpserver"
	"github.com/coinexport/export/pkg/identity"
	"github.com/coinexport/export/pkg/testenv"
)

// shop-schema holds a secret of its own: the gateway signs its calls with
// it, and an identity signed with it, as a compromised shop-schema could
// sign one, is refused 401 by export-reader and sales-writer, which hold
// IDENTITY_SECRET; shop-schema refuses one signed with IDENTITY_SECRET.
// Each refusal stands beside the same call signed with the service's own
// secret, which passes: the secret, nothing else, is refused.
func TestShopSchemaHoldsASecretOfItsOwn(t *testing.T) {
	pool := testenv.Postgres(t)
	fx := newFixture(t, pool)
	s := startStack(t, dsnOf(t, pool), testenv.RedisURL(t))
	shopBody := `{"base_url":"https://127.0.0.1/shop","ws_key":"WSKEY-e2e-0123456789ABCDEFGHIJKLMN"}`
	// Through the gateway: shop-schema verified the identity and answered.
	if status, got, _ := call(t, "POST", s.baseURL+"/sync/prestashop/schema", "", shopBody, nil); status != 400 ||
		got.Error == nil || got.Error.Code != "base_url_not_allowed" {
		t.Fatalf("shop schema through the gateway = %d %+v, want 400 base_url_not_allowed", status, got.Error)
	}

	reader, writer, shop := s.serviceURL(t, "EXPORT_READER_URLS"), s.serviceURL(t, "SALES_WRITER_URLS"), s.serviceURL(t, "SHOP_SCHEMA_URLS")
	read := identity.Identity{OwnerID: fx.owner, KeyID: "e2e-key", Scopes: []string{identity.ScopeExportRead}}
	sell := identity.Identity{OwnerID: fx.owner, PlatformID: "e2e-market", KeyID: "e2e-key", Scopes: []string{identity.ScopeSalesWrite}}
	for _, c := range []struct {
		name, own, other          string
		url, method, target, body string
		id                        identity.Identity
		idempotencyKey            string
		ownStatus                 int
	}{
		{"export-reader", identitySecret, shopSchemaSecret, reader, "GET", "/v1/export/items", "", read, "", 200},
		{"sales-writer", identitySecret, shopSchemaSecret, writer, "POST", "/v1/export/items/e2e-no-such-item/sales/confirm",
			`{"external_order_id":"e2e-secret-1"}`, sell, "e2e-secret-1", 404},
		{"shop-schema", shopSchemaSecret, identitySecret, shop, "POST", "/v1/sync/prestashop/schema", shopBody, identity.Identity{}, "", 400},
	} {
		send := func(secret string) int {
			return sendSigned(t, secret, c.id, c.method, c.url+c.target, c.target, c.body, c.idempotencyKey)
		}
		if got := send(c.own); got != c.ownStatus {
			t.Errorf("%s %s to %s signed with its own secret = %d, want %d", c.method, c.target, c.name, got, c.ownStatus)
		}
		if got := send(c.other); got != http.StatusUnauthorized {
			t.Errorf("%s %s to %s signed with the other secret = %d, want 401", c.method, c.target, c.name, got)
		}
	}
}

// serviceURL is the URL of the service the stack's gateway reaches
// through its setting urlsVar (one instance).
func (s *stack) serviceURL(t *testing.T, urlsVar string) string {
	t.Helper()
	for _, kv := range s.upstreams {
		if name, value, _ := strings.Cut(kv, "="); name == urlsVar {
			return value
		}
	}
	t.Fatalf("the stack's gateway has no %s", urlsVar)
	return ""
}

// sendSigned sends method to url (whose path and query are target) with
// body and, if not "", an Idempotency-Key, the identity id signed with
// secret for it as the gateway signs one, and returns the status.
func sendSigned(t *testing.T, secret string, id identity.Identity, method, url, target, body, idempotencyKey string) int {
	t.Helper()
	signer, err := identity.NewSigner(secret)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if idempotencyKey != "" {
		req.Header.Set("Idempotency-Key", idempotencyKey)
	}
	id.RequestID = httpserver.RandomRequestID()
	signer.SignInto(func(name string, value []byte) { req.Header.Set(name, string(value)) }, id,
		identity.Request{Method: method, Target: target, IdempotencyKey: idempotencyKey}, time.Now())
	// Not kept alive: a connection left open to export-reader or
	// sales-writer made the stack's stop wait out its stop delay (3 s).
	req.Close = true
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}
