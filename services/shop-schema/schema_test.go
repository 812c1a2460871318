package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/envelope"
	"github.com/coinexport/export/pkg/httpserver"
	"github.com/coinexport/export/pkg/identity"
	"github.com/coinexport/export/pkg/logging"
	"github.com/coinexport/export/pkg/testenv"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/coinexport/export/services/shop-schema/internal/fakeshop"
	"github.com/coinexport/export/services/shop-schema/internal/guard"
	"github.com/coinexport/export/services/shop-schema/internal/prestashop"
	"github.com/coinexport/export/services/shop-schema/internal/shopschema"
)

const testSecret = "0123456789abcdef0123456789abcdef-shop-schema"

// service is the shop-schema service under test, reached over loopback
// HTTP with a signed anonymous identity, as the gateway would call it.
type service struct {
	url    string
	signer *identity.Signer
	logs   *testenv.Output
	spans  *tracetest.SpanRecorder
	// metrics is the registry the service's /metrics serves.
	metrics *prometheus.Registry
	// cutOff cancels every request in flight with its cause, as
	// httpserver.Server.Run does with ErrCutOff when its drain times out.
	cutOff context.CancelCauseFunc
}

// startService starts the service trusting shop's CA and, unless the
// allow-list is given, allowing 127.0.0.1 through the guard.
func startService(t *testing.T, shop *fakeshop.Shop, env map[string]string) *service {
	t.Helper()
	return startServiceWith(t, shop, env, net.DefaultResolver)
}

// startServiceWith is startService with resolver as the service's DNS.
func startServiceWith(t *testing.T, shop *fakeshop.Shop, env map[string]string, resolver guard.Resolver) *service {
	t.Helper()
	vars := map[string]string{
		"IDENTITY_SECRET":         testSecret,
		"SHOP_SCHEMA_ALLOW_HOSTS": "127.0.0.1",
		"SHOP_SCHEMA_TIMEOUT":     "5s",
		"LOG_LEVEL":               "debug",
	}
	if shop != nil {
		caFile := filepath.Join(t.TempDir(), "ca.pem")
		if err := os.WriteFile(caFile, shop.CAPEM(), 0o600); err != nil {
			t.Fatal(err)
		}
		vars["SHOP_SCHEMA_CA_FILE"] = caFile
	}
	for k, v := range env {
		vars[k] = v
	}
	cfg, err := loadConfig(func(k string) string { return vars[k] })
	if err != nil {
		t.Fatal(err)
	}
	logs := &testenv.Output{}
	spans := tracetest.NewSpanRecorder()
	// Sampled whatever the server span is: a test that ran the service's
	// run has left a global provider whose spans are not.
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	srv, err := newServer(cfg, logging.New(logs, cfg.LogLevel, "shop-schema"), tp, resolver)
	if err != nil {
		t.Fatal(err)
	}
	base, cutOff := context.WithCancelCause(context.Background())
	t.Cleanup(func() { cutOff(nil) })
	ts := httptest.NewUnstartedServer(srv.Handler())
	ts.Config.BaseContext = func(net.Listener) context.Context { return base }
	ts.Start()
	t.Cleanup(ts.Close)
	signer, _ := identity.NewSigner(testSecret)
	return &service{url: ts.URL, signer: signer, logs: logs, spans: spans, metrics: srv.Registry(), cutOff: cutOff}
}

// post sends body as application/json to the route and decodes the
// envelope.
func (s *service) post(t *testing.T, body string) (int, envelope.Parsed) {
	t.Helper()
	return s.postAs(t, "application/json", body)
}

// postAs is post with another Content-Type; "" sends none.
func (s *service) postAs(t *testing.T, contentType, body string) (int, envelope.Parsed) {
	t.Helper()
	return s.postWithQuery(t, contentType, "", body)
}

// postWithQuery is postAs with a query string ("" for none) in the URL.
func (s *service) postWithQuery(t *testing.T, contentType, query, body string) (int, envelope.Parsed) {
	t.Helper()
	status, _, env := s.send(t, contentType, query, body)
	return status, env
}

// postForHeaders is post that also returns the answer's headers.
func (s *service) postForHeaders(t *testing.T, body string) (int, http.Header, envelope.Parsed) {
	t.Helper()
	return s.send(t, "application/json", "", body)
}

// send posts body to the route, signed, and decodes the envelope.
func (s *service) send(t *testing.T, contentType, query, body string) (int, http.Header, envelope.Parsed) {
	t.Helper()
	return s.sendWith(t, http.Header{"Content-Type": {contentType}}, query, body)
}

// sendWith is send with the request's headers ("" values are not sent).
func (s *service) sendWith(t *testing.T, headers http.Header, query, body string) (int, http.Header, envelope.Parsed) {
	t.Helper()
	target := s.url + "/v1/sync/prestashop/schema"
	if query != "" {
		target += "?" + query
	}
	req, _ := http.NewRequest(http.MethodPost, target, strings.NewReader(body))
	for name, values := range headers {
		if len(values) > 0 && values[0] != "" {
			req.Header[name] = values
		}
	}
	for _, h := range s.signer.Sign(identity.Identity{RequestID: "req-" + t.Name()}, identity.RequestOf(req), time.Now()) {
		req.Header.Set(h.Name, h.Value)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var env envelope.Parsed
	if err := json.Unmarshal(raw, &env); err != nil {
		t.Fatalf("answer is not an envelope: %v: %s", err, raw)
	}
	if env.Meta.RequestID != "req-"+t.Name() || resp.Header.Get("X-Request-Id") != env.Meta.RequestID {
		t.Errorf("meta.request_id = %q, X-Request-Id = %q, want the signed request id", env.Meta.RequestID, resp.Header.Get("X-Request-Id"))
	}
	return resp.StatusCode, resp.Header, env
}

func body(baseURL, key string) string {
	b, _ := json.Marshal(map[string]string{"base_url": baseURL, "ws_key": key})
	return string(b)
}

func errCode(env envelope.Parsed) string {
	if env.Error == nil {
		return "(none)"
	}
	return env.Error.Code
}

// wantSample is the answer for fakeshop.Sample, whatever the version.
func wantSample() shopschema.Result {
	n := func(en, ru, uk string) shopschema.Names {
		return shopschema.Names{"ENG": en, "RUS": ru, "UKR": uk}
	}
	return shopschema.Result{
		Languages: []shopschema.Language{
			{ID: 1, ISOCode: "en", Active: true, ContentLanguage: "ENG"},
			{ID: 2, ISOCode: "ru", Active: true, ContentLanguage: "RUS"},
			{ID: 3, ISOCode: "uk", Active: true, ContentLanguage: "UKR"},
		},
		Categories: []shopschema.Category{
			{ID: 1, ParentID: 0, Name: "Root", Names: n("Root", "Корень", "Корінь"), Active: true},
			{ID: 2, ParentID: 1, Name: "Home", Names: n("Home", "Главная", "Головна"), Active: true, LevelDepth: 1, IsRootCategory: true},
			{ID: 3, ParentID: 2, Name: "Banknotes", Names: n("Banknotes", "Банкноты", "Банкноти"), Active: true, LevelDepth: 2},
			{ID: 9, ParentID: 2, Name: "Coins/Medals", Names: n("Coins/Medals", "Монеты", "Монети"), LevelDepth: 2, Position: 1},
		},
		Features: []shopschema.Feature{
			{ID: 1, Name: "Metal", Names: n("Metal", "Металл", "Метал"), Values: []shopschema.Value{
				{ID: 1, Name: "Silver", Names: n("Silver", "Серебро", "Срібло")},
				{ID: 2, Name: "Gold", Names: n("Gold", "Золото", "Золото")},
			}},
			{ID: 2, Name: "Country", Names: n("Country", "Страна", "Країна"), Position: 1, Values: []shopschema.Value{
				{ID: 7, Name: "Ukraine", Names: n("Ukraine", "Украина", "Україна")},
			}},
			{ID: 5, Name: "Empty", Names: n("Empty", "Пусто", "Порожньо"), Position: 2, Values: []shopschema.Value{}},
		},
	}
}

// readSchema starts shop and a service in front of it, and returns the
// schema the service reads from it, which must be a 200.
func readSchema(t *testing.T, shop *fakeshop.Shop) shopschema.Result {
	t.Helper()
	shop.Start(t.Cleanup)
	svc := startService(t, shop, nil)
	status, env := svc.post(t, body(shop.URL(), fakeshop.Key))
	if status != http.StatusOK {
		t.Fatalf("POST schema = %d %s, want 200", status, errCode(env))
	}
	return decodeResult(t, env)
}

func decodeResult(t *testing.T, env envelope.Parsed) shopschema.Result {
	t.Helper()
	var r shopschema.Result
	if err := json.Unmarshal(env.Data, &r); err != nil {
		t.Fatalf("data is not a schema: %v", err)
	}
	return r
}

func TestSchemaVersions(t *testing.T) {
	tests := []struct {
		version     string
		nativeInts  bool
		wantVersion string
	}{
		{"1.7", false, "1.7.8.10"},
		{"8", false, "8.2.1"},
		{"8", true, "8.2.1"},
		{"9", false, "9.0.3"},
		{"9", true, "9.0.3"},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s native=%v", tt.version, tt.nativeInts), func(t *testing.T) {
			shop := fakeshop.Sample(tt.version, tt.nativeInts)
			got := readSchema(t, shop)
			if got.ShopVersion != tt.wantVersion {
				t.Errorf("shop_version = %q, want %q", got.ShopVersion, tt.wantVersion)
			}
			got.ShopVersion = ""
			if diff := cmp.Diff(wantSample(), got); diff != "" {
				t.Errorf("schema mismatch (-want +got):\n%s", diff)
			}
			for _, r := range shop.Requests() {
				if strings.Contains(r, "ws_key") || strings.Contains(r, fakeshop.Key) {
					t.Errorf("shop saw the key in a URL: %s", r)
				}
				// Lists only, as JSON, sorted and paged: not the resource index
				// /api/ (500 on 8 and 9), not one object (8 and 9 drop its falsy
				// fields), not ?schema= (a description, not data).
				if !listRequest.MatchString(r) {
					t.Errorf("shop was asked %s, want a paged JSON list of one of the four resources", r)
				}
			}
			for _, ua := range shop.UserAgents() {
				if ua != prestashop.UserAgent {
					t.Errorf("shop saw User-Agent %q, want %q (Go's default is refused by some hosts)", ua, prestashop.UserAgent)
				}
			}
		})
	}
}

