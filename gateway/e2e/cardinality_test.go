package e2e

import (
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/coinexport/export/pkg/apikey"
	"github.com/coinexport/export/pkg/testenv"
)

// Every value a client makes up (item ids, keys, paths, methods, cursors,
// query parameters, Idempotency-Keys, order ids, its own request ids and
// trace contexts) is a label value of no series of any binary: once each
// kind of call has been answered once, more of them, each with values of
// its own, add no series, and no series names any of them. A tenant could
// otherwise grow every binary's /metrics, and the Prometheus behind it,
// without bound, by requests that cost it nothing but a refusal.
func TestMadeUpValuesAddNoSeries(t *testing.T) {
	pool := testenv.Postgres(t)
	fx := newFixture(t, pool)
	s := startStack(t, dsnOf(t, pool), testenv.RedisURL(t))

	var made []string // every made-up value sent, each one new
	send := func(round int) {
		v := func(kind string) string {
			value := fmt.Sprintf("madeup%s%dx%d", kind, round, len(made))
			made = append(made, value)
			return value
		}
		unknownKey, _, err := apikey.Generate([]string{"export:read"})
		if err != nil {
			t.Fatal(err)
		}
		items := s.baseURL + "/export/items"
		for _, c := range []struct {
			method, target, key, body string
			headers                   map[string]string
			status                    int
		}{
			{"GET", items + "/" + v("item"), fx.readKey, "", nil, 404},
			{"GET", items + "/" + v("item"), unknownKey, "", nil, 401},
			{"GET", s.baseURL + "/" + v("path"), fx.readKey, "", nil, 404},
			{strings.ToUpper(v("method")), items, fx.readKey, "", nil, 405},
			{"GET", items + "?cursor=" + v("cursor"), fx.readKey, "", nil, 400},
			{"GET", items + "?" + v("param") + "=1", fx.readKey, "", nil, 400},
			{"GET", items + "?status=" + v("status"), fx.readKey, "", nil, 400},
			{"GET", items + "?limit=2", fx.readKey, "", map[string]string{
				"X-Request-Id": v("requestid"),
				"traceparent":  fmt.Sprintf("00-%032x-%016x-01", round+1, round+1),
			}, 200},
			{"POST", items + "/" + v("item") + "/sales/confirm", fx.writeKey, order(v("order")),
				map[string]string{"Idempotency-Key": v("idempotencykey")}, 404},
			{"POST", items + "/" + v("item") + "/sales/cancel", fx.writeKey, order(v("order")),
				map[string]string{"Idempotency-Key": v("idempotencykey")}, 404},
		} {
			if status, env, _ := call(t, c.method, c.target, c.key, c.body, c.headers); status != c.status {
				t.Fatalf("round %d: %s %s = %d %+v, want %d", round, c.method, c.target, status, env.Error, c.status)
			}
		}
		made = append(made, unknownKey)
	}

	send(0) // the first of each kind of answer makes its series
	before := s.seriesSet(t)
	for round := 1; round <= 8; round++ {
		send(round)
	}
	after := s.seriesSet(t)
	for _, series := range after {
		if !slices.Contains(before, series) {
			t.Errorf("made-up values added the series %s", series)
		}
		for _, value := range made {
			if strings.Contains(series, value) || strings.Contains(series, url.PathEscape(value)) {
				t.Errorf("series %s names the made-up %q", series, value)
			}
		}
	}
	if len(after) < 100 {
		t.Fatalf("the binaries expose %d series, want the hundreds they do", len(after))
	}
}

// seriesSet is every series the stack's binaries expose, as binary, name
// and labels (no value), sorted.
func (s *stack) seriesSet(t *testing.T) []string {
	t.Helper()
	var set []string
	for binary, families := range s.metricFamilies(t) {
		for name, f := range families {
			for _, m := range f.GetMetric() {
				var labels []string
				for _, l := range m.GetLabel() {
					labels = append(labels, l.GetName()+"="+l.GetValue())
				}
				set = append(set, binary+" "+name+"{"+strings.Join(labels, ",")+"}")
			}
		}
	}
	slices.Sort(set)
	return set
}
