//go:build !linux

package main

import "os"

// isTerminal is false off Linux: key revoke - reads standard input to its
// end there, without a prompt, and items import --file - says nothing.
func isTerminal(*os.File) bool { return false }

func withoutEcho(*os.File) (func(), error) { return func() {}, nil }

func discardTyped(*os.File) bool { return false }
