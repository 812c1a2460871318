package telemetry

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/testenv"
	"go.opentelemetry.io/otel"
)

// A process without a trace exporter records no span, unless a sampler is
// asked for, and every span still has a trace id (the request id).
func TestSetupRecordsOnlyWhatCanBeExported(t *testing.T) {
	for _, tc := range []struct {
		name          string
		env           map[string]string
		wantRecording bool
	}{
		{"no exporter", nil, false},
		{"no exporter, sampler asked for", map[string]string{"OTEL_TRACES_SAMPLER": "always_on"}, true},
		{"no exporter, a sampler that drops", map[string]string{"OTEL_TRACES_SAMPLER": "always_off"}, false},
		// Never dialled: the batch exporter connects when it first sends,
		// and no span is ended here.
		{"exporter", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The SDK reads OTEL_TRACES_SAMPLER from the process environment,
			// as Setup does in production (getenv = os.Getenv).
			for _, k := range []string{"OTEL_TRACES_SAMPLER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"} {
				t.Setenv(k, tc.env[k])
			}
			shutdown, err := Setup(context.Background(), os.Getenv, "test", slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatalf("Setup() error = %v", err)
			}
			t.Cleanup(func() { _ = shutdown(context.Background()) })
			_, span := otel.GetTracerProvider().Tracer("test").Start(context.Background(), "op")
			if got := span.IsRecording(); got != tc.wantRecording {
				t.Errorf("span recording = %v, want %v", got, tc.wantRecording)
			}
			if sc := span.SpanContext(); !sc.TraceID().IsValid() || sc.IsSampled() != tc.wantRecording {
				t.Errorf("span context = trace %s sampled %v, want a valid trace id, sampled %v", sc.TraceID(), sc.IsSampled(), tc.wantRecording)
			}
		})
	}
}

// What the SDK could not do (an export that failed) reaches the binary's
// JSON log, not a plain-text line of the standard log package.
func TestSDKErrorsAreLogged(t *testing.T) {
	var buf bytes.Buffer
	shutdown, err := Setup(context.Background(), func(string) string { return "" }, "test", slog.New(slog.NewJSONHandler(&buf, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = shutdown(context.Background()) })
	otel.Handle(errors.New("traces export: connection refused"))
	var line struct {
		Level, Msg, Error string
	}
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil || line.Level != "WARN" || line.Error != "traces export: connection refused" {
		t.Errorf("log after an SDK error = %q (%v), want one JSON WARN line with the error", buf.String(), err)
	}
}

// Stopping gives up on a collector that does not answer after
// flushTimeout, rather than holding the process's exit for the exporter's
// own 30 s.
func TestShutdownIsBounded(t *testing.T) {
	collector := testenv.ServeConns(t, func(c net.Conn) { io.Copy(io.Discard, c) }) // reads, never answers
	defer func(d time.Duration) { flushTimeout = d }(flushTimeout)
	flushTimeout = 300 * time.Millisecond
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+collector) // the exporter reads the process's environment
	shutdown, err := Setup(context.Background(), os.Getenv, "test", slog.New(slog.NewJSONHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	_, span := otel.Tracer("test").Start(context.Background(), "op")
	span.End()
	start := time.Now()
	_ = shutdown(context.Background())
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("shutdown with a silent collector took %s, want about flushTimeout (300ms)", took)
	}
}

// A protocol no exporter speaks stops the start with the name of the
// variable that holds it: OTEL_EXPORTER_OTLP_TRACES_PROTOCOL wins over
// OTEL_EXPORTER_OTLP_PROTOCOL, and an error naming the other one sends the
// operator to a setting that is right.
func TestUnknownProtocolNamesItsVariable(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "OTEL_EXPORTER_OTLP_PROTOCOL"},
		{map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"},
			"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"},
	} {
		tc.env["OTEL_EXPORTER_OTLP_ENDPOINT"] = "http://127.0.0.1:1"
		_, err := Setup(context.Background(), func(name string) string { return tc.env[name] }, "test", slog.New(slog.DiscardHandler))
		if err == nil || !strings.HasPrefix(err.Error(), "telemetry: "+tc.want+" must be") {
			t.Errorf("Setup(%v) = %v, want an error naming %s", tc.env, err, tc.want)
		}
	}
}
