// Package cursor makes the opaque meta.next_cursor of the export list: the
// last (updated_at, id) of a page and the sync it belongs to, signed with
// HMAC-SHA256 together with the query (owner, status, updated_after), so a
// tampered cursor or one replayed against another owner or other filters is
// refused instead of silently restarting or leaking a position.
package cursor

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"
)

// version is the first byte of every cursor; a new layout takes a new one,
// and cursors of an unknown version are refused. Version 1 had no sync; its
// cursors, issued before version 2, are still read (as Sync 0) so that the
// syncs under way during an upgrade carry on.
const (
	version       byte = 2
	versionNoSync byte = 1
)

// MaxLen bounds the encoded cursor we try to decode: a version, a sync, a
// timestamp, an id of at most 128 characters (512 bytes of UTF-8) and the
// MAC, 563 bytes: 751 characters of base64url and 18 dots.
const MaxLen = 1024

// dotEvery is how many base64url characters a cursor holds between two
// dots. The gateway refuses (401 key_in_url) a query value with a run of
// letters and digits that reads as an API key without its tag: 49
// characters whose last 6 are their checksum (apikey.ContainsUntaggedKey).
// base64url's '-' and '_' cut a cursor's runs only by chance, and most
// cursors have a run of 49 or more, so about one page in 2e10 would be
// refused for good (its cursor is the same every time). A dot, in neither
// alphabet and safe unescaped in a query, every 40 characters keeps every
// run well under 49; 40 is a multiple of 4, so each part is 30 whole bytes.
const dotEvery = 40

const macLen = 32

// ErrInvalid is every reason a cursor is refused: malformed, tampered,
// unknown version, or bound to another owner or other filters. Telling them
// apart would only help someone probing for other owners' cursors.
var ErrInvalid = errors.New("cursor: invalid")

// ErrSignature is ErrInvalid for a cursor well formed but whose MAC does
// not match: another query's or another owner's cursor, a tampered one, or
// one signed by a reader whose CURSOR_SECRET differs from this one's (and
// from its CURSOR_SECRET_PREVIOUS), which only the operator can fix. The
// client is told no more than ErrInvalid; the reader's log says it.
var ErrSignature = fmt.Errorf("%w: its signature does not match", ErrInvalid)

// Position is where the next page starts: strictly after this (updated_at,
// id), and the sync whose page ended there.
type Position struct {
	UpdatedAt time.Time // microsecond precision, as PostgreSQL keeps it
	ID        string
	// Sync tells one sync (the pages that follow one first page) from
	// another with the same filters: the reader draws it for each first
	// page and keeps it in every cursor after. Pages read ahead answer only
	// their own sync (see export.ReadAhead). 0 on a version 1 cursor.
	Sync uint64
}

// Binding is the query a cursor belongs to. lang and limit may change between
// pages and are deliberately not part of it.
type Binding struct {
	OwnerID      string
	Status       string     // "" when not filtered
	UpdatedAfter *time.Time // nil when not filtered
}

// Codec signs cursors with one secret and accepts those signed with it or
// with the secrets it replaced.
type Codec struct {
	secret   []byte
	previous [][]byte
}

// New returns a Codec signing with secret and still accepting cursors signed
// with any of previous, so the secret can be rotated without failing the
// syncs under way. That takes two rollouts (README, "Rotating
// CURSOR_SECRET"): first every reader accepts the new secret as a previous
// one while still signing with the old, then they swap. Going straight to
// signing with the new one breaks every sync whose cursor reaches a reader
// not yet replaced. Every secret must be at least 32 bytes.
func New(secret string, previous ...string) (*Codec, error) {
	c := &Codec{}
	for i, s := range append([]string{secret}, previous...) {
		if len(s) < 32 {
			return nil, fmt.Errorf("cursor: secret %d must be at least 32 bytes, got %d", i+1, len(s))
		}
		if i == 0 {
			c.secret = []byte(s)
		} else {
			c.previous = append(c.previous, []byte(s))
		}
	}
	return c, nil
}

