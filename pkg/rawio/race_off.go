//go:build !race

package rawio

// raceEnabled is whether the race detector is built in. Its builds read
// and write through net's own calls: RawSyscall is hidden from the
// detector (go:norace), so raw calls would not tell it what the kernel
// reads from and writes into the buffers, nor that a byte written to a
// socket happens before its read on the other end, which net's calls do
// (syscall's ioSync), and every test whose handler and client share
// state ordered by the request and its answer would report a race.
const raceEnabled = false
