package main

import (
	"context"
	"testing"
	"time"
)

// fakeClock advances only when slept on; a sleep until stallAt returns
// stall after it, as a machine too busy to wake the pacer on time would.
type fakeClock struct {
	now            time.Time
	stallAt        time.Time
	stall          time.Duration
	sleepsUntilDue int
}

func (c *fakeClock) Now() time.Time { return c.now }

func (c *fakeClock) SleepUntil(_ context.Context, t time.Time) {
	if !c.now.Before(t) {
		return
	}
	c.sleepsUntilDue++
	c.now = t
	if t.Equal(c.stallAt) {
		c.now = t.Add(c.stall)
	}
}

func TestPlannedIn(t *testing.T) {
	for _, c := range []struct {
		rate float64
		d    time.Duration
		want int
	}{
		{40, 15 * time.Second, 600},
		{5, 15 * time.Second, 75},
		{2, 15 * time.Second, 30},
		{3, time.Second, 3},
		{0.5, 3 * time.Second, 2}, // at 0 and 2 s
		{0.5, 2 * time.Second, 1}, // the one due at 2 s is not within 2 s
		{7, 1500 * time.Millisecond, 11},
		{0, time.Minute, 0},
		{10, 0, 0},
	} {
		if got := plannedIn(c.rate, c.d); got != c.want {
			t.Errorf("plannedIn(%v, %s) = %d, want %d", c.rate, c.d, got, c.want)
		}
	}
}

// The schedule is open loop: a stall delays the requests due during it,
// which then go out at once and are counted late, and the ones after it
// keep their own due times (a pacer that waited an interval after each
// send would have sent the 7th at 850 ms, and counted nothing late).
func TestPaceKeepsTheScheduleThroughAStallAndCountsTheLateOnes(t *testing.T) {
	start := time.Unix(1000, 0)
	clk := &fakeClock{now: start, stallAt: start.Add(300 * time.Millisecond), stall: 250 * time.Millisecond}
	var sentAt []time.Duration
	p := pace(context.Background(), clk, start, 10, time.Second, 10*time.Millisecond, func(i int) {
		if i != len(sentAt) {
			t.Fatalf("send(%d) after %d sends, want them in order", i, len(sentAt))
		}
		sentAt = append(sentAt, clk.Now().Sub(start))
	})
	want := []time.Duration{0, 100, 200, 550, 550, 550, 600, 700, 800, 900}
	if len(sentAt) != len(want) {
		t.Fatalf("sent %d requests at %v, want %d", len(sentAt), sentAt, len(want))
	}
	for i := range want {
		if sentAt[i] != want[i]*time.Millisecond {
			t.Errorf("request %d sent at %s, want %s (sent at %v)", i, sentAt[i], want[i]*time.Millisecond, sentAt)
		}
	}
	if p.Sent != 10 || p.Late != 3 || p.MaxLag != 250*time.Millisecond {
		t.Errorf("pacing = %+v, want 10 sent, 3 late (due at 300, 400, 500 ms), latest by 250ms", p)
	}
}

func TestPaceCountsNothingLateWithinTheTolerance(t *testing.T) {
	start := time.Unix(1000, 0)
	clk := &fakeClock{now: start, stallAt: start.Add(200 * time.Millisecond), stall: 10 * time.Millisecond}
	p := pace(context.Background(), clk, start, 10, time.Second, 10*time.Millisecond, func(int) {})
	if p.Sent != 10 || p.Late != 0 {
		t.Errorf("pacing = %+v, want 10 sent, none late (10 ms is within the tolerance)", p)
	}
}

func TestPaceStopsWhenTheRunIsCanceled(t *testing.T) {
	start := time.Unix(1000, 0)
	ctx, cancel := context.WithCancel(context.Background())
	clk := &fakeClock{now: start}
	p := pace(ctx, clk, start, 10, time.Second, 0, func(i int) {
		if i == 3 {
			cancel()
		}
	})
	if p.Sent != 4 {
		t.Errorf("sent %d, want 4 (the run was canceled at the 4th)", p.Sent)
	}
}
