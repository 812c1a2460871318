package envdoc

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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

// A pod template's container is read whole: its ports, probes, preStop
// sleep and memory, the pod's scrape port and grace period (Kubernetes'
// 30 s when the pod leaves it out), and a memory it cannot read is an
// error naming the container and the field.
func TestReadManifestReadsPodTemplates(t *testing.T) {
	const manifest = `
kind: Deployment
metadata: {name: gateway}
spec:
  template:
    metadata:
      annotations: {prometheus.io/port: "9080"}
    spec:
      terminationGracePeriodSeconds: 45
      containers:
        - name: gateway
          env: [{name: LOG_LEVEL, value: info}]
          ports: [{containerPort: 8080}, {containerPort: 9080}]
          readinessProbe: {httpGet: {path: /v1/health, port: 8080}}
          livenessProbe: {httpGet: {path: /livez, port: 9080}}
          lifecycle: {preStop: {sleep: {seconds: 5}}}
          resources: {requests: {memory: 64Mi}, limits: {memory: 1Gi}}
---
kind: Job
metadata: {name: migrate}
spec:
  template:
    spec:
      containers:
        - name: migrate
`
	path := filepath.Join(t.TempDir(), "manifest.yaml")
	if err := os.WriteFile(path, []byte(manifest), 0o600); err != nil {
		t.Fatal(err)
	}
	m, err := ReadManifest(path, nil)
	if err != nil {
		t.Fatalf("ReadManifest() error %v", err)
	}
	want := map[string]Container{
		"gateway": {Env: map[string]string{"LOG_LEVEL": "info"}, Ports: []int{8080, 9080},
			Probes:     map[string]Probe{"readiness": {Path: "/v1/health", Port: 8080}, "liveness": {Path: "/livez", Port: 9080}},
			ScrapePort: "9080", GracePeriod: 45 * time.Second, PreStopSleep: 5 * time.Second,
			MemoryRequest: 64 << 20, MemoryLimit: 1 << 30},
		"migrate": {Env: map[string]string{}, Probes: map[string]Probe{}, GracePeriod: defaultGracePeriod},
	}
	if diff := cmp.Diff(want, m.Containers); diff != "" {
		t.Errorf("ReadManifest() containers mismatch (-want +got):\n%s", diff)
	}

	bad := strings.Replace(manifest, "limits: {memory: 1Gi}", "limits: {memory: lots}", 1)
	if err := os.WriteFile(path, []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadManifest(path, nil); err == nil || !strings.Contains(err.Error(), "container gateway: resources.limits.memory: ") {
		t.Errorf("ReadManifest(limits.memory: lots) error = %v, want the container and the field named", err)
	}
}
