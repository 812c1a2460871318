package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coinexport/export/gateway/edge"
	"github.com/coinexport/export/pkg/envdoc"
	"github.com/coinexport/export/pkg/postgres"
	"github.com/coinexport/export/pkg/telemetry"
)

// The gateway's settings as the READMEs document them and the manifests
// set them are the ones it reads, with the defaults it applies (envdoc).
func TestSettingsAsDocumentedAndDeployed(t *testing.T) {
	gatewayForDocs(t).Test(t, "testdata/repository", "gateway")
}

// gatewayForDocs is the gateway as envdoc checks it; what it reads is learned
// by starting it (envdoc.ReadAtStart).
func gatewayForDocs(t *testing.T) envdoc.Binary[edge.Config] {
	base := map[string]string{
		"DATABASE_URL":    envdoc.Secrets["DATABASE_URL"],
		"IDENTITY_SECRET": envdoc.Secrets["IDENTITY_SECRET"],
	}
	read := envdoc.ReadAtStart(t, base, "GATEWAY_ADDR", "GATEWAY_ADMIN_ADDR", func(ctx context.Context, getenv func(string) string) error {
		return run(ctx, getenv, io.Discard, nil)
	})
	return envdoc.Binary[edge.Config]{
		Name: "gateway",
		Load: func(getenv func(string) string) (edge.Config, error) {
			cfg, err := edge.LoadConfig(getenv)
			cfg.GC = cfg.GC.InForce() // the runtime's settings once main applied the defaults
			return cfg, err
		},
		Read:       read,
		Base:       base,
		Listeners:  func(c edge.Config) (string, string) { return c.Addr, c.AdminAddr },
		HealthPath: "/v1/health",
		Settings:   func(c edge.Config) []string { return c.Settings },
		// Serving on, draining, closing the key store's pool
		// (postgres.Close), then the last flush of spans, bounded on its
		// own (edge.Gateway.Shutdown).
		Stop: func(c edge.Config) time.Duration {
			return c.ShutdownDelay + c.ShutdownTimeout + postgres.CloseWait + telemetry.MaxFlushTime
		},
	}
}

// upstreamListeners are, for each upstream URL list the gateway reads, the
// setting of the service's listener it must point at.
var upstreamListeners = map[string]string{
	"EXPORT_READER_URLS": "EXPORT_READER_ADDR",
	"SALES_WRITER_URLS":  "SALES_WRITER_ADDR",
	"SHOP_SCHEMA_URLS":   "SHOP_SCHEMA_ADDR",
}

// Each upstream URL the manifests and make run give the gateway names a
// service there and the port its pods listen on: the gateway resolves the name to the
// pods' addresses (UPSTREAM_RESOLVE_INTERVAL) and connects to them on the
// URL's port, past any port mapping of a Service.
func TestUpstreamURLsReachTheServicesListeners(t *testing.T) {
	m, err := envdoc.ReadManifest("../"+envdoc.ManifestFile, envdoc.Secrets)
	if err != nil {
		t.Fatal(err)
	}
	compose, err := envdoc.ReadCompose("../"+envdoc.ComposeFile, envdoc.Secrets)
	if err != nil {
		t.Fatal(err)
	}
	local, err := envdoc.ReadRunScript("../"+envdoc.RunScriptFile, map[string]string{"state": "/run", "state_in_url": "/run"}, envdoc.Secrets)
	if err != nil {
		t.Fatal(err)
	}
	for _, urlsVar := range slices.Sorted(maps.Keys(upstreamListeners)) {
		addrVar := upstreamListeners[urlsVar]
		for _, u := range upstreamURLs(t, m.Containers["gateway"].Env[urlsVar]) {
			svc, ok := m.Services[u.Hostname()]
			if !ok {
				t.Errorf("%s: %s=%s: no Service %s", envdoc.ManifestFile, urlsVar, u, u.Hostname())
				continue
			}
			if listen := m.Containers[svc.App].Env[addrVar]; fmt.Sprint(envdoc.Port(listen)) != u.Port() {
				t.Errorf("%s: %s=%s, but the pods of Service %s listen on %s (%s)", envdoc.ManifestFile, urlsVar, u, u.Hostname(), listen, addrVar)
			}
		}
		for _, u := range upstreamURLs(t, compose["gateway"].Env[urlsVar]) {
			s, ok := compose[u.Hostname()]
			if listen := s.Env[addrVar]; !ok || fmt.Sprint(envdoc.Port(listen)) != u.Port() {
				t.Errorf("%s: %s=%s, but service %s listens on %q (%s)", envdoc.ComposeFile, urlsVar, u, u.Hostname(), listen, addrVar)
			}
		}
		for _, u := range upstreamURLs(t, local[urlsVar]) {
			if u.Host != local[addrVar] {
				t.Errorf("%s: %s=%s, but %s=%s", envdoc.RunScriptFile, urlsVar, u, addrVar, local[addrVar])
			}
		}
	}
}

