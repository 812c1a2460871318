package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/coinexport/export/pkg/catalog"
	"github.com/coinexport/export/pkg/postgres"
)

func itemsImport(ctx context.Context, e *env, args []string) error {
	fs := flag.NewFlagSet("items import", flag.ContinueOnError)
	owner := fs.String("owner", "", "owner id")
	file := fs.String("file", "", "JSON Lines file, or - for standard input")
	allowEmpty := fs.Bool("allow-empty", false, "accept a file with no items")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := flagsOnly(fs, args); err != nil {
		return err
	}
	if err := required(fs, "owner", "file"); err != nil {
		return err
	}
	// Checked first, as key create does: an empty file for an owner that
	// does not exist would otherwise "import 0 items" and exit 0.
	if err := ownerExists(ctx, e, *owner); err != nil {
		return err
	}
	in, closeIn, err := openInput(*file, e.stdin)
	if err != nil {
		return err
	}
	defer closeIn()
	if tty, ok := in.(*os.File); ok && isTerminal(tty) {
		// Waiting without a word for lines a person was not going to type
		// (the file's "<" forgotten) read as a hang. Nobody types gzip, and
		// a terminal's Ctrl-D ends one read, not the input: uncompressed's
		// look ahead would take it.
		e.note("items import --file -: reading JSON Lines from the terminal, up to Ctrl-D (a file: --file PATH, or --file - < PATH)")
	} else if in, err = uncompressed(in, inputName(*file)); err != nil {
		return err
	}
	// The whole file is validated before anything is written: one bad line
	// rejects the file.
	res, err := catalog.ImportJSONL(ctx, e.pool, *owner, in)
	if res.StagingLeft != nil {
		e.note(stagingLeftNote(res.StagingLeft))
	}
	if err != nil {
		return importError(err, inputName(*file))
	}
	total := res.Inserted + res.Updated + res.Unchanged
	if total == 0 && !*allowEmpty {
		// An import only adds and changes items, so a file of none does
		// nothing: most likely it is the wrong file, or one cut to nothing.
		return fmt.Errorf("%s: no items in it: nothing imported (the wrong file? --allow-empty accepts a file with no items)", inputName(*file))
	}
	return emit(e.out, *asJSON, map[string]int{"inserted": res.Inserted, "updated": res.Updated, "unchanged": res.Unchanged},
		fmt.Sprintf("imported %s: %d inserted, %d updated, %d unchanged", count(total, "item"), res.Inserted, res.Updated, res.Unchanged))
}

// stagingLeftNote tells the operator that the import's staging table, a
// copy of the items imported, stayed in the database, why, and what drops
// it: nothing needs doing, but a table of the catalog's size found later
// by nobody's account read as a leak.
func stagingLeftNote(left *catalog.StagingLeft) string {
	cause := left.Err.Error()
	if postgres.LockTimedOut(left.Err) {
		cause = "another session holds a lock on it, as a pg_dump does while it runs: " + cause
	}
	return fmt.Sprintf("items import: warning: the import's staging table %s could not be dropped as it ended (%s); "+
		"the first import started %d minutes from now drops it, or drop it now: %s",
		left.Table(), cause, int(left.StaleAfter().Minutes()), left.DropStatement())
}

// inputName is how an error names --file: "-" said alone, before a colon,
// read as a typo.
func inputName(file string) string {
	if file == "-" {
		return "standard input"
	}
	return file
}

// importError says of an import that failed whether it wrote anything:
// nothing when a line was refused or before its items were staged, and
// otherwise how many it wrote, the chunks before the one that failed (and
// that one's too, when its fate is unknown: WriteError.AtLeast), and to
// run it again to complete it, unless its owner is gone.
func importError(err error, file string) error {
	var bad *catalog.LineError
	var cut *catalog.WriteError
	written := errors.As(err, &cut)
	switch {
	case errors.As(err, &bad):
		return fmt.Errorf("%s: nothing imported: %w", file, err)
	case !written && errors.Is(err, context.Canceled): // a Ctrl-C
		return fmt.Errorf("import: interrupted: nothing written (%w)", err)
	case !written:
		err = fmt.Errorf("nothing written: %w", err)
	}
	switch {
	case errors.Is(err, catalog.ErrOwnerNotFound): // ownerExists found it before the import began
		return fmt.Errorf("import: %w: the owner was deleted while the import ran", err)
	case !written:
		return fmt.Errorf("import: %w", err)
	case errors.Is(err, catalog.ErrItemsLocked):
		return fmt.Errorf("import: %w; once that transaction has ended, run it again to complete it (items already as imported are left alone)", err)
	}
	return fmt.Errorf("import: %w; run it again to complete it (items already as imported are left alone)", err)
}

// gzipMagic is how a gzip file starts.
var gzipMagic = []byte{0x1f, 0x8b}

