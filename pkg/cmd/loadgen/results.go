package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"
)

// Record is one scenario's outcome, one line of the results file.
type Record struct {
	Scenario string             `json:"scenario"`
	Figures  map[string]float64 `json:"figures"`
	Note     string             `json:"note,omitempty"`
	At       time.Time          `json:"at"`
}

// appendRecord adds r to the results file and prints it for the bench log.
func appendRecord(path string, r Record, stdout io.Writer) error {
	r.At = time.Now().UTC()
	line, err := json.Marshal(r)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("results: %w", err)
	}
	if _, err := f.Write(append(line, '\n')); err != nil {
		f.Close()
		return fmt.Errorf("results: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("results: %w", err)
	}
	_, err = fmt.Fprintf(stdout, "%s %s\n", r.Scenario, line)
	return err
}

// readRecords reads a results file. A scenario recorded twice keeps its last
// record, so a rerun of one step replaces the earlier figure.
func readRecords(r io.Reader) (map[string]Record, error) {
	out := map[string]Record{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		if len(sc.Bytes()) == 0 {
			continue
		}
		var rec Record
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			return nil, fmt.Errorf("results line %d: %w", n, err)
		}
		out[rec.Scenario] = rec
	}
	return out, sc.Err()
}
