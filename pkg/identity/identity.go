// Package identity carries the caller's identity from the gateway to the
// services. The gateway resolves the API key once and sends owner, platform,
// key id, scopes and request id as headers signed with HMAC-SHA256 over a
// shared secret and a timestamp, together with the request they are for
// (method, request-target, Idempotency-Key); a service trusts nothing else,
// so a service port reached by mistake exposes nothing, and a set of
// identity headers captured inside the network opens no other request.
package identity

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"hash"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Scopes of spec 5.
const (
	ScopeExportRead = "export:read"
	ScopeSalesWrite = "sales:write"
)

// HeaderPrefix starts every header this package writes. A client's headers
// with it never reach a service: the gateway forwards only the few headers
// of its allowlist (forwardedHeaders, gateway/edge/outbound.go).
const HeaderPrefix = "X-Identity-"

// Header names of the signed identity.
const (
	HeaderOwner     = HeaderPrefix + "Owner"
	HeaderPlatform  = HeaderPrefix + "Platform"
	HeaderKeyID     = HeaderPrefix + "Key-Id"
	HeaderScopes    = HeaderPrefix + "Scopes"
	HeaderRequestID = HeaderPrefix + "Request-Id"
	HeaderTime      = HeaderPrefix + "Time"
	HeaderSignature = HeaderPrefix + "Signature"
)

// MaxSkew bounds how old (or how far in the future) a signature may be.
const MaxSkew = 2 * time.Minute

// ErrUnsigned is returned for a request without a valid signature.
var ErrUnsigned = errors.New("identity: missing or invalid signature")

// Identity is who is calling. OwnerID is empty on the routes that need no API
// key (health, shop schema); PlatformID is empty for keys without a platform.
type Identity struct {
	OwnerID    string
	PlatformID string
	KeyID      string
	Scopes     []string
	RequestID  string
}

// Anonymous reports whether the call carries no API key.
func (id Identity) Anonymous() bool { return id.OwnerID == "" }

// HasScope reports whether the key holds scope.
func (id Identity) HasScope(scope string) bool { return slices.Contains(id.Scopes, scope) }

// Signer signs identities with one shared secret, and verifies those signed
// with it or with one of the secrets it is rotating from or to.
type Signer struct {
	// states recycles HMACs and their buffers: a reused HMAC restores the
	// keyed state saved at its first Reset instead of hashing the key
	// again, and what goes through the hash interface would otherwise be
	// allocated on every request of the gateway's hot path.
	states sync.Pool // of *signingState
	// accepted verify only (IDENTITY_SECRET_PREVIOUS): while the secret is
	// rotated, gateways and services of both sides of a rolling deploy
	// must read each other (README, "Rotating IDENTITY_SECRET").
	accepted []*Signer
	// acceptUnbound: identity-v1 signatures are accepted too (AcceptUnbound).
	acceptUnbound bool
}

type signingState struct {
	mac  hash.Hash
	text []byte // the signed text
	sum  []byte // its MAC
	sig  []byte // the MAC in base64
}

// NewSigner returns a Signer that signs with secret and also accepts what
// the previous secrets signed. Each must be at least 32 bytes.
func NewSigner(secret string, previous ...string) (*Signer, error) {
	s, err := newSigner(secret)
	if err != nil {
		return nil, err
	}
	for _, p := range previous {
		ps, err := newSigner(p)
		if err != nil {
			return nil, err
		}
		s.accepted = append(s.accepted, ps)
	}
	return s, nil
}

func newSigner(secret string) (*Signer, error) {
	if len(secret) < 32 {
		return nil, fmt.Errorf("identity: secret must be at least 32 bytes, got %d", len(secret))
	}
	key := []byte(secret)
	s := &Signer{}
	s.states.New = func() any {
		return &signingState{mac: hmac.New(sha256.New, key), text: make([]byte, 0, 256), sum: make([]byte, 0, sha256.Size),
			sig: make([]byte, 0, base64.RawURLEncoding.EncodedLen(sha256.Size))}
	}
	return s, nil
}

// Request is the request a signature is for. It is signed with the
// identity, so that identity headers captured on their way to a service
// cannot be replayed on another route, item, query or Idempotency-Key: at
// most the same request again, within MaxSkew, which for a sale replays its
// stored answer. The body is not signed: after an answer that binds nothing
// to the Idempotency-Key (a 400 or 413, or a 5xx whose statement was rolled
// back), the same headers with another body could still run
// (gateway README, "What the signature proves, and what not"). Target is the request-target as sent on the wire, path and
// query byte for byte (a service reads it as http.Request.RequestURI).
type Request struct {
	Method, Target, IdempotencyKey string
}