// uncompressed is in, or a refusal when in is gzip-compressed: read as JSON
// Lines, such a file was refused as "line 1: the line must be a JSON
// object", which sent the operator to a file that looks fine unpacked.
func uncompressed(in io.Reader, name string) (io.Reader, error) {
	buffered := bufio.NewReader(in)
	// A failed read is the import's to report, as it reads on.
	if start, _ := buffered.Peek(len(gzipMagic)); bytes.Equal(start, gzipMagic) {
		return nil, fmt.Errorf("%s: nothing imported: it is gzip-compressed: unpack it first (gunzip, or zcat FILE | exportctl items import … --file -)", name)
	}
	return buffered, nil
}

func openInput(path string, stdin io.Reader) (io.Reader, func(), error) {
	if path == "-" {
		// The shell opens a folder for "--file - < FOLDER" as well.
		if f, ok := stdin.(*os.File); ok && isFolder(f) {
			return nil, nil, folderRefusal(inputName(path))
		}
		return stdin, func() {}, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	if isFolder(f) {
		f.Close()
		return nil, nil, folderRefusal(path)
	}
	return f, func() { f.Close() }, nil
}

// isFolder reports whether f is a folder. A folder opens as a file does;
// read, it was refused as "catalog: read line 1: read /tmp: is a
// directory".
func isFolder(f *os.File) bool {
	info, err := f.Stat()
	return err == nil && info.IsDir()
}

func folderRefusal(name string) error {
	return fmt.Errorf("%s: nothing imported: it is a folder: give a file of JSON Lines, one item a line", name)
}

func itemsSeed(ctx context.Context, e *env, args []string) error {
	fs := flag.NewFlagSet("items seed", flag.ContinueOnError)
	owner := fs.String("owner", "", "owner id")
	wanted := fs.Int("count", 0, "how many items")
	seed := fs.Int64("seed", 1, "random seed (same seed, same items)")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := flagsOnly(fs, args); err != nil {
		return err
	}
	if err := required(fs, "owner"); err != nil {
		return err
	}
	if *wanted <= 0 {
		return fmt.Errorf("%w: --count must be a positive number of items", errUsage)
	}
	if err := ownerExists(ctx, e, *owner); err != nil {
		return err
	}
	start := time.Now()
	n, err := catalog.Seed(ctx, e.pool, *owner, *wanted, *seed)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" { // unique_violation
		return fmt.Errorf("seed: the owner has items of seed %d already (ids s%d-…): nothing seeded; pick another --seed", *seed, *seed)
	}
	if err != nil && ctx.Err() != nil {
		// One transaction, so nothing, unless the stop came as it
		// committed: the same seed is then refused as seeded already.
		return fmt.Errorf("seed: interrupted (%w): nothing seeded, unless it came as the items were committed (--seed %d is refused then, as seeded already)",
			ctx.Err(), *seed)
	}
	if err != nil {
		return fmt.Errorf("seed: %w", err)
	}
	took := time.Since(start)
	return emit(e.out, *asJSON, map[string]any{"seeded": n, "seconds": took.Seconds()},
		fmt.Sprintf("seeded %s in %s", count(int(n), "item"), took.Round(time.Millisecond)))
}

// itemsRestamp stamps every item of one owner, or of every owner, anew:
// the step after a restore of the database, so that every marketplace's
// next sync reads the restored catalog whole (catalog.Restamp; README,
// "Restoring the database").
func itemsRestamp(ctx context.Context, e *env, args []string) error {
	fs := flag.NewFlagSet("items restamp", flag.ContinueOnError)
	owner := fs.String("owner", "", "owner id")
	allOwners := fs.Bool("all-owners", false, "every owner's items")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := flagsOnly(fs, args); err != nil {
		return err
	}
	if (*owner == "") == !*allOwners {
		return fmt.Errorf("%w: items restamp takes --owner OWNER_ID or --all-owners (one of them)", errUsage)
	}
	owners := []string{*owner}
	if *allOwners {
		var err error
		if owners, err = ownerIDs(ctx, e); err != nil {
			return err
		}
	} else if err := ownerExists(ctx, e, *owner); err != nil {
		return err
	}
	start := time.Now()
	stamped := 0
	for _, id := range owners {
		n, err := restampOwner(ctx, e, id)
		stamped += n
		if err != nil {
			return fmt.Errorf("restamp: %d items stamped before owner %s failed (run it again: stamping twice is harmless): %w", stamped, id, err)
		}
	}
	took := time.Since(start)
	return emit(e.out, *asJSON, map[string]any{"owners": len(owners), "restamped": stamped, "seconds": took.Seconds()},
		fmt.Sprintf("restamped %s of %s in %s: each client's next sync reads them all again", count(stamped, "item"), count(len(owners), "owner"), took.Round(time.Millisecond)))
}

// count is n things in words: "1 owner" after the usual --owner, "2 owners".
func count(n int, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return fmt.Sprintf("%d %ss", n, thing)
}

func restampOwner(ctx context.Context, e *env, owner string) (int, error) {
	id, err := catalog.ParseOwnerID(owner)
	if err != nil {
		return 0, err
	}
	return catalog.Restamp(ctx, e.pool, id)
}

// ownerIDs lists every owner's id.
func ownerIDs(ctx context.Context, e *env) ([]string, error) {
	rows, err := e.pool.Query(ctx, "SELECT id::text FROM owners ORDER BY id")
	if err != nil {
		return nil, fmt.Errorf("list owners: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}
