// Command logcap is make run's log writer: it copies its input, a binary's
// output, to a file it keeps under a size, the full one moved to NAME.1
// (pkg/cappedfile), until the input ends. Appended by the shell (>>), the
// logs of a stack left up for days filled the disk.
//
//	logcap --file .run/logs/gateway.log --max-bytes 134217728 < output
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/coinexport/export/pkg/cappedfile"
)

func main() {
	// It ends when its input does, once the binary writing it has: a
	// signal ending it first (a Ctrl-C reaching its process group) would
	// close the pipe under the binary, which SIGPIPE then ends mid-drain.
	// SIGPIPE too: told on its own stderr that lines are lost, where that
	// is a pipe whose reader is gone (a terminal's tee ended), Go's
	// runtime would end it, and the binary with it at its next line.
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGPIPE)
	if err := run(os.Args[1:], os.Stdin, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "logcap:", err)
		os.Exit(1)
	}
}

func run(args []string, stdin io.Reader, stderr io.Writer) error {
	fs := flag.NewFlagSet("logcap", flag.ContinueOnError)
	fs.SetOutput(stderr)
	file := fs.String("file", "", "the log file (its full one becomes FILE.1)")
	maxBytes := fs.Int64("max-bytes", 128<<20, "the size past which the file starts afresh (0: none)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *file == "" || fs.NArg() > 0 || *maxBytes < 0 {
		return errors.New("usage: logcap --file FILE [--max-bytes N] < input")
	}
	out, err := cappedfile.Open(*file, *maxBytes)
	if err != nil {
		// Its input is still read to the end, so that the binary writing
		// it runs on (its lines lost, as said here).
		fmt.Fprintf(stderr, "logcap: %v: the lines are lost\n", err)
		_, _ = io.Copy(io.Discard, stdin)
		return err
	}
	defer out.Close()
	return cappedfile.CopyLines(out, stdin, stderr)
}
