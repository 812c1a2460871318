package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/apikey"
	"github.com/coinexport/export/pkg/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

// downUpstreams are the three services' URLs at addresses that refuse
// every connection: with the defaults (127.0.0.1:8081-8083) a test's
// gateway probed, and sent its requests to, the services of a make run
// on the same machine, whose logs then told of refused identities.
func downUpstreams(t *testing.T) map[string]string {
	return map[string]string{
		"EXPORT_READER_URLS": "http://" + testenv.RefusingAddr(t),
		"SALES_WRITER_URLS":  "http://" + testenv.RefusingAddr(t),
		"SHOP_SCHEMA_URLS":   "http://" + testenv.RefusingAddr(t),
	}
}

func TestRunServesAndDrains(t *testing.T) {
	addr, dsn := testenv.FreeAddr(t), testenv.PostgresURL(t)
	secret := "run-test-identity-secret-0123456789abcdef"
	env := map[string]string{
		"GATEWAY_ADDR": addr, "GATEWAY_ADMIN_ADDR": testenv.FreeAddr(t),
		"DATABASE_URL": dsn, "REDIS_URL": testenv.RedisURL(t),
		"IDENTITY_SECRET": secret,
	}
	maps.Copy(env, downUpstreams(t))
	// A setting written wrong in the process's environment is named, with
	// the setting meant, and its value is not logged.
	t.Setenv("RATE_LIMIT_EXPORT_RAED", "100-M-misspelt-value")
	cancel, out, done := runGateway(env)
	defer cancel()

	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/v1/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("gateway not answering /v1/health: %v\n%s", err, out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	testenv.WantSessionNamed(t, dsn, "gateway") // its revocation listener's, at least
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run() after cancel = %v, want nil", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("run() did not return after cancel")
	}
	logs := out.String()
	if strings.Contains(logs, secret) {
		t.Error("the identity secret appears in the logs")
	}
	if strings.Contains(logs, "misspelt-value") {
		t.Error("the value of a misspelt variable appears in the logs")
	}
	// Without SHOP_SCHEMA_IDENTITY_SECRET, shop-schema's calls are signed
	// with IDENTITY_SECRET, and the operator is told what that risks.
	for _, want := range []string{`"msg":"starting"`, `"identity_secret":"***"`, `"msg":"stopped"`,
		`"name":"RATE_LIMIT_EXPORT_RAED","did_you_mean":"RATE_LIMIT_EXPORT_READ"`,
		`"shop_schema_identity_secret":"unset or blank: IDENTITY_SECRET"`, `"level":"WARN","msg":"SHOP_SCHEMA_IDENTITY_SECRET is unset or blank`} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs lack %s", want)
		}
	}
}

// With GATEWAY_SHUTDOWN_DELAY the gateway goes on serving for that long
// after the stop signal, so requests a load balancer still sends it are
// answered, while /v1/health answers 503 so that its health checks take the
// instance out; then it drains and stops.
func TestRunServesOnForTheShutdownDelay(t *testing.T) {
	addr := testenv.FreeAddr(t)
	env := map[string]string{
		"GATEWAY_ADDR": addr, "GATEWAY_ADMIN_ADDR": testenv.FreeAddr(t),
		"DATABASE_URL": testenv.PostgresURL(t), "REDIS_URL": testenv.RedisURL(t),
		"IDENTITY_SECRET": "run-test-identity-secret-0123456789abcdef", "GATEWAY_SHUTDOWN_DELAY": "1500ms",
		"SHOP_SCHEMA_IDENTITY_SECRET": shopSchemaSecret,
	}
	maps.Copy(env, downUpstreams(t))
	cancel, out, done := runGateway(env)
	defer cancel()
	defer checkShopSchemaSecretMasked(t, out)
	health := func() int {
		resp, err := http.Get("http://" + addr + "/v1/health")
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for deadline := time.Now().Add(10 * time.Second); health() != 200; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("gateway not answering /v1/health:\n%s", out.String())
		}
	}
	cancel()
	stopped := time.Now()
	time.Sleep(300 * time.Millisecond)
	// Still serving, but health checks are told to take it out.
	if got := health(); got != 503 {
		t.Errorf("/v1/health 0.3 s after the stop signal (delay 1.5 s) = %d, want 503", got)
	}
	if resp, err := http.Get("http://" + addr + "/v1/export/items"); err != nil || resp.StatusCode != 401 {
		t.Errorf("a request 0.3 s after the stop signal = %v, %v; want it served (401 without a key)", resp, err)
	} else {
		resp.Body.Close()
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run() = %v, want nil", err)
		}
		if took := time.Since(stopped); took < 1500*time.Millisecond {
			t.Errorf("run() returned %s after the stop signal, want after the 1.5 s delay", took)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("run() did not return after the delay")
	}
}

