package testenv

import (
	"net"
	"testing"
)

// ServeConns returns the address (host:port, loopback) of a server that
// hands each connection it accepts to handle, in a goroutine of its own,
// and closes the connection when handle returns: a peer that misbehaves
// in a way of the test's choosing (answers cut short, a slow handshake,
// a request read and never answered). It stops accepting when the test
// ends.
func ServeConns(t testing.TB, handle func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				handle(conn)
			}()
		}
	}()
	return ln.Addr().String()
}
