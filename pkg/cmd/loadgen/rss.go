package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/prometheus/procfs"
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
	p, err := procfs.NewProc(*pid)
	if err != nil {
		return err
	}
	status, err := p.NewStatus()
	if err != nil {
		return fmt.Errorf("process %d: %w", *pid, err)
	}
	peakMB := float64(status.VmHWM) / (1 << 20) // VmHWM is in bytes
	return appendRecord(cfg.Results, Record{Scenario: *name, Figures: map[string]float64{"peak_rss_mb": peakMB}}, stdout)
}
