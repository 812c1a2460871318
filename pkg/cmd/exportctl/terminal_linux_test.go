package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/coinexport/export/pkg/testenv"
)

// openTerminal opens a pseudo-terminal: what is written to typist is
// typed into tty, and what the terminal shows (its echo) is read from
// typist.
func openTerminal(t *testing.T) (typist, tty *os.File) {
	t.Helper()
	typist, err := os.OpenFile("/dev/ptmx", os.O_RDWR, 0)
	if err != nil {
		t.Skipf("no pseudo-terminal: %v", err)
	}
	t.Cleanup(func() { typist.Close() })
	var n int
	err = onFD(typist, func(fd int) error {
		if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil { // unlocked
			return err
		}
		n, err = unix.IoctlGetInt(fd, unix.TIOCGPTN)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	tty, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tty.Close() })
	return typist, tty
}

// revokeAtTerminal runs key revoke - with the terminal tty as standard
// input, types typed once its prompt is shown, and returns its stdout,
// what the terminal showed, and its error.
func revokeAtTerminal(t *testing.T, dsn string, typist, tty *os.File, typed string) (stdout, shown string, err error) {
	t.Helper()
	stdout, err = revokeAfterPrompt(t, context.Background(), dsn, tty, func() {
		if _, err := typist.WriteString(typed); err != nil {
			t.Error(err)
		}
	})
	// The terminal echoes what it is given as it is given it, before the
	// command can read it: the echo, if any, is there now.
	_ = typist.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	echo, _ := io.ReadAll(typist)
	return stdout, string(echo), err
}

// revokeAfterPrompt runs key revoke - with ctx and the terminal tty as
// standard input, calls answer once its prompt is shown, and returns its
// stdout and its error.
func revokeAfterPrompt(t *testing.T, ctx context.Context, dsn string, tty *os.File, answer func()) (stdout string, err error) {
	t.Helper()
	prompts, notes := io.Pipe()
	var out bytes.Buffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"key", "revoke", "-"}, func(string) string { return dsn }, tty, &out, notes)
		notes.Close()
	}()
	prompt := make(chan string, 1)
	go func() {
		text, _ := bufio.NewReader(prompts).ReadString(':')
		prompt <- text
		_, _ = io.Copy(io.Discard, prompts)
	}()
	select {
	case text := <-prompt:
		if !strings.Contains(text, "key") {
			t.Fatalf("key revoke - at a terminal prompted %q, want a prompt for the key", text)
		}
	case err := <-done:
		t.Fatalf("key revoke - at a terminal ended before a prompt: %v", err)
	case <-time.After(10 * time.Second): // a safeguard, not a measure: without a prompt it waits for ever
		t.Fatal("key revoke - at a terminal showed no prompt on stderr")
	}
	answer()
	select {
	case err = <-done:
	case <-time.After(10 * time.Second): // a safeguard, not a measure
		t.Fatal("key revoke - at a terminal still waits after the answer to its prompt")
	}
	return out.String(), err
}

