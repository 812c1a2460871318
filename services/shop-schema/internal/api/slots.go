package api

import (
	"sync"
	"time"
)

// slots bounds the reads in flight (SHOP_SCHEMA_MAX_CONCURRENT) and keeps
// what holds each, so that a read refused for want of one is logged with
// what to act on: one slow shop holding most of them, callers slow to send
// their bodies, or more shops read at once than the instances serve.
type slots struct {
	mu   sync.Mutex
	max  int
	held map[*slot]struct{}
}

// slot is one read in flight.
type slot struct {
	requestID string
	since     time.Time
	host      string // the shop's, as the log names it (shopschema.Service.Host)
	bodyRead  bool   // host is known: a read still reading its body has none yet
}

func newSlots(max int) *slots {
	return &slots{max: max, held: make(map[*slot]struct{}, max)}
}

// take returns a slot for the read requestID, or nil when every one is
// held.
func (s *slots) take(requestID string) *slot {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.held) >= s.max {
		return nil
	}
	held := &slot{requestID: requestID, since: time.Now()}
	s.held[held] = struct{}{}
	return held
}

// release frees held.
func (s *slots) release(held *slot) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.held, held)
}

// inUse returns the slots held now.
func (s *slots) inUse() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.held)
}

// aim records the shop held's read is for, once its body is read.
func (s *slots) aim(held *slot, host string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	held.host, held.bodyRead = host, true
}

// holders sums up what holds the slots.
type holders struct {
	oldest      slot
	busiestHost string // the shop whose reads hold the most slots
	busiest     int    // how many they hold
	hosts       int    // distinct shops read
	readingBody int    // reads still reading their body, no shop yet
}

// holders returns what holds the slots now.
func (s *slots) holders() holders {
	s.mu.Lock()
	defer s.mu.Unlock()
	var sum holders
	perHost := map[string]int{}
	for held := range s.held {
		if sum.oldest.since.IsZero() || held.since.Before(sum.oldest.since) {
			sum.oldest = *held
		}
		if !held.bodyRead {
			sum.readingBody++
			continue
		}
		perHost[held.host]++
		if n := perHost[held.host]; n > sum.busiest {
			sum.busiestHost, sum.busiest = held.host, n
		}
	}
	sum.hosts = len(perHost)
	return sum
}
