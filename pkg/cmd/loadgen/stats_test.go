package main

import (
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	var hundred Latencies
	for i := 100; i >= 1; i-- { // added out of order on purpose
		hundred.Add(time.Duration(i) * time.Millisecond)
	}
	var one Latencies
	one.Add(7 * time.Millisecond)
	tests := []struct {
		name string
		l    *Latencies
		p    float64
		want time.Duration
	}{
		{"p50 of 1..100", &hundred, 50, 50 * time.Millisecond},
		{"p99 of 1..100", &hundred, 99, 99 * time.Millisecond},
		{"p100 of 1..100", &hundred, 100, 100 * time.Millisecond},
		{"p0.1 of 1..100", &hundred, 0.1, 1 * time.Millisecond},
		{"p99 of one sample", &one, 99, 7 * time.Millisecond},
		{"p50 of none", &Latencies{}, 50, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.l.Percentile(tt.p); got != tt.want {
				t.Errorf("Percentile(%v) = %v, want %v", tt.p, got, tt.want)
			}
		})
	}
}

func TestMergeThenPercentile(t *testing.T) {
	var a, b Latencies
	for i := 1; i <= 50; i++ {
		a.Add(time.Duration(2*i) * time.Millisecond)   // even
		b.Add(time.Duration(2*i-1) * time.Millisecond) // odd
	}
	_ = a.Percentile(50) // sorts a; the merge must re-sort
	a.Merge(&b)
	if got, want := a.Count(), 100; got != want {
		t.Fatalf("Count() = %d, want %d", got, want)
	}
	if got, want := a.Percentile(90), 90*time.Millisecond; got != want {
		t.Errorf("Percentile(90) = %v, want %v", got, want)
	}
}
