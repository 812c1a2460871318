package schema

import "time"

// SetLockWait makes a migration wait at most d for another run, until the
// test ends.
func SetLockWait(t interface{ Cleanup(func()) }, d time.Duration) {
	before := lockWait
	lockWait = d
	t.Cleanup(func() { lockWait = before })
}
