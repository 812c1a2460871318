package cursor_test

import (
	"encoding/base64"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/apikey"
	"github.com/coinexport/export/services/export-reader/internal/cursor"
	"github.com/google/go-cmp/cmp"
)

const secret = "0123456789abcdef0123456789abcdef"

func TestRoundTrip(t *testing.T) {
	t.Parallel()
	c, err := cursor.New(secret)
	if err != nil {
		t.Fatal(err)
	}
	after := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tt := range []struct {
		pos cursor.Position
		b   cursor.Binding
	}{
		{cursor.Position{UpdatedAt: time.Date(2026, 10, 15, 8, 30, 0, 123456000, time.UTC), ID: "coin-1", Sync: 1}, cursor.Binding{OwnerID: "o1"}},
		{cursor.Position{UpdatedAt: time.Date(1999, 1, 1, 0, 0, 0, 0, time.UTC), ID: "Монета/ü?&=#", Sync: 1<<64 - 1}, cursor.Binding{OwnerID: "o1", Status: "active", UpdatedAfter: &after}},
		{cursor.Position{UpdatedAt: time.Date(2026, 10, 15, 8, 30, 0, 0, time.UTC), ID: "x"}, cursor.Binding{OwnerID: "o1"}},
	} {
		s := c.Encode(tt.pos, tt.b)
		got, err := c.Decode(s, tt.b)
		if err != nil {
			t.Fatalf("Decode(Encode(%v)) error = %v", tt.pos, err)
		}
		if diff := cmp.Diff(tt.pos, got); diff != "" {
			t.Errorf("Decode(Encode(%v)) (-want +got):\n%s", tt.pos, diff)
		}
	}
}

// A cursor of version 1, issued before cursors carried their sync, still
// reads (Sync 0), so the syncs under way during the upgrade carry on.
func TestDecodeReadsVersion1(t *testing.T) {
	t.Parallel()
	c, _ := cursor.New(secret)
	const issuedByVersion1 = "AQAGXdzafbRABmNvaW4tMQWvnP71oBwqDdmvz8C_Q6B0SwSvl-IzKiCvyIF2Rz9e"
	want := cursor.Position{UpdatedAt: time.Date(2026, 10, 15, 8, 30, 0, 123456000, time.UTC), ID: "coin-1"}
	got, err := c.Decode(issuedByVersion1, cursor.Binding{OwnerID: "o1"})
	if err != nil || got != want {
		t.Errorf("Decode(version 1 cursor) = %+v, %v; want %+v", got, err, want)
	}
	if _, err := c.Decode(issuedByVersion1, cursor.Binding{OwnerID: "o2"}); !errors.Is(err, cursor.ErrInvalid) {
		t.Errorf("Decode(version 1 cursor, other owner) error = %v, want ErrInvalid", err)
	}
}

func TestDecodeRejects(t *testing.T) {
	t.Parallel()
	c, _ := cursor.New(secret)
	other, _ := cursor.New(secret + "x")
	after := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	later := after.Add(time.Microsecond)
	b := cursor.Binding{OwnerID: "o1", Status: "active", UpdatedAfter: &after}
	s := c.Encode(cursor.Position{UpdatedAt: after.Add(time.Hour), ID: "x"}, b)
	// signature: the cursor is well formed and only its MAC does not
	// match, which the reader's log tells apart (ErrSignature).
	for _, tt := range []struct {
		name      string
		s         string
		b         cursor.Binding
		signature bool
	}{
		{"empty", "", b, false},
		{"not base64", "!!!", b, false},
		// base64's decoder skips CR and LF: without a check of its own,
		// these read as s.
		{"a line feed inside", s[:5] + "\n" + s[5:], b, false},
		{"a carriage return at the end", s + "\r", b, false},
		{"too long", s + string(make([]byte, cursor.MaxLen)), b, false},
		{"other secret", other.Encode(cursor.Position{UpdatedAt: after, ID: "x"}, b), b, true},
		{"other owner", s, cursor.Binding{OwnerID: "o2", Status: "active", UpdatedAfter: &after}, true},
		{"owner/status boundary moved", s, cursor.Binding{OwnerID: "o1a", Status: "ctive", UpdatedAfter: &after}, true},
		{"no status", s, cursor.Binding{OwnerID: "o1", UpdatedAfter: &after}, true},
		{"other updated_after", s, cursor.Binding{OwnerID: "o1", Status: "active", UpdatedAfter: &later}, true},
		{"no updated_after", s, cursor.Binding{OwnerID: "o1", Status: "active"}, true},
		{"other sync", otherSync(t, s), b, true},
		{"unknown version", withVersion(t, s, 3), b, false},
		{"version 1 read as 2", withVersion(t, s, 1), b, true},
	} {
		_, err := c.Decode(tt.s, tt.b)
		if !errors.Is(err, cursor.ErrInvalid) || errors.Is(err, cursor.ErrSignature) != tt.signature {
			t.Errorf("%s: Decode() error = %v, want ErrInvalid (ErrSignature: %v)", tt.name, err, tt.signature)
		}
	}
	if _, err := cursor.New("short"); err == nil {
		t.Errorf("New(short secret) error = nil, want an error")
	}
}

