package edge

import (
	"testing"
	"time"

	"github.com/coinexport/export/pkg/identity"
	"github.com/google/go-cmp/cmp"
	"github.com/valyala/fasthttp"
)

// The services verify what headerSigner writes with pkg/identity: both
// must agree on every identity shape, and a tampered header must fail.
func TestHeaderSignerMatchesIdentity(t *testing.T) {
	verifier, err := identity.NewSigner(testSecret)
	if err != nil {
		t.Fatal(err)
	}
	s := newHeaderSigner(testSecret)
	now := time.Now()
	for _, id := range []identity.Identity{
		{OwnerID: "o1", PlatformID: "p1", KeyID: "k1", Scopes: []string{identity.ScopeExportRead, identity.ScopeSalesWrite}, RequestID: "r1"},
		{OwnerID: "5f0c2a9e-1d1b-4c55-9d57-6a3f0c0e0001", KeyID: "5f0c2a9e-1d1b-4c55-9d57-6a3f0c0e0002",
			Scopes: []string{identity.ScopeExportRead}, RequestID: "0123456789abcdef0123456789abcdef"},
		{RequestID: "anonymous"},
	} {
		for range 2 { // the second time from a reused state
			var h fasthttp.RequestHeader
			s.sign(&h, id, now)
			got, err := verifier.Verify(func(name string) string { return string(h.Peek(name)) }, now)
			if err != nil {
				t.Fatalf("Verify(headerSigner.sign(%+v)) = %v, want nil", id, err)
			}
			if diff := cmp.Diff(id, got); diff != "" {
				t.Errorf("identity round trip (-signed +verified):\n%s", diff)
			}
			want := map[string]string{}
			for _, kv := range verifier.Sign(id, now) {
				want[kv.Name] = kv.Value
			}
			for name, value := range want {
				if got := string(h.Peek(name)); got != value {
					t.Errorf("header %s = %q, identity.Signer.Sign gives %q", name, got, value)
				}
			}
			h.Set(identity.HeaderKeyID, "k2")
			if _, err := verifier.Verify(func(name string) string { return string(h.Peek(name)) }, now); err == nil {
				t.Errorf("Verify after changing the key id = nil, want an error")
			}
		}
	}
}
