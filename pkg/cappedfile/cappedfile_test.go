package cappedfile

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// Lines written past the cap go to a new file, the full one kept as
// NAME.1 (the one there before gone): NAME and NAME.1 hold the newest
// lines, each whole and under the cap, where the file grew without bound.
func TestWritesPastTheCapStartAFreshFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gateway.log")
	if err := os.WriteFile(path+".1", []byte("the last run's\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := Open(path, 100)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for i := range 50 {
		line := fmt.Sprintf("line %02d of the run\n", i) // 19 bytes: 5 to a file
		lines = append(lines, line)
		if n, err := c.Write([]byte(line)); err != nil || n != len(line) {
			t.Fatalf("Write(%q) = %d, %v", line, n, err)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	now, last := read(t, path), read(t, path+".1")
	if want := strings.Join(lines[45:], ""); now != want {
		t.Errorf("%s = %q, want the last 5 lines %q", path, now, want)
	}
	if want := strings.Join(lines[40:45], ""); last != want {
		t.Errorf("%s.1 = %q, want the 5 lines before %q", path, last, want)
	}
}

// The files are their owner's alone, the one a rotation starts and one an
// earlier build made 0644 included: they hold request ids, client
// addresses and paths, and were 0644, readable by every user.
func TestTheFilesAreTheirOwnersAlone(t *testing.T) {
	dir := t.TempDir()
	made := filepath.Join(dir, "made-before.log")
	if err := os.WriteFile(made, []byte("an earlier build's line\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(made, 0o644); err != nil { // whatever the umask
		t.Fatal(err)
	}
	c, err := Open(made, 0)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	path := filepath.Join(dir, "gateway.log")
	if c, err = Open(path, 30); err != nil {
		t.Fatal(err)
	}
	for range 3 { // 20 bytes each: the second and third rotate
		if _, err := c.Write([]byte("a line of 20 bytes.\n")); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{made, path, path + ".1"} {
		info, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if info.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v, want -rw------- (its owner's alone)", filepath.Base(p), info.Mode().Perm())
		}
	}
}

// A file the run before left is appended to, its size counted: the cap
// holds across a restart of the writer.
func TestOpenCountsWhatTheFileHolds(t *testing.T) {
	path := filepath.Join(t.TempDir(), "traces.jsonl")
	if err := os.WriteFile(path, []byte(strings.Repeat("x", 90)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := Open(path, 100)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("a new line\n")); err != nil {
		t.Fatal(err)
	}
	if got := read(t, path); got != "a new line\n" {
		t.Errorf("%s = %q, want the new line alone (91 + 11 bytes pass the cap)", path, got)
	}
	if got := len(read(t, path+".1")); got != 91 {
		t.Errorf("%s.1 holds %d bytes, want the 91 it held", path, got)
	}
}

// A line longer than the cap is written whole, to a file of its own; a
// cap of 0 caps nothing.
func TestALineOverTheCapIsWrittenWhole(t *testing.T) {
	dir := t.TempDir()
	c, err := Open(filepath.Join(dir, "a.log"), 10)
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("y", 25) + "\n"
	for _, line := range []string{"short\n", long, "after\n"} {
		if _, err := c.Write([]byte(line)); err != nil {
			t.Fatal(err)
		}
	}
	c.Close()
	if got, got1 := read(t, filepath.Join(dir, "a.log")), read(t, filepath.Join(dir, "a.log.1")); got != "after\n" || got1 != long {
		t.Errorf("a.log = %q, a.log.1 = %q; want %q and the long line whole", got, got1, "after\n")
	}
	unlimited, err := Open(filepath.Join(dir, "b.log"), 0)
	if err != nil {
		t.Fatal(err)
	}
	for range 100 {
		if _, err := unlimited.Write([]byte(long)); err != nil {
			t.Fatal(err)
		}
	}
	unlimited.Close()
	if got := len(read(t, filepath.Join(dir, "b.log"))); got != 100*len(long) {
		t.Errorf("b.log with cap 0 holds %d bytes, want all %d", got, 100*len(long))
	}
}

// CopyLines writes each line whole, a rotation falling between lines, and
// reads its input to the end even while writes fail: the process writing
// it must not find its pipe closed (SIGPIPE ends a Go program).
func TestCopyLinesKeepsReadingWhenWritesFail(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "logs", "shop-schema.log")
	if err := os.Mkdir(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	c, err := Open(path, 64)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var input strings.Builder
	for i := range 20 {
		fmt.Fprintf(&input, `{"msg":"request","n":%d}`+"\n", i)
	}
	if err := CopyLines(c, strings.NewReader(input.String()), io.Discard); err != nil {
		t.Fatal(err)
	}
	for _, file := range []string{path, path + ".1"} {
		for line := range strings.Lines(read(t, file)) {
			if !strings.HasPrefix(line, `{"msg"`) || !strings.HasSuffix(line, "}\n") {
				t.Errorf("%s holds %q, want whole lines", file, line)
			}
		}
	}
	// Its folder gone, the next rotation cannot move the file: lines are
	// lost, said once, and the input is still read to its end.
	if err := os.RemoveAll(filepath.Dir(path)); err != nil {
		t.Fatal(err)
	}
	var errs bytes.Buffer
	r := &countingReader{r: strings.NewReader(input.String())}
	if err := CopyLines(c, r, &errs); err != nil {
		t.Fatal(err)
	}
	if r.n != int64(input.Len()) {
		t.Errorf("CopyLines read %d of %d bytes after a failed write, want all", r.n, input.Len())
	}
	if n := strings.Count(errs.String(), "lines are lost"); n != 1 {
		t.Errorf("CopyLines said %q, want one line saying lines are lost", errs.String())
	}
}

// A write the disk cuts short (full: here the file size limit, which
// cuts a write as a full disk does, part written) is taken back whole:
// the part of a line it left was where the next line went, once there was
// room again, and the two read as one line no reader could parse (make
// trace skipped the span, a log reader the two lines).
func TestAWriteCutShortLeavesNoPartOfALine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "traces.jsonl")
	c, err := Open(path, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	line := func(i int) string { return fmt.Sprintf(`{"span":%d,"name":"GET /v1/export/items"}`+"\n", i) } // 41 bytes
	withFileSizeLimit(t, 100, func() {                                                                     // room for two lines and part of a third
		for i := range 3 {
			n, err := c.Write([]byte(line(i)))
			if (i < 2) != (err == nil) {
				t.Fatalf("Write of line %d with 100 bytes of room = %d, %v; want the third one refused", i, n, err)
			}
		}
	})
	// Room again: the next line goes where the one cut short began.
	if _, err := c.Write([]byte(line(3))); err != nil {
		t.Fatal(err)
	}
	if got, want := read(t, path), line(0)+line(1)+line(3); got != want {
		t.Errorf("%s = %q, want whole lines %q", path, got, want)
	}
}

// A rotation whose Close failed (an I/O error on a network file system;
// here its descriptor closed under it) loses that write alone: the file
// it kept failed every write after it, for the rest of the run.
func TestAFailedCloseAtARotationLosesOneWrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gateway.log")
	c, err := Open(path, 20)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("first line, 17 b\n")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Close(int(c.f.Fd())); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("lost\n")); err == nil {
		t.Fatal("a write whose rotation could not close the file succeeded")
	}
	for _, line := range []string{"then\n", "on\n"} {
		if _, err := c.Write([]byte(line)); err != nil {
			t.Fatalf("Write(%q) after one failed rotation: %v", line, err)
		}
	}
	if got := read(t, path); got != "then\non\n" {
		t.Errorf("%s = %q, want the lines after the failed one", path, got)
	}
}

// A line CopyLines gives in parts (over 64 KiB) stays in one file, which
// it may take past the cap: rotated between its parts, NAME.1 ended in its
// first part and NAME began with the rest, two lines no reader could
// parse, the line before it gone with the NAME.1 it replaced.
func TestALineInPartsStaysInOneFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "shop-schema.log")
	const max = 64<<10 + 4
	c, err := Open(path, max)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	before, long, after := "before\n", strings.Repeat("l", 64<<10+9)+"\n", "after\n" // long: a 64 KiB part and 10 bytes
	if err := CopyLines(c, strings.NewReader(before+long+after), io.Discard); err != nil {
		t.Fatal(err)
	}
	if got, got1 := read(t, path), read(t, path+".1"); got != after || got1 != long {
		t.Errorf("%s = %d bytes %.20q, %s.1 = %d bytes %.20q; want %q and the long line whole",
			path, len(got), got, path, len(got1), got1, after)
	}
}

