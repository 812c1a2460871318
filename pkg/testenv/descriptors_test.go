package testenv

import (
	"errors"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"strings"
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

// A LoopbackServer closed leaves no listener open: the one
// httptest.NewUnstartedServer opened, dropped, listened on until a garbage
// collection closed it. The collector is off meanwhile: reading
// /proc/net/tcp on a busy machine allocates enough for one to run and
// close the dropped listener, and the test passed without the close.
func TestLoopbackServerLeavesNoListenerOpen(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	before := listeningSockets(t)
	srv := LoopbackServer(t, http.NotFoundHandler())
	srv.Start()
	srv.Close()
	if after := listeningSockets(t); after != before {
		t.Errorf("listening sockets: %d before the server, %d once it is closed; want as many", before, after)
	}
}

// listeningSockets counts the process's descriptors that are listening
// TCP sockets (their inodes in /proc/net/tcp and tcp6, state 0A).
func listeningSockets(t *testing.T) int {
	t.Helper()
	listening := map[string]bool{}
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(table)
		if err != nil {
			t.Skipf("no %s to find the listening sockets: %v", table, err)
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
			if f := strings.Fields(line); len(f) > 9 && f[3] == "0A" {
				listening[f[9]] = true
			}
		}
	}
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd to find the open descriptors: %v", err)
	}
	n := 0
	for _, fd := range fds {
		link, _ := os.Readlink("/proc/self/fd/" + fd.Name())
		inode, ok := strings.CutPrefix(link, "socket:[")
		if ok && listening[strings.TrimSuffix(inode, "]")] {
			n++
		}
	}
	return n
}
