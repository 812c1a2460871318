package main

import (
	"math"
	"slices"
	"time"
)

// Latencies collects request durations. The counts here are small (tens of
// thousands per run), so it keeps every sample and sorts once, which gives
// exact percentiles instead of a histogram's bucket bounds.
type Latencies struct {
	samples []time.Duration
	sorted  bool
}

// Add records one duration.
func (l *Latencies) Add(d time.Duration) {
	l.samples = append(l.samples, d)
	l.sorted = false
}

// Merge adds every sample of o.
func (l *Latencies) Merge(o *Latencies) {
	l.samples = append(l.samples, o.samples...)
	l.sorted = false
}

// Count is the number of samples.
func (l *Latencies) Count() int { return len(l.samples) }

// Percentile returns the nearest-rank p-th percentile (0 < p <= 100): the
// smallest sample that at least p% of the samples are less than or equal
// to. It returns 0 without samples.
func (l *Latencies) Percentile(p float64) time.Duration {
	if len(l.samples) == 0 {
		return 0
	}
	if !l.sorted {
		slices.Sort(l.samples)
		l.sorted = true
	}
	rank := int(math.Ceil(p / 100 * float64(len(l.samples))))
	rank = min(max(rank, 1), len(l.samples))
	return l.samples[rank-1]
}

// ms converts a duration to float milliseconds for the results file.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
