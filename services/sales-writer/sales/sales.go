// Package sales confirms and cancels external sales of export items (spec 3,
// 4.5 to 4.7): exactly once per item, with idempotent retries.
//
// Each call is one round trip and one short transaction of two statements:
// the idempotency key's advisory lock (keyLock), then one statement that
// checks the key's record, changes the item and the sale, and stores the
// record with the response. A call that changes nothing reads once more to
// tell why (explainSQL), and a refusal then binds the key in one more round
// trip (bindRefusedSQL). See queries.go for why that is safe under
// concurrency.
package sales

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/coinexport/export/pkg/catalog"
	"github.com/coinexport/export/pkg/jsonw"
)

// Operation is what a call does to an item.
type Operation string

// The two operations of spec 4.5 and 4.6.
const (
	Confirm Operation = "confirm"
	Cancel  Operation = "cancel"
)

// DefaultQuantity is the only quantity version 1 accepts (spec 2.5).
const DefaultQuantity = 1

// Request is one validated confirm or cancel call. OwnerID and PlatformID
// come from the caller's key, never from the request body.
type Request struct {
	Operation       Operation
	OwnerID         string // uuid
	PlatformID      string
	IdempotencyKey  string
	ItemID          string
	ExternalOrderID string
	Quantity        int // DefaultQuantity when the body omits it
}

// Result is the SaleWriteResult of spec 2.4. The same value is stored in the
// idempotency record and replayed with IdempotentReplay set.
type Result struct {
	ItemID           string    `json:"item_id"`
	Status           string    `json:"status"`
	StockQuantity    int       `json:"stock_quantity"`
	PlatformID       string    `json:"platform_id"`
	ExternalOrderID  string    `json:"external_order_id"`
	ConfirmedAt      time.Time `json:"confirmed_at,omitzero"`
	CanceledAt       time.Time `json:"canceled_at,omitzero"`
	IdempotentReplay bool      `json:"idempotent_replay"`
}

// Errors of the sale logic; the HTTP layer maps each to a status and code.
var (
	// ErrNotFound: the item does not exist or belongs to another owner, or
	// (confirm) the caller's platform does not exist.
	ErrNotFound = errors.New("export item not found")
	// ErrAlreadySold: confirm of an item with an open sale (any platform).
	ErrAlreadySold = errors.New("item is already sold")
	// ErrAlreadySoldToThisOrder is ErrAlreadySold when the open sale is
	// the caller's own, of this platform and external order: a confirm
	// that succeeded, sent again under a new Idempotency-Key (the first
	// one lost). The platform can tell it from another's sale without
	// canceling to find out; it learns nothing of other platforms' sales.
	ErrAlreadySoldToThisOrder = fmt.Errorf("%w, to this platform under this external_order_id: "+
		"a confirm of this order has already succeeded", ErrAlreadySold)
	// ErrNotAvailable: confirm of an item its owner has deactivated.
	ErrNotAvailable = errors.New("item is not available for sale")
	// ErrNotCancelable: cancel without an open sale of this platform and order.
	ErrNotCancelable = errors.New("no open sale of this platform and external order to cancel")
	// ErrIdempotencyConflict: the key was used before for a different request.
	ErrIdempotencyConflict = errors.New("idempotency key was already used for a different request")
	// ErrInProgress: another request with this key kept being stored
	// concurrently; its outcome is not known yet.
	ErrInProgress = errors.New("a request with this idempotency key is still in progress")
)

// Fingerprint identifies the canonical request an idempotency key was used
// for: operation, item, external order and quantity with its default applied,
// so an omitted quantity and "quantity": 1 are the same request. Owner and
// platform are not part of it: they are the record's scope.
func Fingerprint(r Request) []byte {
	q := r.Quantity
	if q == 0 {
		q = DefaultQuantity
	}
	// A JSON array keeps the fields apart whatever characters they hold.
	canonical, _ := json.Marshal([]any{"v1", r.Operation, r.ItemID, r.ExternalOrderID, q})
	sum := sha256.Sum256(canonical)
	return sum[:]
}

// MarshalJSON writes the timestamps as the export routes write updated_at
// (catalog.TimeLayout: UTC, six fractional digits), so one client sees one
// timestamp format.
func (r Result) MarshalJSON() ([]byte, error) {
	return r.AppendJSON(make([]byte, 0, 256)), nil
}

// AppendJSON appends r as MarshalJSON writes it, without reflection: this is
// every answer of the service (see envelope.WriteDataJSON).
func (r Result) AppendJSON(dst []byte) []byte {
	dst = append(dst, `{"item_id":`...)
	dst = jsonw.String(dst, r.ItemID)
	dst = append(dst, `,"status":`...)
	dst = jsonw.String(dst, r.Status)
	dst = append(dst, `,"stock_quantity":`...)
	dst = strconv.AppendInt(dst, int64(r.StockQuantity), 10)
	dst = append(dst, `,"platform_id":`...)
	dst = jsonw.String(dst, r.PlatformID)
	dst = append(dst, `,"external_order_id":`...)
	dst = jsonw.String(dst, r.ExternalOrderID)
	dst = append(dst, `,"idempotent_replay":`...)
	dst = strconv.AppendBool(dst, r.IdempotentReplay)
	dst = appendTimestamp(dst, `,"confirmed_at":"`, r.ConfirmedAt)
	dst = appendTimestamp(dst, `,"canceled_at":"`, r.CanceledAt)
	return append(dst, '}')
}

// appendTimestamp appends the member that opens with key, unless t is zero.
func appendTimestamp(dst []byte, key string, t time.Time) []byte {
	if t.IsZero() {
		return dst
	}
	dst = append(dst, key...)
	dst = t.UTC().AppendFormat(dst, catalog.TimeLayout)
	return append(dst, '"')
}