// shopSchemaSecret is the SHOP_SCHEMA_IDENTITY_SECRET of the runs that
// set one.
const shopSchemaSecret = "run-test-shop-schema-identity-secret-0123456789"

// checkShopSchemaSecretMasked checks the log of a run given
// shopSchemaSecret: the secret masked, and no warning of it unset.
func checkShopSchemaSecretMasked(t *testing.T, out *testenv.Output) {
	t.Helper()
	logs := out.String()
	if strings.Contains(logs, shopSchemaSecret) {
		t.Error("SHOP_SCHEMA_IDENTITY_SECRET appears in the logs")
	}
	if !strings.Contains(logs, `"shop_schema_identity_secret":"***"`) || strings.Contains(logs, "SHOP_SCHEMA_IDENTITY_SECRET is unset or blank") {
		t.Errorf("the log of a run with SHOP_SCHEMA_IDENTITY_SECRET set, want it masked and no warning of it unset:\n%s", logs)
	}
}

// A gateway started while PostgreSQL cannot be reached serves at once (a
// rollout during an outage must not leave clients an ingress's HTML page):
// /v1/health says postgres down, a keyed request gets the 503 envelope
// (never 401: the key may be valid), and a stop is a clean exit.
func TestRunServesWhilePostgresIsOutOfReach(t *testing.T) {
	addr := testenv.FreeAddr(t)
	env := map[string]string{
		"GATEWAY_ADDR": addr, "GATEWAY_ADMIN_ADDR": testenv.FreeAddr(t),
		"DATABASE_URL": "host=" + t.TempDir() + "/not-yet user=postgres", "REDIS_URL": testenv.RedisURL(t),
		"IDENTITY_SECRET": "run-test-identity-secret-0123456789abcdef",
	}
	maps.Copy(env, downUpstreams(t))
	cancel, out, done := runGateway(env)
	defer cancel()
	var health *http.Response
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var err error
		if health, err = http.Get("http://" + addr + "/v1/health"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("gateway not listening with PostgreSQL out of reach: %v\n%s", err, out.String())
		}
	}
	var report struct {
		Data struct{ Checks map[string]string }
	}
	decodeBody(t, health, &report)
	if health.StatusCode != 200 || report.Data.Checks["postgres"] != "down" {
		t.Errorf("/v1/health = %d, checks %v; want 200 with postgres down", health.StatusCode, report.Data.Checks)
	}
	resp := getWithUnknownKey(t, addr)
	var refusal struct {
		Error struct{ Code string }
		Meta  struct {
			RequestID string `json:"request_id"`
		}
	}
	decodeBody(t, resp, &refusal)
	if resp.StatusCode != 503 || refusal.Error.Code != "unavailable" || refusal.Meta.RequestID == "" {
		t.Errorf("a keyed request = %d %+v, want the 503 unavailable envelope", resp.StatusCode, refusal)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("run() stopped with PostgreSQL out of reach = %v, want nil", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("run() did not return after the stop")
	}
	if !strings.Contains(out.String(), "PostgreSQL not reached") {
		t.Errorf("logs lack the unreached database:\n%s", out.String())
	}
}

// runGateway starts run with env's settings in the background: cancel
// stops it, out is its log, and done delivers what run returned.
func runGateway(env map[string]string) (cancel context.CancelFunc, out *testenv.Output, done <-chan error) {
	ctx, cancel := context.WithCancel(context.Background())
	out = &testenv.Output{}
	returned := make(chan error, 1)
	go func() { returned <- run(ctx, func(k string) string { return env[k] }, out, nil) }()
	return cancel, out, returned
}

