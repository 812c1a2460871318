// Package telemetry sets up OpenTelemetry tracing from the standard OTEL_*
// environment variables. One request is one trace, and the trace id is the
// request id clients quote (spec 2.1).
package telemetry

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"
	"unicode"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"

	"github.com/coinexport/export/pkg/envconfig"
)

// Setup installs a global tracer provider, the W3C trace-context
// propagator and an error handler that logs to log, and returns a function
// that flushes and stops the provider, for flushTimeout at most (spans it
// could not flush then are a WARN in log too).
//
// Spans are exported over OTLP only when OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set and the export is not turned
// off (exportWanted; protocol from OTEL_EXPORTER_OTLP_TRACES_PROTOCOL or
// else OTEL_EXPORTER_OTLP_PROTOCOL: http/protobuf by default, or grpc). The
// sampler comes from OTEL_TRACES_SAMPLER as the SDK reads it.
//
// Without an exporter, and unless OTEL_TRACES_SAMPLER says otherwise, no
// span is recorded: the SDK would fill each one with attributes and events
// only to drop it when it ends (measured: 4 µs of the gateway's and 12 µs
// of export-reader's CPU per GET by id). Spans then come from
// idsOnlyProvider: they still carry trace ids, so request ids exist and
// propagate, flagged as not sampled. (The SDK reads OTEL_TRACES_SAMPLER
// from the process environment itself: getenv is os.Getenv outside tests.)
func Setup(ctx context.Context, getenv func(string) string, serviceName string, log *slog.Logger) (func(context.Context) error, error) {
	// The SDK reports what it could not do (an export that failed, a span
	// dropped, a bad setting) through this handler; its default writes plain text with the
	// standard log package, a line no JSON log pipeline reads.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { warnSpansLost(log, err) }))
	if name := getenv("OTEL_SERVICE_NAME"); name != "" {
		serviceName = name
	}
	res, err := resource.Merge(resource.Default(),
		resource.NewSchemaless(semconv.ServiceName(serviceName)))
	if err != nil {
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	warnOfOtherPropagators(getenv, log)
	export, err := exportWanted(getenv)
	if err != nil {
		return nil, err
	}
	opts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	if export {
		if err := checkOTLPSettings(getenv); err != nil {
			return nil, err
		}
		exporter, err := newExporter(ctx, getenv)
		if err != nil {
			return nil, err
		}
		opts = append(opts, sdktrace.WithBatcher(validUTF8Exporter{exporter}))
	} else if getenv("OTEL_TRACES_SAMPLER") == "" {
		otel.SetTracerProvider(idsOnlyProvider{})
		return func(context.Context) error { return nil }, nil
	}
	tp := sdktrace.NewTracerProvider(opts...)
	otel.SetTracerProvider(tp)
	return func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, flushTimeout)
		defer cancel()
		// The SDK does not say that it gave the flush up: the spans still
		// queued are dropped without a line. Said here, as its other
		// failures are, so that no binary's stop loses them unsaid; the
		// caller need not log it again.
		if err := tp.Shutdown(ctx); err != nil {
			warnSpansLost(log, fmt.Errorf("telemetry: the last spans were not flushed at stop: %w", err))
			return err
		}
		return nil
	}, nil
}

// warnSpansLost logs what OpenTelemetry could not do, which may have lost
// spans, at WARN in the binary's own log.
func warnSpansLost(log *slog.Logger, err error) {
	log.Warn("opentelemetry error (spans may be lost)", "error", err)
}

// exportWanted says whether spans are to be exported: an OTLP endpoint is
// set, and neither OTEL_SDK_DISABLED=true nor OTEL_TRACES_EXPORTER=none
// turns the export off (the Go SDK reads neither itself; an operator who
// sets one means it, as with any other OpenTelemetry SDK). An exporter
// other than otlp or none stops the start, as an unknown protocol does:
// its spans would go nowhere without a word.
func exportWanted(getenv func(string) string) (bool, error) {
	switch exporter := getenv("OTEL_TRACES_EXPORTER"); exporter {
	case "", "otlp":
	case "none":
		return false, nil
	default:
		return false, fmt.Errorf("telemetry: OTEL_TRACES_EXPORTER must be otlp or none (got %s)", envconfig.Shown(exporter))
	}
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return false, nil
	}
	return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "", nil
}

// warnOfOtherPropagators warns when OTEL_PROPAGATORS asks for more than
// the W3C trace context and baggage, the only ones propagated (the gateway
// trusts a caller's traceparent, and the services the gateway's): a b3 or
// jaeger header from a caller starts a new trace here.
func warnOfOtherPropagators(getenv func(string) string, log *slog.Logger) {
	value := getenv("OTEL_PROPAGATORS")
	for p := range strings.SplitSeq(value, ",") {
		if p = strings.TrimSpace(p); p != "" && p != "tracecontext" && p != "baggage" {
			log.Warn("OTEL_PROPAGATORS ignored: only tracecontext and baggage are propagated", "propagator", p)
		}
	}
}

