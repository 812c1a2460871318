package main

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// runRSS is "loadgen rss": with --reset it clears a process's peak RSS
// (Linux clear_refs 5), else it records VmHWM, the peak resident set since
// start or the last reset, in MB.
func runRSS(_ context.Context, cfg Config, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("rss", flag.ContinueOnError)
	name := fs.String("name", "", "scenario name in the results file, e.g. rss_gateway")
	pid := fs.Int("pid", 0, "process id")
	reset := fs.Bool("reset", false, "reset the peak instead of recording it")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *pid <= 0 {
		return errUsagef("--pid is required")
	}
	proc := fmt.Sprintf("/proc/%d", *pid)
	if *reset {
		if err := os.WriteFile(proc+"/clear_refs", []byte("5"), 0); err != nil {
			return fmt.Errorf("reset peak RSS of %d: %w", *pid, err)
		}
		return nil
	}
	if *name == "" {
		return errUsagef("--name is required")
	}
	status, err := os.ReadFile(proc + "/status")
	if err != nil {
		return err
	}
	kb, err := statusField(status, "VmHWM")
	if err != nil {
		return fmt.Errorf("process %d: %w", *pid, err)
	}
	return appendRecord(cfg.Results, Record{Scenario: *name, Figures: map[string]float64{"peak_rss_mb": float64(kb) / 1024}}, stdout)
}

// statusField reads a "Name:   123 kB" line of /proc/PID/status, in kB.
func statusField(status []byte, field string) (int64, error) {
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), field+":")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("%s: unexpected %q", field, rest)
		}
		return strconv.ParseInt(f[0], 10, 64)
	}
	return 0, fmt.Errorf("%s not found", field)
}
