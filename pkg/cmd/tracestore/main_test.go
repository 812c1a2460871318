package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// make trace finds a request whose id was quoted upper-cased or with the
// spaces a copy picked up, and refuses what is no request id at all.
func TestShowReadsARequestIDAsQuoted(t *testing.T) {
	const id = "4bf92f3577b34da6a3ce929d0e0e4736"
	file := filepath.Join(t.TempDir(), "traces.jsonl")
	line := `{"trace_id":"` + id + `","span_id":"00f067aa0ba902b7","service":"gateway","name":"GET /v1/health","kind":"server","start":"2026-11-22T04:00:00Z","duration_ms":1.5}` + "\n"
	if err := os.WriteFile(file, []byte(line), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, quoted := range []string{id, strings.ToUpper(id), " " + id + "\n"} {
		var out bytes.Buffer
		if err := show(&out, file, quoted); err != nil || !strings.Contains(out.String(), "GET /v1/health") {
			t.Errorf("show(%q) = %v, output %q; want the trace", quoted, err, out.String())
		}
	}
	if err := show(&bytes.Buffer{}, file, "not-an-id"); err == nil {
		t.Error("show(not-an-id) = nil error, want one")
	}
}
