package main

import (
	"errors"
	"fmt"
	"strings"
)

// Config is what every scenario may need from the environment. Which fields
// a scenario needs is checked by the scenario (need*), so "report" runs with
// none of them set.
type Config struct {
	DatabaseURL    string   // DATABASE_URL: the stack's database (baselines, id sampling, changes)
	IdentitySecret string   // IDENTITY_SECRET: signs identity headers for calls that bypass the gateway
	OwnerID        string   // LOADGEN_OWNER_ID: the owner whose items are read
	ReadKey        string   // LOADGEN_READ_KEY: an export:read API key of that owner
	ReadKeyID      string   // LOADGEN_READ_KEY_ID: its id, put in signed identities (default "bench")
	WriteKeys      []string // LOADGEN_WRITE_KEYS: comma-separated sales:write keys, one platform each
	Results        string   // LOADGEN_RESULTS: the JSON Lines results file (default results.jsonl)

	// The flooding owner of "loadgen neighbours" (owner A; the owner above is B).
	FloodOwnerID   string   // LOADGEN_FLOOD_OWNER_ID: its owner id (its items are sold)
	FloodReadKeys  []string // LOADGEN_FLOOD_READ_KEYS: comma-separated export:read keys of it
	FloodWriteKeys []string // LOADGEN_FLOOD_WRITE_KEYS: comma-separated sales:write keys of it
}

// LoadConfig reads the environment. Defaults sit beside each field.
func LoadConfig(getenv func(string) string) (Config, error) {
	cfg := Config{
		DatabaseURL:    getenv("DATABASE_URL"),
		IdentitySecret: getenv("IDENTITY_SECRET"),
		OwnerID:        getenv("LOADGEN_OWNER_ID"),
		ReadKey:        getenv("LOADGEN_READ_KEY"),
		ReadKeyID:      orDefault(getenv("LOADGEN_READ_KEY_ID"), "bench"),
		Results:        orDefault(getenv("LOADGEN_RESULTS"), "results.jsonl"),
		FloodOwnerID:   getenv("LOADGEN_FLOOD_OWNER_ID"),
		WriteKeys:      keyList(getenv("LOADGEN_WRITE_KEYS")),
		FloodReadKeys:  keyList(getenv("LOADGEN_FLOOD_READ_KEYS")),
		FloodWriteKeys: keyList(getenv("LOADGEN_FLOOD_WRITE_KEYS")),
	}
	if cfg.IdentitySecret != "" && len(cfg.IdentitySecret) < 32 {
		return Config{}, errors.New("IDENTITY_SECRET must be at least 32 bytes")
	}
	return cfg, nil
}

// need reports the first of the named settings that is empty; the error
// names the variable, never its value.
func (c Config) need(names ...string) error {
	values := map[string]bool{
		"DATABASE_URL":       c.DatabaseURL != "",
		"IDENTITY_SECRET":    c.IdentitySecret != "",
		"LOADGEN_OWNER_ID":   c.OwnerID != "",
		"LOADGEN_READ_KEY":   c.ReadKey != "",
		"LOADGEN_WRITE_KEYS": len(c.WriteKeys) > 0,

		"LOADGEN_FLOOD_OWNER_ID":   c.FloodOwnerID != "",
		"LOADGEN_FLOOD_READ_KEYS":  len(c.FloodReadKeys) > 0,
		"LOADGEN_FLOOD_WRITE_KEYS": len(c.FloodWriteKeys) > 0,
	}
	for _, n := range names {
		if !values[n] {
			return fmt.Errorf("%s is not set", n)
		}
	}
	return nil
}

// keyList splits a comma-separated list of keys, blanks left out.
func keyList(v string) []string {
	var keys []string
	for _, k := range strings.Split(v, ",") {
		if k = strings.TrimSpace(k); k != "" {
			keys = append(keys, k)
		}
	}
	return keys
}

func orDefault(v, def string) string {
	if v == "" {
		return def
	}
	return v
}
