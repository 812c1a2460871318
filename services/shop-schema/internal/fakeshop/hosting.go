package fakeshop

import (
	"compress/gzip"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"time"
	"unicode/utf8"
)

// gzipWriter compresses what the handler writes, as a host's server does
// when it gzips PHP's answers.
type gzipWriter struct {
	http.ResponseWriter
	gz *gzip.Writer
}

func (g gzipWriter) Write(p []byte) (int, error) { return g.gz.Write(p) }

// Flush sends what is compressed so far, so that a drip stays a drip.
func (g gzipWriter) Flush() {
	g.gz.Flush()
	if f, ok := g.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// writeEndless streams rows of resource that never end, until the client
// leaves or stops reading.
func (s *Shop) writeEndless(w http.ResponseWriter, r *http.Request, resource string) {
	if _, err := fmt.Fprintf(w, `{"%s":[`, resource); err != nil {
		return
	}
	for id := 1; r.Context().Err() == nil; id++ {
		if _, err := fmt.Fprintf(w, `{"id":%d,"name":"row %[1]d"},`, id); err != nil {
			return
		}
	}
}

// drip writes body a byte at a time, pause apart, flushed, until it is
// written or the client leaves.
func drip(w http.ResponseWriter, r *http.Request, body []byte, pause time.Duration) {
	flusher, _ := w.(http.Flusher)
	for _, b := range body {
		if _, err := w.Write([]byte{b}); err != nil {
			return
		}
		if flusher != nil {
			flusher.Flush()
		}
		if !waited(r, time.After(pause)) {
			return
		}
	}
}

// phpNotice is what PHP prints before the answer when display_errors is
// on (html_errors too, as PHP-FPM has it by default) and a module raises a
// notice.
const phpNotice = "<br />\n<b>Deprecated</b>:  Return type of Module\\Thing::count() should be compatible with Countable::count(): int in <b>/var/www/html/modules/thing/Thing.php</b> on line <b>12</b><br />\n"

// windows1251 re-encodes UTF-8 text as Windows-1251, Cyrillic included;
// a rune it has no byte for becomes "?".
func windows1251(utf8Text []byte) []byte {
	out := make([]byte, 0, len(utf8Text))
	for len(utf8Text) > 0 {
		r, size := utf8.DecodeRune(utf8Text)
		utf8Text = utf8Text[size:]
		switch {
		case r < 0x80:
			out = append(out, byte(r))
		case r >= 'А' && r <= 'я':
			out = append(out, byte(r-'А'+0xC0))
		case cp1251Extra[r] != 0:
			out = append(out, cp1251Extra[r])
		default:
			out = append(out, '?')
		}
	}
	return out
}

// cp1251Extra holds the Ukrainian letters outside А..я.
var cp1251Extra = map[rune]byte{'Ё': 0xA8, 'ё': 0xB8, 'Є': 0xAA, 'є': 0xBA, 'І': 0xB2, 'і': 0xB3, 'Ї': 0xAF, 'ї': 0xBF, 'Ґ': 0xA5, 'ґ': 0xB4}

// SelfSigned makes a self-signed certificate for hosts (names or IP
// addresses), valid from notBefore to notAfter: trusted through CAPEM, it
// is its own root.
func SelfSigned(hosts []string, notBefore, notAfter time.Time) tls.Certificate {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		panic(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "fakeshop"},
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		panic(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}
