package catalog

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"testing"

	"github.com/coinexport/export/pkg/testenv"
	"github.com/jackc/pgx/v5/pgtype"
)

// What appendCopyText writes, PostgreSQL's COPY reads back as it was:
// every byte that text format reads as its own (a backslash, a tab, a
// newline, a return), the strings \N and \. , nulls, booleans, prices.
func TestCopyTextReadsBackAsWritten(t *testing.T) {
	ctx := context.Background()
	conn := acquire(t, testenv.Postgres(t))
	if _, err := conn.Exec(ctx, `CREATE TEMP TABLE copied (n int, s text, p text, b boolean, price numeric(18,4), j jsonb)`); err != nil {
		t.Fatal(err)
	}
	awkward := "a\\b\tc\nd\re \\N \\. \\t ünï"
	rows := [][]any{
		{"1", awkward, &awkward, true, numeric(ptr(json.Number("0.0001"))), []byte(`{"k":"v\n","l":"\\"}`)},
		{"2", `\N`, (*string)(nil), false, numeric(nil), nil},
		{"3", `\.`, ptr(""), true, numeric(ptr(json.Number("12345678901234.5"))), []byte(`[]`)},
	}
	text, err := appendCopyText(nil, rows)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.PgConn().CopyFrom(ctx, bytes.NewReader(text), `COPY copied (n, s, p, b, price, j) FROM STDIN`); err != nil {
		t.Fatalf("COPY of %q: %v", text, err)
	}
	got, err := conn.Query(ctx, `SELECT s, coalesce(p, 'null'), b, coalesce(price::text, 'null'), coalesce(j::text, 'null') FROM copied ORDER BY n`)
	if err != nil {
		t.Fatal(err)
	}
	want := [][]string{
		{awkward, awkward, "true", "0.0001", `{"k": "v\n", "l": "\\"}`},
		{`\N`, "null", "false", "null", "null"},
		{`\.`, "", "true", "12345678901234.5000", "[]"},
	}
	for i := 0; got.Next(); i++ {
		var s, p, price, j string
		var b bool
		if err := got.Scan(&s, &p, &b, &price, &j); err != nil {
			t.Fatal(err)
		}
		if row := []string{s, p, map[bool]string{true: "true", false: "false"}[b], price, j}; i >= len(want) || !slices.Equal(row, want[i]) {
			t.Errorf("row %d read back as %q, want %q", i+1, row, want[min(i, len(want)-1)])
		}
	}
	if err := got.Err(); err != nil {
		t.Fatal(err)
	}
}

// A value of a type it has no text form for is an error, not a guess.
func TestCopyTextRefusesAnUnknownType(t *testing.T) {
	if _, err := appendCopyText(nil, [][]any{{"id", pgtype.UUID{}}}); err == nil {
		t.Error("appendCopyText of a pgtype.UUID = nil error, want one")
	}
}

func ptr[T any](v T) *T { return &v }