// getWithUnknownKey lists items through the gateway at addr with a key of
// the right form that no database holds, new each call, so that the
// gateway looks it up in PostgreSQL (none is cached).
func getWithUnknownKey(t *testing.T, addr string) *http.Response {
	t.Helper()
	key, _, err := apikey.Generate([]string{"export:read"})
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/v1/export/items", nil)
	req.Header.Set("X-API-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func decodeBody(t *testing.T, resp *http.Response, into any) {
	t.Helper()
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(into); err != nil {
		t.Fatalf("%s: body is not the envelope: %v", resp.Request.URL, err)
	}
}

func TestRunRejectsBadConfig(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		want string
	}{
		{"no database", map[string]string{"IDENTITY_SECRET": "run-test-identity-secret-0123456789abcdef"}, "DATABASE_URL"},
		{"short secret", map[string]string{"DATABASE_URL": "host=/tmp", "IDENTITY_SECRET": "short"}, "IDENTITY_SECRET"},
		{"bad rate", map[string]string{"DATABASE_URL": "host=/tmp", "IDENTITY_SECRET": "run-test-identity-secret-0123456789abcdef",
			"RATE_LIMIT_EXPORT_READ": "6000/min"}, "RATE_LIMIT_EXPORT_READ"},
		{"bad upstream", map[string]string{"DATABASE_URL": "host=/tmp", "IDENTITY_SECRET": "run-test-identity-secret-0123456789abcdef",
			"GATEWAY_ADDR": "127.0.0.1:0", "EXPORT_READER_URLS": "ftp://x"}, "EXPORT_READER_URLS"},
		{"bad address", map[string]string{"DATABASE_URL": "host=/tmp", "IDENTITY_SECRET": "run-test-identity-secret-0123456789abcdef",
			"GATEWAY_ADDR": "notanaddr"}, "GATEWAY_ADDR must be host:port"},
		{"admin on the public port of every address", map[string]string{"DATABASE_URL": "host=/tmp", "IDENTITY_SECRET": "run-test-identity-secret-0123456789abcdef",
			"GATEWAY_ADMIN_ADDR": ":8080"}, "GATEWAY_ADDR and GATEWAY_ADMIN_ADDR must be different listening addresses"},
		{"bad database url", map[string]string{"DATABASE_URL": "notaurl", "IDENTITY_SECRET": "run-test-identity-secret-0123456789abcdef"},
			"DATABASE_URL must be a PostgreSQL connection string"},
		// Key=value pairs with a keyword in capitals are not told they are
		// none (what a gateway of 2026-11-28 that ran with one read on
		// upgrading): the keyword is named.
		{"database url keyword in capitals", map[string]string{"DATABASE_URL": "Host=/tmp dbname=app", "IDENTITY_SECRET": "run-test-identity-secret-0123456789abcdef"},
			"DATABASE_URL writes the keyword Host, which PostgreSQL reads in lower case only (host)"},
		// Without a scheme: refused with the other problems, not once
		// PostgreSQL was reached, and without quoting the URL.
		{"bad redis url", map[string]string{"DATABASE_URL": "host=/tmp", "IDENTITY_SECRET": "run-test-identity-secret-0123456789abcdef",
			"REDIS_URL": "redis-host:6379"}, "REDIS_URL must be a redis://, rediss:// or unix:// URL"},
		// A redis:// URL whose port cannot be is not told it is no redis://
		// URL (what a redis://redis:99999 that ran before the port was
		// checked read on upgrading), nor quoted.
		{"redis url with a port out of range", map[string]string{"DATABASE_URL": "host=/tmp", "IDENTITY_SECRET": "run-test-identity-secret-0123456789abcdef",
			"REDIS_URL": "redis://redis-host:99999"}, "REDIS_URL must have a port from 1 to 65535"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := run(context.Background(), func(k string) string { return tt.env[k] }, &bytes.Buffer{}, nil)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("run(%v) = %v, want an error naming %s", tt.env, err, tt.want)
			}
		})
	}
}

// A config error names a variable set under a name close to a setting's:
// a required setting reported missing is most often one misspelt.
func TestConfigErrorNamesAMisspeltVariable(t *testing.T) {
	t.Setenv("DATABSE_URL", "host=/tmp/misspelt-value")
	t.Setenv("GOMEMLIMT", "64MiB") // a setting read outside the Reader (gcdefaults) is named too
	env := map[string]string{"IDENTITY_SECRET": "run-test-identity-secret-0123456789abcdef"}
	err := run(context.Background(), func(k string) string { return env[k] }, io.Discard, nil)
	if err == nil || !strings.Contains(err.Error(), "DATABASE_URL") ||
		!strings.Contains(err.Error(), "DATABSE_URL is set: did you mean DATABASE_URL?") ||
		!strings.Contains(err.Error(), "GOMEMLIMT is set: did you mean GOMEMLIMIT?") ||
		strings.Contains(err.Error(), "misspelt-value") {
		t.Errorf("run() without DATABASE_URL = %v, want the config error with a hint naming DATABSE_URL, not its value", err)
	}
}