// A line in parts that the disk cuts short is taken back whole, its parts
// written before included, and its parts after it dropped: the part left
// was where the next line went, and the rest of it read as a line. So
// whether the disk took some of the part it cut short or none of it.
func TestALineInPartsCutShortIsTakenBackWhole(t *testing.T) {
	for _, room := range []uint64{50, 39} { // 13 + 26 bytes, and part of the next 23 or none
		t.Run(fmt.Sprint(room), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "gateway.log")
			c, err := Open(path, 1<<20)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			write := func(part string, wantErr bool) {
				t.Helper()
				if n, err := c.Write([]byte(part)); (err != nil) != wantErr {
					t.Fatalf("Write(%q) = %d, %v; want an error: %v", part, n, err, wantErr)
				}
			}
			write("a whole line\n", false)
			write("the start of a long line, ", false)
			withFileSizeLimit(t, room, func() { write("its middle part, lost, ", true) })
			write("and its end\n", true)
			write("the next line\n", false)
			if got, want := read(t, path), "a whole line\nthe next line\n"; got != want {
				t.Errorf("%s = %q, want the whole lines alone %q", path, got, want)
			}
		})
	}
}

// withFileSizeLimit runs f with the process's file size limit at limit
// bytes, which cuts a write short as a full disk does (Go takes no action
// on SIGXFSZ); tests that use it must not run in parallel.
func withFileSizeLimit(t *testing.T, limit uint64, f func()) {
	t.Helper()
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_FSIZE, &old); err != nil {
		t.Fatal(err)
	}
	full := syscall.Rlimit{Cur: limit, Max: old.Max}
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &full); err != nil {
		t.Skipf("the file size limit cannot be set here: %v", err)
	}
	defer func() {
		if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &old); err != nil {
			t.Fatal(err)
		}
	}()
	f()
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// A file whose mode may not change, such as an append-only log (chattr
// +a: even root's chmod fails), is written to as it is: refused for its
// mode, its lines were all lost (logcap).
func TestAFileWhoseModeMayNotChangeIsWrittenAsItIs(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gateway.log")
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("chattr", "+a", path).CombinedOutput(); err != nil {
		t.Skipf("cannot make a file append-only here (root and chattr needed): %v %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("chattr", "-a", path).Run() }) // else TempDir cannot remove it
	c, err := Open(path, 0)
	if err != nil {
		t.Fatalf("Open(an append-only file) = %v, want it opened as it is", err)
	}
	if _, err := c.Write([]byte("a line\n")); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(path); string(got) != "a line\n" {
		t.Errorf("the file holds %q, want the line written", got)
	}
}

// Only a regular file's mode is made 0600: a pipe or device given as the
// path (/dev/null) is not the logs' to restrict, and others write to it.
func TestTheModeOfAPipeIsLeftAsItIs(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pipe")
	if err := syscall.Mkfifo(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o644); err != nil { // whatever the umask
		t.Fatal(err)
	}
	reader, err := os.OpenFile(path, os.O_RDWR, 0) // so that opening it to write does not wait
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	c, err := Open(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	info, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode().Perm() != 0o644 {
		t.Errorf("the pipe's mode is %v after Open, want it left at -rw-r--r--", info.Mode().Perm())
	}
}