// listRequest is a request of a list page (reference §2, §4.3, §4.4).
var listRequest = regexp.MustCompile(`^/api/(languages|categories|product_features|product_feature_values)\?output_format=JSON&display=(full|\[[a-z_,]+\])&sort=\[id_ASC\]&limit=[0-9]+,[0-9]+(&filter\[custom\]=0)?$`)

func TestSchemaShopQuirks(t *testing.T) {
	tests := []struct {
		name  string
		setup func(s *fakeshop.Shop)
		env   map[string]string
	}{
		{"subfolder", func(s *fakeshop.Shop) { s.Prefix = "/shop/prestashop" }, nil},
		{"no rewrite: dispatcher.php fallback", func(s *fakeshop.Shop) { s.NoRewrite = true; s.Prefix = "/ps" }, nil},
		// Without the rewrite rule, /api/ is a front-office page, which
		// PrestaShop answers 503 in maintenance mode and 403 to a country
		// the shop restricts; the webservice answers all the same.
		{"no rewrite, shop in maintenance: dispatcher.php fallback", func(s *fakeshop.Shop) {
			s.NoRewrite, s.FrontOfficeStatus = true, http.StatusServiceUnavailable
		}, nil},
		{"no rewrite, caller's country restricted: dispatcher.php fallback", func(s *fakeshop.Shop) {
			s.NoRewrite, s.FrontOfficeStatus = true, http.StatusForbidden
		}, nil},
		{"field lists refused: display=full fallback", func(s *fakeshop.Shop) { s.RejectFieldLists = true }, nil},
		{"small pages", func(s *fakeshop.Shop) {}, map[string]string{"SHOP_SCHEMA_PAGE_SIZE": "1"}},
		{"shop ignores limit", func(s *fakeshop.Shop) { s.IgnoreLimit = true }, map[string]string{"SHOP_SCHEMA_PAGE_SIZE": "2"}},
		{"redirect within the shop", moveShop, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			shop := fakeshop.Sample("8", false)
			tt.setup(shop)
			shop.Start(t.Cleanup)
			svc := startService(t, shop, tt.env)
			base := shop.URL()
			if tt.name == "redirect within the shop" {
				base = strings.Replace(base, "/new", "/old", 1)
			}
			status, env := svc.post(t, body(base, fakeshop.Key))
			if status != http.StatusOK {
				t.Fatalf("POST schema = %d %s, want 200", status, errCode(env))
			}
			got := decodeResult(t, env)
			got.ShopVersion = ""
			if diff := cmp.Diff(wantSample(), got); diff != "" {
				t.Errorf("schema mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// A query parameter is refused before anything else, and the shop is not
// called: the route reads none, and a ws_key there belongs in the body.
func TestSchemaRefusesQueryParameters(t *testing.T) {
	shop := fakeshop.Sample("1.7", false)
	shop.Start(t.Cleanup)
	svc := startService(t, shop, nil)
	for _, query := range []string{"ws_key=" + fakeshop.Key, "dry_run=1", "x"} {
		status, env := svc.postWithQuery(t, "application/json", query, body(shop.URL(), fakeshop.Key))
		if status != http.StatusBadRequest || errCode(env) != "invalid_parameter" {
			t.Errorf("POST schema?%s = %d %s, want 400 invalid_parameter", query, status, errCode(env))
		}
		if env.Error != nil && (!strings.Contains(env.Error.Message, "JSON body") || strings.Contains(env.Error.Message, fakeshop.Key)) {
			t.Errorf("error message %q: want it to point at the JSON body, without the key", env.Error.Message)
		}
	}
	if n := shop.Connections(); n != 0 {
		t.Errorf("shop accepted %d connections, want 0", n)
	}
}

func TestSchemaEmptyShop(t *testing.T) {
	shop := &fakeshop.Shop{Version: "9", Languages: []fakeshop.Lang{{ID: 1, ISO: "en", Active: true}}}
	shop.Start(t.Cleanup)
	// Mid-rotation (README, "Rotating IDENTITY_SECRET"): the request is
	// signed with the previous secret (svc.signer), as a gateway not yet
	// replaced signs it.
	svc := startService(t, shop, map[string]string{"IDENTITY_SECRET": testSecret + "-rotated", "IDENTITY_SECRET_PREVIOUS": testSecret})
	status, env := svc.post(t, body(shop.URL(), fakeshop.Key))
	if status != http.StatusOK {
		t.Fatalf("POST schema = %d %s, want 200", status, errCode(env))
	}
	if !bytes.Contains(env.Data, []byte(`"categories":[]`)) || !bytes.Contains(env.Data, []byte(`"features":[]`)) {
		t.Errorf("data = %s, want empty categories and features arrays", env.Data)
	}
}

// PrestaShop answers 200 with an empty body when json_encode fails on a
// text of the shop that is not valid UTF-8: an answer of the webservice,
// told apart from a page that is not JSON, and not a sign that /api/ is
// not the webservice (dispatcher.php, blocked on some hosts, would then
// have its answer taken for the shop's).
func TestSchemaEmptyAnswer(t *testing.T) {
	shop := fakeshop.Sample("8", false)
	shop.Unencodable = map[string]bool{"categories": true}
	shop.Start(t.Cleanup)
	svc := startService(t, shop, nil)
	status, env := svc.post(t, body(shop.URL(), fakeshop.Key))
	if status != http.StatusBadGateway || errCode(env) != "shop_bad_response" {
		t.Fatalf("POST schema = %d %s, want 502 shop_bad_response", status, errCode(env))
	}
	if want := "categories: the shop's answer is empty"; !strings.HasPrefix(env.Error.Message, want) {
		t.Errorf("message = %q, want it to start with %q", env.Error.Message, want)
	}
	for _, r := range shop.Requests() {
		if strings.Contains(r, "dispatcher.php") {
			t.Errorf("the shop was asked %s: an empty answer came from the webservice at /api/", r)
		}
	}
}

func TestSchemaSingleLanguageShop(t *testing.T) {
	shop := fakeshop.Sample("1.7", false)
	shop.Languages[1].Active = false
	shop.Languages[2].Active = false
	got := readSchema(t, shop)
	want := shopschema.Category{ID: 2, ParentID: 1, Name: "Home", Names: shopschema.Names{"ENG": "Home"}, Active: true, LevelDepth: 1, IsRootCategory: true}
	if diff := cmp.Diff(want, got.Categories[1]); diff != "" {
		t.Errorf("category 2 from plain-string names (-want +got):\n%s", diff)
	}
}

// TestSchemaLanguagesNotPermitted: a key refused languages, with no
// permission on them (401 code 26) or with others than GET (405 code 25),
// still reads the schema, without names per language.
func TestSchemaLanguagesNotPermitted(t *testing.T) {
	refusals := map[string]func(*fakeshop.Shop){
		"no permission (401 code 26)": func(s *fakeshop.Shop) { s.DeniedResources = map[string]bool{"languages": true} },
		"not GET (405 code 25)":       func(s *fakeshop.Shop) { s.GetDenied = map[string]bool{"languages": true} },
	}
	for name, refuse := range refusals {
		t.Run(name, func(t *testing.T) {
			shop := fakeshop.Sample("8", false)
			refuse(shop)
			got := readSchema(t, shop)
			if got.Categories[1].Name != "Home" || got.Categories[1].Names != nil {
				t.Errorf("category 2 = %+v, want name Home (first language) and no names", got.Categories[1])
			}
		})
	}
}

func TestSchemaValueCap(t *testing.T) {
	shop := fakeshop.Sample("8", true)
	for i := 0; i < 5003; i++ {
		shop.Values = append(shop.Values, fakeshop.Value{ID: 1000 + i, FeatureID: 5, Names: map[int]string{1: fmt.Sprint("v", i)}})
	}
	// Feature 2 gets exactly the limit: one shared value of the sample's
	// and 4999 more (its custom value is not shared and does not count).
	for i := 0; i < 4999; i++ {
		shop.Values = append(shop.Values, fakeshop.Value{ID: 10000 + i, FeatureID: 2, Names: map[int]string{1: fmt.Sprint("c", i)}})
	}
	shop.Start(t.Cleanup)
	// ~10,000 values take 0.6 s, but 5 s (startService's timeout) under
	// -race on two busy cores: this test is not about the timeout.
	svc := startService(t, shop, map[string]string{"SHOP_SCHEMA_PAGE_SIZE": "1000", "SHOP_SCHEMA_TIMEOUT": "60s"})
	status, env := svc.post(t, body(shop.URL(), fakeshop.Key))
	if status != http.StatusOK {
		t.Fatalf("POST schema = %d %s, want 200", status, errCode(env))
	}
	got := decodeResult(t, env)
	f := got.Features[2]
	if len(f.Values) != 5000 || !f.ValuesTruncated || f.Values[4999].ID != 5999 {
		t.Errorf("feature 5: %d values, truncated %v, want 5000 (ids 1000..5999), truncated true", len(f.Values), f.ValuesTruncated)
	}
	if got.Features[0].ValuesTruncated {
		t.Errorf("feature 1 values_truncated = true, want false")
	}
	if f := got.Features[1]; f.ID != 2 || len(f.Values) != 5000 || f.ValuesTruncated {
		t.Errorf("feature %d: %d values, truncated %v, want feature 2 with all 5000, truncated false", f.ID, len(f.Values), f.ValuesTruncated)
	}
}

func TestSchemaShopErrors(t *testing.T) {
	tests := []struct {
		name       string
		setup      func(s *fakeshop.Shop)
		key        string
		env        map[string]string
		wantStatus int
		wantCode   string
	}{
		{"wrong key", nil, "ZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZ", nil, 400, "shop_401"},
		{"malformed key", nil, "short", nil, 400, "shop_401"},
		{"authorization header lost (plain-text 401)", func(s *fakeshop.Shop) { s.DropAuth = true }, "", nil, 400, "shop_401"},
		{"resource not permitted", func(s *fakeshop.Shop) { s.DeniedResources = map[string]bool{"product_feature_values": true} }, "", nil, 400, "shop_401"},
		{"GET not permitted, other methods are (405 code 25)", func(s *fakeshop.Shop) { s.GetDenied = map[string]bool{"categories": true} }, "", nil, 400, "shop_401"},
		{"key not for this shop (403 code 132)", func(s *fakeshop.Shop) { s.WrongShop = true }, "", nil, 400, "shop_403"},
		{"webservice disabled (503 code 22)", func(s *fakeshop.Shop) { s.Disabled = true }, "", nil, 502, "shop_webservice_disabled"},
		{"PHP warning (500)", func(s *fakeshop.Shop) { s.ServerError = true }, "", nil, 502, "shop_unavailable"},
		{"HTML instead of JSON", func(s *fakeshop.Shop) { s.HTML = true }, "", nil, 502, "shop_bad_response"},
		{"no webservice at all", func(s *fakeshop.Shop) { s.Prefix = "/elsewhere" }, "", nil, 502, "shop_not_found"},
		{"server down: a 503 page at every path", func(s *fakeshop.Shop) { s.ErrorPage = http.StatusServiceUnavailable }, "", nil, 502, "shop_unavailable"},
		// /api's page switches the call to dispatcher.php, in case /api is
		// the front office's; where a host blocks dispatcher.php, its 404
		// says nothing of the webservice behind /api, which answered.
		{"server down, dispatcher.php blocked", func(s *fakeshop.Shop) {
			s.ErrorPage, s.DispatcherBlocked = http.StatusServiceUnavailable, true
		}, "", nil, 502, "shop_unavailable"},
		{"a firewall's 403 page, dispatcher.php blocked", func(s *fakeshop.Shop) {
			s.ErrorPage, s.DispatcherBlocked = http.StatusForbidden, true
		}, "", nil, 400, "shop_403"},
		{"slow shop", func(s *fakeshop.Shop) { s.Delay = 3 * time.Second }, "", map[string]string{"SHOP_SCHEMA_TIMEOUT": "300ms", "SHOP_SCHEMA_CONNECT_TIMEOUT": "300ms"}, 504, "shop_timeout"},
		{"oversized answer", func(s *fakeshop.Shop) { s.Oversize = 200 << 10 }, "", map[string]string{"SHOP_SCHEMA_MAX_RESPONSE_BYTES": "65536"}, 502, "shop_too_large"},
		// Each answer under its cap (64 KiB), four of them over the call's.
		{"answers too large together", func(s *fakeshop.Shop) { s.Oversize = 40 << 10 }, "",
			map[string]string{"SHOP_SCHEMA_MAX_RESPONSE_BYTES": "65536", "SHOP_SCHEMA_MAX_CALL_BYTES": "100000"}, 502, "shop_too_large"},
		{"too many rows", nil, "", map[string]string{"SHOP_SCHEMA_MAX_ROWS": "3", "SHOP_SCHEMA_PAGE_SIZE": "2"}, 502, "shop_too_large"},
		// Reached, and answered badly: not shop_unreachable, which sends the
		// merchant to check DNS and firewalls.
		{"answer headers over 64 KiB", func(s *fakeshop.Shop) { s.HeaderPadding = 100 << 10 }, "", nil, 502, "shop_too_large"},
		{"answer cut short", func(s *fakeshop.Shop) { s.CutShort = true }, "", nil, 502, "shop_bad_response"},
		{"redirect to http", func(s *fakeshop.Shop) {
			s.Redirect = func(r *http.Request) string { return "http://127.0.0.1:1/api/x" }
		}, "", nil, 502, "shop_bad_response"},
		{"certificate not trusted", nil, "", map[string]string{"SHOP_SCHEMA_CA_FILE": ""}, 502, "shop_tls_error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			shop := fakeshop.Sample("8", false)
			if tt.setup != nil {
				tt.setup(shop)
			}
			shop.Start(t.Cleanup)
			svc := startService(t, shop, tt.env)
			key := tt.key
			if key == "" {
				key = fakeshop.Key
			}
			base := shop.URL()
			if tt.name == "no webservice at all" {
				base = strings.TrimSuffix(base, shop.Prefix) // the shop is elsewhere
			}
			status, env := svc.post(t, body(base, key))
			if status != tt.wantStatus || errCode(env) != tt.wantCode {
				t.Errorf("POST schema = %d %s, want %d %s", status, errCode(env), tt.wantStatus, tt.wantCode)
			}
			if env.Error != nil && strings.Contains(env.Error.Message, "Webservice") {
				t.Errorf("error message %q echoes the shop's body", env.Error.Message)
			}
			if got := logLine(t, svc.logs, "shop call failed")["shop_host"]; got != "127.0.0.1" {
				t.Errorf(`"shop call failed" shop_host = %v, want 127.0.0.1`, got)
			}
			spans := clientSpans(svc.spans.Ended())
			checkSpanVocabulary(t, spans)
			// Too many rows is a fact of the whole resource, not of one
			// request: no shop request failed.
			named := tt.name == "too many rows"
			for _, s := range spans {
				named = named || s.errorType == tt.wantCode
			}
			if !named {
				t.Errorf("no span has error.type %s: %+v", tt.wantCode, spans)
			}
		})
	}
}

// Pages at /api that dispatcher.php, behind the same server, would answer
// alike send no request there. A 401 without a PrestaShop error code is the
// webservice's answer to a request that reached it without the key (a
// plain-text page): dispatcher.php would not get the key either. A 5xx page
// other than 503 (the front office's in maintenance mode) is a server
// failing, a gateway's 502 or 504: asked again, it cost the rest of the
// call's budget when it came slowly, and shop_unavailable became
// shop_timeout.
func TestPagesNotAskedOfDispatcher(t *testing.T) {
	for _, tt := range []struct {
		name       string
		setup      func(*fakeshop.Shop)
		wantStatus int
		wantCode   string
	}{
		{"authorization header lost (plain-text 401)", func(s *fakeshop.Shop) { s.DropAuth = true }, 400, "shop_401"},
		{"a gateway's 502 page", func(s *fakeshop.Shop) { s.ErrorPage = http.StatusBadGateway }, 502, "shop_unavailable"},
		{"a gateway's 504 page", func(s *fakeshop.Shop) { s.ErrorPage = http.StatusGatewayTimeout }, 502, "shop_unavailable"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			shop := fakeshop.Sample("8", false)
			tt.setup(shop)
			shop.Start(t.Cleanup)
			svc := startService(t, shop, nil)
			if status, env := svc.post(t, body(shop.URL(), fakeshop.Key)); status != tt.wantStatus || errCode(env) != tt.wantCode {
				t.Errorf("POST schema = %d %s, want %d %s", status, errCode(env), tt.wantStatus, tt.wantCode)
			}
			for _, r := range shop.Requests() {
				if strings.Contains(r, "dispatcher.php") {
					t.Errorf("the shop was asked %s", r)
				}
			}
		})
	}
}

func TestSchemaUnreachable(t *testing.T) {
	addr := testenv.RefusingAddr(t) // nothing listens there
	svc := startService(t, nil, nil)
	status, env := svc.post(t, body("https://"+addr, fakeshop.Key))
	if status != http.StatusBadGateway || errCode(env) != "shop_unreachable" {
		t.Errorf("POST schema to a closed port = %d %s, want 502 shop_unreachable", status, errCode(env))
	}
	if got := logLine(t, svc.logs, "shop call failed")["shop_host"]; got != "127.0.0.1" {
		t.Errorf(`"shop call failed" shop_host = %v, want 127.0.0.1`, got)
	}
}

// A connection to the shop that this process cannot open, out of file
// descriptors or memory, is the service's shortage, not the shop's fault:
// 503 unavailable with Retry-After, and an ERROR that says so. It was 502
// shop_unreachable ("the shop could not be reached"), which sends the
// merchant to check its DNS and firewall and the SRE to the shop (its WARN
// "shop call failed" named the shop's host), while the shortage that needs
// acting on was ours. A shop given by name is looked up first, and the
// lookup is what fails then, by the guard's check or as it is dialled (a
// name allowed by the operator): that was 502 shop_unreachable "the
// shop's host name could not be resolved (DNS failed)", and "the shop
// could not be reached", until the resolver's error, which keeps the
// socket's as text alone, was read for the shortage.
func TestOutOfDescriptorsTheShopIsNotBlamed(t *testing.T) {
	// No lookup leaves the machine: the resolver's socket is to a closed
	// loopback port, and it cannot be opened anyway.
	dnsServer := testenv.RefusingAddr(t)
	loopbackDNS := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", dnsServer)
	}}
	for _, tt := range []struct {
		name, shop string
		env        map[string]string
	}{
		{"by its address", "https://" + testenv.RefusingAddr(t), nil},
		{"by a name the guard looks up", "https://shop.test", nil},
		{"by a name allowed, looked up as it is dialled", "https://shop.test", map[string]string{"SHOP_SCHEMA_ALLOW_HOSTS": "shop.test"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			svc := startServiceWith(t, nil, tt.env, loopbackDNS)
			if status, _ := svc.post(t, `{}`); status != http.StatusBadRequest { // a kept-alive connection to send on
				t.Fatalf("POST {} = %d, want 400", status)
			}
			testenv.ExhaustDescriptors(t)
			status, headers, env := svc.send(t, "application/json", "", body(tt.shop, fakeshop.Key))
			checkShortageAnswered(t, svc, syscall.EMFILE, status, headers, env)
		})
	}
}

// Our local ports running out (EADDRNOTAVAIL: every ephemeral port to
// that address in use or in TIME_WAIT) is this process's shortage too, not
// the shop's fault: it was 502 shop_unreachable, which sent the merchant
// to check DNS and firewalls. A shop's connect cannot be made to fail so
// over loopback alone, and transportError's case is
// TestOurLocalPortsRunningOutIsAShortage; here the lookup of the shop's
// name fails so, its socket to the DNS server refused a port, as the
// resolver reports it (the errno's text alone).
func TestOutOfLocalPortsTheShopIsNotBlamed(t *testing.T) {
	noPort := &net.Resolver{PreferGo: true, Dial: func(_ context.Context, network, address string) (net.Conn, error) {
		return nil, &net.OpError{Op: "dial", Net: network, Err: os.NewSyscallError("connect", syscall.EADDRNOTAVAIL)}
	}}
	for _, tt := range []struct {
		name string
		env  map[string]string
	}{
		{"by a name the guard looks up", nil},
		{"by a name allowed, looked up as it is dialled", map[string]string{"SHOP_SCHEMA_ALLOW_HOSTS": "shop.test"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			svc := startServiceWith(t, nil, tt.env, noPort)
			status, headers, env := svc.send(t, "application/json", "", body("https://shop.test", fakeshop.Key))
			checkShortageAnswered(t, svc, syscall.EADDRNOTAVAIL, status, headers, env)
		})
	}
}

// checkShortageAnswered checks a schema read answered for a shortage of
// ours: 503 unavailable, its ERROR naming the shortage, errno's text
// (EMFILE's: nofile, not memory, is to raise), and no span blaming the shop.
func checkShortageAnswered(t *testing.T, svc *service, errno syscall.Errno, status int, headers http.Header, env envelope.Parsed) {
	t.Helper()
	if status != http.StatusServiceUnavailable || errCode(env) != "unavailable" || headers.Get("Retry-After") != "1" {
		t.Errorf("POST schema short of %v = %d %s (Retry-After %q), want 503 unavailable with Retry-After: 1\n%s",
			errno, status, errCode(env), headers.Get("Retry-After"), svc.logs)
	}
	line := logLine(t, svc.logs, "shop schema read failed: this process is out of file descriptors, memory or local ports")
	if line["level"] != "ERROR" {
		t.Errorf("no ERROR saying the process is short of %v:\n%s", errno, svc.logs)
	}
	if msg, _ := line["error"].(string); !strings.Contains(msg, errno.Error()) {
		t.Errorf("the ERROR's error = %q, want it to name the shortage (%q)", msg, errno.Error())
	}
	for _, s := range svc.spans.Ended() { // the shop request's span says it too
		for _, a := range s.Attributes() {
			if v := a.Value.String(); strings.HasPrefix(v, "shop_") && (a.Key == "error.type" || a.Key == "app.cancel_cause") {
				t.Errorf("span %q: %s = %s, a shop's fault", s.Name(), a.Key, v)
			}
		}
	}
}

// TestSchemaUnresolvable: a name DNS says does not exist is the caller's
// address to fix (400 invalid_base_url); a lookup that fails otherwise is
// shop_unreachable, and the warning that says why names the host as the
// guard spelled it (ASCII), as the outcome line does.
func TestSchemaUnresolvable(t *testing.T) {
	svc := startServiceWith(t, nil, nil, fakeshop.Resolver{}) // resolves nothing, asks no DNS server
	status, env := svc.post(t, body("https://nxdomain.example.com/shop", fakeshop.Key))
	if status != http.StatusBadRequest || errCode(env) != "invalid_base_url" {
		t.Errorf("POST schema for a name that does not exist = %d %s, want 400 invalid_base_url", status, errCode(env))
	}

	svc = startServiceWith(t, nil, nil, fakeshop.FailingResolver{})
	status, env = svc.post(t, body("https://bücher.example.com/shop", fakeshop.Key))
	if status != http.StatusBadGateway || errCode(env) != "shop_unreachable" {
		t.Fatalf("POST schema while DNS fails = %d %s, want 502 shop_unreachable", status, errCode(env))
	}
	for _, msg := range []string{"shop call failed", "shop schema refused"} {
		if got := logLine(t, svc.logs, msg)["shop_host"]; got != "xn--bcher-kva.example.com" {
			t.Errorf("%q shop_host = %v, want xn--bcher-kva.example.com", msg, got)
		}
	}
}

// logLine returns the first JSON log line whose msg is msg.
func logLine(t *testing.T, logs *testenv.Output, msg string) map[string]any {
	t.Helper()
	for _, line := range strings.Split(logs.String(), "\n") {
		var fields map[string]any
		if json.Unmarshal([]byte(line), &fields) == nil && fields["msg"] == msg {
			return fields
		}
	}
	t.Fatalf("no log line %q in:\n%s", msg, logs.String())
	return nil
}

// TestGuardRefusesLoopback: with an empty allow-list, a running shop on
// 127.0.0.1 is refused and never sees a connection. Its port is allowed,
// so that the address alone is refused: on a port the guard refuses
// anyway, the test passed with loopback let through.
func TestGuardRefusesLoopback(t *testing.T) {
	shop := fakeshop.Sample("8", false)
	shop.Start(t.Cleanup)
	_, port, _ := net.SplitHostPort(shop.Addr())
	svc := startService(t, shop, map[string]string{"SHOP_SCHEMA_ALLOW_HOSTS": "", "SHOP_SCHEMA_PORTS": "443," + port})
	for _, base := range []string{shop.URL(), "https://127.1:" + port, "https://[::ffff:127.0.0.1]:" + port, "https://localhost:" + port} {
		status, env := svc.post(t, body(base, fakeshop.Key))
		if status != http.StatusBadRequest || errCode(env) != "base_url_not_allowed" {
			t.Errorf("POST schema %s = %d %s, want 400 base_url_not_allowed", base, status, errCode(env))
		}
	}
	if n := shop.Connections(); n != 0 {
		t.Errorf("shop accepted %d connections, want 0", n)
	}
}

// TestRedirectToLoopbackRefused: an allowed shop redirects to another
// loopback address; the connect-time check refuses it.
func TestRedirectToLoopbackRefused(t *testing.T) {
	target := fakeshop.Sample("8", false)
	target.StartOn("127.0.0.2:0", t.Cleanup)
	shop := fakeshop.Sample("8", false)
	shop.Redirect = func(r *http.Request) string { return "https://" + target.Addr() + r.URL.RequestURI() }
	shop.Start(t.Cleanup)
	// 127.0.0.2 passes the syntax check only if its port is allowed: list it.
	_, port, _ := net.SplitHostPort(target.Addr())
	svc := startService(t, shop, map[string]string{"SHOP_SCHEMA_PORTS": "443," + port})
	status, env := svc.post(t, body(shop.URL(), fakeshop.Key))
	if status != http.StatusBadRequest || errCode(env) != "base_url_not_allowed" {
		t.Errorf("POST schema with a redirect to %s = %d %s, want 400 base_url_not_allowed", target.Addr(), status, errCode(env))
	}
	if n := target.Connections(); n != 0 {
		t.Errorf("redirect target accepted %d connections, want 0", n)
	}
}

// TestRedirectToANameOfLoopbackRefused: a redirect to a host name passes
// the redirect check (a name says nothing of its address); the name
// resolves to loopback, and the dial's check refuses it before a packet
// is sent.
func TestRedirectToANameOfLoopbackRefused(t *testing.T) {
	target := fakeshop.Sample("8", false)
	target.StartOn("127.0.0.2:0", t.Cleanup)
	_, port, _ := net.SplitHostPort(target.Addr())
	shop := fakeshop.Sample("8", false)
	shop.Redirect = func(r *http.Request) string { return "https://shop-cdn.example.com:" + port + r.URL.RequestURI() }
	shop.Start(t.Cleanup)
	svc := startServiceWith(t, shop, map[string]string{"SHOP_SCHEMA_PORTS": "443," + port},
		fakeshop.Resolver{"shop-cdn.example.com": {"127.0.0.2"}})
	status, env := svc.post(t, body(shop.URL(), fakeshop.Key))
	if status != http.StatusBadRequest || errCode(env) != "base_url_not_allowed" {
		t.Errorf("POST schema with a redirect to a name of 127.0.0.2 = %d %s, want 400 base_url_not_allowed", status, errCode(env))
	}
	if env.Error != nil && strings.Contains(env.Error.Message, "127.0.0.2") {
		t.Errorf("message %q names the address the redirect's name resolved to", env.Error.Message)
	}
	if n := target.Connections(); n != 0 {
		t.Errorf("redirect target accepted %d connections, want 0", n)
	}
}

func TestSchemaInput(t *testing.T) {
	svc := startService(t, nil, map[string]string{"SHOP_SCHEMA_ALLOW_HOSTS": ""})
	tests := []struct {
		name, body, wantCode string
	}{
		{"empty body", ``, "invalid_body"},
		{"not JSON", `base_url=x`, "invalid_body"},
		{"array", `[{"base_url":"https://shop.example.com","ws_key":"k"}]`, "invalid_body"},
		{"null", `null`, "invalid_body"},
		{"string", `"https://shop.example.com"`, "invalid_body"},
		{"truncated", `{"base_url":"https://shop.example.com"`, "invalid_body"},
		{"trailing data", `{"base_url":"https://shop.example.com","ws_key":"k"} {}`, "invalid_body"},
		{"unknown property", `{"base_url":"https://shop.example.com","ws_key":"k","id_shop":1}`, "invalid_body"},
		{"property in other case", `{"BASE_URL":"https://shop.example.com","ws_key":"k"}`, "invalid_body"},
		// encoding/json keeps the last of two equal names and reads invalid
		// UTF-8 and lone surrogate escapes as U+FFFD. The literal 10.0.0.1
		// is refused before any DNS query, so these stay offline whatever
		// the decoder lets through.
		{"duplicate base_url", `{"base_url":"https://10.0.0.1","base_url":"https://10.0.0.2","ws_key":"K"}`, "invalid_body"},
		{"duplicate ws_key", `{"base_url":"https://10.0.0.1","ws_key":"K","ws_key":"L"}`, "invalid_body"},
		{"duplicate name, once escaped", `{"base_url":"https://10.0.0.1","ws_key":"K","ws_\u006bey":"L"}`, "invalid_body"},
		{"ws_key with a lone surrogate", `{"base_url":"https://10.0.0.1","ws_key":"K\ud800"}`, "invalid_body"},
		{"ws_key with invalid UTF-8", "{\"base_url\":\"https://10.0.0.1\",\"ws_key\":\"K\xff\"}", "invalid_body"},
		{"base_url with a lone surrogate", `{"base_url":"https://10.0.0.1/\udfff","ws_key":"K"}`, "invalid_body"},
		{"base_url with invalid UTF-8", "{\"base_url\":\"https://10.0.0.1/\xff\",\"ws_key\":\"K\"}", "invalid_body"},
		{"base_url missing", `{"ws_key":"k"}`, "invalid_base_url"},
		{"base_url null", `{"base_url":null,"ws_key":"k"}`, "invalid_base_url"},
		{"base_url number", `{"base_url":5,"ws_key":"k"}`, "invalid_base_url"},
		{"base_url not a URL", `{"base_url":"shop example","ws_key":"k"}`, "invalid_base_url"},
		{"base_url with user info", `{"base_url":"https://KEY@shop.example.com","ws_key":"k"}`, "invalid_base_url"},
		{"base_url with query", `{"base_url":"https://shop.example.com/?a=1","ws_key":"k"}`, "invalid_base_url"},
		{"base_url with fragment", `{"base_url":"https://shop.example.com/#x","ws_key":"k"}`, "invalid_base_url"},
		{"base_url bad port", `{"base_url":"https://shop.example.com:99999","ws_key":"k"}`, "invalid_base_url"},
		{"http", `{"base_url":"http://shop.example.com","ws_key":"k"}`, "base_url_must_be_https"},
		{"metadata", `{"base_url":"https://169.254.169.254/latest","ws_key":"k"}`, "base_url_not_allowed"},
		{"private", `{"base_url":"https://10.0.0.1","ws_key":"k"}`, "base_url_not_allowed"},
		{"localhost", `{"base_url":"https://localhost","ws_key":"k"}`, "base_url_not_allowed"},
		{"ws_key missing", `{"base_url":"https://shop.example.com"}`, "missing_ws_key"},
		{"ws_key empty", `{"base_url":"https://shop.example.com","ws_key":""}`, "missing_ws_key"},
		{"ws_key blank", `{"base_url":"https://shop.example.com","ws_key":"  "}`, "missing_ws_key"},
		{"ws_key number", `{"base_url":"https://shop.example.com","ws_key":12}`, "missing_ws_key"},
		{"ws_key with a line break", `{"base_url":"https://shop.example.com","ws_key":"K\r\nX: y"}`, "invalid_body"},
		{"ws_key with a NUL", `{"base_url":"https://shop.example.com","ws_key":"K\u0000L"}`, "invalid_body"},
		{"ws_key with a tab", `{"base_url":"https://shop.example.com","ws_key":"K\tL"}`, "invalid_body"},
		{"ws_key with a DEL", `{"base_url":"https://shop.example.com","ws_key":"K\u007fL"}`, "invalid_body"},
		{"ws_key with a C1 control", `{"base_url":"https://shop.example.com","ws_key":"K\u0085L"}`, "invalid_body"},
		// Only white space is trimmed from its ends: a NUL or DEL there is refused too.
		{"ws_key ending in a NUL", `{"base_url":"https://shop.example.com","ws_key":"KL\u0000"}`, "invalid_body"},
		{"ws_key starting with a DEL", `{"base_url":"https://shop.example.com","ws_key":"\u007fKL"}`, "invalid_body"},
		// base_url is checked first, whatever is wrong with ws_key.
		{"http, ws_key missing", `{"base_url":"http://shop.example.com"}`, "base_url_must_be_https"},
		{"http, ws_key number", `{"base_url":"http://shop.example.com","ws_key":12}`, "base_url_must_be_https"},
		{"private, ws_key array", `{"base_url":"https://10.0.0.1","ws_key":["k"]}`, "base_url_not_allowed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, env := svc.post(t, tt.body)
			if status != http.StatusBadRequest || errCode(env) != tt.wantCode {
				t.Errorf("POST %s = %d %s, want 400 %s", tt.name, status, errCode(env), tt.wantCode)
			}
			if env.Error != nil && strings.Contains(env.Error.Message, "KEY@") {
				t.Errorf("error message %q repeats base_url", env.Error.Message)
			}
		})
	}
}

