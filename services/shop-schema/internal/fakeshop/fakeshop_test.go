package fakeshop

import (
	"context"
	"net/http/httptest"
	"testing"
)

// With HoldUntil, the requests are held until that many have arrived: the
// channel record gives is closed by the last of them, not before.
func TestRecordReleasesAtHoldUntil(t *testing.T) {
	s := &Shop{HoldUntil: 2}
	released := s.record(httptest.NewRequest("GET", "/api/categories", nil))
	select {
	case <-released:
		t.Fatal("released after 1 request of HoldUntil 2")
	default:
	}
	if again := s.record(httptest.NewRequest("GET", "/api/features", nil)); again != released {
		t.Error("the second request waits on another channel than the first")
	}
	select {
	case <-released:
	default:
		t.Error("not released after 2 requests of HoldUntil 2")
	}
	if got := s.Requests(); len(got) != 2 {
		t.Errorf("Requests() = %q, want the 2 requests", got)
	}
	if released := (&Shop{}).record(httptest.NewRequest("GET", "/api/", nil)); released != nil {
		t.Error("record without HoldUntil gave a channel to wait on")
	}
}

// waited says whether what a request waits for came before its caller left.
func TestWaited(t *testing.T) {
	ready := make(chan struct{})
	close(ready)
	if !waited(httptest.NewRequest("GET", "/", nil), ready) {
		t.Error("waited(ready) = false, want true")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	gone := httptest.NewRequest("GET", "/", nil).WithContext(ctx)
	if waited(gone, make(chan struct{})) {
		t.Error("waited(a request whose caller left, never ready) = true, want false")
	}
}
