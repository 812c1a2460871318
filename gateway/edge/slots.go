package edge

import "sync"

// inFlightSlots bounds the requests one holder (a client address, an
// owner) has in flight. The shop schema route needs it per address: each
// call may wait on the merchant's shop for SHOP_SCHEMA_TIMEOUT (20 s),
// shop-schema serves SHOP_SCHEMA_MAX_CONCURRENT (32) at once for everyone,
// and the route's rate limit alone (30 a minute per address) would let one
// address start 30 calls to a shop of its own that never answers and hold
// nearly every slot, so that every other merchant's call is refused 429
// for as long. With it (RATE_LIMIT_SHOP_SCHEMA_IN_FLIGHT, 4) an address
// holds 4, and shop-schema's cap per shop address, when turned on
// (SHOP_SCHEMA_MAX_CONCURRENT_PER_SHOP), bounds the calls of many addresses
// to one slow server; what neither bounds (many addresses, each with
// calls that wait before reaching any shop) is in the gateway README,
// "Shop schema calls in flight". The keyed routes need it per owner
// (takeOwnerSlot). A count per holder is kept only while it has calls in
// flight.
type inFlightSlots struct {
	mu    sync.Mutex
	held  map[string]int
	limit int
}

func newInFlightSlots(limit int) *inFlightSlots {
	return &inFlightSlots{held: make(map[string]int), limit: limit}
}

// acquire takes a slot for holder, or reports that holder holds every one it
// may.
func (s *inFlightSlots) acquire(holder string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held[holder] >= s.limit {
		return false
	}
	s.held[holder]++
	return true
}

// release gives back a slot acquire took.
func (s *inFlightSlots) release(holder string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held[holder] <= 1 {
		delete(s.held, holder)
		return
	}
	s.held[holder]--
}

// takeShopSlot takes one of address's shop schema slots for rq, or refuses
// it 429 naming the cap as the limit that refused it (access line, span,
// decisions metric), as every 429 of a limit is named; it returns the
// release, which the caller calls once the call ends (its answer relayed
// whole: proxyUntilRelayed).
func (g *Gateway) takeShopSlot(rq *request, address string) (release func(), err error) {
	if !g.shopSlots.acquire(address) {
		g.shopSlotDecisions.limited.Inc()
		rq.limitedBy = classShopSchemaInFlight
		return nil, errTooManyInFlight(g.shopSlots.limit)
	}
	g.shopSlotDecisions.allowed.Inc()
	return func() { g.shopSlots.release(address) }, nil
}

// ownerShare is an owner's slots on the routes of one service: the count,
// the rate_limit_class its refusals are named by, what their 429 says of
// the routes, and its decisions metric.
type ownerShare struct {
	slots     *inFlightSlots
	class     string // classOwnerExportInFlight, classOwnerSaleInFlight
	routes    string // export, sale: in the 429's message
	decisions slotDecisions
}

// newOwnerSlots splits an owner's limit slots between the services of
// the keyed routes: sale of them for the sale routes (sales-writer), the
// rest for the export routes (export-reader), each counted apart, so that
// an owner holds at most limit in all and neither service's calls can
// take the other's share.
//
// Apart, because a request holds its slot until its upstream answers:
// with one count, the sales of a replaying platform hung on a
// sales-writer that stopped answering (each held until
// UPSTREAM_READ_TIMEOUT, 30 s, its client long gone) took every slot of
// the owner, and its syncs, which export-reader would have served at once,
// were refused 429 "too many requests in flight for this owner" for as
// long (README, "Sales guide"): an outage of one service shown as the
// owner's fault on the other's routes. Split rather than a full count
// each, because with 64 in each service an owner flooding both queued 64
// sales in front of the writer's 8 connections and twice the requests in
// all: a neighbour's sales took 65–84 ms at the median against 18–25 with
// one count (gateway README, "Tenants sharing a stack").
func newOwnerSlots(m *metrics, limit, sale int) map[string]*ownerShare {
	return map[string]*ownerShare{
		upstreamExportReader: {slots: newInFlightSlots(limit - sale), class: classOwnerExportInFlight, routes: "export",
			decisions: m.forSlots(classOwnerExportInFlight)},
		upstreamSalesWriter: {slots: newInFlightSlots(sale), class: classOwnerSaleInFlight, routes: "sale",
			decisions: m.forSlots(classOwnerSaleInFlight)},
	}
}

// takeOwnerSlot takes one of the key's owner's slots on rt's upstream for
// rq, or refuses it 429 naming the share that was full (access line, span,
// decisions metric); the caller defers rq.endCall once it is taken (a
// direct call, where a release returned as a closure, as takeShopSlot's,
// cost every keyed request an allocation), or hands rq over as the call's
// callEnd. The per-key rate limits bound each key, not its owner: an owner
// with 64 keys has 64 budgets of 6,000 a minute, far more than a stack
// serves, and every request it has in flight waits in the same queues as
// everyone's (the gateway's connections to an instance, export-reader's
// database pool, the CPU), first come first served. Measured (README, "Tenants sharing a stack"): 2,500 connections
// of one owner took another owner's GET by id from 2 ms to 5 s, and its
// requests from 600 to 3 in 15 s. Bounding what one owner holds in flight
// bounds the queue its neighbours wait behind, whatever keys and
// connections it uses.
func (g *Gateway) takeOwnerSlot(rq *request, rt route) error {
	if g.ownerSlots == nil { // RATE_LIMIT_OWNER_IN_FLIGHT=0
		return nil
	}
	share := g.ownerSlots[rt.Upstream]
	if !share.slots.acquire(rq.key.OwnerID) {
		share.decisions.limited.Inc()
		rq.limitedBy = share.class
		return errOwnerTooManyInFlight(share.slots.limit, share.routes)
	}
	share.decisions.allowed.Inc()
	rq.ownerSlots = share.slots
	return nil
}

// endCall gives back the owner's slot takeOwnerSlot took for rq, if it
// took one: a callEnd, handed over as rq itself (proxyUntilRelayed).
func (rq *request) endCall() {
	if rq.ownerSlots != nil {
		rq.ownerSlots.release(rq.key.OwnerID)
	}
}
