package catalog

import (
	"bytes"
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// The staging rows travel in COPY's text format, not in pgx's binary one.
// Into a table in shared buffers (the import's UNLOGGED staging table) a
// binary COPY made the PostgreSQL 15 backend take ~1.5 minor page faults
// per row of ~2 KB (150,000 for 100,000 rows; ~20 µs each on these VMs),
// its heap given back to the system and touched anew batch after batch
// (perf: memset in heap_toast_insert_or_update and heap_form_tuple,
// _int_malloc); the same rows in text format made 2,200. Tried with psql
// alone, 100 batches of 1,000 rows each way: binary 5.4-6.0 s of the
// backend's CPU, text 2.5 s; into a TEMP table (the staging before
// migration 00008) both ~2.7 s.

// copyStaging is the COPY statement of a batch into table.
func copyStaging(table string) string {
	return "COPY " + table + " (" + strings.Join(stagingColumns, ", ") + ") FROM STDIN"
}

// appendCopyText appends rows to buf in COPY's text format: a line per
// row, its columns apart by tabs, \N for null.
func appendCopyText(buf []byte, rows [][]any) ([]byte, error) {
	for _, row := range rows {
		for i, v := range row {
			if i > 0 {
				buf = append(buf, '\t')
			}
			var err error
			if buf, err = appendCopyValue(buf, v); err != nil {
				return nil, fmt.Errorf("catalog: staging column %s: %w", stagingColumns[i], err)
			}
		}
		buf = append(buf, '\n')
	}
	return buf, nil
}

// appendCopyValue appends v, a value of stagingRow's, as COPY's text
// format gives it.
func appendCopyValue(buf []byte, v any) ([]byte, error) {
	switch v := v.(type) {
	case nil:
		return append(buf, `\N`...), nil
	case string:
		return appendCopyEscaped(buf, v), nil
	case *string:
		if v == nil {
			return append(buf, `\N`...), nil
		}
		return appendCopyEscaped(buf, *v), nil
	case []byte:
		return appendCopyEscaped(buf, v), nil
	case bool:
		if v {
			return append(buf, 't'), nil
		}
		return append(buf, 'f'), nil
	case pgtype.Numeric:
		if !v.Valid {
			return append(buf, `\N`...), nil
		}
		text, err := v.MarshalJSON() // a decimal, as numeric reads it
		return append(buf, text...), err
	}
	return nil, fmt.Errorf("no COPY text form for %T", v)
}

// appendCopyEscaped appends s with the four bytes COPY's text format
// reads otherwise (backslash, newline, carriage return and the tab that
// parts columns) escaped, the runs between them whole.
func appendCopyEscaped[T string | []byte](buf []byte, s T) []byte {
	start := 0
	for i := 0; i < len(s); i++ {
		var escaped byte
		switch s[i] {
		case '\\':
			escaped = '\\'
		case '\n':
			escaped = 'n'
		case '\r':
			escaped = 'r'
		case '\t':
			escaped = 't'
		default:
			continue
		}
		buf = append(append(buf, s[start:i]...), '\\', escaped)
		start = i + 1
	}
	return append(buf, s[start:]...)
}

// copyTextIn copies text (appendCopyText's) into run's table within tx, and
// returns how many rows it copied.
func copyTextIn(ctx context.Context, tx pgx.Tx, run *stagingRun, text []byte) (int64, error) {
	tag, err := tx.Conn().PgConn().CopyFrom(ctx, bytes.NewReader(text), copyStaging(run.table()))
	return tag.RowsAffected(), err
}
