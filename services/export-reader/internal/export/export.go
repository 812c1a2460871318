// Package export reads export items for the list and item routes. Items are
// stored pre-rendered per language (see pkg/catalog), so a page is one index
// range scan whose rows are composed into JSON by appending bytes: no item is
// decoded or encoded on the way out.
package export

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/coinexport/export/pkg/catalog"
	"github.com/coinexport/export/services/export-reader/internal/cursor"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Errors of this package; the HTTP layer maps each to one status and code.
var (
	ErrNotFound      = errors.New("export: item not found")
	ErrInvalidCursor = errors.New("export: invalid cursor")
)

// Query is one list request, already validated.
type Query struct {
	OwnerID      string
	Lang         string     // ENG, RUS or UKR
	Limit        int        // 1 to 100
	Status       string     // "", active or inactive
	UpdatedAfter *time.Time // strictly after; microsecond precision
	Cursor       string     // "" for the first page
}

// position is where a page ends: the last (updated_at, id) it holds.
type position = cursor.Position

// Reader reads export items from PostgreSQL (a replica is fine).
type Reader struct {
	pool    *pgxpool.Pool
	cursors *cursor.Codec
}

// NewReader returns a Reader over pool that signs cursors with cursors.
func NewReader(pool *pgxpool.Pool, cursors *cursor.Codec) *Reader {
	return &Reader{pool: pool, cursors: cursors}
}

// AppendPage appends the page's ExportItems, comma-separated, to dst and
// returns the cursor of the next page, or "" when this page is the last.
// One extra row is read to know whether another page exists.
func (r *Reader) AppendPage(ctx context.Context, dst []byte, q Query) ([]byte, string, error) {
	owner, err := catalog.ParseOwnerID(q.OwnerID)
	if err != nil {
		return dst, "", fmt.Errorf("export: %w", err)
	}
	binding := cursor.Binding{OwnerID: q.OwnerID, Status: q.Status, UpdatedAfter: q.UpdatedAfter}
	var after *position
	if q.Cursor != "" {
		pos, err := r.cursors.Decode(q.Cursor, binding)
		if err != nil {
			return dst, "", ErrInvalidCursor
		}
		after = &pos
	}
	dst, next, err := r.scan(ctx, dst, q, owner, after)
	if err != nil || next == nil {
		return dst, "", err
	}
	return dst, r.cursors.Encode(*next, binding), nil
}

// scan reads one page after the position (from the start when nil).
func (r *Reader) scan(ctx context.Context, dst []byte, q Query, owner pgtype.UUID, after *position) ([]byte, *position, error) {
	sql, args := listStatement(q, owner)
	if after != nil {
		sql, args = listAfterStatement(q, owner, *after)
	}
	rows, err := r.pool.Query(ctx, sql, args...)
	if err != nil {
		return dst, nil, fmt.Errorf("export: list: %w", err)
	}
	defer rows.Close()
	var (
		n               int
		last            position
		id, status, doc pgtype.DriverBytes
		updated         time.Time
	)
	for rows.Next() {
		if n == q.Limit {
			// The extra row: another page exists after the last one kept.
			rows.Close()
			return dst, &last, rows.Err()
		}
		if err := rows.Scan(&id, &status, &updated, &doc); err != nil {
			return dst, nil, fmt.Errorf("export: list: %w", err)
		}
		if n > 0 {
			dst = append(dst, ',')
		}
		dst = catalog.Compose(dst, statusOf(status), updated, doc)
		n++
		if n == q.Limit {
			// Copied now: id points into the driver's buffer, which the
			// next rows.Next reuses.
			last = position{UpdatedAt: updated, ID: string(id)}
		}
	}
	if err := rows.Err(); err != nil {
		return dst, nil, fmt.Errorf("export: list: %w", err)
	}
	return dst, nil, nil
}

// AppendItem appends one ExportItem to dst. An item of another owner is as
// not found as a missing one.
func (r *Reader) AppendItem(ctx context.Context, dst []byte, ownerID, itemID, lang string) ([]byte, error) {
	owner, err := catalog.ParseOwnerID(ownerID)
	if err != nil {
		return dst, fmt.Errorf("export: %w", err)
	}
	// Ids the database could not hold cannot exist; asking would only turn
	// bad bytes into a database error.
	if itemID == "" || utf8.RuneCountInString(itemID) > 128 || !utf8.ValidString(itemID) || strings.ContainsRune(itemID, 0) {
		return dst, ErrNotFound
	}
	rows, err := r.pool.Query(ctx, itemStatements[langIndex(lang)], owner, itemID)
	if err != nil {
		return dst, fmt.Errorf("export: item: %w", err)
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return dst, fmt.Errorf("export: item: %w", err)
		}
		return dst, ErrNotFound
	}
	var status, doc pgtype.DriverBytes
	var updated time.Time
	if err := rows.Scan(&status, &updated, &doc); err != nil {
		return dst, fmt.Errorf("export: item: %w", err)
	}
	return catalog.Compose(dst, statusOf(status), updated, doc), nil
}

// statusOf maps the driver's bytes to a constant without allocating a string
// per row.
func statusOf(b []byte) string {
	if string(b) == catalog.StatusActive {
		return catalog.StatusActive
	}
	return catalog.StatusInactive
}
