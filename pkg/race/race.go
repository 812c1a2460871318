//go:build race

package race

// Enabled: this binary was built with -race.
const Enabled = true
