package edge

import "sync"

// addressSlots bounds the requests one client address has in flight on a
// route. The shop schema route needs it: each call may wait on the
// merchant's shop for SHOP_SCHEMA_TIMEOUT (20 s), shop-schema serves
// SHOP_SCHEMA_MAX_CONCURRENT (32) at once for everyone, and the route's
// rate limit (30 a minute per address) lets one address start 30 calls to
// a shop of its own that never answers and hold nearly every slot, so that
// every other merchant's call is refused 429 for as long. A count per
// address is kept only while it has calls in flight.
type addressSlots struct {
	mu    sync.Mutex
	held  map[string]int
	limit int
}

func newAddressSlots(limit int) *addressSlots {
	return &addressSlots{held: make(map[string]int), limit: limit}
}

// acquire takes a slot for addr, or reports that addr holds every one it
// may.
func (s *addressSlots) acquire(addr string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held[addr] >= s.limit {
		return false
	}
	s.held[addr]++
	return true
}

// release gives back a slot acquire took.
func (s *addressSlots) release(addr string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held[addr] <= 1 {
		delete(s.held, addr)
		return
	}
	s.held[addr]--
}

// takeShopSlot takes one of address's shop schema slots for rq, or refuses
// it 429 naming the cap as the limit that refused it (access line, span,
// decisions metric), as every 429 of a limit is named: the slot is given
// back by the caller, once the call ends.
func (g *Gateway) takeShopSlot(rq *request, address string) error {
	if !g.shopSlots.acquire(address) {
		g.shopSlotDecisions.limited.Inc()
		rq.limitedBy = classShopSchemaInFlight
		return errTooManyInFlight(g.shopSlots.limit)
	}
	g.shopSlotDecisions.allowed.Inc()
	return nil
}