// TestInputErrorMessages pins what a refusal says. A message may name the IP
// address or port written in base_url: the client sent it, and it says what
// to fix. It never names ws_key, and never an address a host name resolved
// to, which would tell a stranger what our DNS knows of internal names.
func TestInputErrorMessages(t *testing.T) {
	svc := startServiceWith(t, nil, map[string]string{"SHOP_SCHEMA_ALLOW_HOSTS": ""}, fakeshop.Resolver{
		"intranet.example.com": {"10.1.2.3"},
		"mixed.example.com":    {"93.184.216.34", "fd12:3456::1"},
	})
	const key = "LEAKCANARY0123456789LEAKCANARY01"
	surrogate := "a string in the body holds a lone surrogate escape (\\ud800 to \\udfff not in a pair)"
	tests := []struct {
		name, body, wantCode, wantMessage string
	}{
		{"http", body("http://shop.example.com", key), "base_url_must_be_https", "base_url must be https"},
		{"private address", body("https://10.1.2.3", key), "base_url_not_allowed", "base_url not allowed: 10.1.2.3 is a special-purpose address"},
		{"loopback in decimal", body("https://2130706433", key), "base_url_not_allowed", "base_url not allowed: 127.0.0.1 is a special-purpose address"},
		{"unique local IPv6", body("https://[fd12:3456::1]", key), "base_url_not_allowed", "base_url not allowed: fd12:3456::1 is a special-purpose address"},
		{"port", body("https://shop.example.com:22", key), "base_url_not_allowed", "base_url not allowed: port 22 (shops may use 443, 8443)"},
		{"internal name space", body("https://shop.internal", key), "base_url_not_allowed", "base_url not allowed: .internal is an internal name space"},
		{"name DNS never answers for", body("https://shop.invalid", key), "invalid_base_url", "invalid base_url: .invalid names are never in DNS"},
		{"name resolving to a private address", body("https://intranet.example.com", key), "base_url_not_allowed", "base_url resolves to an address that is not allowed"},
		{"name with one private address", body("https://mixed.example.com", key), "base_url_not_allowed", "base_url resolves to an address that is not allowed"},
		{"key as user info", body("https://"+key+"@shop.example.com", key), "invalid_base_url", "invalid base_url: base_url must not contain user info; send the key as ws_key"},
		{"key too long", body("https://shop.example.com", strings.Repeat(key, 9)), "invalid_body", "ws_key is too long"},
		{"key as a property name", `{"base_url":"https://shop.example.com","ws_key":"x","` + key + `":1}`, "invalid_body", "unknown property in the body; allowed: base_url, ws_key"},
		{"key twice", `{"base_url":"https://shop.example.com","ws_key":"` + key + `","ws_key":"` + key + `"}`, "invalid_body", "a property appears twice in the body"},
		{"key with a lone surrogate", `{"base_url":"https://shop.example.com","ws_key":"` + key + `\ud800"}`, "invalid_body", surrogate},
		{"key with a line break", `{"base_url":"https://shop.example.com","ws_key":"` + key[:16] + `\r\n` + key[16:] + `"}`, "invalid_body", "ws_key must not hold a control character (a line break, a tab, a NUL): no webservice key does"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, env := svc.post(t, tt.body)
			if status != http.StatusBadRequest || env.Error == nil || env.Error.Code != tt.wantCode || env.Error.Message != tt.wantMessage {
				t.Fatalf("POST %s = %d %+v, want 400 %s %q", tt.name, status, env.Error, tt.wantCode, tt.wantMessage)
			}
			if strings.Contains(env.Error.Message, key) {
				t.Errorf("error message %q names the key", env.Error.Message)
			}
		})
	}
}

