package identity

import (
	"net/http"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

const testSecret = "0123456789abcdef0123456789abcdef"

func signedHeader(t *testing.T, s *Signer, id Identity, at time.Time) http.Header {
	t.Helper()
	h := http.Header{}
	for _, kv := range s.Sign(id, at) {
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
	got, err := s.Verify(signedHeader(t, s, want, now).Get, now)
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
			if _, err := s.Verify(tt.header().Get, now); err != ErrUnsigned {
				t.Errorf("Verify = %v, want ErrUnsigned", err)
			}
		})
	}
}

func TestNewSignerRefusesShortSecret(t *testing.T) {
	if _, err := NewSigner("short"); err == nil {
		t.Error("NewSigner(short) = nil error, want error")
	}
}
