package prestashop

import (
	"context"
	"net"
	"net/url"
	"os"
	"syscall"
	"testing"
)

// A connect that fails for want of a local port (EADDRNOTAVAIL: every
// ephemeral port to the shop's address in use or in TIME_WAIT) is this
// process's shortage, answered 503 unavailable as one of descriptors or
// memory: it was shop_unreachable, which sends the merchant to check DNS
// and firewalls. The error is built as net/http returns it: no connect
// can be made to fail so over loopback alone.
func TestOurLocalPortsRunningOutIsAShortage(t *testing.T) {
	for _, errno := range []syscall.Errno{syscall.EADDRNOTAVAIL, syscall.EMFILE} {
		err := &url.Error{Op: "Get", URL: "https://127.0.0.1:8443/api/languages", Err: &net.OpError{Op: "dial", Net: "tcp",
			Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8443}, Err: os.NewSyscallError("connect", errno)}}
		if e := transportError(context.Background(), "languages", err); e.Kind != KindShortage || e.Kind.Code() != "unavailable" {
			t.Errorf("transportError(%v) = kind %v (%s), want KindShortage (unavailable)", err, e.Kind, e.Kind.Code())
		}
	}
}
