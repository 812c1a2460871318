package envdoc

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.yaml.in/yaml/v3"
)

// A container's environment is its ConfigMaps' keys with its env entries
// over them, a Secret's key given its sample value, an optional one without
// a value left unset, as Kubernetes makes it.
func TestContainerEnv(t *testing.T) {
	var c struct {
		Env     []envVar
		EnvFrom []envFromSource `yaml:"envFrom"`
	}
	const container = `
envFrom:
  - configMapRef: {name: common}
env:
  - {name: LOG_LEVEL, value: debug}
  - name: IDENTITY_SECRET
    valueFrom: {secretKeyRef: {name: s, key: identity-secret}}
  - name: IDENTITY_SECRET_PREVIOUS
    valueFrom: {secretKeyRef: {name: s, key: identity-secret-previous, optional: true}}
`
	if err := yaml.Unmarshal([]byte(container), &c); err != nil {
		t.Fatal(err)
	}
	configMaps := map[string]map[string]string{"common": {"LOG_LEVEL": "info", "REDIS_URL": "redis://redis:6379/0"}}
	secrets := map[string]string{"identity-secret": "sample"}
	got, err := containerEnv(c.Env, c.EnvFrom, configMaps, secrets)
	if err != nil {
		t.Fatalf("containerEnv() error %v", err)
	}
	want := map[string]string{"LOG_LEVEL": "debug", "REDIS_URL": "redis://redis:6379/0", "IDENTITY_SECRET": "sample"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("containerEnv() mismatch (-want +got):\n%s", diff)
	}

	if _, err := containerEnv(c.Env, c.EnvFrom, configMaps, nil); err == nil ||
		!strings.Contains(err.Error(), "IDENTITY_SECRET: no sample value for secret key identity-secret") {
		t.Errorf("containerEnv(no sample secrets) error = %v, want the variable and its key named", err)
	}
	if _, err := containerEnv(nil, c.EnvFrom, nil, secrets); err == nil || !strings.Contains(err.Error(), "no ConfigMap common") {
		t.Errorf("containerEnv(no ConfigMaps) error = %v, want the missing ConfigMap named", err)
	}
}
