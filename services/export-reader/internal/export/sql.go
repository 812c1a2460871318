package export

import (
	"fmt"

	"github.com/coinexport/export/pkg/catalog"
	"github.com/jackc/pgx/v5/pgtype"
)

// docColumns are the stored documents, in catalog.Languages order.
var docColumns = []string{"doc_eng", "doc_rus", "doc_ukr"}

func langIndex(lang string) int {
	for i, l := range catalog.Languages {
		if l == lang {
			return i
		}
	}
	return 0
}

// The list statements are built once: per language, with or without the
// status filter, and with no lower bound, an updated_after bound or a cursor
// bound. Each is a single range scan of export_items_sync_idx (owner_id,
// updated_at, id) or export_items_status_sync_idx (owner_id, status,
// updated_at, id), already in ORDER BY order, stopped by the LIMIT. The row
// comparison (updated_at, id) > ($, $) is an index condition.
type listKey struct {
	lang   int
	status bool
	bound  int // 0 none, 1 updated_after, 2 cursor
}

const (
	boundNone = iota
	boundUpdatedAfter
	boundCursor
)

var listStatements = func() map[listKey]string {
	m := map[listKey]string{}
	for lang, col := range docColumns {
		for _, status := range []bool{false, true} {
			for bound := boundNone; bound <= boundCursor; bound++ {
				m[listKey{lang, status, bound}] = listSQL(col, status, bound)
			}
		}
	}
	return m
}()

func listSQL(col string, status bool, bound int) string {
	where, next := "owner_id = $1", 2
	if status {
		where += " AND status = $2"
		next = 3
	}
	switch bound {
	case boundUpdatedAfter:
		where += fmt.Sprintf(" AND updated_at > $%d", next)
		next++
	case boundCursor:
		where += fmt.Sprintf(" AND (updated_at, id) > ($%d, $%d)", next, next+1)
		next += 2
	}
	return fmt.Sprintf("SELECT id, status, updated_at, %s FROM export_items WHERE %s ORDER BY updated_at, id LIMIT $%d",
		col, where, next)
}

// listStatement is the statement of a page scan and its arguments: from
// the first row (after updated_after, if given) when after is nil, else
// strictly after that position, reading at most rows rows. A position is
// always after updated_after (it was read under that filter and the cursor
// is bound to it), so the cursor bound alone is enough.
func listStatement(q Query, owner pgtype.UUID, after *position, rows int) (string, []any) {
	key := listKey{lang: langIndex(q.Lang), status: q.Status != ""}
	args := []any{owner}
	if key.status {
		args = append(args, q.Status)
	}
	switch {
	case after != nil:
		key.bound = boundCursor
		args = append(args, after.UpdatedAt, after.ID)
	case q.UpdatedAfter != nil:
		key.bound = boundUpdatedAfter
		args = append(args, *q.UpdatedAfter)
	}
	return listStatements[key], append(args, rows)
}

var itemStatements = func() []string {
	s := make([]string, len(docColumns))
	for i, col := range docColumns {
		s[i] = fmt.Sprintf("SELECT status, updated_at, %s FROM export_items WHERE owner_id = $1 AND id = $2", col)
	}
	return s
}()
