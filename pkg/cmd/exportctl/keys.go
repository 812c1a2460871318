package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/coinexport/export/pkg/apikey"
	"github.com/coinexport/export/pkg/identity"
	"github.com/coinexport/export/pkg/postgres"
)

// createdKey is printed once: it is the only place the secret ever appears.
type createdKey struct {
	ID         string   `json:"id"`
	Key        string   `json:"key"`
	Prefix     string   `json:"prefix"`
	OwnerID    string   `json:"owner_id"`
	PlatformID *string  `json:"platform_id"`
	Scopes     []string `json:"scopes"`
}

// listedKey never holds the secret.
type listedKey struct {
	ID         string     `json:"id"`
	Prefix     string     `json:"prefix"`
	Name       string     `json:"name"`
	OwnerID    string     `json:"owner_id"`
	PlatformID *string    `json:"platform_id"`
	Scopes     []string   `json:"scopes"`
	CreatedAt  time.Time  `json:"created_at"`
	RevokedAt  *time.Time `json:"revoked_at"`
}

func keyCreate(ctx context.Context, e *env, args []string) error {
	fs := flag.NewFlagSet("key create", flag.ContinueOnError)
	owner := fs.String("owner", "", "owner id")
	scopeList := fs.String("scope", "", "export:read and/or sales:write, comma-separated")
	platform := fs.String("platform", "", "platform id (required for sales:write)")
	name := fs.String("name", "", "a label for the key")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := flagsOnly(fs, args); err != nil {
		return err
	}
	if err := required(fs, "owner", "scope"); err != nil {
		return err
	}
	if err := refuseKeys(fs, "name"); err != nil {
		return err
	}
	scopes, err := parseScopes(*scopeList)
	if err != nil {
		return err
	}
	switch sales := slices.Contains(scopes, identity.ScopeSalesWrite); {
	case sales && *platform == "":
		return fmt.Errorf("%w: a sales:write key is bound to one platform: --platform is required", errUsage)
	case !sales && *platform != "":
		// Accepted, it would bind a read key to a platform that no read
		// route looks at: a mistake for a sales key, most likely.
		return fmt.Errorf("%w: --platform binds a sales:write key; an export:read key is bound to its owner only", errUsage)
	}
	if err := ownerExists(ctx, e, *owner); err != nil {
		return err
	}
	secret, prefix, err := apikey.Generate(scopes)
	if err != nil {
		return err
	}
	hash := apikey.HashOf(secret)
	k := createdKey{Key: secret, Prefix: prefix, OwnerID: *owner, Scopes: scopes}
	if *platform != "" {
		k.PlatformID = platform
	}
	err = e.pool.QueryRow(ctx, `
		INSERT INTO api_keys (owner_id, platform_id, name, prefix, hash, scopes)
		VALUES ($1, $2, $3, $4, $5, $6) RETURNING id::text`,
		*owner, k.PlatformID, *name, prefix, hash[:], scopes).Scan(&k.ID)
	if err != nil {
		return fmt.Errorf("create key: %w", keyCreateError(err, *owner, *platform))
	}
	// A pipe whose reader has gone must fail the write, as a full disk
	// does: by default Go ends a process writing to one on its stdout with
	// SIGPIPE, before unprintedKey could revoke the key.
	signal.Ignore(syscall.SIGPIPE)
	err = emit(e.out, *asJSON, k, fmt.Sprintf("key %s (%s)\n%s\nThis secret is shown once: store it now.", k.ID, strings.Join(scopes, ","), secret))
	if err != nil {
		return unprintedKey(ctx, e, k.ID, err)
	}
	return nil
}

// unprintedKey revokes a key whose secret could not be printed (a full
// disk, a closed pipe): nobody holds the secret, and the key stayed
// active, with the write's error alone to tell why.
func unprintedKey(ctx context.Context, e *env, id string, printErr error) error {
	// Not stopped by Ctrl-C: an interrupted pipeline fails the print and
	// the command at once, and the key would stay active.
	// Bounded all the same: a database that stopped answering, or a lock
	// on the row, held the command, and the operator with it, without a word.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unprintedRevokeWait)
	defer cancel()
	if _, err := revoke(ctx, e, "id = $1::uuid", id); err != nil {
		return fmt.Errorf("key %s was made, but its secret could not be printed (%w), nor the key revoked (%w): revoke it (exportctl key revoke %s)",
			id, printErr, err, id)
	}
	return fmt.Errorf("key %s was made, but its secret could not be printed (%w): revoked it; run key create again", id, printErr)
}

