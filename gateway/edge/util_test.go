package edge_test

import (
	"bytes"
	"encoding/json"
	"io"
	"strconv"
	"testing"
	"time"
)

type healthBody struct {
	Status  string            `json:"status"`
	Version string            `json:"version"`
	Checks  map[string]string `json:"checks"`
}

func health(t *testing.T, base string) healthBody {
	t.Helper()
	r := do(t, "GET", base+"/v1/health", nil, nil)
	checkEnvelope(t, r)
	if r.Status != 200 {
		t.Fatalf("GET /v1/health = %d %s, want 200", r.Status, r.Body)
	}
	var h healthBody
	if err := json.Unmarshal(r.Env.Data, &h); err != nil {
		t.Fatal(err)
	}
	return h
}

func healthCheck(t *testing.T, base, name string) string {
	t.Helper()
	return health(t, base).Checks[name]
}

// waitFor polls ok until it holds or d passes; it fails the test then.
func waitFor(t *testing.T, d time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v", d)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// grep returns the lines of b that contain s.
func grep(b []byte, s string) string {
	var out [][]byte
	for _, l := range bytes.Split(b, []byte("\n")) {
		if bytes.Contains(l, []byte(s)) {
			out = append(out, l)
		}
	}
	return string(bytes.Join(out, []byte("\n")))
}

// wantSeries reports each series (a whole exposition line, value included)
// that metrics lack, showing the lines of family it has.
func wantSeries(t *testing.T, metrics []byte, family string, series ...string) {
	t.Helper()
	for _, line := range series {
		if !bytes.Contains(metrics, []byte(line)) {
			t.Errorf("metrics lack %s:\n%s", line, grep(metrics, family))
		}
	}
}

// seriesValue is the value of the series named series (its name and
// labels, as written) in metrics, or -1 if metrics lack it.
func seriesValue(metrics []byte, series string) float64 {
	for _, l := range bytes.Split(metrics, []byte("\n")) {
		if name, value, ok := bytes.Cut(l, []byte(" ")); ok && string(name) == series {
			if v, err := strconv.ParseFloat(string(value), 64); err == nil {
				return v
			}
		}
	}
	return -1
}

// scrape returns the gateway's Prometheus exposition.
func scrape(t *testing.T, adminURL string) []byte {
	t.Helper()
	resp, err := client.Get(adminURL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET /metrics = %d, %v", resp.StatusCode, err)
	}
	return b
}
