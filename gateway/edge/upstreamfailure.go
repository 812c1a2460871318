package edge

import (
	"errors"

	"github.com/coinexport/export/gateway/upstream"
	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"
)

// isIdempotentSale reports whether the request is a sale sent with an
// Idempotency-Key: safe to send again, by us or by the client; one without
// is neither (the writer refuses it 400 anyway).
func isIdempotentSale(c *fiber.Ctx, rt route) bool {
	return rt.RepeatWithIdempotencyKey && len(c.Request().Header.Peek(idempotencyKeyHeader)) > 0
}

// nothingSent reports whether err, upstream.Do's, says that no attempt of
// the request can have applied anything and no instance is there to take
// it: every instance out, or refused, or no connection free, so that
// nothing left the gateway; or a safe request (a GET) whose repeat was
// refused after its first attempt's connection closed, which was sent
// but applies nothing. A sale's repeat refused after a first attempt that
// was sent is that attempt's failure, not this: Do returns the first's.
func nothingSent(err error) bool {
	return errors.Is(err, upstream.ErrUnavailable) || errors.Is(err, upstream.ErrUnreachable)
}

// errSaleMayBeApplied marks the failure of a sale sent with an
// Idempotency-Key that may have reached the writer: its answer tells the
// client to retry with the same key. A sale sent without one gets the
// generic answer: there is no key to retry with.
var errSaleMayBeApplied = errors.New("the sale may have been applied")

// errSaleNothingApplied marks the failure of a sale sent with an
// Idempotency-Key that reached no writer (nothingSent): its answer says so,
// as the writer's own 503s do, so that a platform reads the same words for
// the same outcome whoever answered.
var errSaleNothingApplied = errors.New("nothing was applied")

// mayHaveArrived reports whether the request may have reached the
// instance before err: it timed out, or the connection closed or the answer
// was unreadable after it was sent.
func mayHaveArrived(err error) bool {
	return errors.Is(err, upstream.ErrTimeout) || errors.Is(err, upstream.ErrClosed) || errors.Is(err, upstream.ErrBadResponse)
}

// repeatLeftInDoubt reports whether a request was sent again after a first
// attempt that may have arrived, and the repeat answered a 5xx or refused
// the gateway's identity (401), which say nothing of that first attempt.
func repeatLeftInDoubt(out upstream.Outcome, resp *fasthttp.Response) bool {
	status := resp.StatusCode()
	return out.Repeated != nil && mayHaveArrived(out.Repeated.Err) &&
		(status >= fiber.StatusInternalServerError || status == fiber.StatusUnauthorized)
}

// kindUnavailable is errorKind's name for a request no instance was
// tried for; instanceErrorKinds are its other values, each the failure of
// an instance.
const kindUnavailable = "unavailable"

// kindShortage is errorKind's name for a connection the gateway could not
// open for want of its own file descriptors or memory. Counted as the
// instance's "unreachable", it had ExportUpstreamRetries blame a reader
// that was fine ("repeats export-reader requests after unreachable
// failures of http://…:24301") while the gateway sat at its limit; it is
// counted under no instance (failedInstanceLabel).
const kindShortage = "gateway_shortage"

var instanceErrorKinds = []string{"unreachable", "timeout", "closed", "identity_refused", "bad_response"}

// instanceLabel is the upstream_instance of a failure on instance, as
// upstream.Outcome names it: "" when none was tried.
func instanceLabel(instance string) string {
	if instance == "" {
		return noInstance
	}
	return instance
}

// failedInstanceLabel is the upstream_instance of a failure err on
// instance: none for a shortage of the gateway's own, which no instance had.
func failedInstanceLabel(instance string, err error) string {
	if errors.Is(err, upstream.ErrShortage) {
		return noInstance
	}
	return instanceLabel(instance)
}

// repeatedErrorKinds are those after which upstream.Do may send a request
// again (nothing was sent after "unavailable", and a refused identity is
// not repeated).
var repeatedErrorKinds = []string{"unreachable", "timeout", "closed", "bad_response"}

// errorKind names err's kind in gateway_upstream_errors_total.
func errorKind(err error) string {
	switch {
	case errors.Is(err, upstream.ErrUnavailable):
		return kindUnavailable
	case errors.Is(err, upstream.ErrShortage):
		return kindShortage
	case errors.Is(err, upstream.ErrUnreachable):
		return "unreachable"
	case errors.Is(err, upstream.ErrTimeout):
		return "timeout"
	case errors.Is(err, upstream.ErrClosed):
		return "closed"
	case errors.Is(err, errIdentityRefused):
		return "identity_refused"
	default:
		return "bad_response"
	}
}