// keyCreateError names the owner or platform that does not exist instead
// of the foreign key that says so.
func keyCreateError(err error, owner, platform string) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23503" { // foreign_key_violation
		return err
	}
	switch pgErr.ConstraintName {
	case "api_keys_owner_id_fkey":
		return fmt.Errorf("no owner with id %q (exportctl owner create makes one)", owner)
	case "api_keys_platform_id_fkey":
		return fmt.Errorf("no platform with id %q (exportctl platform create --id %s makes it)", platform, platform)
	}
	return err
}

func parseScopes(list string) ([]string, error) {
	var scopes []string
	for _, s := range strings.Split(list, ",") {
		s = strings.TrimSpace(s)
		if s != identity.ScopeExportRead && s != identity.ScopeSalesWrite {
			return nil, fmt.Errorf("%w: unknown scope %q (want export:read or sales:write)", errUsage, s)
		}
		if !slices.Contains(scopes, s) {
			scopes = append(scopes, s)
		}
	}
	slices.Sort(scopes)
	return scopes, nil
}

// keyRevoke revokes a key named by its id or by the key itself: a leaked
// key is what an administrator has in hand, and its owner is not written
// on it. The key is looked up by its hash and never printed.
func keyRevoke(ctx context.Context, e *env, args []string) error {
	fs := flag.NewFlagSet("key revoke", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print JSON")
	positional, err := flags(fs, args)
	if err != nil {
		return err
	}
	if len(positional) != 1 {
		return fmt.Errorf("%w: key revoke takes one KEY_ID (or the key itself, or - to read it from standard input)", errUsage)
	}
	arg := positional[0]
	if arg == "-" {
		if arg, err = stdinArgument(ctx, e); err != nil {
			return err
		}
	}
	where, param, notFound, err := revokeTarget(arg)
	if err != nil {
		return err
	}
	r, err := revoke(ctx, e, where, param)
	if errors.Is(err, pgx.ErrNoRows) {
		return errors.New(notFound + idMixUp(ctx, e, strings.TrimSpace(arg)))
	}
	if err != nil {
		return fmt.Errorf("revoke key: %w", err)
	}
	text := "revoked key " + r.ID
	if r.Already {
		text = "key " + r.ID + " was revoked already, at " + r.RevokedAt.Format(time.RFC3339)
	}
	return emit(e.out, *asJSON, r, text)
}

// revoked is what key revoke did, as --json prints it.
type revoked struct {
	ID        string    `json:"id"`
	RevokedAt time.Time `json:"revoked_at"`
	Already   bool      `json:"already_revoked"`
}

// revokeLockWait bounds a revoke's wait for a lock on the key's row (or on
// api_keys): behind an operator's SELECT … FOR UPDATE left open, or a
// migration, key revoke waited without end and without a word, the key
// working all the while. A lock_timeout in DATABASE_URL does not change it.
const revokeLockWait = 5 * time.Second

// unprintedRevokeWait bounds the whole revoke of a key whose secret could
// not be printed, which Ctrl-C does not stop.
const unprintedRevokeWait = 15 * time.Second

// revoke revokes the key that where (a condition on api_keys, param its
// $1) finds, waiting at most revokeLockWait for a lock. COALESCE keeps the
// first revocation time when a key is revoked twice; a time other than
// this statement's now() is that earlier one. No such key is
// pgx.ErrNoRows.
func revoke(ctx context.Context, e *env, where string, param any) (revoked, error) {
	var r revoked
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		// SET LOCAL, before the UPDATE takes its table's lock: the bound
		// covers that one too, and ends with the transaction.
		if _, err := tx.Exec(ctx, "SELECT set_config('lock_timeout', $1, true)", revokeLockWait.String()); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `
			UPDATE api_keys SET revoked_at = COALESCE(revoked_at, now())
			WHERE `+where+` RETURNING id::text, revoked_at, revoked_at <> now()`, param).Scan(&r.ID, &r.RevokedAt, &r.Already)
	})
	if postgres.LockTimedOut(err) {
		return r, fmt.Errorf("%w: the key stayed locked by another transaction for over %s, nothing revoked (%s); "+
			"once that transaction has ended (or its session: SELECT pg_terminate_backend(pid)), run key revoke again",
			err, revokeLockWait, postgres.OldTransactions(ctx, e.pool, revokeLockWait))
	}
	r.RevokedAt = r.RevokedAt.UTC() // pgx gives the host's zone
	return r, err
}

