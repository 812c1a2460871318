package schema

import "time"

// SetLockWait makes a migration wait at most d for another run, until the
// test ends.
func SetLockWait(t interface{ Cleanup(func()) }, d time.Duration) {
	before := lockWait
	lockWait = d
	t.Cleanup(func() { lockWait = before })
}

// SetSessionWait makes a migration wait at most d for a database session,
// until the test ends.
func SetSessionWait(t interface{ Cleanup(func()) }, d time.Duration) {
	before := sessionWait
	sessionWait = d
	t.Cleanup(func() { sessionWait = before })
}

// MigrationDB is the database/sql handle the migrations run on.
var MigrationDB = migrationDB
