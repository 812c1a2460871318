// Package identity carries the caller's identity from the gateway to the
// services. The gateway resolves the API key once and sends owner, platform,
// key id, scopes and request id as headers signed with HMAC-SHA256 over a
// shared secret and a timestamp; a service trusts nothing else, so a service
// port reached by mistake exposes nothing.
package identity

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Scopes of spec 5.
const (
	ScopeExportRead = "export:read"
	ScopeSalesWrite = "sales:write"
)

// HeaderPrefix starts every header this package writes. The gateway deletes
// every inbound header with this prefix before proxying.
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

// Signer signs and verifies identities with one shared secret.
type Signer struct {
	secret []byte
}

// NewSigner returns a Signer. The secret must be at least 32 bytes.
func NewSigner(secret string) (*Signer, error) {
	if len(secret) < 32 {
		return nil, fmt.Errorf("identity: secret must be at least 32 bytes, got %d", len(secret))
	}
	return &Signer{secret: []byte(secret)}, nil
}

// Header is one header to set on the upstream request.
type Header struct {
	Name, Value string
}

// Sign returns the headers that carry id, signed at now.
func (s *Signer) Sign(id Identity, now time.Time) []Header {
	ts := strconv.FormatInt(now.UnixMilli(), 10)
	scopes := strings.Join(id.Scopes, ",")
	return []Header{
		{HeaderOwner, id.OwnerID},
		{HeaderPlatform, id.PlatformID},
		{HeaderKeyID, id.KeyID},
		{HeaderScopes, scopes},
		{HeaderRequestID, id.RequestID},
		{HeaderTime, ts},
		{HeaderSignature, s.mac(id.OwnerID, id.PlatformID, id.KeyID, scopes, id.RequestID, ts)},
	}
}

// Verify reads the signed identity through get (a header getter) and checks
// its signature and age.
func (s *Signer) Verify(get func(name string) string, now time.Time) (Identity, error) {
	owner, platform, keyID := get(HeaderOwner), get(HeaderPlatform), get(HeaderKeyID)
	scopes, requestID, ts := get(HeaderScopes), get(HeaderRequestID), get(HeaderTime)
	want := s.mac(owner, platform, keyID, scopes, requestID, ts)
	if !hmac.Equal([]byte(get(HeaderSignature)), []byte(want)) {
		return Identity{}, ErrUnsigned
	}
	ms, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return Identity{}, ErrUnsigned
	}
	if age := now.Sub(time.UnixMilli(ms)); age > MaxSkew || age < -MaxSkew {
		return Identity{}, ErrUnsigned
	}
	id := Identity{OwnerID: owner, PlatformID: platform, KeyID: keyID, RequestID: requestID}
	if scopes != "" {
		id.Scopes = strings.Split(scopes, ",")
	}
	return id, nil
}

// mac joins the fields with a separator that cannot occur in any of them
// (header values cannot hold a newline), so no two identities share an input.
func (s *Signer) mac(fields ...string) string {
	m := hmac.New(sha256.New, s.secret)
	m.Write([]byte("identity-v1"))
	for _, f := range fields {
		m.Write([]byte{'\n'})
		m.Write([]byte(f))
	}
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
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