func TestRotation(t *testing.T) {
	t.Parallel()
	oldSecret, newSecret := secret, secret+"-rotated"
	before, _ := cursor.New(oldSecret)
	during, err := cursor.New(newSecret, oldSecret)
	if err != nil {
		t.Fatal(err)
	}
	after, _ := cursor.New(newSecret)
	b := cursor.Binding{OwnerID: "o1"}
	pos := cursor.Position{UpdatedAt: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), ID: "x"}
	issuedBefore := before.Encode(pos, b)

	if got, err := during.Decode(issuedBefore, b); err != nil || got != pos {
		t.Errorf("during rotation, Decode(cursor of the old secret) = %v, %v; want %v", got, err, pos)
	}
	if _, err := during.Decode(issuedBefore, cursor.Binding{OwnerID: "o2"}); !errors.Is(err, cursor.ErrInvalid) {
		t.Errorf("during rotation, Decode(old cursor, other owner) error = %v, want ErrInvalid", err)
	}
	issuedDuring := during.Encode(pos, b)
	if _, err := after.Decode(issuedDuring, b); err != nil {
		t.Errorf("after rotation, Decode(cursor issued during it) error = %v: new cursors must be signed with the new secret", err)
	}
	if _, err := after.Decode(issuedBefore, b); !errors.Is(err, cursor.ErrInvalid) {
		t.Errorf("after rotation, Decode(cursor of the dropped secret) error = %v, want ErrInvalid", err)
	}
	if _, err := cursor.New(newSecret, "short"); err == nil {
		t.Error("New(secret, short previous) error = nil, want an error")
	}
}

// The README's rolling rotation: at every step, a pod of the step before
// and a pod of the step after read each other's cursors; a single rollout
// straight to the swap does not (an old pod refuses the new pods' cursors).
func TestRollingRotation(t *testing.T) {
	t.Parallel()
	oldSecret, newSecret := secret, secret+"-rotated"
	codec := func(s string, previous ...string) *cursor.Codec {
		c, err := cursor.New(s, previous...)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	b := cursor.Binding{OwnerID: "o1"}
	pos := cursor.Position{UpdatedAt: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), ID: "x"}
	steps := []*cursor.Codec{
		codec(oldSecret),            // before
		codec(oldSecret, newSecret), // 1: the new secret accepted
		codec(newSecret, oldSecret), // 2: swapped
		codec(newSecret),            // 3: the old one dropped
	}
	for i := 1; i < len(steps); i++ {
		for _, pair := range [][2]int{{i - 1, i}, {i, i - 1}} {
			issued := steps[pair[0]].Encode(pos, b)
			if _, err := steps[pair[1]].Decode(issued, b); err != nil {
				t.Errorf("cursor of step %d read by a pod of step %d: %v", pair[0], pair[1], err)
			}
		}
	}
	if _, err := steps[0].Decode(steps[2].Encode(pos, b), b); !errors.Is(err, cursor.ErrInvalid) {
		t.Errorf("skipping step 1: a pod not yet replaced read a new pod's cursor (%v); the README's warning would be wrong", err)
	}
}

// otherSync returns s with its sync changed, its MAC kept.
func otherSync(t testing.TB, s string) string {
	t.Helper()
	raw := rawOf(t, s)
	raw[1] ^= 1
	return spelledLike(s, raw)
}

// withVersion returns s with its version byte set to v, its MAC kept.
func withVersion(t testing.TB, s string, v byte) string {
	t.Helper()
	raw := rawOf(t, s)
	raw[0] = v
	return spelledLike(s, raw)
}

