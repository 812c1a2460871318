package testenv

import (
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Link is how a slow link to a primary relays what the primary sends.
type Link struct {
	// Delay is how long after it came each chunk is handed on: a link that
	// streams on without a gap, every message late (a distant standby).
	Delay time.Duration
	// BytesPerSecond, when not 0, bounds how fast chunks are read: a link
	// slower than the primary writes WAL, the backlog left on the
	// primary's side.
	BytesPerSecond int
}

// StandbyPairOver is StandbyPair with the standby's WAL receiver connected
// to the primary through a relay that hands on what the primary sends as
// link says. The standby hears from its primary as often as a close one
// does, and replays what it receives at once, yet lags behind.
func StandbyPairOver(t testing.TB, link Link, standbyOpts ...string) *Pair {
	t.Helper()
	return standbyPair(t, func(p *Pair) []string {
		relayDir := filepath.Join(p.dir, "relay-socket")
		startSlowRelay(t, relayDir, filepath.Join(p.socketDir("primary"), ".s.PGSQL.5432"), link)
		return []string{"primary_conninfo=host=" + relayDir + " user=postgres"}
	}, standbyOpts...)
}

// startSlowRelay listens on the PostgreSQL socket of dir (port 5432), open
// to the server's user, and relays each connection to the socket target,
// its answers over link. It stops when the test ends.
func startSlowRelay(t testing.TB, dir, target string, link Link) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("testenv: relay: %v", err)
	}
	path := filepath.Join(dir, ".s.PGSQL.5432")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatalf("testenv: relay: %v", err)
	}
	if err := os.Chmod(path, 0o777); err != nil { // the server's user connects
		t.Fatalf("testenv: relay: %v", err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("unix", target)
			if err != nil {
				client.Close()
				continue
			}
			go func() { _, _ = io.Copy(server, client); server.Close() }()
			go func() { relayOver(client, server, link); client.Close() }()
		}
	}()
}

// relayOver copies src to dst over link: read at most BytesPerSecond (so
// that the sender waits), each chunk written Delay after it was read.
func relayOver(dst io.Writer, src io.Reader, link Link) {
	type chunk struct {
		b  []byte
		at time.Time
	}
	chunks := make(chan chunk, 1<<16)
	go func() {
		defer close(chunks)
		for {
			b := make([]byte, 16<<10)
			n, err := src.Read(b)
			if n > 0 {
				chunks <- chunk{b[:n], time.Now()}
				if link.BytesPerSecond > 0 {
					time.Sleep(time.Duration(n) * time.Second / time.Duration(link.BytesPerSecond))
				}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range chunks {
		time.Sleep(time.Until(c.at.Add(link.Delay)))
		if _, err := dst.Write(c.b); err != nil {
			for range chunks { // let the reader end
			}
			return
		}
	}
}
