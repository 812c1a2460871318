package upstream

import (
	"context"
	"time"

	"github.com/valyala/fasthttp"
)

// HealthPath is what every service answers, unauthenticated, on its main
// listener. Any answer below 500 counts as alive, so a service that lacks
// the route is not taken out.
const HealthPath = "/healthz"

// Probe checks every instance each interval until ctx ends: one that
// answers is put back at once, one that does not is skipped until the next
// probe, so the proxy stops sending to it.
func (u *Upstream) Probe(ctx context.Context, interval time.Duration) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		for _, inst := range u.current() {
			if inst.alive(interval) {
				u.markUp(inst)
			} else {
				u.markDown(inst, interval+u.opts.DownFor, "its health probe failed")
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (inst *Instance) alive(timeout time.Duration) bool {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(inst.base + HealthPath)
	req.Header.SetMethod(fasthttp.MethodGet)
	// A fresh connection each time: a probe answers for the instance as it
	// is now, never for a connection from before its restart.
	req.SetConnectionClose()
	resp.SkipBody = true
	if err := inst.probe.DoTimeout(req, resp, min(timeout, time.Second)); err != nil {
		return false
	}
	return resp.StatusCode() < 500
}