// TestOversizedBody: a body over 16 KiB is 413 payload_too_large, as the
// sales routes answer it; 16 KiB exactly is read.
func TestOversizedBody(t *testing.T) {
	svc := startService(t, nil, map[string]string{"SHOP_SCHEMA_ALLOW_HOSTS": ""})
	sized := func(n int) string {
		prefix, suffix := `{"base_url":"https://10.0.0.1","ws_key":"`, `"}`
		return prefix + strings.Repeat("k", n-len(prefix)-len(suffix)) + suffix
	}
	status, env := svc.post(t, sized(16<<10))
	if status != http.StatusBadRequest || errCode(env) != "base_url_not_allowed" {
		t.Errorf("POST a body of 16384 bytes = %d %s, want 400 base_url_not_allowed", status, errCode(env))
	}
	status, env = svc.post(t, sized(16<<10+1))
	if status != http.StatusRequestEntityTooLarge || errCode(env) != "payload_too_large" ||
		env.Error.Message != "the body must be at most 16384 bytes" {
		t.Errorf("POST a body of 16385 bytes = %d %s %+v, want 413 payload_too_large %q", status, errCode(env), env.Error,
			"the body must be at most 16384 bytes")
	}
}

// TestUnreadableBody: a body that breaks off (a malformed chunk) is
// invalid_body, not payload_too_large.
func TestUnreadableBody(t *testing.T) {
	svc := startService(t, nil, nil)
	conn, err := net.Dial("tcp", strings.TrimPrefix(svc.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	req := "POST /v1/sync/prestashop/schema HTTP/1.1\r\nHost: shop-schema\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
	for _, h := range svc.signer.Sign(identity.Identity{RequestID: "req-unreadable"},
		identity.Request{Method: http.MethodPost, Target: "/v1/sync/prestashop/schema"}, time.Now()) {
		req += h.Name + ": " + h.Value + "\r\n"
	}
	req += "\r\n5\r\n{\"bas\r\nzz\r\n" // "zz" is no chunk size
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var env envelope.Parsed
	if err := json.NewDecoder(resp.Body).Decode(&env); err != nil {
		t.Fatalf("answer is not an envelope: %v", err)
	}
	if resp.StatusCode != http.StatusBadRequest || errCode(env) != "invalid_body" {
		t.Errorf("POST a malformed chunked body = %d %s, want 400 invalid_body", resp.StatusCode, errCode(env))
	}
}

// TestAnyContentType: spec 4.2, unlike 4.5, names no Content-Type, so the
// body is read as JSON whatever the header says (README, "Request").
func TestAnyContentType(t *testing.T) {
	svc := startService(t, nil, map[string]string{"SHOP_SCHEMA_ALLOW_HOSTS": ""})
	for _, ct := range []string{"", "text/plain", "application/x-www-form-urlencoded", "application/json; charset=latin1"} {
		status, env := svc.postAs(t, ct, body("https://10.0.0.1", "K"))
		if status != http.StatusBadRequest || errCode(env) != "base_url_not_allowed" {
			t.Errorf("POST with Content-Type %q = %d %s, want the body read: 400 base_url_not_allowed", ct, status, errCode(env))
		}
	}
}

func TestUnsignedCallRefused(t *testing.T) {
	svc := startService(t, nil, nil)
	resp, err := http.Post(svc.url+"/v1/sync/prestashop/schema", "application/json", strings.NewReader(body("https://shop.example.com", "k")))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("unsigned POST schema = %d, want 401", resp.StatusCode)
	}
}

func startHandler(t *testing.T, h http.Handler) string {
	t.Helper()
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)
	return ts.URL
}