// Encode returns the cursor for the page after p.
func (c *Codec) Encode(p Position, b Binding) string {
	buf := make([]byte, 0, 1+8+8+binary.MaxVarintLen64+len(p.ID)+macLen)
	buf = append(buf, version)
	buf = binary.BigEndian.AppendUint64(buf, p.Sync)
	buf = binary.BigEndian.AppendUint64(buf, uint64(p.UpdatedAt.UnixMicro()))
	buf = binary.AppendUvarint(buf, uint64(len(p.ID)))
	buf = append(buf, p.ID...)
	buf = append(buf, mac(c.secret, buf, b)...)
	return dotted(base64.RawURLEncoding.EncodeToString(buf))
}

// dotted returns s with a dot after every dotEvery characters but the last.
func dotted(s string) string {
	var b strings.Builder
	b.Grow(len(s) + len(s)/dotEvery)
	for len(s) > dotEvery {
		b.WriteString(s[:dotEvery])
		b.WriteByte('.')
		s = s[dotEvery:]
	}
	b.WriteString(s)
	return b.String()
}

// Decode checks s against b and returns its position. s is read with its
// dots where Encode puts them, or with none: the previous version wrote
// cursors without dots, and the syncs under way during an upgrade carry on.
func (c *Codec) Decode(s string, b Binding) (Position, error) {
	// The decoder skips CR and LF even when Strict, so a cursor with them
	// added would read as the one sent: refused, as any other change is.
	if len(s) == 0 || len(s) > MaxLen || strings.ContainsAny(s, "\r\n") {
		return Position{}, ErrInvalid
	}
	undotted := strings.ReplaceAll(s, ".", "")
	if len(undotted) != len(s) && s != dotted(undotted) { // a dot moved, added or removed
		return Position{}, ErrInvalid
	}
	raw, err := base64.RawURLEncoding.Strict().DecodeString(undotted)
	if err != nil || len(raw) < 1+macLen {
		return Position{}, ErrInvalid
	}
	var pos Position
	fields := 1 // where the fields after the sync start
	switch raw[0] {
	case version:
		fields += 8
	case versionNoSync:
	default:
		return Position{}, ErrInvalid
	}
	if len(raw) < fields+8+1+macLen {
		return Position{}, ErrInvalid
	}
	body, sum := raw[:len(raw)-macLen], raw[len(raw)-macLen:]
	if !c.signed(body, sum, b) {
		return Position{}, ErrSignature
	}
	if fields > 1 {
		pos.Sync = binary.BigEndian.Uint64(body[1:fields])
	}
	micros := int64(binary.BigEndian.Uint64(body[fields : fields+8]))
	n, k := binary.Uvarint(body[fields+8:])
	if k <= 0 || n != uint64(len(body)-fields-8-k) {
		return Position{}, ErrInvalid
	}
	pos.UpdatedAt, pos.ID = time.UnixMicro(micros).UTC(), string(body[fields+8+k:])
	return pos, nil
}

// signed reports whether sum is the MAC of body and b under the current
// secret or a previous one.
func (c *Codec) signed(body, sum []byte, b Binding) bool {
	if hmac.Equal(sum, mac(c.secret, body, b)) {
		return true
	}
	for _, secret := range c.previous {
		if hmac.Equal(sum, mac(secret, body, b)) {
			return true
		}
	}
	return false
}

// mac covers the cursor body and its binding. The binding fields are
// length-prefixed, so no two bindings share an input.
func mac(secret, body []byte, b Binding) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("export-cursor"))
	m.Write(body)
	for _, f := range []string{b.OwnerID, b.Status} {
		m.Write(binary.AppendUvarint(nil, uint64(len(f))))
		m.Write([]byte(f))
	}
	if b.UpdatedAfter == nil {
		m.Write([]byte{0})
	} else {
		m.Write([]byte{1})
		m.Write(binary.BigEndian.AppendUint64(nil, uint64(b.UpdatedAfter.UnixMicro())))
	}
	return m.Sum(nil)
}
