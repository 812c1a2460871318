package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// logcap keeps its file under --max-bytes, the full one as FILE.1, and
// refuses a call without a file.
func TestRunCapsTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gateway.log")
	input := strings.Repeat(`{"level":"INFO","msg":"request"}`+"\n", 100) // 33 bytes a line
	if err := run([]string{"--file", path, "--max-bytes", "330"}, strings.NewReader(input), &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	for _, file := range []string{path, path + ".1"} {
		info, err := os.Stat(file)
		if err != nil || info.Size() != 330 {
			t.Errorf("%s: %v, %d bytes; want 10 lines, 330 bytes", file, err, info.Size())
		}
	}
	for _, args := range [][]string{nil, {"--max-bytes", "10"}, {"--file", path, "extra"}, {"--file", path, "--max-bytes", "-1"}} {
		if err := run(args, strings.NewReader(""), &bytes.Buffer{}); err == nil {
			t.Errorf("run(%q) = nil, want a usage error", args)
		}
	}
}

// A file that cannot be opened (its folder gone) still has its input read
// to the end: the binary writing it must not find the pipe closed.
func TestRunReadsItsInputWhenTheFileCannotBeOpened(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gone", "gateway.log")
	input := strings.NewReader(strings.Repeat("a line\n", 1000))
	var stderr bytes.Buffer
	if err := run([]string{"--file", path}, input, &stderr); err == nil {
		t.Error("run with a file that cannot be opened = nil, want its error")
	}
	if input.Len() != 0 {
		t.Errorf("run left %d bytes of its input unread", input.Len())
	}
	if !strings.Contains(stderr.String(), "the lines are lost") {
		t.Errorf("stderr = %q, want it to say the lines are lost", stderr.String())
	}
}