// A database renamed (or dropped) under a running gateway refuses the key
// lookups' new connections (SQLSTATE 3D000): a keyed request gets the 503
// envelope, whose log line says what the operator must put right, and once
// the database is back lookups pass again with no restart (here an unknown
// key's 401).
func TestRunAnswersADatabaseRenamedUnderIt(t *testing.T) {
	dsn := testenv.PostgresURL(t)
	answersARefusalUnderIt(t, dsn, func() func() { return testenv.RenameDatabase(t, dsn) },
		"3D000", "DATABASE_URL's database does not exist", "")
}

// A password changed under a running gateway (rotated in PostgreSQL
// before DATABASE_URL) refuses the key lookups' new connections
// (SQLSTATE 28P01, on a cluster that asks for it) as a database renamed
// does, and neither the log nor an answer holds the password.
func TestRunAnswersAPasswordChangedUnderIt(t *testing.T) {
	role := testenv.PasswordCluster(t)
	answersARefusalUnderIt(t, role.DSN, func() func() {
		restore := role.ChangePassword(t)
		role.EndSessions(t) // the gateway's pool opens new ones
		return restore
	},
		"28P01", "PostgreSQL refused the password of DATABASE_URL's role", role.Password)
}

// answersARefusalUnderIt runs the gateway on dsn, has refuse make
// PostgreSQL refuse its new connections with code, and checks that keyed
// requests are 503 with the log naming cause, until refuse's restore,
// after which lookups pass again. secret must be in no log line nor any
// answer ("" for none).
func answersARefusalUnderIt(t *testing.T, dsn string, refuse func() (restore func()), code, cause, secret string) {
	t.Helper()
	addr := testenv.FreeAddr(t)
	env := map[string]string{
		"GATEWAY_ADDR": addr, "GATEWAY_ADMIN_ADDR": testenv.FreeAddr(t),
		"DATABASE_URL": dsn, "REDIS_URL": testenv.RedisURL(t), "RATE_LIMIT_KEY_PREFIX": testenv.KeyPrefix(t),
		"IDENTITY_SECRET": "run-test-identity-secret-0123456789abcdef",
	}
	maps.Copy(env, downUpstreams(t))
	cancel, out, done := runGateway(env)
	defer cancel()
	defer func() {
		cancel()
		<-done
	}()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		resp, err := http.Get("http://" + addr + "/v1/health")
		if err == nil {
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("gateway not listening: %v\n%s", err, out.String())
		}
	}
	lookup := func() int {
		resp := getWithUnknownKey(t, addr)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		if secret != "" && strings.Contains(string(body), secret) {
			t.Errorf("an answer holds the password: %s", body)
		}
		return resp.StatusCode
	}
	restore := refuse()
	// The first lookups may meet the pool's connections the refusal ended
	// (a broken pipe): 503 too, then new connections are refused. Waited
	// for is the lookup's line naming the cause, not the code alone: the
	// revocation listener's reconnection meets the refusal too, and its
	// WARN, which names the code and no cause, may come first.
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(out.String(), `"cause":"`+cause); {
		if got := lookup(); got != http.StatusServiceUnavailable {
			t.Fatalf("a keyed request with new connections refused (%s) = %d, want 503", code, got)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no lookup's line said what to do of the refusal (%s, cause %q) in 10 s:\n%s", code, cause, out.String())
		}
	}
	if logs := out.String(); !strings.Contains(logs, code) {
		t.Errorf("the log does not name the refusal's code %s:\n%s", code, logs)
	}
	restore()
	for deadline := time.Now().Add(10 * time.Second); lookup() != http.StatusUnauthorized; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("an unknown key is not answered 401 10 s after the refusal ended:\n%s", out.String())
		}
	}
	if secret != "" && strings.Contains(out.String(), secret) {
		t.Errorf("the log holds the password:\n%s", out.String())
	}
}
