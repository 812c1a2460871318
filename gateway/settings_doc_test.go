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
	"github.com/coinexport/export/pkg/telemetry"
)

// The gateway's settings as the READMEs document them and the manifests
// set them are the ones it reads, with the defaults it applies (envdoc).
func TestSettingsAsDocumentedAndDeployed(t *testing.T) {
	gatewayForDocs(t).Test(t, "..", "gateway")
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
		// Serving on, draining, then the last flush of spans, bounded on its
		// own (edge.Gateway.Shutdown).
		Stop: func(c edge.Config) time.Duration { return c.ShutdownDelay + c.ShutdownTimeout + telemetry.MaxFlushTime },
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
