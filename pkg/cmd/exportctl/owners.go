package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/coinexport/export/pkg/schema"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// migrate applies the pending migrations and names each one it applied:
// 00004 and 00005 ask for a restart of the services after them (README),
// so "up to date" alone would not tell an administrator whether to.
func migrate(ctx context.Context, e *env, args []string) error {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print JSON")
	if err := flagsOnly(fs, args); err != nil {
		return err
	}
	applied, err := schema.Up(ctx, e.pool)
	files := make([]string, 0, len(applied))
	for _, a := range applied {
		files = append(files, a.File)
		if !*asJSON {
			fmt.Fprintf(e.out, "applied %s (%s)\n", a.File, a.Duration.Round(time.Millisecond))
		}
	}
	if err != nil {
		if *asJSON && len(files) > 0 { // no line above named them
			return fmt.Errorf("%w (applied before it: %s)", err, strings.Join(files, ", "))
		}
		return err
	}
	database, build, err := schema.Versions(ctx, e.pool)
	if err != nil {
		return err
	}
	human := fmt.Sprintf("schema is up to date (version %d)", database)
	if len(applied) == 0 {
		human += ": nothing to apply"
	}
	if database > build {
		human = fmt.Sprintf("nothing applied: the database is at version %d, newer than this exportctl's %d (a later release migrated it)",
			database, build)
	}
	return emit(e.out, *asJSON, map[string]any{"schema_version": schema.Version(), "version": database,
		"build_version": build, "applied": files}, human)
}

// maxOwnerName is the owners table's limit on a name.
const maxOwnerName = 200

func ownerCreate(ctx context.Context, e *env, args []string) error {
	fs := flag.NewFlagSet("owner create", flag.ContinueOnError)
	name := fs.String("name", "", "owner name")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := flagsOnly(fs, args); err != nil {
		return err
	}
	if err := required(fs, "name"); err != nil {
		return err
	}
	if err := refuseKeys(fs, "name"); err != nil {
		return err
	}
	// The table's check (1 to 200 characters), said in the administrator's
	// terms; a name of spaces only names nobody.
	if n := utf8.RuneCountInString(*name); n > maxOwnerName || strings.TrimSpace(*name) == "" {
		return fmt.Errorf("%w: --name must be 1 to %d characters, not blank (got %d)", errUsage, maxOwnerName, n)
	}
	var id string
	err := e.pool.QueryRow(ctx, "INSERT INTO owners (name) VALUES ($1) RETURNING id::text", *name).Scan(&id)
	if err != nil {
		return fmt.Errorf("create owner: %w", err)
	}
	return emit(e.out, *asJSON, map[string]string{"id": id, "name": *name}, "owner "+id)
}

func platformCreate(ctx context.Context, e *env, args []string) error {
	fs := flag.NewFlagSet("platform create", flag.ContinueOnError)
	id := fs.String("id", "", "platform id (letters, digits, . _ -)")
	name := fs.String("name", "", "platform name")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := flagsOnly(fs, args); err != nil {
		return err
	}
	if err := required(fs, "id"); err != nil {
		return err
	}
	if err := refuseKeys(fs, "id", "name"); err != nil {
		return err
	}
	if _, err := e.pool.Exec(ctx, "INSERT INTO platforms (id, name) VALUES ($1, $2)", *id, *name); err != nil {
		return fmt.Errorf("create platform: %w", platformCreateError(err, *id))
	}
	return emit(e.out, *asJSON, map[string]string{"id": *id, "name": *name}, "platform "+*id)
}

// listed is an owner or a platform as owner list and platform list print it.
type listed struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
}

// ownerList prints every owner: an owner's id is printed once, by owner
// create, and every other command needs it.
func ownerList(ctx context.Context, e *env, args []string) error {
	return list(ctx, e, args, "owner list", "SELECT id::text, name, created_at FROM owners ORDER BY created_at, id",
		"no owners (owner create makes one)")
}

// platformList prints every platform, for the --platform of a sales key.
func platformList(ctx context.Context, e *env, args []string) error {
	return list(ctx, e, args, "platform list", "SELECT id, name, created_at FROM platforms ORDER BY id",
		"no platforms (platform create makes one)")
}

// list runs the list command name, printing what query finds, or the note
// none when it finds nothing.
func list(ctx context.Context, e *env, args []string, name, query, none string) error {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print JSON")
	if err := flagsOnly(fs, args); err != nil {
		return err
	}
	rows, err := e.pool.Query(ctx, query)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	all, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (listed, error) {
		var l listed
		err := row.Scan(&l.ID, &l.Name, &l.CreatedAt)
		l.CreatedAt = l.CreatedAt.UTC() // pgx gives the host's zone
		return l, err
	})
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if *asJSON {
		if all == nil {
			all = []listed{}
		}
		return emit(e.out, true, all, "")
	}
	if len(all) == 0 {
		e.note(none)
		return nil
	}
	for _, l := range all {
		// A line not written fails the command, as emit does: a list cut
		// short by a full disk exited 0.
		if _, err := fmt.Fprintf(e.out, "%s  %s  %q\n", l.ID, l.CreatedAt.Format(time.RFC3339), l.Name); err != nil {
			return err
		}
	}
	return nil
}

// platformCreateError says which rule a platform id broke instead of the
// constraint's name.
func platformCreateError(err error, id string) error {
	var pgErr *pgconn.PgError
	switch {
	case !errors.As(err, &pgErr):
		return err
	case pgErr.Code == "23505": // unique_violation
		return fmt.Errorf("platform %q exists already", id)
	case pgErr.Code == "23514": // check_violation
		return fmt.Errorf("platform id %q: 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit", id)
	}
	return err
}

// ownerExists is nil when owner is the id of an owner, and otherwise says
// what it is not.
func ownerExists(ctx context.Context, e *env, owner string) error {
	if !isUUID(owner) {
		return fmt.Errorf("%w: --owner %q is not an owner id (a UUID)", errUsage, owner)
	}
	var found bool
	if err := e.pool.QueryRow(ctx, "SELECT EXISTS (SELECT FROM owners WHERE id = $1::uuid)", owner).Scan(&found); err != nil {
		return err
	}
	if !found {
		hint := idMixUp(ctx, e, owner)
		if hint == "" {
			hint = " (owner list lists the owners; owner create makes one)"
		}
		return fmt.Errorf("no owner with id %q%s", owner, hint)
	}
	return nil
}

// idMixUp says, after a command found no owner or no key of the id it was
// given, that the id is the other's: both are UUIDs, and an owner's id
// given to key revoke, or a key's as --owner, was refused as "no such"
// alone. It is "" for an id of neither, or when the look-up fails (the
// refusal says enough then).
func idMixUp(ctx context.Context, e *env, id string) string {
	var owner, key bool
	if !isUUID(id) || e.pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM owners WHERE id = $1::uuid),
		EXISTS (SELECT FROM api_keys WHERE id = $1::uuid)`, id).Scan(&owner, &key) != nil {
		return ""
	}
	switch {
	case owner:
		return fmt.Sprintf(": it is an owner's id (key list --owner %s lists its keys)", id)
	case key:
		return ": it is a key's id (owner list lists the owners)"
	}
	return ""
}

// uuidPattern is a UUID as PostgreSQL prints it (either case): the
// form of the ids owner create and key create print, which the other
// commands take. pgtype's parser lets other characters stand where the
// dashes go, which PostgreSQL refuses.
var uuidPattern = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

func isUUID(s string) bool { return uuidPattern.MatchString(s) }
