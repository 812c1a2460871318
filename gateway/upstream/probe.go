package upstream

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/coinexport/export/gateway/monotime"
	"github.com/coinexport/export/pkg/envelope"
	"github.com/valyala/fasthttp"
)

// HealthPath is what every service answers, unauthenticated, on its main
// listener. Any answer below 500 counts as alive, so a service that lacks
// the route is not taken out.
const HealthPath = "/healthz"

// unansweredProbesBeforeDown is how many probes in a row an instance may
// leave unanswered before it is taken out. One slow answer is weak
// evidence: a service busy with work still answers requests, and taking
// its only instance out would turn load into an outage. A dead one is
// taken out at once all the same, as its connection is refused (the
// kernel accepts connections for a process however busy it is), and one
// that answers 5xx says itself that it cannot serve. Kubernetes' probes
// and HAProxy's checks count failures in a row the same way, and take
// three by default.
const unansweredProbesBeforeDown = 3

var reasonUnanswered = fmt.Sprintf("its health probe went unanswered %d times in a row", unansweredProbesBeforeDown)

// downRecheck is how often an instance that is out is probed again. An
// outage every instance shares (PostgreSQL restarting: every service's
// readiness answers 503) takes them all out, and probed only each
// interval, they would stay out up to a whole interval after the cause had
// passed.
const downRecheck = 250 * time.Millisecond

// Probe checks every instance each interval until ctx ends, and one that is
// out every downRecheck: one that answers is put back at once; one that
// refuses the connection or answers 5xx is skipped for interval +
// Options.DownFor, and again each time a probe finds it so, so the proxy
// stops sending to it; one that leaves its probe unanswered (in interval,
// at most a second) is skipped once it has done so
// unansweredProbesBeforeDown times in a row.
//
// Each instance is probed on its own goroutine, one probe at a time: probed
// one after the other, every instance that left its probe unanswered (up
// to a second each) delayed the recheck of all the others, and an instance
// out would come back a second later per silent peer, not within
// downRecheck. Probe returns once the probes under way have ended.
func (u *Upstream) Probe(ctx context.Context, interval time.Duration) {
	tick := time.NewTicker(min(interval, downRecheck))
	defer tick.Stop()
	var probes sync.WaitGroup
	defer probes.Wait()
	for {
		for _, inst := range u.current() {
			now := time.Now()
			up := inst.upAt(monotime.Of(now))
			if (up && now.Before(inst.nextProbe)) || inst.probing.Load() {
				continue
			}
			inst.nextProbe = now.Add(interval)
			inst.probing.Store(true)
			probes.Go(func() {
				defer inst.probing.Store(false)
				verdict, failure := inst.probeOnce(interval)
				u.judge(inst, verdict, failure, interval)
			})
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// probeVerdict is what one probe found.
type probeVerdict int

const (
	probeAnswered   probeVerdict = iota // an answer below 500
	probeFailed                         // no connection, or an answer of 5xx
	probeUnanswered                     // connected, but no answer in time
	probeNotSent                        // the gateway had no descriptor for it: nothing learnt
)

// judge acts on what a probe of inst found; failure says why a failed
// probe failed.
func (u *Upstream) judge(inst *Instance, v probeVerdict, failure string, interval time.Duration) {
	switch v {
	case probeAnswered:
		inst.unansweredProbes = 0
		u.markUp(inst)
	case probeFailed:
		// A refusal or a 5xx is no silence: it ends a run of unanswered
		// probes, which counted on would take the instance out again, for
		// a reason it does not have, at the next silent one.
		inst.unansweredProbes = 0
		u.markDown(inst, interval+u.opts.DownFor, failure)
	case probeNotSent:
		// The instance was not asked: it stays as it was.
	default:
		// Three in a row take an instance out. One already out (refused,
		// 5xx) is not kept out by a probe left unanswered: a readiness
		// check slowed by a database coming back is no refusal, and
		// keeping every instance out for it would turn the slowness into
		// an outage. It returns when its time out ends, and a refusal or a
		// 5xx takes it out again at once.
		inst.unansweredProbes++
		if inst.unansweredProbes >= unansweredProbesBeforeDown {
			u.markDown(inst, interval+u.opts.DownFor, reasonUnanswered)
		}
	}
}

// probeOnce probes inst once. For a failed probe it also says why, as the
// log of the instance taken out will: the connection refused or not
// accepted in time (dialError.reason), or the 5xx with the error code the
// service sent in X-Error-Code (a service with another IDENTITY_SECRET
// answers 503 identity_refused, one whose database is unreachable 503
// unavailable), which is what on-call needs to tell the two apart.
func (inst *Instance) probeOnce(timeout time.Duration) (probeVerdict, string) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(inst.base + HealthPath)
	req.Header.SetMethod(fasthttp.MethodGet)
	// A fresh connection each time: a probe answers for the instance as it
	// is now, never for a connection from before its restart.
	req.SetConnectionClose()
	if inst.signProbe != nil {
		inst.signProbe(&req.Header)
	}
	resp.SkipBody = true
	err := inst.probe.DoTimeout(req, resp, min(timeout, time.Second))
	var dial dialError
	switch {
	case errors.As(err, new(shortageError)):
		return probeNotSent, ""
	case errors.As(err, &dial):
		return probeFailed, dial.reason()
	case err != nil:
		return probeUnanswered, ""
	case resp.StatusCode() >= 500:
		failure := "its health probe was answered " + strconv.Itoa(resp.StatusCode())
		if code := resp.Header.Peek(envelope.ErrorCodeHeader); envelope.WellFormedCode(code) {
			failure += " " + string(code)
		}
		return probeFailed, failure
	}
	return probeAnswered, ""
}
