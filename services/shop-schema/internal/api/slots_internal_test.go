package api

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http/httptest"
	"testing"

	"github.com/coinexport/export/pkg/logging"
)

// A read refused with every slot taken is logged after the refusal, and
// the reads that held the slots may all have ended by then: the WARN then
// names no oldest read, where it named one held since year 1
// (oldest_since 0001-01-01, oldest_held_ms 9223372036854).
func TestSlotsFreedBeforeTheirWarnNameNoOldestRead(t *testing.T) {
	var out bytes.Buffer
	h := &Handler{log: slog.New(slog.NewJSONHandler(&out, nil)), slots: newSlots(1),
		busyLines: &logging.Throttle{Interval: busyLineInterval}}
	held := h.slots.take("first")
	if h.slots.take("second") != nil {
		t.Fatal("take with the one slot held = a slot, want none")
	}
	h.slots.release(held) // the first read ends before the second's WARN
	h.logSlotsHeld(httptest.NewRequest("POST", "/v1/sync/prestashop/schema", nil))
	var line map[string]any
	if err := json.Unmarshal(out.Bytes(), &line); err != nil {
		t.Fatalf("the WARN = %q: %v", out.String(), err)
	}
	for _, k := range []string{"oldest_request_id", "oldest_shop_host", "oldest_since", "oldest_held_ms"} {
		if v, ok := line[k]; ok {
			t.Errorf("the WARN's %s = %v, want none: no read holds a slot", k, v)
		}
	}
	if line["shop_hosts"] != 0.0 || line["reading_body"] != 0.0 {
		t.Errorf("the WARN = %s, want shop_hosts 0 and reading_body 0", out.String())
	}
}
