// Package e2e holds black-box tests of the whole stack: the real gateway and
// service binaries, built from this workspace and started as processes
// against real PostgreSQL and Redis, exporting their spans to an in-process
// OTLP receiver.
package e2e