// oneLine reads key revoke -'s argument: the one line of stdin, to its end (a key
// pasted, Enter, then Ctrl-D), which keeps a key that is still valid out of ps
// and the shell's history. More than one line is refused, not read as its
// first: another key after it would stay unrevoked.
func oneLine(stdin io.Reader) (string, error) {
	const max = 4096 // far more than a key or an id with spaces around it
	text, err := io.ReadAll(io.LimitReader(stdin, max+1))
	if err != nil {
		return "", fmt.Errorf("key revoke -: reading standard input: %w", err)
	}
	line := strings.TrimSpace(string(text))
	if line == "" || strings.ContainsAny(line, "\r\n") || len(text) > max {
		return "", errNotOneLine
	}
	return line, nil
}

// oneLineUnlessStopped is oneLine, or the stop (Ctrl-C) that came first: a
// pipe whose writer keeps it open (a script that waits) held the revoke
// past Ctrl-C for as long. The read is left to the process's exit.
func oneLineUnlessStopped(ctx context.Context, stdin io.Reader) (string, error) {
	type read struct {
		line string
		err  error
	}
	done := make(chan read, 1)
	go func() {
		line, err := oneLine(stdin)
		done <- read{line, err}
	}()
	select {
	case <-ctx.Done():
		return "", fmt.Errorf("key revoke -: interrupted (%w) before standard input ended: nothing revoked", ctx.Err())
	case r := <-done:
		return r.line, r.err
	}
}

var errNotOneLine = fmt.Errorf("%w: key revoke - reads one line from standard input: one key id, or one key", errUsage)

// stdinArgument is key revoke -'s argument: at a terminal, the line typed
// after a prompt on stderr, up to Enter and not shown (a person met a
// silent wait for Ctrl-D, and a key that still works stayed on the
// screen); from a pipe or a file, oneLine.
func stdinArgument(ctx context.Context, e *env) (string, error) {
	tty, ok := e.stdin.(*os.File)
	if !ok || !isTerminal(tty) {
		return oneLineUnlessStopped(ctx, e.stdin)
	}
	// Ctrl-\ (SIGQUIT) ends the wait as Ctrl-C does: Go's own answer to
	// it ends the process at once, its echo still off, and the shell after
	// it showed nothing typed. Caught before the echo goes off and until
	// it is on again (deferred calls run last first).
	ctx, stopQuit := signal.NotifyContext(ctx, syscall.SIGQUIT)
	defer stopQuit()
	restore, err := withoutEcho(tty)
	if err != nil {
		return "", fmt.Errorf("key revoke -: the terminal: %w", err)
	}
	defer restore()
	fmt.Fprint(e.notes, "Key or key id to revoke (not shown; Enter ends it): ")
	defer fmt.Fprintln(e.notes) // the Enter, not echoed
	// A terminal's read returns one line. Ctrl-C or Ctrl-\ (ctx) ends the
	// wait, the echo turned on again first: a read is not interrupted by a
	// signal.
	typed := make(chan []byte, 1)
	go func() {
		line := make([]byte, 4096) // a terminal's longest line
		n, _ := tty.Read(line)
		typed <- line[:n]
	}()
	select {
	case <-ctx.Done():
		return "", fmt.Errorf("key revoke -: %w before a key was given: nothing revoked", ctx.Err())
	case line := <-typed:
		if discardTyped(tty) { // a line more: refused as from a pipe
			return "", errNotOneLine
		}
		return oneLine(bytes.NewReader(line))
	}
}

// keyPrefix is a key's prefix as key create and key list print it (with
// or without the ellipsis after it): no key's whole, nor its id.
var keyPrefix = regexp.MustCompile(`^cx[raw]_[0-9A-Za-z]{8}(…|\.\.\.)?$`)

