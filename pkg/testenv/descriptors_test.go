package testenv

import (
	"errors"
	"net"
	"os"
	"syscall"
	"testing"
)

// NoDescriptors leaves none to open even when a descriptor of the process
// is closed meanwhile, as a listener a garbage collection closes: under
// ExhaustDescriptors' limit the next open took its number.
func TestNoDescriptorsLeavesNoneWhateverIsClosed(t *testing.T) {
	closedMeanwhile, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	restore := NoDescriptors(t)
	closedMeanwhile.Close()
	if f, err := os.Open(os.DevNull); !errors.Is(err, syscall.EMFILE) {
		f.Close()
		t.Errorf("Open after a descriptor was closed = %v, want EMFILE", err)
	}
	if c, err := net.Dial("tcp", "127.0.0.1:1"); !errors.Is(err, syscall.EMFILE) {
		if c != nil {
			c.Close()
		}
		t.Errorf("Dial after a descriptor was closed = %v, want EMFILE", err)
	}
	restore()
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatalf("Open after restore = %v, want a descriptor", err)
	}
	f.Close()
}
