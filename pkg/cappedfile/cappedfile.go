// Package cappedfile is an append-only file that a long run cannot grow
// without bound: a write that would take it past its cap first moves it to
// NAME.1 (replacing the one there) and starts NAME afresh, so NAME and
// NAME.1 hold the newest lines, at most about twice the cap. make run
// writes its logs and spans so: left up under load for days, they filled
// the disk (about 1 GB an hour). lumberjack, the usual library for this,
// names its backups by time; make trace and make run read NAME.1.
package cappedfile

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
)

// File is the file at path, capped at max bytes. Writes are not
// synchronized: one writer at a time (its caller's lock).
type File struct {
	path string
	max  int64
	f    *os.File // nil after a rotation that failed: the next write tries again
	size int64
	// lineStart is where the line being written began: size between
	// lines, below it while a line given in parts is unfinished.
	lineStart int64
	// dropping is set once a part of a line is lost: its parts up to its
	// end are dropped too.
	dropping bool
	closed   bool
}

// Open opens path for appending (creating it), counting what it holds
// already; max at or below 0 caps nothing.
func Open(path string, max int64) (*File, error) {
	c := &File{path: path, max: max}
	if err := c.open(); err != nil {
		return nil, err
	}
	return c, nil
}

// fileMode is the files' mode: their owner's alone, as logs and spans
// hold request ids, client addresses and paths.
const fileMode = 0o600

func (c *File) open() error {
	f, err := os.OpenFile(c.path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, fileMode)
	if err != nil {
		return err
	}
	info, err := f.Stat()
	if err == nil && info.Mode().IsRegular() && info.Mode().Perm() != fileMode {
		// OpenFile leaves the mode of a file that exists as it is. Only a
		// regular file's: a device or pipe given as the path (/dev/null,
		// whose mode every user counts on) is not the logs' to restrict.
		// A file whose mode may not change (append-only, chattr +a, a
		// usual guard of logs, or on a filesystem without modes) is
		// written to as it is: refused, all its lines would be lost
		// (logcap) for the sake of a mode.
		_ = f.Chmod(fileMode)
	}
	if err != nil {
		f.Close()
		return err
	}
	c.f, c.size, c.lineStart = f, info.Size(), info.Size()
	return nil
}

// Write appends p, moving the file to NAME.1 first when p would take it
// past the cap (never an empty file: a p larger than the cap is written
// whole to a file of its own). Give it whole lines, so that each file
// begins and ends with one, or a line in parts (a p not ending in a
// newline is followed by the rest of its line): its parts stay in one
// file, which they may take past the cap. A write that fails part way is
// taken back, with the parts of its line written before it, and the parts
// of that line after it are dropped (an error each).
func (c *File) Write(p []byte) (int, error) {
	if c.closed {
		return 0, errors.New("cappedfile: " + c.path + " is closed")
	}
	if len(p) == 0 {
		return 0, nil
	}
	endsLine := p[len(p)-1] == '\n'
	if c.dropping {
		c.dropping = !endsLine
		return 0, errors.New("cappedfile: " + c.path + ": the rest of a line whose start could not be written")
	}
	n, err := c.write(p)
	if err != nil {
		c.dropping = !endsLine
		return n, err
	}
	if endsLine {
		c.lineStart = c.size
	}
	return n, nil
}

// write appends p, rotating first between lines.
func (c *File) write(p []byte) (int, error) {
	if c.f == nil {
		if err := c.open(); err != nil {
			return 0, err
		}
	}
	betweenLines := c.lineStart == c.size
	if c.max > 0 && c.size > 0 && betweenLines && c.size+int64(len(p)) > c.max {
		if err := c.rotate(); err != nil {
			return 0, err
		}
	}
	n, err := c.f.Write(p)
	if err != nil && (n > 0 || !betweenLines) && c.f.Truncate(c.lineStart) == nil {
		// Cut short (a full disk), the write left part of a line, and the
		// next line, once there was room again, went on it: two lines
		// that read as one no reader could parse. The part is taken back,
		// from the line's start.
		c.size = c.lineStart
		return 0, err
	}
	c.size += int64(n)
	return n, err
}

// rotate moves the file to NAME.1 and opens NAME anew.
func (c *File) rotate() error {
	// Dropped whatever Close says: kept after a failed Close, the closed
	// file failed every write from then on, each one rotating again.
	err := c.f.Close()
	c.f = nil
	if err != nil {
		return err
	}
	if err := os.Rename(c.path, c.path+".1"); err != nil {
		return fmt.Errorf("cappedfile: %s reached %d bytes and could not become %s.1: %w", c.path, c.max, c.path, err)
	}
	return c.open()
}

// Close closes the file.
func (c *File) Close() error {
	c.closed = true
	if c.f == nil {
		return nil
	}
	err := c.f.Close()
	c.f = nil
	return err
}

// CopyLines writes r's lines to c, each whole (a line longer than 64 KiB
// in parts, kept in one file), until r ends. A write that fails is said
// once to errs, and the lines go on being read and tried: r is a process's
// output, which must never find its pipe closed (a Go program writing to
// a pipe nobody reads ends on SIGPIPE), and a disk full for a while may
// have room again.
func CopyLines(c *File, r io.Reader, errs io.Writer) error {
	in := bufio.NewReaderSize(r, 64<<10)
	failing := false
	for {
		line, err := in.ReadSlice('\n')
		if len(line) > 0 {
			if _, werr := c.Write(line); werr != nil && !failing {
				fmt.Fprintf(errs, "%s: lines are lost: %v\n", c.path, werr)
				failing = true
			} else if werr == nil && failing {
				fmt.Fprintf(errs, "%s: written again\n", c.path)
				failing = false
			}
		}
		switch {
		case err == io.EOF:
			return nil
		case err != nil && !errors.Is(err, bufio.ErrBufferFull):
			return err
		}
	}
}
