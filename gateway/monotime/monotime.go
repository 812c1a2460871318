// Package monotime keeps a moment in an int64, for atomics, measured on the
// process's monotonic clock.
//
// A moment kept as Unix nanoseconds (time.Now().UnixNano()) and compared
// with a later one reads the wall clock twice, and the wall clock steps: an
// NTP correction or a VM resumed from a snapshot moves it by seconds or
// hours. Something marked "out until" a wall-clock instant then stays out
// for as long as the clock stepped back, or comes back at once when it
// stepped forward. An Instant is the time since the process began, read
// from the monotonic reading time.Now carries, which no step moves.
package monotime

import "time"

// start anchors every Instant. time.Now's monotonic reading is what makes
// the durations measured from it immune to steps of the wall clock.
var start = time.Now()

// Instant is a moment as nanoseconds since the process began, on the
// monotonic clock. Instants are compared with each other only, never with
// Unix times.
type Instant int64

// Now is the Instant now.
func Now() Instant { return Instant(time.Since(start)) }

// Of returns the Instant of t: measured on the monotonic clock when t has a
// monotonic reading (time.Now's has), on the wall clock otherwise (a time
// built from a date, as a test's clock makes).
func Of(t time.Time) Instant { return Instant(t.Sub(start)) }

// Add returns i moved by d.
func (i Instant) Add(d time.Duration) Instant { return i + Instant(d) }

// Time returns i as a time.Time that carries a monotonic reading, so that
// comparing it with time.Now's compares on the monotonic clock. Its wall
// reading (for display) is the wall clock's at the process's start plus
// the time elapsed since, which differs from the wall clock by any step
// since the start.
func (i Instant) Time() time.Time { return start.Add(time.Duration(i)) }
