package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TLSCluster starts a cluster of the test's own that takes logins on
// 127.0.0.1 over TLS only (pg_hba.conf: hostssl trust, hostnossl reject),
// with a server certificate for 127.0.0.1 signed by a CA of its own, and
// returns the DSN of its postgres database with sslmode=verify-full and
// that CA as sslrootcert: a production database asks for TLS, and the
// shared cluster listens on a Unix socket only, where pgx sends none. The
// cluster stops when the test ends. It takes a second or two.
func TLSCluster(t testing.TB) string {
	t.Helper()
	c := ownClusters(t, "testenv-tls-")
	c.initdb(t, "main")
	data := filepath.Join(c.dir, "main")
	rootCert := filepath.Join(c.dir, "root.crt")
	writeServerCertificate(t, c, data, rootCert)
	hba := filepath.Join(data, "pg_hba.conf")
	local, err := os.ReadFile(hba)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	// The first line that matches a login decides it.
	overTLSOnly := "hostssl all all 127.0.0.1/32 trust\nhostnossl all all 127.0.0.1/32 reject\n"
	if err := os.WriteFile(hba, append([]byte(overTLSOnly), local...), 0o600); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	_, port, err := net.SplitHostPort(FreeAddr(t))
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	// Later settings win: launch's listen_addresses (none) is overridden.
	c.start(t, "main", "listen_addresses=127.0.0.1", "port="+port, "ssl=on",
		"ssl_cert_file=server.crt", "ssl_key_file=server.key")
	return fmt.Sprintf("host=127.0.0.1 port=%s user=postgres dbname=postgres sslmode=verify-full sslrootcert=%s", port, rootCert)
}

// writeServerCertificate writes a CA's certificate to rootCert, and a
// certificate for 127.0.0.1 it signed, with its key, into the cluster's
// data folder, owned by the server's user (PostgreSQL refuses a key
// others can read).
func writeServerCertificate(t testing.TB, c *clusters, data, rootCert string) {
	t.Helper()
	caKey, caDER := certificate(t, &x509.Certificate{
		Subject: pkix.Name{CommonName: "testenv CA"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign,
	}, nil, nil)
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	serverKey, serverDER := certificate(t, &x509.Certificate{
		Subject: pkix.Name{CommonName: "127.0.0.1"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}, ca, caKey)
	keyDER, err := x509.MarshalECPrivateKey(serverKey)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	files := []struct {
		path, kind string
		der        []byte
		serverOwns bool
	}{
		{rootCert, "CERTIFICATE", caDER, false},
		{filepath.Join(data, "server.crt"), "CERTIFICATE", serverDER, true},
		{filepath.Join(data, "server.key"), "EC PRIVATE KEY", keyDER, true},
	}
	for _, f := range files {
		if err := os.WriteFile(f.path, pem.EncodeToMemory(&pem.Block{Type: f.kind, Bytes: f.der}), 0o600); err != nil {
			t.Fatalf("testenv: %v", err)
		}
		if f.serverOwns && c.user != "" {
			if out, err := runAs("", "chown", c.user, f.path); err != nil {
				t.Fatalf("testenv: chown: %v: %s", err, out)
			}
		}
	}
}

// certificate signs template with parentKey as parent (itself when parent
// is nil) and returns the new certificate's key and DER bytes.
func certificate(t testing.TB, template, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (*ecdsa.PrivateKey, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	template.SerialNumber = big.NewInt(time.Now().UnixNano())
	template.NotBefore, template.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
	if parent == nil {
		parent, parentKey = template, key
	}
	der, err := x509.CreateCertificate(rand.Reader, template, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return key, der
}