// rawOf returns the bytes of cursor s, its dots left out.
func rawOf(t testing.TB, s string) []byte {
	t.Helper()
	raw, err := base64.RawURLEncoding.DecodeString(strings.ReplaceAll(s, ".", ""))
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// spelledLike returns raw in base64url with dots where like, a cursor of
// as many bytes, has them: a cursor changed only in its bytes.
func spelledLike(like string, raw []byte) string {
	enc := base64.RawURLEncoding.EncodeToString(raw)
	var b strings.Builder
	for i := range len(like) {
		if like[i] == '.' {
			b.WriteByte('.')
			continue
		}
		b.WriteByte(enc[0])
		enc = enc[1:]
	}
	return b.String()
}

// untaggedKeyLen is how many letters and digits in a row the gateway reads
// as a key without its tag (apikey.ContainsUntaggedKey): its body and
// checksum.
var untaggedKeyLen = apikey.Len - len(apikey.TagRead)

// longestRun returns the length of the longest run of [0-9A-Za-z] in s.
func longestRun(s string) int {
	longest, run := 0, 0
	for _, r := range s {
		if '0' <= r && r <= '9' || 'A' <= r && r <= 'Z' || 'a' <= r && r <= 'z' {
			run++
			longest = max(longest, run)
		} else {
			run = 0
		}
	}
	return longest
}

// holdsKeyLikeRun reports why the gateway could refuse cursor s as a query
// value holding an API key (401 key_in_url), or "" when it cannot.
func holdsKeyLikeRun(s string) string {
	switch {
	case apikey.ContainsKey(s):
		return "apikey.ContainsKey is true"
	case longestRun(s) >= untaggedKeyLen:
		return "it has a run of letters and digits as long as a key without its tag"
	}
	return ""
}

// No cursor has a run of letters and digits as long as an API key's
// secret, so none is ever refused by the gateway as a key in the URL
// (401 key_in_url, for good: a cursor is the same every time it is
// asked). Without its dots about one cursor in five has such a run, and
// the id made of a key's secret is refused outright.
func TestEncodeHoldsNoKeyLikeRun(t *testing.T) {
	t.Parallel()
	c, _ := cursor.New(secret)
	key, _, err := apikey.Generate(nil)
	if err != nil {
		t.Fatal(err)
	}
	// An id starts 18 bytes (24 characters) into a cursor: these 39 bytes
	// are written there as a key's secret between '-' and '-_'.
	keyID, err := base64.RawURLEncoding.DecodeString("-" + key[len(apikey.TagRead):] + "-_")
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{string(keyID)}
	rnd := rand.New(rand.NewPCG(57, 1))
	const base62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
	for range 2000 {
		id := make([]byte, 1+rnd.IntN(128))
		for i := range id {
			id[i] = base62[rnd.IntN(len(base62))]
		}
		ids = append(ids, string(id))
		id = make([]byte, 1+rnd.IntN(512))
		for i := range id {
			id[i] = byte(rnd.Uint32())
		}
		ids = append(ids, string(id))
	}
	for _, id := range ids {
		stamp := time.UnixMicro(rnd.Int64N(time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro())).UTC()
		pos := cursor.Position{UpdatedAt: stamp, ID: id, Sync: rnd.Uint64()}
		b := cursor.Binding{OwnerID: "o1"}
		s := c.Encode(pos, b)
		if why := holdsKeyLikeRun(s); why != "" {
			t.Fatalf("Encode(id %q) = %q: %s", id, s, why)
		}
		if got, err := c.Decode(s, b); err != nil || got != pos {
			t.Fatalf("Decode(Encode(%+v)) = %+v, %v", pos, got, err)
		}
	}
}

// A version 2 cursor of the previous reader, without dots, still reads, so
// the syncs under way during the upgrade carry on; the next cursor is
// dotted.
func TestDecodeReadsUndotted(t *testing.T) {
	t.Parallel()
	c, _ := cursor.New(secret)
	const undotted = "AgAAAAAAAAAqAAZd3Np9tEAGY29pbi0xBNPL5I1_I16w9fNfsudYNjleCe37XxIhmCUTMipvL1w"
	want := cursor.Position{UpdatedAt: time.Date(2026, 10, 15, 8, 30, 0, 123456000, time.UTC), ID: "coin-1", Sync: 42}
	b := cursor.Binding{OwnerID: "o1"}
	got, err := c.Decode(undotted, b)
	if err != nil || got != want {
		t.Errorf("Decode(undotted cursor) = %+v, %v; want %+v", got, err, want)
	}
	if s := c.Encode(want, b); s != undotted[:40]+"."+undotted[40:] {
		t.Errorf("Encode(%+v) = %q, want the undotted cursor with a dot after 40 characters", want, s)
	}
}

// Only the dots Encode writes, or none (the previous version's spelling of
// the same cursor), are read: a dot moved, added or removed is refused as
// malformed, as any other change is.
func TestDecodeRefusesMisplacedDots(t *testing.T) {
	t.Parallel()
	c, _ := cursor.New(secret)
	b := cursor.Binding{OwnerID: "o1"}
	pos := cursor.Position{UpdatedAt: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), ID: strings.Repeat("coin", 25)}
	s := c.Encode(pos, b)
	first := strings.IndexByte(s, '.')
	if first < 0 || strings.Count(s, ".") < 3 {
		t.Fatalf("Encode(%+v) = %q: want three dots or more", pos, s)
	}
	for _, tt := range []struct{ name, s string }{
		{"the first dot one earlier", s[:first-1] + "." + s[first-1:first] + s[first+1:]},
		{"the first dot one later", s[:first] + s[first+1:first+2] + "." + s[first+2:]},
		{"the first dot removed", s[:first] + s[first+1:]},
		{"the last dot removed", s[:strings.LastIndexByte(s, '.')] + s[strings.LastIndexByte(s, '.')+1:]},
		{"a dot doubled", s[:first] + "." + s[first:]},
		{"a dot added inside", s[:5] + "." + s[5:]},
		{"a dot added first", "." + s},
		{"a dot added last", s + "."},
		{"dots only", strings.Repeat(".", len(s))},
	} {
		if _, err := c.Decode(tt.s, b); !errors.Is(err, cursor.ErrInvalid) || errors.Is(err, cursor.ErrSignature) {
			t.Errorf("%s: Decode(%q) error = %v, want ErrInvalid, not ErrSignature", tt.name, tt.s, err)
		}
	}
	if got, err := c.Decode(strings.ReplaceAll(s, ".", ""), b); err != nil || got != pos {
		t.Errorf("Decode(cursor without its dots) = %+v, %v; want %+v (the previous version's spelling)", got, err, pos)
	}
}

