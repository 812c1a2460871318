package edge

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
)

// The OpenAPI document (gateway/openapi.yaml) has an operation for every
// route the gateway serves, HEAD ones included, and none it does not serve;
// an operation needs the API key exactly when its route needs a scope; and
// it is of the contract's version.
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
	// Spec 9: the contract's version, which /health reports too.
	if doc.Info.Version != ContractVersion {
		t.Errorf("../openapi.yaml is of version %q, the gateway serves contract %q", doc.Info.Version, ContractVersion)
	}
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

// The document reads right in a generated client (oapi-codegen,
// openapi-typescript): a HEAD operation's responses describe no content,
// since a client decodes the body a response describes and a HEAD answer
// has none (a HEAD 401 failed "unexpected end of JSON input"); every number
// is a double, which oapi-codegen makes a float32 without a format; and no
// schema has a default, which makes the member required in TypeScript (a
// sale without `quantity` did not compile); parameters may have defaults. A
// parameter's enum is a named schema: oapi-codegen made an inline one a type
// per operation (ListExportItemsParamsLang, GetExportItemParamsLang...).
func TestOpenAPIGeneratesWorkingClients(t *testing.T) {
	doc, err := openapi3.NewLoader().LoadFromFile("../openapi.yaml")
	if err != nil {
		t.Fatalf("load ../openapi.yaml: %v", err)
	}
	for path, item := range doc.Paths.Map() {
		if item.Head == nil {
			continue
		}
		for status, r := range item.Head.Responses.Map() {
			if len(r.Value.Content) != 0 {
				t.Errorf("openapi.yaml: HEAD %s answers %s with content: a HEAD answer has no body", path, status)
			}
		}
	}
	for name, p := range doc.Components.Parameters {
		if s := p.Value.Schema; s.Ref == "" && len(s.Value.Enum) != 0 {
			t.Errorf("openapi.yaml: parameter %s writes its enum inline: name it in components.schemas, or each operation gets a type of its own", name)
		}
	}
	for name, s := range doc.Components.Schemas {
		forEachSchema(s.Value, name, func(where string, s *openapi3.Schema) {
			if s.Type.Is("number") && s.Format != "double" {
				t.Errorf("openapi.yaml: %s is a number of format %q, want double", where, s.Format)
			}
			if s.Default != nil {
				t.Errorf("openapi.yaml: %s has a default, which openapi-typescript's type makes required: say it in the description", where)
			}
		})
	}
}

// forEachSchema calls f on s and on every schema written within it
// (properties, items, additionalProperties, allOf), where naming the path to
// it; a $ref within is left to the loop over its own component.
func forEachSchema(s *openapi3.Schema, where string, f func(string, *openapi3.Schema)) {
	f(where, s)
	inner := func(r *openapi3.SchemaRef, at string) {
		if r != nil && r.Ref == "" && r.Value != nil {
			forEachSchema(r.Value, at, f)
		}
	}
	for name, p := range s.Properties {
		inner(p, where+"."+name)
	}
	inner(s.Items, where+"[]")
	inner(s.AdditionalProperties.Schema, where+"{}")
	for i, a := range s.AllOf {
		inner(a, fmt.Sprintf("%s.allOf[%d]", where, i))
	}
}

// Every error answer with a body has an example of its own, which a
// generated client's docs show for its status (they showed the envelope
// schema's one, invalid_limit, for a 401 or a 502), and the example is true
// of its response: an ErrorEnvelope whose error.code is one of its
// x-error-codes. That its message is one the stack sends with that code is
// e2e.TestOpenAPIDescribesTheStack's to check.
func TestOpenAPIErrorExamplesAreTheirResponses(t *testing.T) {
	doc, err := openapi3.NewLoader().LoadFromFile("../openapi.yaml")
	if err != nil {
		t.Fatalf("load ../openapi.yaml: %v", err)
	}
	responses := map[string]*openapi3.Response{}
	for name, ref := range doc.Components.Responses {
		responses["components.responses."+name] = ref.Value
	}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			for status, ref := range op.Responses.Map() {
				if ref.Ref == "" {
					responses[method+" "+path+" "+status] = ref.Value
				}
			}
		}
	}
	for where, r := range responses {
		codes, listed := r.Extensions["x-error-codes"].([]any)
		media := r.Content.Get("application/json")
		if !listed || media == nil { // a success, or a HEAD answer
			continue
		}
		examples := examplesOf(media)
		if len(examples) == 0 {
			t.Errorf("openapi.yaml: %s has no example: a client's docs show none, or another answer's", where)
		}
		for name, value := range examples {
			which := "its example"
			if name != "" {
				which += " " + name
			}
			if err := media.Schema.Value.VisitJSON(value); err != nil {
				t.Errorf("openapi.yaml: %s, %s, is not its schema's: %v", where, which, err)
			}
			env, _ := value.(map[string]any)
			e, _ := env["error"].(map[string]any)
			if !slices.Contains(codes, e["code"]) {
				t.Errorf("openapi.yaml: %s, %s, has code %v, which is not in its x-error-codes %v", where, which, e["code"], codes)
			}
		}
	}
}

// examplesOf is a media type's example (named "") or its examples, by
// name.
func examplesOf(media *openapi3.MediaType) map[string]any {
	examples := map[string]any{}
	if media.Example != nil {
		examples[""] = media.Example
	}
	for name, ex := range media.Examples {
		examples[name] = ex.Value.Value
	}
	return examples
}