// Ctrl-C at the prompt ends the wait, says that nothing was revoked, and
// leaves the terminal echoing again: a read of the terminal is not
// interrupted by the signal, so the command stops waiting for it.
func TestKeyRevokeAtATerminalStopsAtCtrlC(t *testing.T) {
	dsn := testenv.PostgresURL(t)
	_, tty := openTerminal(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, err := revokeAfterPrompt(t, ctx, dsn, tty, cancel)
	if want := "key revoke -: context canceled before a key was given: nothing revoked"; err == nil || err.Error() != want {
		t.Errorf("key revoke - at a terminal, Ctrl-C at the prompt = %v, want %q", err, want)
	}
	echoAndLinesBack(t, tty)
}

// Ctrl-\ at the prompt ends the wait as Ctrl-C does, the terminal echoing
// again: Go's own answer to SIGQUIT ended the process at once, its echo
// off, and the shell after it showed nothing typed.
func TestKeyRevokeAtATerminalStopsAtCtrlBackslash(t *testing.T) {
	dsn := testenv.PostgresURL(t)
	_, tty := openTerminal(t)
	// The test binary's own catch: without the command's, the signal is
	// taken here and the command waits on, which fails the test instead
	// of ending the test binary.
	quit := make(chan os.Signal, 1)
	signal.Notify(quit, syscall.SIGQUIT)
	defer signal.Stop(quit)
	_, err := revokeAfterPrompt(t, context.Background(), dsn, tty, func() {
		if err := syscall.Kill(os.Getpid(), syscall.SIGQUIT); err != nil {
			t.Fatal(err)
		}
	})
	if want := "key revoke -: context canceled before a key was given: nothing revoked"; err == nil || err.Error() != want {
		t.Errorf("key revoke - at a terminal, Ctrl-\\ at the prompt = %v, want %q", err, want)
	}
	echoAndLinesBack(t, tty)
}

// key revoke - at a terminal prompts on stderr, reads the line typed up
// to Enter (it waited silently for a Ctrl-D, which a person took for a
// hang), and does not show it: a key that still works stays off the
// screen, as it stays out of ps and the shell's history.
func TestKeyRevokeAtATerminalPrompts(t *testing.T) {
	dsn := testenv.PostgresURL(t)
	_, key := newReadKey(t, dsn)
	typist, tty := openTerminal(t)
	stdout, shown, err := revokeAtTerminal(t, dsn, typist, tty, key.Key+"\n")
	if err != nil || stdout != "revoked key "+key.ID+"\n" {
		t.Errorf("key revoke - at a terminal, the key typed = %v, printed %q; want key %s revoked", err, stdout, key.ID)
	}
	if strings.Contains(shown, key.Key[4:20]) {
		t.Errorf("key revoke - at a terminal showed the key typed: %q", shown)
	}
	echoAndLinesBack(t, tty)
}

// echoAndLinesBack fails t unless the terminal tty echoes and reads lines
// (ICANON) again, as the shell after the command wants it.
func echoAndLinesBack(t *testing.T, tty *os.File) {
	t.Helper()
	var lflag uint32
	err := onFD(tty, func(fd int) error {
		settings, err := unix.IoctlGetTermios(fd, unix.TCGETS)
		if err == nil {
			lflag = settings.Lflag
		}
		return err
	})
	if err != nil || lflag&unix.ECHO == 0 || lflag&unix.ICANON == 0 {
		t.Errorf("after key revoke -, the terminal's echo is on: %t, its lines: %t (%v); want both", lflag&unix.ECHO != 0, lflag&unix.ICANON != 0, err)
	}
}

// Two lines pasted at the prompt are refused, and the second is not left
// for the shell, which would run it (a key as a command, into its history).
func TestKeyRevokeAtATerminalRefusesTwoLines(t *testing.T) {
	dsn := testenv.PostgresURL(t)
	_, key := newReadKey(t, dsn)
	typist, tty := openTerminal(t)
	// The second line without its Enter (the last line of a paste seldom
	// has one) is a line more all the same: its key would stay unrevoked.
	for _, typed := range []string{key.Key + "\n" + key.Key + "\n", key.Key + "\n" + key.Key} {
		_, _, err := revokeAtTerminal(t, dsn, typist, tty, typed)
		if err == nil || !strings.Contains(err.Error(), "one line") {
			t.Errorf("key revoke - at a terminal, %q typed = %v, want it refused", strings.ReplaceAll(typed, key.Key, "KEY"), err)
		}
		if left := leftForTheShell(t, typist, tty); left != "" {
			t.Errorf("after key revoke - refused two lines, %q is left typed for the shell, want nothing", strings.ReplaceAll(left, key.Key, "KEY"))
		}
		echoAndLinesBack(t, tty)
	}
}

// leftForTheShell is what was typed into tty and not read: what the shell
// would read next. An Enter typed ends it, as a line not ended is not
// read, nor counted by TIOCINQ.
func leftForTheShell(t *testing.T, typist, tty *os.File) string {
	t.Helper()
	if _, err := typist.WriteString("\n"); err != nil {
		t.Fatal(err)
	}
	_ = tty.SetReadDeadline(time.Now().Add(10 * time.Second)) // a safeguard: the Enter is there in microseconds
	defer func() { _ = tty.SetReadDeadline(time.Time{}) }()
	line := make([]byte, 8192)
	n, err := tty.Read(line)
	if err != nil {
		t.Fatalf("reading the terminal after the command: %v", err)
	}
	return strings.TrimSuffix(string(line[:n]), "\n")
}

// items import --file - at a terminal says that it reads the terminal:
// it waited silently, for a file whose "<" was forgotten.
func TestItemsImportFromATerminalSaysSo(t *testing.T) {
	dsn := testenv.PostgresURL(t)
	owner := newOwner(t, dsn)
	typist, tty := openTerminal(t)
	var notes bytes.Buffer
	done := make(chan error, 1)
	go func() {
		done <- run(context.Background(), []string{"items", "import", "--owner", owner.ID, "--file", "-", "--allow-empty"},
			func(string) string { return dsn }, tty, io.Discard, &notes)
	}()
	if _, err := typist.Write([]byte{4}); err != nil { // Ctrl-D: the end of the input
		t.Fatal(err)
	}
	if err := <-done; err != nil || !strings.Contains(notes.String(), "reading JSON Lines from the terminal, up to Ctrl-D") {
		t.Errorf("items import --file - at a terminal = %v, said %q; want it to say that it reads the terminal", err, notes.String())
	}
}
