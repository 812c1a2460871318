// Package saleclaim holds the words in which a failed answer to a sale,
// the gateway's or the sales writer's, says whether the sale was applied:
// in its message, for the platform deciding whether to retry; on its
// access line and span as sale_applied, for the SRE tracing its request
// id; and as the drill reads them (salescheck.SaysNothingApplied). Two
// binaries answer sales, and a platform cannot tell which one spoke, so
// both take their words from here. The sales-writer README's "What each
// answer of a sale says was applied" lists every answer's claim.
package saleclaim

// The claims, as messages say them.
const (
	// NothingApplied: this attempt changed nothing (no statement of it
	// reached PostgreSQL, or PostgreSQL rolled it back).
	NothingApplied = "nothing was applied"
	// MayHaveBeenApplied: the attempt may have committed.
	MayHaveBeenApplied = "the sale may have been applied"
	// RetryWithTheKey ends every such message: a retry with the same
	// Idempotency-Key applies the sale at most once, whichever was true.
	RetryWithTheKey = "retry with backoff and the same Idempotency-Key"
)

// The 500s' messages: spec 7's action for a 500 (retry with backoff,
// report the request id if it persists) and what is known of the sale.
const (
	InternalNothingApplied     = "internal error; " + NothingApplied + ": " + RetryWithTheKey + ", and quote meta.request_id if it persists"
	InternalMayHaveBeenApplied = "internal error; " + MayHaveBeenApplied + ": " + RetryWithTheKey + ", and quote meta.request_id if it persists"
)

// The claims as the access line and span record them.
const (
	// Key names the field (app.sale_applied on a span).
	Key = "sale_applied"
	// Nothing is NothingApplied's value, Maybe MayHaveBeenApplied's.
	Nothing = "no"
	Maybe   = "maybe"
)