// RequestOf is the Request r is: on a server, the request-target as
// received (r.RequestURI); on a client, the one net/http will send.
func RequestOf(r *http.Request) Request {
	target := r.RequestURI
	if target == "" {
		target = r.URL.RequestURI()
	}
	return Request{Method: r.Method, Target: target, IdempotencyKey: r.Header.Get("Idempotency-Key")}
}

// Header is one header to set on the upstream request.
type Header struct {
	Name, Value string
}

// Sign returns the headers that carry id for req, signed at now.
func (s *Signer) Sign(id Identity, req Request, now time.Time) []Header {
	headers := make([]Header, 0, 7)
	s.SignInto(func(name string, value []byte) { headers = append(headers, Header{name, string(value)}) }, id, req, now)
	return headers
}

// SignInto passes each header that carries id for req, signed at now, to
// set, without allocating: the values point into a buffer reused once
// SignInto returns, so set must copy them (as fasthttp's SetBytesV does).
func (s *Signer) SignInto(set func(name string, value []byte), id Identity, req Request, now time.Time) {
	st := s.states.Get().(*signingState)
	defer s.put(st)
	var tsBuf [20]byte
	ts := strconv.AppendInt(tsBuf[:0], now.UnixMilli(), 10)
	text, fields := appendSignedText(st.text[:0], id.OwnerID, id.PlatformID, id.KeyID, id.Scopes, id.RequestID, ts, req, false)
	st.text = text
	st.sig = base64.RawURLEncoding.AppendEncode(st.sig[:0], st.sum256(text))
	for i, name := range signedHeaders {
		set(name, fields[i])
	}
	set(HeaderSignature, st.sig)
}

// signedHeaders are the signed fields' headers, in signing order.
var signedHeaders = [...]string{HeaderOwner, HeaderPlatform, HeaderKeyID, HeaderScopes, HeaderRequestID, HeaderTime}

// appendSignedText appends the text the MAC covers and returns each signed
// header's bytes within it. The fields are joined by a separator that cannot
// occur in any of them (neither header values nor a request line can hold a
// newline), so no two identities or requests share an input. The request's
// fields come last: they are not headers, the service has them already.
//
// unbound builds the text of identity-v1 instead, which held no request:
// what gateways of builds before identity-v2 signed, read only while
// AcceptUnbound says so.
func appendSignedText(dst []byte, owner, platform, keyID string, scopes []string, requestID string, ts []byte, req Request, unbound bool) ([]byte, [len(signedHeaders)][]byte) {
	var at [len(signedHeaders) + 1]int
	if unbound {
		dst = append(dst, "identity-v1"...)
	} else {
		dst = append(dst, "identity-v2"...)
	}
	field := 0
	next := func() { dst = append(dst, '\n'); at[field] = len(dst); field++ }
	next()
	dst = append(dst, owner...)
	next()
	dst = append(dst, platform...)
	next()
	dst = append(dst, keyID...)
	next()
	for i, scope := range scopes {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, scope...)
	}
	next()
	dst = append(dst, requestID...)
	next()
	dst = append(dst, ts...)
	at[field] = len(dst) + 1 // the separator that follows
	for _, v := range [...]string{req.Method, req.Target, req.IdempotencyKey} {
		if unbound {
			break
		}
		dst = append(append(dst, '\n'), v...)
	}
	var fields [len(signedHeaders)][]byte
	for i := range fields {
		fields[i] = dst[at[i] : at[i+1]-1 : at[i+1]-1]
	}
	return dst, fields
}

// put recycles st unless a request's oversized headers grew its text: such
// a buffer is left to the collector rather than kept in the pool.
func (s *Signer) put(st *signingState) {
	if cap(st.text) <= 4<<10 {
		s.states.Put(st)
	}
}

// sum256 returns the MAC of text in the state's buffer.
func (st *signingState) sum256(text []byte) []byte {
	st.mac.Reset()
	st.mac.Write(text)
	st.sum = st.mac.Sum(st.sum[:0])
	return st.sum
}