// The range of the stamps a cursor carries: PostgreSQL's timestamptz, far
// inside what UnixMicro can hold.
var (
	minStamp = time.Date(-4713, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
	maxStamp = time.Date(294276, 12, 31, 23, 59, 59, 999999000, time.UTC).UnixMicro()
)

// A cursor a client sends is decoded without a panic, and only one this
// codec signed for the same query is accepted: garbage, a cursor of
// another secret or of another query is ErrInvalid, which the API answers
// 400 invalid_cursor. The seeds are the cursors of the tests above, a
// version 1 one and an undotted one among them.
func FuzzDecode(f *testing.F) {
	c, _ := cursor.New(secret)
	other, _ := cursor.New(secret + "x")
	after := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	b := cursor.Binding{OwnerID: "o1", Status: "active", UpdatedAfter: &after}
	s := c.Encode(cursor.Position{UpdatedAt: after.Add(time.Hour), ID: "x", Sync: 7}, b)
	for _, seed := range []string{
		"", "!!!", "abc", "AAAA", s, s + "A", s[:len(s)-1], s + "=",
		other.Encode(cursor.Position{UpdatedAt: after, ID: "x"}, b),
		"AQAGXdzafbRABmNvaW4tMQWvnP71oBwqDdmvz8C_Q6B0SwSvl-IzKiCvyIF2Rz9e",            // version 1, owner o1
		"AgAAAAAAAAAqAAZd3Np9tEAGY29pbi0xBNPL5I1_I16w9fNfsudYNjleCe37XxIhmCUTMipvL1w", // version 2 without dots, owner o1
		withVersion(f, s, 3), withVersion(f, s, 1), otherSync(f, s),
	} {
		f.Add(seed, "o1", "active", after.UnixMicro(), true)
		f.Add(seed, "o1", "", int64(0), false)
	}
	f.Fuzz(func(t *testing.T, s, owner, status string, afterMicros int64, hasAfter bool) {
		var ua *time.Time
		if hasAfter {
			at := time.UnixMicro(afterMicros)
			ua = &at
		}
		b := cursor.Binding{OwnerID: owner, Status: status, UpdatedAfter: ua}
		pos, err := c.Decode(s, b)
		if err != nil {
			if !errors.Is(err, cursor.ErrInvalid) {
				t.Fatalf("Decode(%q) error = %v, want ErrInvalid", s, err)
			}
			return
		}
		// Accepted: it can only be a cursor c signed for b, which it
		// issues again byte for byte (a version 1 one as version 2), with
		// its dots or, as the previous version wrote it, without.
		again := c.Encode(pos, b)
		if raw := rawOf(t, s); raw[0] == 2 && s != again && s != strings.ReplaceAll(again, ".", "") {
			t.Fatalf("Decode(%q) = %+v, which encodes as %q", s, pos, again)
		}
		if pos.UpdatedAt.Location() != time.UTC {
			t.Errorf("Decode(%q).UpdatedAt = %v, want UTC", s, pos.UpdatedAt)
		}
	})
}

// Decode(Encode(p)) is p for every position and query, and the cursor
// opens that query only: the same cursor with a byte changed, cut short or
// grown, or read for another owner, status or updated_after, is refused.
func FuzzRoundTrip(f *testing.F) {
	f.Add("coin-1", uint64(1), int64(1792053000123456), "o1", "", int64(0), false, 0, byte(1), "o2")
	f.Add("Монета/ü?&=#", uint64(1<<64-1), int64(915148800000000), "o1", "active", int64(1767225600000000), true, 10, byte(0x80), "o1")
	f.Add("x", uint64(0), int64(0), "o1", "inactive", int64(-1), true, -1, byte(0), "")
	f.Add("", uint64(0), int64(-62135596800000000), "", "", int64(0), false, 1000, byte(0xff), "o1a")
	f.Add("coin-2", uint64(7), int64(1792053000123456), "o1", "", int64(0), false, 1000, byte('\n'), "o2") // grown by a newline
	f.Fuzz(func(t *testing.T, id string, sync uint64, micros int64, owner, status string, afterMicros int64, hasAfter bool,
		at int, flip byte, otherOwner string) {
		if len(id) > 512 || micros < minStamp || micros > maxStamp {
			t.Skip() // no item id or stamp PostgreSQL holds
		}
		c, _ := cursor.New(secret)
		var ua *time.Time
		if hasAfter {
			after := time.UnixMicro(afterMicros)
			ua = &after
		}
		b := cursor.Binding{OwnerID: owner, Status: status, UpdatedAfter: ua}
		want := cursor.Position{UpdatedAt: time.UnixMicro(micros).UTC(), ID: id, Sync: sync}
		s := c.Encode(want, b)
		if got, err := c.Decode(s, b); err != nil || got != want {
			t.Fatalf("Decode(Encode(%+v)) = %+v, %v", want, got, err)
		}
		if why := holdsKeyLikeRun(s); why != "" {
			t.Fatalf("Encode(%+v) = %q: %s", want, s, why)
		}

		tampered := []byte(s)
		switch {
		case at >= 0 && at < len(s) && flip != 0:
			tampered[at] ^= flip
		case at < 0 && -at <= len(s):
			tampered = tampered[:len(s)+at]
		default:
			tampered = append(tampered, flip)
		}
		if _, err := c.Decode(string(tampered), b); !errors.Is(err, cursor.ErrInvalid) {
			t.Errorf("Decode(%q, %q tampered) error = %v, want ErrInvalid", tampered, s, err)
		}

		others := []cursor.Binding{
			{OwnerID: otherOwner, Status: status, UpdatedAfter: ua},
			{OwnerID: owner, Status: otherOwner, UpdatedAfter: ua},
			{OwnerID: owner + status, UpdatedAfter: ua}, // the boundary moved
		}
		if hasAfter {
			later := ua.Add(time.Microsecond)
			others = append(others, cursor.Binding{OwnerID: owner, Status: status},
				cursor.Binding{OwnerID: owner, Status: status, UpdatedAfter: &later})
		} else {
			zero := time.UnixMicro(0)
			others = append(others, cursor.Binding{OwnerID: owner, Status: status, UpdatedAfter: &zero})
		}
		for _, o := range others {
			if sameQuery(o, b) {
				continue
			}
			if _, err := c.Decode(s, o); !errors.Is(err, cursor.ErrSignature) {
				t.Errorf("Decode(cursor of %+v) for %+v error = %v, want ErrSignature", b, o, err)
			}
		}
	})
}

// sameQuery reports whether a and b are one query (updated_after counts to
// the microsecond, as the reader reads it).
func sameQuery(a, b cursor.Binding) bool {
	if a.OwnerID != b.OwnerID || a.Status != b.Status || (a.UpdatedAfter == nil) != (b.UpdatedAfter == nil) {
		return false
	}
	return a.UpdatedAfter == nil || a.UpdatedAfter.UnixMicro() == b.UpdatedAfter.UnixMicro()
}