// shop_schema_reads_total counts every read by its outcome (README,
// "Metric"): ok, or the code answered, a body refused before any shop was
// asked included. The refusal for every slot taken (rate_limited) shows
// at 0 from the start: an alert on its rate needs the series before the
// first one.
func TestReadsAreCountedByOutcome(t *testing.T) {
	shop := fakeshop.Sample("8", false)
	shop.Start(t.Cleanup)
	svc := startService(t, shop, nil)
	for _, b := range []string{
		body(shop.URL(), fakeshop.Key),
		body(shop.URL(), fakeshop.Key),
		body(shop.URL(), "ZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZ"),
		`{"base_url":`,
	} {
		svc.post(t, b)
	}
	err := testutil.GatherAndCompare(svc.metrics, strings.NewReader(`
# HELP shop_schema_reads_total Shop schema reads, by outcome (ok or the error code answered).
# TYPE shop_schema_reads_total counter
shop_schema_reads_total{outcome="invalid_body"} 1
shop_schema_reads_total{outcome="ok"} 2
shop_schema_reads_total{outcome="rate_limited"} 0
shop_schema_reads_total{outcome="shop_401"} 1
`), "shop_schema_reads_total")
	if err != nil {
		t.Errorf("shop_schema_reads_total by outcome: %v", err)
	}
}

