package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestMain runs logcap's main when a test starts this binary as logcap.
func TestMain(m *testing.M) {
	if os.Getenv("LOGCAP_TEST_RUN_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

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

// logcap whose stderr is a pipe nobody reads any more, told there that its
// lines are lost (its file cannot be opened), still reads its input to the
// end and exits 1: ended by SIGPIPE at that word, it would close the pipe
// under the binary writing it, which its next line then ends.
func TestAClosedStderrDoesNotEndIt(t *testing.T) {
	gone, stderr, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	gone.Close()
	defer stderr.Close()
	cmd := exec.Command(os.Args[0], "--file", filepath.Join(t.TempDir(), "gone", "gateway.log"))
	cmd.Env = append(os.Environ(), "LOGCAP_TEST_RUN_MAIN=1")
	cmd.Stdin = strings.NewReader(strings.Repeat("a line\n", 100_000))
	cmd.Stderr = stderr
	err = cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Errorf("logcap with its stderr closed ended with %v (%v), want exit status 1 after reading its input", err, cmd.ProcessState)
	}
}
