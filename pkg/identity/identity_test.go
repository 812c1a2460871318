package identity

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"maps"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/racedetector"
	"github.com/google/go-cmp/cmp"
)

const testSecret = "0123456789abcdef0123456789abcdef"

// testRequest is the request the tests sign for, unless they say otherwise.
var testRequest = Request{Method: "POST", Target: "/v1/export/items/a%2Fb/sales/confirm?x=1", IdempotencyKey: "order-1"}

func signedHeader(t *testing.T, s *Signer, id Identity, at time.Time) http.Header {
	t.Helper()
	h := http.Header{}
	for _, kv := range s.Sign(id, testRequest, at) {
		h.Set(kv.Name, kv.Value)
	}
	return h
}

func TestSignVerifyRoundTrip(t *testing.T) {
	s, err := NewSigner(testSecret)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	want := Identity{OwnerID: "o1", PlatformID: "p1", KeyID: "k1", Scopes: []string{ScopeExportRead, ScopeSalesWrite}, RequestID: "r1"}
	got, err := s.Verify(signedHeader(t, s, want, now).Get, testRequest, now)
	if err != nil {
		t.Fatalf("Verify = %v, want nil", err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Verify mismatch (-want +got):\n%s", diff)
	}
}

func TestVerifyRefuses(t *testing.T) {
	s, _ := NewSigner(testSecret)
	other, _ := NewSigner(testSecret + "x")
	now := time.Now()
	id := Identity{OwnerID: "o1", PlatformID: "p1", KeyID: "k1", Scopes: []string{ScopeExportRead}, RequestID: "r1"}
	tests := []struct {
		name   string
		header func() http.Header
	}{
		{"unsigned", func() http.Header { return http.Header{HeaderOwner: {"o1"}} }},
		{"other secret", func() http.Header { return signedHeader(t, other, id, now) }},
		{"owner swapped", func() http.Header {
			h := signedHeader(t, s, id, now)
			h.Set(HeaderOwner, "o2")
			return h
		}},
		{"scope added", func() http.Header {
			h := signedHeader(t, s, id, now)
			h.Set(HeaderScopes, ScopeExportRead+","+ScopeSalesWrite)
			return h
		}},
		{"too old", func() http.Header { return signedHeader(t, s, id, now.Add(-MaxSkew-time.Second)) }},
		{"from the future", func() http.Header { return signedHeader(t, s, id, now.Add(MaxSkew+time.Second)) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := s.Verify(tt.header().Get, testRequest, now); err != ErrUnsigned {
				t.Errorf("Verify = %v, want ErrUnsigned", err)
			}
		})
	}
}

// A signature opens only the request it was made for: identity headers
// captured on their way to a service, replayed on another method, route,
// item, query or Idempotency-Key, are refused.
func TestVerifyRefusesAnotherRequest(t *testing.T) {
	s, _ := NewSigner(testSecret)
	now := time.Now()
	id := Identity{OwnerID: "o1", PlatformID: "p1", KeyID: "k1", Scopes: []string{ScopeSalesWrite}, RequestID: "r1"}
	h := signedHeader(t, s, id, now)
	if _, err := s.Verify(h.Get, testRequest, now); err != nil {
		t.Fatalf("Verify(the signed request) = %v, want nil", err)
	}
	others := map[string]Request{
		"method":          {Method: "PUT", Target: testRequest.Target, IdempotencyKey: testRequest.IdempotencyKey},
		"route":           {Method: "POST", Target: "/v1/export/items/a%2Fb/sales/cancel?x=1", IdempotencyKey: testRequest.IdempotencyKey},
		"item":            {Method: "POST", Target: "/v1/export/items/a/b/sales/confirm?x=1", IdempotencyKey: testRequest.IdempotencyKey},
		"query":           {Method: "POST", Target: "/v1/export/items/a%2Fb/sales/confirm", IdempotencyKey: testRequest.IdempotencyKey},
		"idempotency key": {Method: "POST", Target: testRequest.Target, IdempotencyKey: "order-2"},
		"no key":          {Method: "POST", Target: testRequest.Target},
		// The fields are separated: moving bytes from one to the next
		// makes another input.
		"shifted": {Method: "POST\n/v1/export/items/a%2Fb/sales/confirm?x=1", Target: "order-1"},
	}
	for name, req := range others {
		if _, err := s.Verify(h.Get, req, now); err != ErrUnsigned {
			t.Errorf("Verify(another %s) = %v, want ErrUnsigned", name, err)
		}
	}
}

// Renew gives a stale identity a fresh signature and keeps every field;
// it renews only what the same secret signed.
func TestRenew(t *testing.T) {
	s, _ := NewSigner(testSecret)
	other, _ := NewSigner(testSecret + "x")
	now := time.Now()
	id := Identity{OwnerID: "o1", PlatformID: "p1", KeyID: "k1", Scopes: []string{ScopeExportRead, ScopeSalesWrite}, RequestID: "r1"}
	h := signedHeader(t, s, id, now.Add(-10*time.Minute))
	if _, err := s.Verify(h.Get, testRequest, now); err != ErrUnsigned {
		t.Fatalf("Verify(signed 10 min ago) = %v, want ErrUnsigned", err)
	}
	if err := s.Renew(h.Get, testRequest, func(name string, v []byte) { h.Set(name, string(v)) }, now); err != nil {
		t.Fatalf("Renew = %v, want nil", err)
	}
	got, err := s.Verify(h.Get, testRequest, now)
	if err != nil || !reflect.DeepEqual(got, id) {
		t.Errorf("Verify(renewed) = %+v, %v; want %+v", got, err, id)
	}

	forged := signedHeader(t, other, id, now)
	forged.Set(HeaderOwner, "o2")
	for name, h := range map[string]http.Header{"other secret": signedHeader(t, other, id, now), "tampered": forged} {
		set := func(string, []byte) { t.Errorf("Renew(%s) set a header", name) }
		if err := s.Renew(h.Get, testRequest, set, now); err != ErrUnsigned {
			t.Errorf("Renew(%s) = %v, want ErrUnsigned", name, err)
		}
	}
}

func TestNewSignerRefusesShortSecret(t *testing.T) {
	if _, err := NewSigner("short"); err == nil {
		t.Error("NewSigner(short) = nil error, want error")
	}
}

// The signed text is a wire format between separately deployed binaries:
// pin it, computed here independently of the package's own builder.
func TestSignatureFormat(t *testing.T) {
	s, err := NewSigner(testSecret)
	if err != nil {
		t.Fatal(err)
	}
	at := time.UnixMilli(1763700000123)
	id := Identity{OwnerID: "o1", PlatformID: "p1", KeyID: "k1", Scopes: []string{ScopeExportRead, ScopeSalesWrite}, RequestID: "r1"}
	m := hmac.New(sha256.New, []byte(testSecret))
	m.Write([]byte("identity-v2\no1\np1\nk1\nexport:read,sales:write\nr1\n1763700000123" +
		"\nPOST\n/v1/export/items/a%2Fb/sales/confirm?x=1\norder-1"))
	want := base64.RawURLEncoding.EncodeToString(m.Sum(nil))
	if got := signedHeader(t, s, id, at).Get(HeaderSignature); got != want {
		t.Errorf("Sign(%+v).%s = %q, want %q", id, HeaderSignature, got, want)
	}
}

func TestSignIntoReusesStateWithoutAllocating(t *testing.T) {
	s, err := NewSigner(testSecret)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	ids := []Identity{
		{OwnerID: "5f0c2a9e-1d1b-4c55-9d57-6a3f0c0e0001", PlatformID: "platform-with-a-long-name", KeyID: "k1",
			Scopes: []string{ScopeExportRead, ScopeSalesWrite}, RequestID: "0123456789abcdef0123456789abcdef"},
		{RequestID: "anonymous"},
		{OwnerID: "o2", KeyID: "k2", Scopes: []string{ScopeExportRead}, RequestID: "r2"},
	}
	for range 2 { // the second round from reused states
		for _, want := range ids {
			h := http.Header{}
			s.SignInto(func(name string, value []byte) { h.Set(name, string(value)) }, want, testRequest, now)
			got, err := s.Verify(h.Get, testRequest, now)
			if err != nil {
				t.Fatalf("Verify(SignInto(%+v)) error = %v", want, err)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("SignInto round trip (-signed +verified):\n%s", diff)
			}
		}
	}
	if racedetector.Enabled {
		return // allocation counts mean nothing under the race detector
	}
	discard := func(string, []byte) {}
	if n := testing.AllocsPerRun(100, func() { s.SignInto(discard, ids[0], testRequest, now) }); n != 0 {
		t.Errorf("SignInto allocates %.0f times per call, want 0 (it runs on every proxied request)", n)
	}
}

// The README's rolling rotation of IDENTITY_SECRET: at every step, a gateway
// of the step before and a service of the step after (and the reverse)
// understand each other; a single rollout straight to the swap does not.
func TestRollingRotation(t *testing.T) {
	oldSecret, newSecret := testSecret, testSecret+"-rotated"
	signer := func(secret string, previous ...string) *Signer {
		s, err := NewSigner(secret, previous...)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	steps := []*Signer{
		signer(oldSecret),            // before
		signer(oldSecret, newSecret), // 1: the new secret accepted
		signer(newSecret, oldSecret), // 2: swapped
		signer(newSecret),            // 3: the old one dropped
	}
	now := time.Now()
	id := Identity{OwnerID: "o1", KeyID: "k1", Scopes: []string{ScopeExportRead}, RequestID: "r1"}
	for i := 1; i < len(steps); i++ {
		for _, pair := range [][2]int{{i - 1, i}, {i, i - 1}} {
			if _, err := steps[pair[1]].Verify(signedHeader(t, steps[pair[0]], id, now).Get, testRequest, now); err != nil {
				t.Errorf("identity signed at step %d, verified at step %d: %v", pair[0], pair[1], err)
			}
		}
	}
	if _, err := steps[0].Verify(signedHeader(t, steps[2], id, now).Get, testRequest, now); err == nil {
		t.Error("skipping step 1: a service not yet replaced accepted a new gateway's signature; the README's warning would be wrong")
	}
	// Renewing reads an accepted signature and signs with the current secret.
	h := signedHeader(t, steps[1], id, now)
	if err := steps[2].Renew(h.Get, testRequest, func(name string, v []byte) { h.Set(name, string(v)) }, now); err != nil {
		t.Fatalf("Renew of an identity signed with the accepted secret = %v", err)
	}
	if _, err := steps[3].Verify(h.Get, testRequest, now); err != nil {
		t.Errorf("renewed identity is not signed with the current secret: %v", err)
	}
	if _, err := NewSigner(newSecret, "short"); err == nil {
		t.Error("NewSigner(secret, short previous) = nil error, want one")
	}
}

// An identity-v1 signature (no request bound: a gateway of a build before
// identity-v2) is refused, unless the service accepts unbound ones for an
// upgrade; then from the current secret and the previous ones alike.
func TestUnboundSignaturesOnlyWhileAccepted(t *testing.T) {
	at := time.Now()
	v1 := func(secret string) http.Header {
		ts := strconv.FormatInt(at.UnixMilli(), 10)
		m := hmac.New(sha256.New, []byte(secret))
		m.Write([]byte("identity-v1\no1\np1\nk1\nsales:write\nr1\n" + ts))
		return http.Header{HeaderOwner: {"o1"}, HeaderPlatform: {"p1"}, HeaderKeyID: {"k1"}, HeaderScopes: {"sales:write"},
			HeaderRequestID: {"r1"}, HeaderTime: {ts}, HeaderSignature: {base64.RawURLEncoding.EncodeToString(m.Sum(nil))}}
	}
	previous := testSecret + "-previous"
	strict, _ := NewSigner(testSecret, previous)
	upgrading, _ := NewSigner(testSecret, previous)
	upgrading.AcceptUnbound()
	for _, secret := range []string{testSecret, previous} {
		if _, err := strict.Verify(v1(secret).Get, testRequest, at); err != ErrUnsigned {
			t.Errorf("Verify(identity-v1) by a service not upgrading = %v, want ErrUnsigned", err)
		}
		if id, err := upgrading.Verify(v1(secret).Get, testRequest, at); err != nil || id.OwnerID != "o1" {
			t.Errorf("Verify(identity-v1) by a service upgrading = %+v, %v; want o1", id, err)
		}
	}
	if _, err := upgrading.Verify(v1(testSecret+"x").Get, testRequest, at); err != ErrUnsigned {
		t.Errorf("Verify(identity-v1 of another secret) by a service upgrading = %v, want ErrUnsigned", err)
	}
	// Its own bound signatures still verify, for their request only.
	h := signedHeader(t, upgrading, Identity{OwnerID: "o1"}, at)
	if _, err := upgrading.Verify(h.Get, testRequest, at); err != nil {
		t.Errorf("Verify(identity-v2) by a service upgrading = %v", err)
	}
	if _, err := upgrading.Verify(h.Get, Request{Method: "GET", Target: "/v1/export/items"}, at); err != ErrUnsigned {
		t.Errorf("Verify(identity-v2 for another request) by a service upgrading = %v, want ErrUnsigned", err)
	}
}

// A signed identity verifies as signed, for its request and within
// MaxSkew; with any one signed value changed (replaced, cut short, grown,
// a newline put in to shift the fields), for another request, by another
// secret or outside MaxSkew, it never does, whether the service accepts
// identity-v1 signatures or not. Renew renews only what Verify would read.
func FuzzVerify(f *testing.F) {
	f.Add("o1", "p1", "k1", "export:read,sales:write", "r1", "POST", testRequest.Target, "order-1", uint8(0), "o2", int64(0))
	f.Add("o1", "", "k1", "export:read", "r1", "GET", "/v1/export/items?limit=1", "", uint8(3), "export:read,sales:write", int64(-120000))
	f.Add("", "", "", "", "anonymous", "GET", "/v1/health", "", uint8(6), "", int64(120001))
	f.Add("o1", "p1", "k1", "sales:write", "r1", "POST\n/v1/export/items/a%2Fb/sales/confirm?x=1", "order-1", "", uint8(7), "PUT", int64(1))
	f.Add("o1", "p1", "k1", "sales:write", "r1", "POST", "/v1/export/items/a/sales/cancel", "order-1", uint8(11), "1", int64(-1))
	f.Fuzz(func(t *testing.T, owner, platform, keyID, scopes, requestID, method, target, idempotencyKey string,
		tamper uint8, value string, ageMillis int64) {
		for _, v := range []string{owner, platform, keyID, scopes, requestID, method, target, idempotencyKey} {
			if strings.Contains(v, "\n") {
				t.Skip() // no header value nor request line holds one
			}
		}
		s, _ := NewSigner(testSecret)
		upgrading, _ := NewSigner(testSecret)
		upgrading.AcceptUnbound()
		other, _ := NewSigner(testSecret + "x")
		now := time.UnixMilli(1763700000123)
		id := Identity{OwnerID: owner, PlatformID: platform, KeyID: keyID, RequestID: requestID}
		if scopes != "" {
			id.Scopes = strings.Split(scopes, ",")
		}
		req := Request{Method: method, Target: target, IdempotencyKey: idempotencyKey}
		h := map[string]string{}
		for _, kv := range s.Sign(id, req, now) {
			h[kv.Name] = kv.Value
		}
		get := func(name string) string { return h[name] }

		for _, verifier := range []*Signer{s, upgrading} {
			got, err := verifier.Verify(get, req, now)
			if err != nil {
				t.Fatalf("Verify(Sign(%+v, %+v)) error = %v", id, req, err)
			}
			if diff := cmp.Diff(id, got); diff != "" {
				t.Fatalf("Verify(Sign(%+v)) (-signed +verified):\n%s", id, diff)
			}
		}
		if _, err := other.Verify(get, req, now); err != ErrUnsigned {
			t.Fatalf("Verify by another secret = %v, want ErrUnsigned", err)
		}
		age := time.Duration(ageMillis) * time.Millisecond
		if _, err := s.Verify(get, req, now.Add(age)); (err == nil) != (-MaxSkew <= age && age <= MaxSkew) {
			t.Fatalf("Verify %v after signing = %v", age, err)
		}

		// One value changed: a header (by name, as sent) or a field of
		// the request.
		names := append(signedHeaders[:], HeaderSignature)
		forged, forgedReq := maps.Clone(h), req
		fields := append([]*string{}, &forgedReq.Method, &forgedReq.Target, &forgedReq.IdempotencyKey)
		var old string
		var set func(string)
		if i := int(tamper>>2) % (len(names) + len(fields)); i < len(names) {
			old, set = forged[names[i]], func(v string) { forged[names[i]] = v }
		} else {
			p := fields[i-len(names)]
			old, set = *p, func(v string) { *p = v }
		}
		switch tamper % 4 {
		case 0:
			set(value)
		case 1:
			set(old[:min(len(value), len(old))]) // cut short
		case 2:
			set(old + value)
		case 3:
			set(value + old)
		}
		changed := !maps.Equal(forged, h) || forgedReq != req
		forgedGet := func(name string) string { return forged[name] }
		for _, verifier := range []*Signer{s, upgrading} {
			_, err := verifier.Verify(forgedGet, forgedReq, now)
			if changed && err != ErrUnsigned || !changed && err != nil {
				t.Fatalf("Verify(%q for %+v, signed as %q for %+v) = %v, want it refused exactly when changed (%v)",
					forged, forgedReq, h, req, err, changed)
			}
			// Renew renews only what verifies, whatever its age.
			renewed := false
			err = verifier.Renew(forgedGet, forgedReq, func(string, []byte) { renewed = true }, now.Add(time.Hour))
			if (err == nil) != !changed || renewed != !changed {
				t.Fatalf("Renew(%q for %+v) = %v (renewed: %v), want it only when unchanged (%v)", forged, forgedReq, err, renewed, !changed)
			}
		}
	})
}
