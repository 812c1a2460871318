package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"strings"
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

// throughputFigures are the figures "best" is judged by, in order.
var throughputFigures = []string{"rps", "pairs_per_s", "items_per_s"}

// bestOfRounds folds records named "NAME#ROUND" into NAME, keeping the round
// with the highest throughput. The bench interleaves rounds of the scenarios
// it compares (nginx, gateway, gateway without limits), so a slow spell of
// the shared machine hits each of them alike, and the best round of each is
// the least disturbed one. The folded record also keeps the worst round's
// throughput ("worst_round"), so the table can show how far the rounds were
// apart, and the failed requests of all rounds ("errors"), so that none is
// hidden by keeping a clean round.
func bestOfRounds(rs map[string]Record) map[string]Record {
	out := map[string]Record{}
	rounds := map[string]int{}
	worst := map[string]float64{}
	errs := map[string]float64{}
	for name, r := range rs {
		base, _, isRound := strings.Cut(name, "#")
		if !isRound {
			if _, seen := rounds[base]; !seen {
				out[name] = r
			}
			continue
		}
		rounds[base]++
		if w, ok := worst[base]; !ok || throughput(r) < w {
			worst[base] = throughput(r)
		}
		if n, ok := r.Figures["errors"]; ok {
			errs[base] += n
		}
		if best, ok := out[base]; !ok || rounds[base] == 1 || throughput(r) > throughput(best) {
			r.Scenario = base
			r.Figures = maps.Clone(r.Figures) // "rounds" is added below
			out[base] = r
		}
	}
	for base, n := range rounds {
		out[base].Figures["rounds"] = float64(n)
		out[base].Figures["worst_round"] = worst[base]
		if n, ok := errs[base]; ok {
			out[base].Figures["errors"] = n
		}
	}
	return out
}

func throughput(r Record) float64 {
	for _, f := range throughputFigures {
		if v, ok := r.Figures[f]; ok {
			return v
		}
	}
	return 0
}
