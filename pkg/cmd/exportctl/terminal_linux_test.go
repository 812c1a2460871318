package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

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
	var unlock int32
	var n uint32
	if err := ioctl(typist, syscall.TIOCSPTLCK, unsafe.Pointer(&unlock)); err != nil {
		t.Fatal(err)
	}
	if err := ioctl(typist, syscall.TIOCGPTN, unsafe.Pointer(&n)); err != nil {
		t.Fatal(err)
	}
	tty, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
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
	prompts, notes := io.Pipe()
	var out bytes.Buffer
	done := make(chan error, 1)
	go func() {
		done <- run(context.Background(), []string{"key", "revoke", "-"}, func(string) string { return dsn }, tty, &out, notes)
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
	if _, err := typist.WriteString(typed); err != nil {
		t.Fatal(err)
	}
	err = <-done
	// The terminal echoes what it is given as it is given it, before the
	// command can read it: the echo, if any, is there now.
	_ = typist.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	echo, _ := io.ReadAll(typist)
	return out.String(), string(echo), err
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
}

// Two lines pasted at the prompt are refused, and the second is not left
// for the shell, which would run it (a key as a command, into its history).
func TestKeyRevokeAtATerminalRefusesTwoLines(t *testing.T) {
	dsn := testenv.PostgresURL(t)
	_, key := newReadKey(t, dsn)
	typist, tty := openTerminal(t)
	_, _, err := revokeAtTerminal(t, dsn, typist, tty, key.Key+"\n"+key.Key+"\n")
	if err == nil || !strings.Contains(err.Error(), "one line") {
		t.Errorf("key revoke - at a terminal, two lines typed = %v, want them refused", err)
	}
	var left int32
	if err := ioctl(tty, syscall.TIOCINQ, unsafe.Pointer(&left)); err != nil || left != 0 {
		t.Errorf("after key revoke - refused two lines, %d bytes (%v) are left typed for the shell, want none", left, err)
	}
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
