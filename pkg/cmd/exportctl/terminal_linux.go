package main

import (
	"os"

	"golang.org/x/sys/unix"
)

// The terminal's requests are golang.org/x/sys/unix's, whose numbers are
// right for each architecture: TCFLSH, written out here as amd64's 0x540B,
// is another request on mips (0x5407) and ppc64 (0x2000741F), where the
// second line pasted was left for the shell.

// onFD runs call on f's descriptor through its SyscallConn: f.Fd() would
// take f out of Go's poller for good.
func onFD(f *os.File, call func(fd int) error) error {
	conn, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var callErr error
	if err := conn.Control(func(fd uintptr) { callErr = call(int(fd)) }); err != nil {
		return err
	}
	return callErr
}

// isTerminal reports whether f is a terminal: its line settings can be read.
func isTerminal(f *os.File) bool {
	return onFD(f, func(fd int) error {
		_, err := unix.IoctlGetTermios(fd, unix.TCGETS)
		return err
	}) == nil
}

// withoutEcho turns the terminal f's echo off, and returns what turns it
// on again (or an error, its echo left as it was).
func withoutEcho(f *os.File) (restore func(), err error) {
	var was *unix.Termios
	err = onFD(f, func(fd int) error {
		if was, err = unix.IoctlGetTermios(fd, unix.TCGETS); err != nil {
			return err
		}
		quiet := *was
		quiet.Lflag &^= unix.ECHO
		return unix.IoctlSetTermios(fd, unix.TCSETS, &quiet)
	})
	if err != nil {
		return nil, err
	}
	return func() {
		_ = onFD(f, func(fd int) error { return unix.IoctlSetTermios(fd, unix.TCSETS, was) })
	}, nil
}

// discardTyped drops what was typed into the terminal f and not read yet,
// and reports whether there was any: a second line pasted would otherwise
// go to the shell once the command has ended, a key in it run as a
// command and kept in the shell's history.
func discardTyped(f *os.File) (typed bool) {
	_ = onFD(f, func(fd int) error {
		typed = typedAhead(fd)
		return unix.IoctlSetInt(fd, unix.TCFLSH, unix.TCIFLUSH)
	})
	return typed
}

// typedAhead reports whether the terminal fd holds input not read yet.
// Counted with the line discipline's ICANON off: on, TIOCINQ counts whole
// lines only, so a line pasted after the first without an Enter (as a
// paste's last line often is) went uncounted, and the first line's key
// was revoked, the second's not.
func typedAhead(fd int) bool {
	lines, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	if err != nil {
		return false
	}
	raw := *lines
	raw.Lflag &^= unix.ICANON
	if err := unix.IoctlSetTermios(fd, unix.TCSETS, &raw); err != nil {
		return false
	}
	defer func() { _ = unix.IoctlSetTermios(fd, unix.TCSETS, lines) }()
	n, err := unix.IoctlGetInt(fd, unix.TIOCINQ)
	return err == nil && n > 0
}