// Verify reads the signed identity through get (a header getter) and checks
// its signature, for req, and its age.
func (s *Signer) Verify(get func(name string) string, req Request, now time.Time) (Identity, error) {
	id, signedAt, err := s.verifySignature(get, req)
	if err != nil {
		return Identity{}, err
	}
	if age := now.Sub(signedAt); age > MaxSkew || age < -MaxSkew {
		return Identity{}, ErrUnsigned
	}
	return id, nil
}

// Renew signs again, at now and with the current secret, the identity that
// get reads for req, passing each header to set, as SignInto does. Only an
// identity this Signer signed or accepts (a previous secret) for req is
// renewed, whatever its age; anything else is ErrUnsigned. The gateway
// renews a request it sends again to another instance after waiting on the
// first, so that it never arrives with a stale signature.
func (s *Signer) Renew(get func(name string) string, req Request, set func(name string, value []byte), now time.Time) error {
	id, _, err := s.verifySignature(get, req)
	if err != nil {
		return err
	}
	s.SignInto(set, id, req, now)
	return nil
}

// verifySignature reads the signed identity through get and checks its
// signature for req, and returns it with the time it was signed at.
func (s *Signer) verifySignature(get func(name string) string, req Request) (Identity, time.Time, error) {
	owner, platform, keyID := get(HeaderOwner), get(HeaderPlatform), get(HeaderKeyID)
	scopes, requestID, ts := get(HeaderScopes), get(HeaderRequestID), get(HeaderTime)
	if !s.validMAC(get(HeaderSignature), owner, platform, keyID, scopes, requestID, ts, req) {
		return Identity{}, time.Time{}, ErrUnsigned
	}
	ms, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return Identity{}, time.Time{}, ErrUnsigned
	}
	id := Identity{OwnerID: owner, PlatformID: platform, KeyID: keyID, RequestID: requestID}
	if scopes != "" {
		id.Scopes = strings.Split(scopes, ",")
	}
	return id, time.UnixMilli(ms), nil
}

// validMAC reports whether sig signs the fields (scopes as sent: joined)
// and req with the secret or one of the accepted ones.
func (s *Signer) validMAC(sig, owner, platform, keyID, scopes, requestID, ts string, req Request) bool {
	for _, unbound := range [...]bool{false, true} {
		if unbound && !s.acceptUnbound {
			break
		}
		if s.signedBy(sig, owner, platform, keyID, scopes, requestID, ts, req, unbound) {
			return true
		}
		for _, a := range s.accepted {
			if a.signedBy(sig, owner, platform, keyID, scopes, requestID, ts, req, unbound) {
				return true
			}
		}
	}
	return false
}

// NewServiceSigner is the Signer a service verifies identities with: those
// signed with secret or one of previous, and, if acceptUnbound
// (IDENTITY_ACCEPT_UNBOUND), identity-v1 ones as well (AcceptUnbound).
func NewServiceSigner(secret string, previous []string, acceptUnbound bool) (*Signer, error) {
	s, err := NewSigner(secret, previous...)
	if err == nil && acceptUnbound {
		s.AcceptUnbound()
	}
	return s, err
}

// AcceptUnbound makes s accept, besides its own signatures, identity-v1
// ones, which bind no request: what gateways of builds before identity-v2
// send. Only for the upgrade of a running deployment, services first
// (IDENTITY_ACCEPT_UNBOUND, README "Upgrading to identity-v2"): while it is
// on, captured identity headers open any call again for MaxSkew.
func (s *Signer) AcceptUnbound() { s.acceptUnbound = true }

// signedBy reports whether sig signs the fields and req with s's own secret.
func (s *Signer) signedBy(sig, owner, platform, keyID, scopes, requestID, ts string, req Request, unbound bool) bool {
	st := s.states.Get().(*signingState)
	defer s.put(st)
	text, _ := appendSignedText(st.text[:0], owner, platform, keyID, []string{scopes}, requestID, []byte(ts), req, unbound)
	st.text = text
	want := base64.RawURLEncoding.AppendEncode(nil, st.sum256(text))
	return hmac.Equal([]byte(sig), want)
}

type contextKey struct{}

// WithContext returns ctx carrying id.
func WithContext(ctx context.Context, id Identity) context.Context {
	return context.WithValue(ctx, contextKey{}, id)
}

// FromContext returns the identity stored by WithContext.
func FromContext(ctx context.Context) (Identity, bool) {
	id, ok := ctx.Value(contextKey{}).(Identity)
	return id, ok
}
