// Package telemetry sets up OpenTelemetry tracing from the standard OTEL_*
// environment variables. One request is one trace, and the trace id is the
// request id clients quote (spec 2.1).
package telemetry

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
)

// Setup installs a global tracer provider, the W3C trace-context
// propagator and an error handler that logs to log, and returns a function
// that flushes and stops the provider, for flushTimeout at most.
//
// Spans are exported over OTLP only when OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set (protocol from
// OTEL_EXPORTER_OTLP_TRACES_PROTOCOL or else OTEL_EXPORTER_OTLP_PROTOCOL:
// http/protobuf by default, or grpc). The
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
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("opentelemetry error (spans may be lost)", "error", err)
	}))
	if name := getenv("OTEL_SERVICE_NAME"); name != "" {
		serviceName = name
	}
	res, err := resource.Merge(resource.Default(),
		resource.NewSchemaless(semconv.ServiceName(serviceName)))
	if err != nil {
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	opts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	if getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "" {
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
		return tp.Shutdown(ctx)
	}, nil
}

// flushTimeout bounds the last flush of spans when a process stops: with a
// collector that does not answer, the exporter's own timeout (30 s) would
// hold the exit past a Kubernetes grace period (30 s, the HTTP drain
// included), and the pod would be killed before its "stopped" line. The
// spans still queued then are lost, and the SDK says so in the log.
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