// checkOTLPSettings refuses the OTLP headers and endpoints the exporter
// could not read. The SDK reads them itself, and writes one that does not
// parse whole, with its own logger, to stderr ("parse headers"
// "input"="authorization: Bearer …", "escape header value", "parse url"
// "input"="https://user:password@…"), then exports without that header, or
// to localhost for that endpoint: the credentials these settings carry
// reached the log, and the spans went nowhere. The error names the
// variable and the entry, never its text.
func checkOTLPSettings(getenv func(string) string) error {
	for _, name := range []string{"OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS"} {
		for i, entry := range strings.Split(strings.TrimSpace(getenv(name)), ",") {
			if problem := headerProblem(entry); problem != "" {
				return fmt.Errorf("telemetry: %s: entry %d %s, as key=value with the value %%-encoded (such as authorization=Bearer%%20TOKEN); the setting is not shown, as it may hold credentials", name, i+1, problem)
			}
		}
	}
	for _, name := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"} {
		if _, err := url.Parse(strings.TrimSpace(getenv(name))); err != nil {
			return fmt.Errorf("telemetry: %s must be a URL, such as http://collector:4318 (a %% written as %%25); it is not shown, as it may hold credentials", name)
		}
	}
	return nil
}

// headerProblem says what is wrong with one key=value entry of an OTLP
// headers setting, as the SDK reads it, "" when nothing is (or the entry is
// blank, which the SDK skips and which holds nothing to hide).
func headerProblem(entry string) string {
	if strings.TrimSpace(entry) == "" {
		return ""
	}
	key, value, found := strings.Cut(entry, "=")
	switch {
	case !found:
		return "has no '='"
	case !isHeaderName(strings.TrimSpace(key)):
		return "has a key that is no header name"
	}
	if _, err := url.PathUnescape(value); err != nil {
		return "has a value with a '%' that is not followed by two hex digits"
	}
	return ""
}

// isHeaderName reports whether s is an HTTP header name (RFC 9110 token).
func isHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if c > unicode.MaxASCII || !(unicode.IsLetter(c) || unicode.IsDigit(c) || strings.ContainsRune("!#$%&'*+-.^_`|~", c)) {
			return false
		}
	}
	return true
}

// flushTimeout bounds the last flush of spans when a process stops: with a
// collector that does not answer, the exporter's own timeout (30 s) would
// hold the exit past a Kubernetes grace period (30 s, the HTTP drain
// included), and the pod would be killed before its "stopped" line. The
// spans still queued then are lost, which the function Setup returns says
// in the log (the SDK says nothing of them).
var flushTimeout = MaxFlushTime // a variable for the test only

// MaxFlushTime is the longest the function Setup returns takes: a
// process's stop lasts that much past its drain (envdoc holds the grace
// periods of the manifests to it).
const MaxFlushTime = 5 * time.Second

// newExporter makes the OTLP exporter of the protocol the traces' own
// variable names, else the general one (the OpenTelemetry rule).
func newExporter(ctx context.Context, getenv func(string) string) (sdktrace.SpanExporter, error) {
	variable := "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	protocol := getenv(variable)
	if protocol == "" {
		variable = "OTEL_EXPORTER_OTLP_PROTOCOL"
		protocol = getenv(variable)
	}
	switch protocol {
	case "", "http/protobuf":
		return otlptracehttp.New(ctx)
	case "grpc":
		return otlptracegrpc.New(ctx)
	default:
		return nil, fmt.Errorf("telemetry: %s must be http/protobuf or grpc", variable)
	}
}

// Names are the variables tracing reads (Setup, the SDK and its OTLP
// trace exporters, those of go.opentelemetry.io/otel v1.47.0, the
// experimental OTEL_GO_X_* aside), for a binary's list of settings: a name
// written close to one of them (OTEL_EXPORTER_OTLP_ENDPIONT, which leaves
// every span unexported without a word) is then warned of at start
// (envconfig.Misspelt). Last, the log batch processor's, which no binary
// here reads but other programs' SDKs do in a shared environment: each is
// two edits from the span processor's (OTEL_BLRP_SCHEDULE_DELAY,
// OTEL_BSP_SCHEDULE_DELAY) and would be reported as its misspelling.
var Names = []string{
	"OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES", "OTEL_SDK_DISABLED", "OTEL_PROPAGATORS",
	"OTEL_TRACES_EXPORTER", "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG",
	"OTEL_BSP_SCHEDULE_DELAY", "OTEL_BSP_EXPORT_TIMEOUT", "OTEL_BSP_MAX_QUEUE_SIZE", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
	"OTEL_ATTRIBUTE_COUNT_LIMIT", "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT",
	"OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT",
	"OTEL_SPAN_EVENT_COUNT_LIMIT", "OTEL_SPAN_LINK_COUNT_LIMIT", "OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT", "OTEL_LINK_ATTRIBUTE_COUNT_LIMIT",
	"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
	"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
	"OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
	"OTEL_EXPORTER_OTLP_TIMEOUT", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
	"OTEL_EXPORTER_OTLP_COMPRESSION", "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
	"OTEL_EXPORTER_OTLP_INSECURE", "OTEL_EXPORTER_OTLP_TRACES_INSECURE",
	"OTEL_EXPORTER_OTLP_CERTIFICATE", "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
	"OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE",
	"OTEL_EXPORTER_OTLP_CLIENT_KEY", "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY",
	"OTEL_BLRP_SCHEDULE_DELAY", "OTEL_BLRP_EXPORT_TIMEOUT", "OTEL_BLRP_MAX_QUEUE_SIZE", "OTEL_BLRP_MAX_EXPORT_BATCH_SIZE",
}
