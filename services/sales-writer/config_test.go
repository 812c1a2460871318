package main

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

const secret = "0123456789abcdef0123456789abcdef"

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestLoadConfigDefaults(t *testing.T) {
	got, err := loadConfig(env(map[string]string{"DATABASE_URL": "host=/tmp", "IDENTITY_SECRET": secret,
		"IDENTITY_SECRET_PREVIOUS": secret + "-old"}))
	if err != nil {
		t.Fatal(err)
	}
	want := Config{Addr: "127.0.0.1:8082", AdminAddr: "127.0.0.1:9082", DatabaseURL: "host=/tmp", DBMaxConns: 8, CommitGroups: 1,
		QueryTimeout: 10 * time.Second, ShutdownDelay: 3 * time.Second, IdentitySecret: secret, IdentityPrevious: []string{secret + "-old"}, IdempotencyRetention: 24 * time.Hour, PurgeInterval: 5 * time.Minute, LogLevel: "info"}
	if diff := cmp.Diff(want, got, cmpopts.IgnoreFields(Config{}, "Settings")); diff != "" {
		t.Errorf("loadConfig mismatch (-want +got):\n%s", diff)
	}
}

func TestLoadConfigRefuses(t *testing.T) {
	base := map[string]string{"DATABASE_URL": "host=/tmp", "IDENTITY_SECRET": secret}
	tests := []struct{ name, key, value, wantInErr string }{
		{"no database", "DATABASE_URL", "", "DATABASE_URL"},
		{"blank database", "DATABASE_URL", "   ", "DATABASE_URL"},
		{"short secret", "IDENTITY_SECRET", "short", "IDENTITY_SECRET"},
		{"short previous secret", "IDENTITY_SECRET_PREVIOUS", "short", "IDENTITY_SECRET_PREVIOUS"},
		{"bad retention", "IDEMPOTENCY_RETENTION", "a day", "IDEMPOTENCY_RETENTION"},
		{"negative retention", "IDEMPOTENCY_RETENTION", "-1h", "IDEMPOTENCY_RETENTION"},
		{"bad purge interval", "IDEMPOTENCY_PURGE_INTERVAL", "0s", "IDEMPOTENCY_PURGE_INTERVAL"},
		{"bad pool size", "SALES_WRITER_DB_MAX_CONNS", "0", "SALES_WRITER_DB_MAX_CONNS"},
		{"bad query timeout", "SALES_WRITER_QUERY_TIMEOUT", "0s", "SALES_WRITER_QUERY_TIMEOUT"},
		{"shutdown delay over a minute", "SALES_WRITER_SHUTDOWN_DELAY", "2m", "SALES_WRITER_SHUTDOWN_DELAY"},
		{"admin on the main address", "SALES_WRITER_ADMIN_ADDR", "127.0.0.1:8082", "SALES_WRITER_ADDR and SALES_WRITER_ADMIN_ADDR must be different"},
		{"bad GOGC", "GOGC", "abc", "GOGC"},
		{"GOMEMLIMIT of 0, not off", "GOMEMLIMIT", "0", "GOMEMLIMIT"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := map[string]string{}
			for k, v := range base {
				m[k] = v
			}
			m[tt.key] = tt.value
			_, err := loadConfig(env(m))
			if err == nil || !strings.Contains(err.Error(), tt.wantInErr) {
				t.Errorf("loadConfig(%s=%q) = %v, want an error naming %s", tt.key, tt.value, err, tt.wantInErr)
			}
			if err != nil && strings.Contains(err.Error(), secret) {
				t.Errorf("loadConfig error %q quotes the secret", err)
			}
		})
	}
}

// IDENTITY_ACCEPT_UNBOUND (off by default) is read, for the upgrade to
// identity-v2 (README), and refused unless a boolean.
func TestLoadConfigAcceptUnbound(t *testing.T) {
	base := map[string]string{"DATABASE_URL": "host=/tmp", "IDENTITY_SECRET": secret}
	if cfg, err := loadConfig(env(base)); err != nil || cfg.IdentityAcceptUnbound {
		t.Errorf("loadConfig() accept unbound = %v, %v; want false by default", cfg.IdentityAcceptUnbound, err)
	}
	base["IDENTITY_ACCEPT_UNBOUND"] = "true"
	if cfg, err := loadConfig(env(base)); err != nil || !cfg.IdentityAcceptUnbound {
		t.Errorf("loadConfig(IDENTITY_ACCEPT_UNBOUND=true) = %v, %v; want true", cfg.IdentityAcceptUnbound, err)
	}
	base["IDENTITY_ACCEPT_UNBOUND"] = "maybe"
	if _, err := loadConfig(env(base)); err == nil || !strings.Contains(err.Error(), "IDENTITY_ACCEPT_UNBOUND") {
		t.Errorf("loadConfig(IDENTITY_ACCEPT_UNBOUND=maybe) = %v, want an error naming it", err)
	}
}
