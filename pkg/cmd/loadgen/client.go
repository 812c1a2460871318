package main

import (
	"crypto/rand"
	"encoding/hex"
	"net"
	"net/http"
	"time"

	"github.com/coinexport/export/pkg/identity"
)

// newHTTPClient returns a keep-alive client for conns concurrent requests.
// Compression is off: the figures measure the service's own work, and a
// client on the same two cores would otherwise pay for inflating every page.
func newHTTPClient(conns int) *http.Client {
	return &http.Client{
		Timeout: time.Minute,
		Transport: &http.Transport{
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:        2 * conns,
			MaxIdleConnsPerHost: 2 * conns,
			IdleConnTimeout:     90 * time.Second,
			DisableCompression:  true,
		},
	}
}

// authenticator puts credentials on a request.
type authenticator func(h http.Header)

// byAPIKey authenticates like a real client, through the gateway.
func byAPIKey(key string) authenticator {
	return func(h http.Header) { h.Set("X-API-Key", key) }
}

// bySignedIdentity signs the identity the gateway would send, for calls that
// bypass it (direct to a service, or through the nginx baseline proxy).
func bySignedIdentity(signer *identity.Signer, id identity.Identity) authenticator {
	return func(h http.Header) {
		id := id
		id.RequestID = randomHex(16)
		for _, hd := range signer.Sign(id, time.Now()) {
			h.Set(hd.Name, hd.Value)
		}
	}
}

// readIdentity is the identity of the bench's read key.
func readIdentity(cfg Config) identity.Identity {
	return identity.Identity{OwnerID: cfg.OwnerID, KeyID: cfg.ReadKeyID, Scopes: []string{identity.ScopeExportRead}}
}

// authFor returns the authenticator for mode "key" or "signed".
func authFor(cfg Config, mode string) (authenticator, error) {
	switch mode {
	case "key":
		if err := cfg.need("LOADGEN_READ_KEY"); err != nil {
			return nil, err
		}
		return byAPIKey(cfg.ReadKey), nil
	case "signed":
		if err := cfg.need("IDENTITY_SECRET", "LOADGEN_OWNER_ID"); err != nil {
			return nil, err
		}
		signer, err := identity.NewSigner(cfg.IdentitySecret)
		if err != nil {
			return nil, err
		}
		return bySignedIdentity(signer, readIdentity(cfg)), nil
	}
	return nil, errUsagef("--auth must be key or signed, got %q", mode)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