// TestConcurrencyLimit: with one slot busy, the next read is answered 429
// at once instead of queueing behind the slow shop, with Retry-After: 1 and
// no "shop schema refused" line: no shop was asked.
func TestConcurrencyLimit(t *testing.T) {
	shop := fakeshop.Sample("8", false)
	shop.Hold = make(chan struct{})
	shop.Start(t.Cleanup)
	svc := startService(t, shop, map[string]string{"SHOP_SCHEMA_MAX_CONCURRENT": "1"})
	first := make(chan int, 1)
	go func() { first <- svc.sendAs("first", body(shop.URL(), fakeshop.Key)) }()
	for len(shop.Requests()) == 0 {
		time.Sleep(5 * time.Millisecond)
	}
	status, header, env := svc.postForHeaders(t, body(shop.URL(), fakeshop.Key))
	if status != http.StatusTooManyRequests || errCode(env) != "rate_limited" {
		t.Errorf("second concurrent POST schema = %d %s, want 429 rate_limited", status, errCode(env))
	}
	if got := header.Get("Retry-After"); got != "1" {
		t.Errorf("429 Retry-After = %q, want 1", got)
	}
	if strings.Contains(svc.logs.String(), "shop schema refused") {
		t.Errorf("a 429 of the in-flight limit was logged as a refused shop read:\n%s", svc.logs.String())
	}
	close(shop.Hold)
	if got := <-first; got != http.StatusOK {
		t.Errorf("first POST schema = %d, want 200", got)
	}
}

