package edge

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
)

// The OpenAPI document (gateway/openapi.yaml) has an operation for every
// route the gateway serves, HEAD ones included, and none it does not serve;
// an operation needs the API key exactly when its route needs a scope.
// e2e.TestOpenAPIDescribesTheStack checks what the operations answer.
func TestOpenAPIListsEveryRoute(t *testing.T) {
	doc, err := openapi3.NewLoader().LoadFromFile("../openapi.yaml")
	if err != nil {
		t.Fatalf("load ../openapi.yaml: %v", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("../openapi.yaml is not a valid OpenAPI document: %v", err)
	}
	if len(doc.Servers) != 1 {
		t.Fatalf("../openapi.yaml has %d servers, want 1 (the base path)", len(doc.Servers))
	}
	base := doc.Servers[0].URL
	documented := map[string]*openapi3.Operation{}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			documented[method+" "+base+path] = op
		}
	}
	for _, r := range servedRoutes {
		op, ok := documented[r.Name()]
		if !ok {
			t.Errorf("route %s is served but not in openapi.yaml", r.Name())
			continue
		}
		delete(documented, r.Name())
		keyed := op.Security != nil && slices.ContainsFunc(*op.Security, func(req openapi3.SecurityRequirement) bool {
			_, ok := req["ApiKey"]
			return ok
		})
		if keyed != (r.Scope != "") {
			t.Errorf("openapi.yaml: %s needs an API key = %v, but its route's scope is %q", r.Name(), keyed, r.Scope)
		}
		if op.OperationID == "" || !strings.Contains(op.Summary, " ") {
			t.Errorf("openapi.yaml: %s has operationId %q and summary %q, want both", r.Name(), op.OperationID, op.Summary)
		}
	}
	for name := range documented {
		t.Errorf("openapi.yaml documents %s, which the gateway does not serve", name)
	}
}
