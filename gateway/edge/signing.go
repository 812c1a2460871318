package edge

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"hash"
	"strconv"
	"sync"
	"time"

	"github.com/coinexport/export/pkg/identity"
	"github.com/valyala/fasthttp"
)

// headerSigner writes the signed identity onto an upstream request: the
// same headers and signature as identity.Signer.Sign (the services check
// them with identity.Signer.Verify, and TestHeaderSignerMatchesIdentity
// holds the two together), without Sign's dozen or so allocations per
// request. Its HMACs are kept in a pool: a reused HMAC restores the keyed
// state saved at its first Reset instead of hashing the key again, and the
// signed text is built in one stack buffer.
//
// pkg/identity is the home of this format; a Signer.SignInto there (or a
// state prepared once per key) would let this copy go.
type headerSigner struct {
	states sync.Pool // of *signingState
}

// signingState is one HMAC with the buffers it writes and sums into: the
// hash is an interface, so what is passed to it escapes to the heap, and
// is better reused than allocated per request.
type signingState struct {
	mac  hash.Hash
	text []byte
	sum  []byte
}

// signedTextPrefix starts the signed text (pkg/identity's mac).
const signedTextPrefix = "identity-v1"

func newHeaderSigner(secret string) *headerSigner {
	key := []byte(secret)
	return &headerSigner{states: sync.Pool{New: func() any {
		return &signingState{mac: hmac.New(sha256.New, key), text: make([]byte, 0, 256), sum: make([]byte, 0, sha256.Size)}
	}}}
}

// sign sets the identity headers of id, signed at now, on h.
func (s *headerSigner) sign(h *fasthttp.RequestHeader, id identity.Identity, now time.Time) {
	var tsBuf [20]byte
	ts := strconv.AppendInt(tsBuf[:0], now.UnixMilli(), 10)

	st := s.states.Get().(*signingState)
	defer s.states.Put(st)
	text := append(st.text[:0], signedTextPrefix...)
	text = appendField(text, id.OwnerID)
	text = appendField(text, id.PlatformID)
	text = appendField(text, id.KeyID)
	text = append(text, '\n')
	scopesAt := len(text)
	text = appendJoined(text, id.Scopes)
	scopes := text[scopesAt:]
	text = appendField(text, id.RequestID)
	text = append(text, '\n')
	text = append(text, ts...)
	st.text = text

	st.mac.Reset()
	st.mac.Write(text)
	st.sum = st.mac.Sum(st.sum[:0])
	var sigBuf [64]byte
	sig := base64.RawURLEncoding.AppendEncode(sigBuf[:0], st.sum)

	h.Set(identity.HeaderOwner, id.OwnerID)
	h.Set(identity.HeaderPlatform, id.PlatformID)
	h.Set(identity.HeaderKeyID, id.KeyID)
	h.SetBytesV(identity.HeaderScopes, scopes)
	h.Set(identity.HeaderRequestID, id.RequestID)
	h.SetBytesV(identity.HeaderTime, ts)
	h.SetBytesV(identity.HeaderSignature, sig)
}

// appendField appends the field separator (a newline, which no header
// value can hold) and f.
func appendField(dst []byte, f string) []byte {
	return append(append(dst, '\n'), f...)
}

// appendJoined appends parts joined by commas, like strings.Join.
func appendJoined(dst []byte, parts []string) []byte {
	for i, p := range parts {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, p...)
	}
	return dst
}