// A read refused with every slot taken writes a WARN that says what holds
// them, for the SRE the alert ExportShopSchemaSlotsFull sends: the access
// line of the 429 was all there was, which named neither the reads in
// flight nor their shops. Here one slot is held by a shop that does not
// answer yet and one by a caller still sending its body; the WARN names the
// oldest read (its request id, shop and since when), the shop holding the
// most slots, how many distinct shops hold them and how many reads are
// still reading their body. Never the key.
func TestSlotsFullSaysWhatHoldsThem(t *testing.T) {
	shop := fakeshop.Sample("8", false)
	shop.Hold = make(chan struct{})
	shop.Start(t.Cleanup)
	svc := startService(t, shop, map[string]string{"SHOP_SCHEMA_MAX_CONCURRENT": "2"})
	first := make(chan int, 1)
	go func() { first <- svc.sendAs("first", body(shop.URL(), fakeshop.Key)) }()
	for len(shop.Requests()) == 0 {
		time.Sleep(5 * time.Millisecond)
	}
	before := time.Now()
	holdBodyUnsent(t, svc, "slow-body")
	status, _, env := svc.postForHeaders(t, body(shop.URL(), fakeshop.Key))
	if status != http.StatusTooManyRequests || errCode(env) != "rate_limited" {
		t.Fatalf("third concurrent POST schema = %d %s, want 429 rate_limited", status, errCode(env))
	}
	line := logLine(t, svc.logs, "shop schema read refused: every slot taken")
	host, _, _ := net.SplitHostPort(shop.Addr())
	want := map[string]any{"level": "WARN", "slots": 2.0, "refused_since_last": 0.0, "shop_hosts": 1.0, "reading_body": 1.0,
		"busiest_shop_host": host, "busiest_shop_slots": 1.0, "oldest_request_id": "first", "oldest_shop_host": host}
	for k, v := range want {
		if line[k] != v {
			t.Errorf("the WARN's %s = %v, want %v\n%s", k, line[k], v, svc.logs)
		}
	}
	if since, err := time.Parse(time.RFC3339Nano, fmt.Sprint(line["oldest_since"])); err != nil || since.After(before) {
		t.Errorf("the WARN's oldest_since = %v (%v), want when the first read began, before %v", line["oldest_since"], err, before)
	}
	if _, ok := line["oldest_held_ms"].(float64); !ok {
		t.Errorf("the WARN's oldest_held_ms = %v, want how long the first read has held its slot", line["oldest_held_ms"])
	}
	if strings.Contains(svc.logs.String(), fakeshop.Key) {
		t.Errorf("the logs hold the shop's key:\n%s", svc.logs)
	}
	if status, _ := svc.post(t, body(shop.URL(), fakeshop.Key)); status != http.StatusTooManyRequests ||
		strings.Count(svc.logs.String(), "every slot taken") != 1 {
		t.Errorf("a second refusal at once = %d, and %d WARNs; want 429 and still one WARN (one per 10 s, counting the others)",
			status, strings.Count(svc.logs.String(), "every slot taken"))
	}
	close(shop.Hold)
	if got := <-first; got != http.StatusOK {
		t.Errorf("first POST schema = %d, want 200", got)
	}
}

// sendAs posts body signed with requestID and returns the answer's status
// (0 when none came); unlike svc.post it calls no t.Fatal, so it may run
// outside the test's goroutine.
func (s *service) sendAs(requestID, body string) int {
	req, _ := http.NewRequest(http.MethodPost, s.url+"/v1/sync/prestashop/schema", strings.NewReader(body))
	for _, h := range s.signer.Sign(identity.Identity{RequestID: requestID}, identity.RequestOf(req), time.Now()) {
		req.Header.Set(h.Name, h.Value)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// holdBodyUnsent sends the head of a read signed with requestID, and no
// body, and returns once the handler reads it (its 100 Continue): the read
// holds a slot until the test ends.
func holdBodyUnsent(t *testing.T, svc *service, requestID string) {
	t.Helper()
	target := "/v1/sync/prestashop/schema"
	req, _ := http.NewRequest(http.MethodPost, svc.url+target, nil)
	conn, err := net.Dial("tcp", req.URL.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	head := "POST " + target + " HTTP/1.1\r\nHost: " + req.URL.Host + "\r\nContent-Length: 100\r\nExpect: 100-continue\r\n"
	for _, h := range svc.signer.Sign(identity.Identity{RequestID: requestID}, identity.RequestOf(req), time.Now()) {
		head += h.Name + ": " + h.Value + "\r\n"
	}
	if _, err := io.WriteString(conn, head+"\r\n"); err != nil {
		t.Fatal(err)
	}
	status, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil || !strings.HasPrefix(status, "HTTP/1.1 100 ") {
		t.Fatalf("the body's wait = %q (%v), want 100 Continue", status, err)
	}
}

// A caller that hangs up (the gateway past its upstream timeout) cancels
// the shop's requests: that is reported as client_closed_request, not as a
// shop timeout that would send operators after the shop.
func TestAbandonedReadIsNotAShopTimeout(t *testing.T) {
	shop := fakeshop.Sample("8", false)
	shop.Delay = 3 * time.Second
	shop.Start(t.Cleanup)
	svc := startService(t, shop, nil)
	ctx, hangUp := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer hangUp()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, svc.url+"/v1/sync/prestashop/schema",
		strings.NewReader(body(shop.URL(), fakeshop.Key)))
	for _, h := range svc.signer.Sign(identity.Identity{RequestID: "req-abandoned"}, identity.RequestOf(req), time.Now()) {
		req.Header.Set(h.Name, h.Value)
	}
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("POST answered %d before the client hung up", resp.StatusCode)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(svc.logs.String(), `"msg":"shop schema refused"`) {
		if time.Now().After(deadline) {
			t.Fatalf("no outcome logged:\n%s", svc.logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	logs := svc.logs.String()
	if !strings.Contains(logs, `"code":"client_closed_request"`) || strings.Contains(logs, "shop_timeout") {
		t.Errorf("logs = %s, want the read logged as client_closed_request, never shop_timeout", logs)
	}
	// Nor do the shop's spans blame the shop.
	spans := clientSpans(svc.spans.Ended())
	if len(spans) == 0 {
		t.Fatal("no client span recorded")
	}
	for _, s := range spans {
		if want := (clientSpan{url: s.url, errorType: "canceled", cancelReason: "caller_left", status: codes.Unset}); s != want {
			t.Errorf("span of a request the caller abandoned = %+v, want %+v", s, want)
		}
	}
}

// A read the shutdown's drain cut off is the service's doing: 503
// unavailable and the WARN that says so, not the shop's 504 shop_timeout
// (net/http's client returns the cut's cause, ErrCutOff, which CutOff
// did not know).
func TestAReadTheDrainCutsOffIsNotTheShops(t *testing.T) {
	shop := fakeshop.Sample("8", false)
	shop.Hold = make(chan struct{}) // never closed: the reads wait for the cut
	shop.Start(t.Cleanup)
	svc := startService(t, shop, nil)
	go func() {
		// Once the four fetches (languages, categories, features, values)
		// wait for the shop; a read that never got there is cut all the same.
		for deadline := time.Now().Add(10 * time.Second); len(shop.Requests()) < 4 && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
		}
		svc.cutOff(httpserver.ErrCutOff)
	}()
	if status, env := svc.post(t, body(shop.URL(), fakeshop.Key)); status != http.StatusServiceUnavailable || errCode(env) != "unavailable" {
		t.Errorf("POST schema cut off = %d %s, want 503 unavailable", status, errCode(env))
	}
	if logs := svc.logs.String(); !strings.Contains(logs, `"msg":"shop schema read cut off`) || strings.Contains(logs, "shop call failed") {
		t.Errorf("logs = %s, want the read logged as cut off, not as a shop call that failed", logs)
	}
	// Nor do its shop requests' spans say the caller left.
	spans := clientSpans(svc.spans.Ended())
	if len(spans) != 4 {
		t.Fatalf("%d client spans, want 4: %+v", len(spans), spans)
	}
	for _, s := range spans {
		if want := (clientSpan{url: s.url, errorType: "canceled", cancelReason: "cut_off", status: codes.Unset}); s != want {
			t.Errorf("span of a request the drain cut off = %+v, want %+v", s, want)
		}
	}
}

// A shop URL whose port speaks plain HTTP is a TLS failure, as the README
// says, not an unreachable shop.
func TestSchemaPortWithoutTLS(t *testing.T) {
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "plain http", http.StatusOK)
	}))
	t.Cleanup(plain.Close)
	svc := startService(t, nil, nil)
	status, env := svc.post(t, body(strings.Replace(plain.URL, "http://", "https://", 1), fakeshop.Key))
	if status != http.StatusBadGateway || errCode(env) != "shop_tls_error" {
		t.Errorf("POST schema to a plain-HTTP port = %d %s, want 502 shop_tls_error", status, errCode(env))
	}
}

