package main

import (
	"context"
	"time"
)

// Open-loop pacing for "loadgen neighbours": the i-th request of a kind is
// due at start + i/rate whatever became of the ones before it, so a slow
// answer never slows the schedule (a closed loop, which waits for each
// answer before the next request, measures less load exactly when the
// stack is slow, and hides the wait it is meant to show). A request sent
// more than a tolerance after its due time is counted late: the figure says
// how far the load generator itself, on a shared machine, kept to the plan.

// clock is the time the pacer reads and waits on; tests give it a fake one.
type clock interface {
	Now() time.Time
	// SleepUntil returns at t or later, or when ctx is done.
	SleepUntil(ctx context.Context, t time.Time)
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) SleepUntil(ctx context.Context, t time.Time) {
	d := time.Until(t)
	if d <= 0 {
		return
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
	case <-timer.C:
	}
}

// dueAfter is when the i-th request of a kind paced at rate a second is due,
// counted from the start.
func dueAfter(i int, rate float64) time.Duration {
	return time.Duration(float64(i) * float64(time.Second) / rate)
}

// plannedIn is how many requests paced at rate a second fall due within d
// (those due at 0, 1/rate, … before d).
func plannedIn(rate float64, d time.Duration) int {
	if rate <= 0 || d <= 0 {
		return 0
	}
	n := int(d.Seconds() * rate)
	for dueAfter(n, rate) < d {
		n++
	}
	for n > 0 && dueAfter(n-1, rate) >= d {
		n--
	}
	return n
}

// pacing is what a pacer did: requests sent, how many of them went out
// more than the tolerance after their due time, and the latest of them.
type pacing struct {
	Sent, Late int
	MaxLag     time.Duration
}

// pace calls send(i) for every request of rate a second due within d of
// start, each at its due time, without waiting for send to return (send
// starts the request and returns; its answer is its own business). It
// stops early when ctx is done.
func pace(ctx context.Context, clk clock, start time.Time, rate float64, d, tolerance time.Duration, send func(i int)) pacing {
	var p pacing
	for i := range plannedIn(rate, d) {
		due := start.Add(dueAfter(i, rate))
		clk.SleepUntil(ctx, due)
		if ctx.Err() != nil {
			break
		}
		if lag := clk.Now().Sub(due); lag > tolerance {
			p.Late++
			p.MaxLag = max(p.MaxLag, lag)
		}
		p.Sent++
		send(i)
	}
	return p
}
