// Package rawio reads and writes a socket with raw system calls, so that
// the Go runtime's monitor thread (sysmon) is not woken by each of them.
//
// Every read and write on a net.Conn enters the runtime's system-call
// state (syscall.Syscall). When a process has been idle, every P of it
// parked, sysmon sleeps deeply; the next call in that state wakes it, and
// it then polls every 20 µs for about a millisecond, each poll a
// nanosleep and two context switches. A socket that is non-blocking, as
// every socket of the net package is, never blocks in a read or a write,
// so the call needs none of that state: it can be made raw
// (syscall.RawSyscall), and when the socket is not ready the goroutine
// waits for it in the runtime's network poller as net's own calls do
// (syscall.RawConn), deadlines included. A race detector's build keeps
// net's calls (raceEnabled).
//
// Measured on the make bench stack (BENCHMARKS.md, "Profiles"): sysmon
// was 20–29 % of the gateway's and export-reader's CPU on the sync and
// sales paths; with the gateway and export-reader on raw calls, GETs by id
// through the gateway served 1.2–1.6× the requests at a lower p99, where
// the gateway alone on raw calls moved its saved work to export-reader.
package rawio

import (
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"unsafe"

	"github.com/coinexport/export/pkg/racedetector"
)

// Conn is a TCP or Unix socket whose Read, Write and WriteBuffers make
// raw system calls. Everything else (Close, deadlines, addresses) is the
// socket's own.
type Conn struct {
	net.Conn
	raw syscall.RawConn
}

// Wrap returns c reading and writing with raw system calls when it is a
// *net.TCPConn or a *net.UnixConn, and c itself otherwise (a TLS
// connection, a test's pipe).
func Wrap(c net.Conn) net.Conn {
	switch c.(type) {
	case *net.TCPConn, *net.UnixConn:
	default:
		return c
	}
	raw, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		return c
	}
	return &Conn{Conn: c, raw: raw}
}

// raceEnabled is whether the race detector is built in (racedetector).
// Its builds read and write through net's own calls: RawSyscall is hidden
// from the detector (go:norace), so raw calls would not tell it what the kernel
// reads from and writes into the buffers, nor that a byte written to a
// socket happens before its read on the other end, which net's calls do
// (syscall's ioSync), and every test whose handler and client share
// state ordered by the request and its answer would report a race.
const raceEnabled = racedetector.Enabled

// maxRW is the most one read or write system call is asked for, as in
// internal/poll: some kernels refuse larger counts.
const maxRW = 1 << 30

// maxIovecs is the most buffers one writev is given (the kernel's
// IOV_MAX); the rest go in the next call.
const maxIovecs = 1024

// Read reads into p: io.EOF once the peer has closed its side, a
// *net.OpError otherwise, as net's Read.
func (c *Conn) Read(p []byte) (int, error) {
	if raceEnabled {
		return c.Conn.Read(p)
	}
	if len(p) == 0 {
		return 0, nil
	}
	p = p[:min(len(p), maxRW)]
	var n int
	var errno syscall.Errno
	err := c.raw.Read(func(fd uintptr) bool {
		for {
			r, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
			switch e {
			case syscall.EINTR:
				continue
			case syscall.EAGAIN:
				return false // wait in the poller, then read again
			case 0:
				n = int(r)
			default:
				errno = e
			}
			return true
		}
	})
	if err := c.failure("read", err, errno); err != nil {
		return 0, err
	}
	if n == 0 {
		return 0, io.EOF
	}
	return n, nil
}

// Write writes all of p, or fails with a *net.OpError saying how much
// was written, as net's Write.
func (c *Conn) Write(p []byte) (int, error) {
	if raceEnabled {
		return c.Conn.Write(p)
	}
	var n int
	var errno syscall.Errno
	err := c.raw.Write(func(fd uintptr) bool {
		for n < len(p) {
			chunk := p[n:][:min(len(p)-n, maxRW)]
			r, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&chunk[0])), uintptr(len(chunk)))
			switch e {
			case 0:
				n += int(r)
			case syscall.EINTR:
			case syscall.EAGAIN:
				return false
			default:
				errno = e
				return true
			}
		}
		return true
	})
	if err := c.failure("write", err, errno); err != nil {
		return n, err
	}
	return n, nil
}

// WriteBuffers writes bufs in as few writev calls as the socket takes
// them, consuming them and failing (op "writev") as net.Buffers.WriteTo on
// a socket does.
func (c *Conn) WriteBuffers(bufs *net.Buffers) (int64, error) {
	if raceEnabled {
		return bufs.WriteTo(c.Conn)
	}
	var written int64
	var errno syscall.Errno
	iovecs := make([]syscall.Iovec, 0, min(len(*bufs), maxIovecs))
	err := c.raw.Write(func(fd uintptr) bool {
		for {
			iovecs = appendIovecs(iovecs[:0], *bufs)
			if len(iovecs) == 0 {
				*bufs = (*bufs)[:0]
				return true
			}
			r, _, e := syscall.RawSyscall(syscall.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&iovecs[0])), uintptr(len(iovecs)))
			switch e {
			case 0:
				written += int64(r)
				consume(bufs, int64(r))
			case syscall.EINTR:
			case syscall.EAGAIN:
				return false
			default:
				errno = e
				return true
			}
		}
	})
	if err := c.failure("writev", err, errno); err != nil {
		return written, err
	}
	return written, nil
}

// appendIovecs appends an iovec for each non-empty buffer of bufs, up to
// maxIovecs, each at most maxRW long.
func appendIovecs(iovecs []syscall.Iovec, bufs net.Buffers) []syscall.Iovec {
	for _, b := range bufs {
		if len(b) == 0 {
			continue
		}
		iov := syscall.Iovec{Base: &b[0]}
		iov.SetLen(min(len(b), maxRW))
		iovecs = append(iovecs, iov)
		if len(iovecs) == maxIovecs {
			break
		}
	}
	return iovecs
}

// consume drops the first n bytes of bufs, and the buffers they empty.
func consume(bufs *net.Buffers, n int64) {
	for len(*bufs) > 0 {
		first := int64(len((*bufs)[0]))
		if first > n {
			(*bufs)[0] = (*bufs)[0][n:]
			return
		}
		n -= first
		(*bufs)[0] = nil
		*bufs = (*bufs)[1:]
	}
}

// CloseWrite shuts the socket's write side, for callers that look for it
// (net/http after a 431): net's own sockets have it, and so must a
// wrapper of one.
func (c *Conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

// SyscallConn is the socket's own, for callers that set options on it.
func (c *Conn) SyscallConn() (syscall.RawConn, error) { return c.raw, nil }

// failure is a call's error as net's own call gives it, nil if none: the
// RawConn's (the socket closed, a deadline passed) or the system call's
// errno, under a *net.OpError of op, so that callers that look for a
// timeout (net.Error), net.ErrClosed or a syscall.Errno find it, and logs
// read net's words. The RawConn's errors come in a *net.OpError of their
// own op ("raw-read"), whose cause is taken: around it, every address was
// said twice.
func (c *Conn) failure(op string, err error, errno syscall.Errno) error {
	switch {
	case err == nil && errno == 0:
		return nil
	case err == nil:
		err = os.NewSyscallError(op, errno)
	}
	if raw, ok := err.(*net.OpError); ok {
		err = raw.Err
	}
	return &net.OpError{Op: op, Net: c.LocalAddr().Network(), Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
}