// revokeTarget reads key revoke's argument: a key's id (in either case)
// or a key, and the statement's condition on it. Anything else is named
// for what it is, not looked for as "a key with id", which no key has: a
// key mistyped or cut short (not quoted: most of a secret), its prefix
// from key list, a word that is neither.
func revokeTarget(arg string) (where string, param any, notFound string, err error) {
	// A key pasted with a space or a line end around it is still the key,
	// and one without its tag (cut at its '_') too: its checksum names
	// the tag, and it is the whole secret, to be revoked as the key.
	arg = strings.TrimSpace(arg)
	if key, ok := apikey.RestoreTag(arg); ok {
		arg = key
	}
	switch {
	case isUUID(arg): // a key's id
		return "id = $1::uuid", arg, fmt.Sprintf("no key with id %q", arg), nil
	case apikey.WellFormed(arg):
		hash := apikey.HashOf(arg)
		return "hash = $1", hash[:], "no such key (it was never issued here)", nil
	case apikey.ContainsKeyLike(arg):
		return "", nil, "", fmt.Errorf("%w: key revoke's argument looks like a key, but its checksum does not match "+
			"(a character mistyped, or the key cut short): nothing revoked", errUsage)
	case keyPrefix.MatchString(arg):
		return "", nil, "", fmt.Errorf("%w: %q is a key's prefix, as key list prints it: give the key's id (key list's first column) or the whole key",
			errUsage, arg)
	}
	return "", nil, "", fmt.Errorf("%w: %q is neither a key id (a UUID) nor a key", errUsage, arg)
}

func keyList(ctx context.Context, e *env, args []string) error {
	fs := flag.NewFlagSet("key list", flag.ContinueOnError)
	owner := fs.String("owner", "", "owner id")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := flagsOnly(fs, args); err != nil {
		return err
	}
	if err := required(fs, "owner"); err != nil {
		return err
	}
	if err := ownerExists(ctx, e, *owner); err != nil {
		return err
	}
	keys, err := ownerKeys(ctx, e, *owner)
	if err != nil {
		return fmt.Errorf("list keys: %w", err)
	}
	if *asJSON {
		return emit(e.out, true, keys, "")
	}
	if len(keys) == 0 {
		e.note("owner " + *owner + " has no keys (key create makes one)")
		return nil
	}
	return printKeys(e.out, keys)
}

// ownerKeys is the owner's keys, oldest first ([] for none: printed as
// JSON, an empty list, not null).
func ownerKeys(ctx context.Context, e *env, owner string) ([]listedKey, error) {
	rows, err := e.pool.Query(ctx, `
		SELECT id::text, prefix, name, owner_id::text, platform_id, scopes, created_at, revoked_at
		FROM api_keys WHERE owner_id = $1::uuid ORDER BY created_at, id`, owner)
	if err != nil {
		return nil, err
	}
	keys, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (listedKey, error) {
		var k listedKey
		err := row.Scan(&k.ID, &k.Prefix, &k.Name, &k.OwnerID, &k.PlatformID, &k.Scopes, &k.CreatedAt, &k.RevokedAt)
		// pgx gives the host's zone; exportctl prints UTC, as owner list does.
		k.CreatedAt = k.CreatedAt.UTC()
		if k.RevokedAt != nil {
			*k.RevokedAt = k.RevokedAt.UTC()
		}
		return k, err
	})
	if keys == nil {
		keys = []listedKey{}
	}
	return keys, err
}

// printKeys writes keys one a line for a person: id, prefix, scopes,
// platform, state and name. A line not written is its error, as emit's.
func printKeys(out io.Writer, keys []listedKey) error {
	for _, k := range keys {
		state := "active"
		if k.RevokedAt != nil {
			state = "revoked " + k.RevokedAt.Format(time.RFC3339)
		}
		platform := "-" // a read key is bound to its owner only
		if k.PlatformID != nil {
			platform = *k.PlatformID
		}
		if _, err := fmt.Fprintf(out, "%s  %s…  %-24s  platform %-12s  %-26s  %q\n",
			k.ID, k.Prefix, strings.Join(k.Scopes, ","), platform, state, k.Name); err != nil {
			return err
		}
	}
	return nil
}
