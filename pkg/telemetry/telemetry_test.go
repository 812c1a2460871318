package telemetry

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	stdlog "log"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/envconfig"
	"github.com/coinexport/export/pkg/testenv"
	"github.com/go-logr/logr/funcr"
	"github.com/go-logr/stdr"
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
		{"exporter, OTEL_TRACES_EXPORTER=none",
			map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_TRACES_EXPORTER": "none"}, false},
		{"exporter, OTEL_TRACES_EXPORTER=otlp",
			map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:1", "OTEL_TRACES_EXPORTER": "otlp"}, true},
		{"exporter, OTEL_SDK_DISABLED=true",
			map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_SDK_DISABLED": "true"}, false},
		{"exporter, OTEL_SDK_DISABLED=false",
			map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_SDK_DISABLED": "false"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The SDK reads OTEL_TRACES_SAMPLER from the process environment,
			// as Setup does in production (getenv = os.Getenv).
			for _, k := range []string{"OTEL_TRACES_SAMPLER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
				"OTEL_TRACES_EXPORTER", "OTEL_SDK_DISABLED"} {
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
// own 30 s, and says in the log that spans were lost: the SDK drops them
// without a word, and the binaries' run ignored the error (export-reader,
// sales-writer, the gateway).
func TestShutdownIsBoundedAndSaysSpansWereLost(t *testing.T) {
	collector := testenv.ServeConns(t, func(c net.Conn) { io.Copy(io.Discard, c) }) // reads, never answers
	defer func(d time.Duration) { flushTimeout = d }(flushTimeout)
	flushTimeout = 300 * time.Millisecond
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+collector) // the exporter reads the process's environment
	var logs testenv.Output
	shutdown, err := Setup(context.Background(), os.Getenv, "test", slog.New(slog.NewJSONHandler(&logs, nil)))
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
	if got := logs.String(); !strings.Contains(got, `"level":"WARN","msg":"opentelemetry error (spans may be lost)","error":"telemetry: the last spans were not flushed at stop`) {
		t.Errorf("log after a flush given up = %q, want a WARN that the last spans were not flushed", got)
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

// Names holds every variable the SDK's trace and resource packages and the
// OTLP trace exporters read, as their sources name them (an upgrade that
// reads a new one fails here, not in a misspelling gone unwarned), and
// every one Setup reads itself.
func TestNamesAreWhatTracingReads(t *testing.T) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}",
		"go.opentelemetry.io/otel/sdk",
		"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp",
		"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	dirs := strings.Fields(string(out))
	if len(dirs) != 3 {
		t.Fatalf("go list gave %q, want three module folders", dirs)
	}
	quoted := regexp.MustCompile(`"([A-Z][A-Z_]*)"`)
	read := map[string]string{} // variable → the source that names it
	scan := func(file, prefix string) {
		src, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range quoted.FindAllStringSubmatch(string(src), -1) {
			name := m[1]
			if !strings.HasPrefix(name, "OTEL_") {
				name = prefix + name
			}
			if strings.HasPrefix(name, "OTEL_") && name != "OTEL_EXPORTER_OTLP" && !strings.HasPrefix(name, "OTEL_GO_X_") {
				read[name] = file
			}
		}
	}
	for _, f := range []string{"trace/sampler_env.go", "trace/internal/env/env.go", "resource/env.go"} {
		scan(filepath.Join(dirs[0], f), "")
	}
	for _, exporter := range dirs[1:] {
		// The exporters' names are written without their namespace.
		scan(filepath.Join(exporter, "internal/otlpconfig/envconfig.go"), "OTEL_EXPORTER_OTLP_")
	}
	scan("telemetry.go", "")
	if len(read) < 30 {
		t.Fatalf("found %d variables in the sources, want the SDK's and the exporters' (more than 30)", len(read))
	}
	for name, source := range read {
		if !slices.Contains(Names, name) {
			t.Errorf("%s (read in %s) is not in Names", name, source)
		}
	}
}

// An exporter no binary has stops the start, naming the variable: its
// spans would otherwise go nowhere without a word.
func TestUnknownTracesExporterStopsTheStart(t *testing.T) {
	env := map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_TRACES_EXPORTER": "console"}
	_, err := Setup(context.Background(), func(name string) string { return env[name] }, "test", slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "OTEL_TRACES_EXPORTER must be otlp or none") {
		t.Errorf("Setup with OTEL_TRACES_EXPORTER=console = %v, want an error naming the variable", err)
	}
}

// A propagator asked for and not propagated is warned of, once each; the
// two that are propagated are not.
func TestOtherPropagatorsAreWarnedOf(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	env := map[string]string{"OTEL_PROPAGATORS": "tracecontext, baggage,b3,jaeger"}
	shutdown, err := Setup(context.Background(), func(name string) string { return env[name] }, "test", log)
	if err != nil {
		t.Fatalf("Setup() error = %v", err)
	}
	t.Cleanup(func() { _ = shutdown(context.Background()) })
	var warned []string
	for line := range strings.Lines(buf.String()) {
		var entry struct{ Msg, Propagator string }
		if err := json.Unmarshal([]byte(line), &entry); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if strings.HasPrefix(entry.Msg, "OTEL_PROPAGATORS ignored") {
			warned = append(warned, entry.Propagator)
		}
	}
	if want := []string{"b3", "jaeger"}; !slices.Equal(warned, want) {
		t.Errorf("warned of %q, want %q (log: %s)", warned, want, buf.String())
	}
}

// With Names among a binary's settings, a tracing variable written wrong is
// warned of at start with the one meant, and the log batch processor's
// variables, set for other programs, are not taken for the span
// processor's written wrong.
func TestTracingVariablesWrittenWrongAreWarnedOf(t *testing.T) {
	environ := []string{
		"OTEL_EXPORTER_OTLP_ENDPIONT=http://collector:4318",
		"OTEL_SERVICENAME=gateway",
		"OTEL_BLRP_SCHEDULE_DELAY=1000",
		"OTEL_EXPORTER_OTLP_TRACES_INSECURE=true",
	}
	want := []envconfig.Misspelling{
		{Name: "OTEL_EXPORTER_OTLP_ENDPIONT", Meant: "OTEL_EXPORTER_OTLP_ENDPOINT"},
		{Name: "OTEL_SERVICENAME", Meant: "OTEL_SERVICE_NAME"},
	}
	if got := envconfig.Misspelt(environ, Names); !slices.Equal(got, want) {
		t.Errorf("Misspelt = %v, want %v", got, want)
	}
}

// OTLP headers carry a collector's credentials (authorization=Bearer …,
// a vendor's API key), and an endpoint may carry user info. The SDK reads
// these variables itself and, when one does not parse, writes it whole
// with its own logger to stderr ("parse headers" "input"="authorization:
// Bearer …", "escape header value" "value"=…, "parse url" "input"=…),
// then goes on without the header, or without the endpoint, exporting to
// localhost. Such a setting stops the start instead, named and not quoted,
// and nothing of it is written anywhere.
func TestOTLPSettingsThatDoNotParseStopTheStartUnquoted(t *testing.T) {
	const secret = "OtlpSecretCanary"
	for _, tc := range []struct{ name, value, want string }{
		{"OTEL_EXPORTER_OTLP_HEADERS", "authorization: Bearer " + secret, "OTEL_EXPORTER_OTLP_HEADERS"},
		{"OTEL_EXPORTER_OTLP_HEADERS", "x-team=a%2Cb,authorization=Bearer%20" + secret + "%zz", "OTEL_EXPORTER_OTLP_HEADERS"},
		{"OTEL_EXPORTER_OTLP_TRACES_HEADERS", "authorization=" + secret + "%", "OTEL_EXPORTER_OTLP_TRACES_HEADERS"},
		{"OTEL_EXPORTER_OTLP_HEADERS", secret + " key=x", "OTEL_EXPORTER_OTLP_HEADERS"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:" + secret + "@127.0.0.1:4318/%zz", "OTEL_EXPORTER_OTLP_ENDPOINT"},
		{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://collector:" + secret + "@127.0.0.1:4318/v1/traces%", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"},
	} {
		t.Run(tc.name+"="+tc.value, func(t *testing.T) {
			env := map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", tc.name: tc.value}
			for name, value := range env {
				t.Setenv(name, value) // the SDK reads the process environment itself
			}
			var sdkLog, log bytes.Buffer
			// The SDK's own logger (stderr by default), every level; its
			// default again after, so that no later test writes into this
			// subtest's buffer.
			otel.SetLogger(funcr.New(func(prefix, args string) { sdkLog.WriteString(prefix + args + "\n") }, funcr.Options{Verbosity: 8}))
			t.Cleanup(func() { otel.SetLogger(stdr.New(stdlog.New(os.Stderr, "", stdlog.LstdFlags|stdlog.Lshortfile))) })
			shutdown, err := Setup(context.Background(), os.Getenv, "test", slog.New(slog.NewJSONHandler(&log, nil)))
			if err == nil {
				shutdown(context.Background())
				t.Errorf("Setup(%s=%q) = nil error, want one naming %s", tc.name, tc.value, tc.want)
			} else if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Setup(%s=%q) = %v, want an error naming %s", tc.name, tc.value, err, tc.want)
			}
			for what, text := range map[string]string{"the error": fmt.Sprint(err), "the log": log.String(), "stderr": sdkLog.String()} {
				if strings.Contains(text, secret) {
					t.Errorf("%s holds the setting's secret: %s", what, text)
				}
			}
		})
	}
}

// A well-formed header list still starts (what the check above refuses
// is only what the SDK cannot read).
func TestOTLPHeadersWellFormedStart(t *testing.T) {
	for _, value := range []string{"", "authorization=Bearer%20abc", "a=1, b = x%2Cy ,c=", "api-key=abc=="} {
		env := map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_EXPORTER_OTLP_HEADERS": value}
		shutdown, err := Setup(context.Background(), func(name string) string { return env[name] }, "test", slog.New(slog.DiscardHandler))
		if err != nil {
			t.Errorf("Setup(OTEL_EXPORTER_OTLP_HEADERS=%q) = %v, want nil", value, err)
			continue
		}
		shutdown(context.Background())
	}
}