// moveShop serves the shop under /new and redirects what is asked under
// /old there, as a shop moved to another path does.
func moveShop(s *fakeshop.Shop) {
	s.Prefix = "/new"
	s.Redirect = func(r *http.Request) string {
		if strings.HasPrefix(r.URL.Path, "/old/") {
			return "/new/" + strings.TrimPrefix(r.URL.RequestURI(), "/old/")
		}
		return ""
	}
}

// TestRedirectToAnotherHost: a shop whose address redirects to another host
// name (www. to the bare domain, here example.com to 127.0.0.1) gets no
// key at the last hop, since net/http forwards Authorization only to the
// same host or a subdomain. The answer says so, instead of sending the
// merchant after a server that drops the header.
func TestRedirectToAnotherHost(t *testing.T) {
	shop := fakeshop.Sample("8", false)
	var port string // the shop's, once it listens
	shop.Redirect = func(r *http.Request) string {
		if strings.HasPrefix(r.Host, "example.com") {
			return "https://127.0.0.1:" + port + r.URL.RequestURI()
		}
		return ""
	}
	shop.Start(t.Cleanup)
	_, port, _ = net.SplitHostPort(shop.Addr())
	// httptest's certificate names example.com and 127.0.0.1.
	svc := startServiceWith(t, shop, map[string]string{"SHOP_SCHEMA_ALLOW_HOSTS": "127.0.0.1,example.com"},
		fakeshop.Resolver{"example.com": {"127.0.0.1"}})
	status, env := svc.post(t, body("https://example.com:"+port, fakeshop.Key))
	if status != http.StatusBadRequest || errCode(env) != "shop_401" {
		t.Fatalf("POST schema = %d %s, want 400 shop_401", status, errCode(env))
	}
	if msg := env.Error.Message; !strings.Contains(msg, "redirected to another host") || strings.Contains(msg, "127.0.0.1") {
		t.Errorf("error message %q: want it to name the redirect to another host (and not the host)", msg)
	}
	if keys := shop.Keys(); len(keys) != 0 {
		t.Errorf("shop received keys %q, want none (the other host is not sent the key)", keys)
	}
}

// TestBaseURLEndingInAPI: base_url copied from the back office's webservice
// page (https://shop/api) makes /api/api/<resource>, which PrestaShop
// answers 400 code 27 (unknown resource "api"). That is the caller's
// address to fix, 400 invalid_base_url, not a shop answering badly (502),
// and is not asked again with display=full.
func TestBaseURLEndingInAPI(t *testing.T) {
	shop := fakeshop.Sample("8", false)
	shop.Start(t.Cleanup)
	svc := startService(t, shop, nil)
	status, env := svc.post(t, body(shop.URL()+"/api/", fakeshop.Key))
	if status != http.StatusBadRequest || errCode(env) != "invalid_base_url" {
		t.Fatalf("POST schema with base_url .../api/ = %d %s, want 400 invalid_base_url", status, errCode(env))
	}
	if !strings.Contains(env.Error.Message, "without /api") {
		t.Errorf("error message %q: want it to say base_url goes without /api", env.Error.Message)
	}
	for _, r := range shop.Requests() {
		if strings.Contains(r, "display=full") && !strings.Contains(r, "/languages") {
			t.Errorf("shop was asked %s: want no display=full retry for an unknown resource", r)
		}
	}
	checkSpanVocabulary(t, clientSpans(svc.spans.Ended()))
}

// A schema answer is gzipped for a client that accepts gzip (the gateway
// passes Accept-Encoding on, and the answer's Content-Encoding back), and
// not for one that does not; both vary by Accept-Encoding and carry their
// length. It was sent
// whole to every client: a large shop's schema is a few MB of JSON that
// gzip cuts about fourteen times.
func TestSchemaGzippedWhenAccepted(t *testing.T) {
	shop := fakeshop.Sample("8", false)
	for i := range 50 {
		shop.Categories = append(shop.Categories, fakeshop.Category{ID: 100 + i, ParentID: 2, Depth: 2, Position: 2 + i,
			Active: true, Names: map[int]string{1: fmt.Sprint("Category ", i), 2: "Категория", 3: "Категорія"}})
	}
	shop.Start(t.Cleanup)
	s := startService(t, shop, nil)
	var plain []byte
	for _, accept := range []string{"identity", "gzip, deflate, br"} {
		req, _ := http.NewRequest(http.MethodPost, s.url+"/v1/sync/prestashop/schema", strings.NewReader(body(shop.URL(), fakeshop.Key)))
		req.Header.Set("Accept-Encoding", accept) // set by hand, Go's transport leaves the body as sent
		for _, h := range s.signer.Sign(identity.Identity{RequestID: "req-gzip"}, identity.RequestOf(req), time.Now()) {
			req.Header.Set(h.Name, h.Value)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Vary") != "Accept-Encoding" {
			t.Fatalf("Accept-Encoding %q: %d, Vary %q, want 200 varying by Accept-Encoding", accept, resp.StatusCode, resp.Header.Get("Vary"))
		}
		// With its length, whatever its coding: without one, the gateway
		// read it whole for an HTTP/1.0 client and held it there, this
		// process's slot free again, however slowly the client read.
		if resp.ContentLength != int64(len(raw)) || len(resp.TransferEncoding) > 0 {
			t.Errorf("Accept-Encoding %q: Content-Length %d, Transfer-Encoding %v, %d bytes read: want the answer's length", accept, resp.ContentLength, resp.TransferEncoding, len(raw))
		}
		if accept == "identity" {
			if ce := resp.Header.Get("Content-Encoding"); ce != "" || !json.Valid(raw) {
				t.Fatalf("Accept-Encoding identity: Content-Encoding %q, want the JSON as it is", ce)
			}
			plain = raw
			continue
		}
		zr, err := gzip.NewReader(bytes.NewReader(raw))
		if err != nil || resp.Header.Get("Content-Encoding") != "gzip" {
			t.Fatalf("Accept-Encoding %q: Content-Encoding %q, %d bytes (%v), want gzip", accept, resp.Header.Get("Content-Encoding"), len(raw), err)
		}
		unzipped, err := io.ReadAll(zr)
		if err != nil || !bytes.Equal(unzipped, plain) || len(raw) >= len(plain)/2 {
			t.Errorf("gzipped: %d bytes, %d unzipped (%v), want the identity answer's %d bytes, at most half as many sent", len(raw), len(unzipped), err, len(plain))
		}
	}
}

// A shop's schema is read with the shop's ws_key: no cache between the
// merchant's module and the gateway may keep it, nor answer another caller
// with it, as export-reader's pages say; an error answer is no-store, as
// every error envelope is.
func TestASchemaIsNotCached(t *testing.T) {
	shop := fakeshop.Sample("8", false)
	shop.Start(t.Cleanup)
	svc := startService(t, shop, nil)
	status, header, env := svc.postForHeaders(t, body(shop.URL(), fakeshop.Key))
	if status != http.StatusOK {
		t.Fatalf("POST schema = %d %s, want 200", status, errCode(env))
	}
	if got := header.Get("Cache-Control"); got != envelope.PrivateCacheControl {
		t.Errorf("200: Cache-Control = %q, want %q", got, envelope.PrivateCacheControl)
	}
	status, header, env = svc.postForHeaders(t, body(shop.URL(), "WRONGKEYWRONGKEYWRONGKEYWRONGKEY"))
	if status == http.StatusOK || header.Get("Cache-Control") != envelope.ErrorCacheControl {
		t.Errorf("POST schema with a wrong key = %d %s, Cache-Control %q; want an error, %q",
			status, errCode(env), header.Get("Cache-Control"), envelope.ErrorCacheControl)
	}
}
