package testenv

import (
	"fmt"
	"os/exec"
	"testing"
)

// The caps of ShortOfResources' server.
const (
	// FileSizeCap is the most any file of the server may hold: a table
	// extended past it gets the write of a block cut short, as on a full
	// disk. A multiple of the 8 kB block and 1 kB more, so that the block
	// that crosses it is written in part (a write that starts at the cap
	// fails whole, with EFBIG, not as a full disk); above a WAL segment's
	// 16 MB, which every WAL file is written to at once.
	FileSizeCap = 20<<20 + 1<<10
	// MemoryCap is the address space of each server process: the
	// postmaster maps some 220 MB (shared_buffers at its 128 MB default),
	// so a statement that allocates 900 MB at once is refused.
	MemoryCap = 768 << 20
)

// ShortOfResources starts a cluster of the test's own whose server runs
// under prlimit's FileSizeCap and MemoryCap, and returns the DSN of its
// postgres database: what a full disk or a server out of memory answers
// can be had there with no mount and no root, at a statement chosen by the
// test. An INSERT that extends a table past FileSizeCap is refused "could
// not extend file ...: wrote only 1024 of 8192 bytes", SQLSTATE 53100
// (disk_full), through PostgreSQL 15; from 16 a table is extended by
// writes of zeros that report the cap's EFBIG instead (XX000). A
// statement that allocates more than MemoryCap leaves is refused "out of
// memory", 53200, on every version. The server stops when the test ends.
func ShortOfResources(t testing.TB) string {
	t.Helper()
	prlimit, err := exec.LookPath("prlimit")
	if err != nil {
		t.Fatalf("testenv: prlimit (util-linux) not found: %v", err)
	}
	c := ownClusters(t, "testenv-short-")
	c.initdb(t, "main")
	c.startUnder(t, "main", []string{prlimit, fmt.Sprintf("--fsize=%d", FileSizeCap), fmt.Sprintf("--as=%d", MemoryCap)}, "jit=off")
	return c.dsn("main", "postgres")
}
