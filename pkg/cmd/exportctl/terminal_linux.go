package main

import (
	"os"
	"syscall"
	"unsafe"
)

// ioctl runs the terminal request req on f with arg, a pointer.
func ioctl(f *os.File, req uintptr, arg unsafe.Pointer) error {
	return onFD(f, func(fd uintptr) syscall.Errno {
		_, _, errno := syscall.Syscall(syscall.SYS_IOCTL, fd, req, uintptr(arg))
		return errno
	})
}

// onFD runs call on f's descriptor through its SyscallConn: f.Fd() would
// take f out of Go's poller for good.
func onFD(f *os.File, call func(fd uintptr) syscall.Errno) error {
	conn, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var errno syscall.Errno
	if err := conn.Control(func(fd uintptr) { errno = call(fd) }); err != nil {
		return err
	}
	if errno != 0 {
		return errno
	}
	return nil
}

// isTerminal reports whether f is a terminal: its line settings can be read.
func isTerminal(f *os.File) bool {
	var t syscall.Termios
	return ioctl(f, syscall.TCGETS, unsafe.Pointer(&t)) == nil
}

// withoutEcho turns the terminal f's echo off, and returns what turns it
// on again (or an error, its echo left as it was).
func withoutEcho(f *os.File) (restore func(), err error) {
	var was syscall.Termios
	if err := ioctl(f, syscall.TCGETS, unsafe.Pointer(&was)); err != nil {
		return nil, err
	}
	quiet := was
	quiet.Lflag &^= syscall.ECHO
	if err := ioctl(f, syscall.TCSETS, unsafe.Pointer(&quiet)); err != nil {
		return nil, err
	}
	return func() { _ = ioctl(f, syscall.TCSETS, unsafe.Pointer(&was)) }, nil
}

// discardTyped drops what was typed into the terminal f and not read yet,
// and reports whether there was any: a second line pasted would otherwise
// go to the shell once the command has ended, a key in it run as a
// command and kept in the shell's history.
func discardTyped(f *os.File) bool {
	var pending int32
	typed := ioctl(f, syscall.TIOCINQ, unsafe.Pointer(&pending)) == nil && pending > 0
	_ = onFD(f, func(fd uintptr) syscall.Errno {
		_, _, errno := syscall.Syscall(syscall.SYS_IOCTL, fd, tcflsh, syscall.TCIFLUSH)
		return errno
	})
	return typed
}

// tcflsh is Linux's TCFLSH request (tcflush(3)), which package syscall
// does not name.
const tcflsh = 0x540B