func upstreamURLs(t *testing.T, list string) []*url.URL {
	t.Helper()
	var out []*url.URL
	for _, raw := range strings.Split(list, ",") {
		u, err := url.Parse(strings.TrimSpace(raw))
		if err != nil || u.Port() == "" {
			t.Errorf("upstream URL %q: want http://host:port", raw)
			continue
		}
		out = append(out, u)
	}
	return out
}

// clusterDNSTTL is how old an answer of the cluster's DNS may be when the
// gateway resolves a headless Service: CoreDNS's kubernetes plugin gives
// its answers a TTL of 5 s by default, and its cache keeps them that long.
// endpointsLag is a margin for the deletion of a pod to reach CoreDNS
// (EndpointSlices, watched).
const clusterDNSTTL, endpointsLag = 5 * time.Second, 2 * time.Second

// A pod deleted (a rollout's old pod, an eviction, a scale-down) leaves its
// headless Service at once, but a gateway goes on sending to it until it
// resolves the name again, every UPSTREAM_RESOLVE_INTERVAL, to an answer
// up to the DNS's TTL old. Each service's pods must serve on that long
// before SIGTERM (a preStop sleep): stopped at once, a rollout of two
// writers stopped the second old pod while the gateway still knew only
// the two old ones, and every sale was answered 503 upstream_unavailable
// for 7 s (a drill whose gateway resolved the writers' name; gateway
// README, "Replicas behind one name").
func TestDeletedPodsServeOnUntilTheGatewayResolvedThemAway(t *testing.T) {
	m, err := envdoc.ReadManifest("../"+envdoc.ManifestFile, envdoc.Secrets)
	if err != nil {
		t.Fatal(err)
	}
	env := m.Containers["gateway"].Env
	interval, err := time.ParseDuration(env["UPSTREAM_RESOLVE_INTERVAL"])
	if err != nil || interval <= 0 {
		t.Fatalf("%s: UPSTREAM_RESOLVE_INTERVAL=%q: the test expects the gateway to resolve the services' names", envdoc.ManifestFile, env["UPSTREAM_RESOLVE_INTERVAL"])
	}
	want := interval + clusterDNSTTL + endpointsLag
	for _, urlsVar := range slices.Sorted(maps.Keys(upstreamListeners)) {
		for _, u := range upstreamURLs(t, env[urlsVar]) {
			svc, ok := m.Services[u.Hostname()]
			if !ok {
				continue // TestUpstreamURLsReachTheServicesListeners names it
			}
			if got := m.Containers[svc.App].PreStopSleep; got < want {
				t.Errorf("%s: %s's pods sleep %s in preStop, want at least %s (UPSTREAM_RESOLVE_INTERVAL %s + the DNS's TTL %s + %s for the deletion to reach it)",
					envdoc.ManifestFile, svc.App, got, want, interval, clusterDNSTTL, endpointsLag)
			}
		}
	}
}
