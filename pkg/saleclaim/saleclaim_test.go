package saleclaim

import (
	"strings"
	"testing"
)

// Each 500's message carries its claim and the retry advice in full, and
// no message carries both claims (a reader looking for one would find
// the other).
func TestInternalMessagesSayOneClaimEach(t *testing.T) {
	for message, claim := range map[string]string{
		InternalNothingApplied:     NothingApplied,
		InternalMayHaveBeenApplied: MayHaveBeenApplied,
	} {
		other := MayHaveBeenApplied
		if claim == MayHaveBeenApplied {
			other = NothingApplied
		}
		if !strings.Contains(message, claim+": "+RetryWithTheKey) || strings.Contains(message, other) ||
			!strings.Contains(message, "meta.request_id") {
			t.Errorf("%q: want %q then the retry advice and the request id, and not %q", message, claim, other)
		}
	}
}
