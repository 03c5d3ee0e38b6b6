package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers/legacy"

	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/unsubscribe"
)

// TestHandlerMatchesOpenAPI loads docs/openapi.yaml, checks it is a valid
// OpenAPI document, and checks the real handler's requests and responses
// against it: every documented status, with valid and invalid requests.
func TestHandlerMatchesOpenAPI(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	doc, err := openapi3.NewLoader().LoadFromFile("../docs/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := doc.Validate(ctx); err != nil {
		t.Fatalf("docs/openapi.yaml: %v", err)
	}
	router, err := legacy.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, func(c *Config) { c.Rate, c.Burst = 0.001, 28 }) // the 29th authenticated call is the 429

	type call struct {
		name, method, path string
		body               any
		hdr                map[string]string
		status             int
		validRequest       bool // the request conforms to the document
	}
	good := map[string]any{"from": "a@src.example", "to": []string{"b@one.example"}, "subject": "s", "text": "hi",
		"attachments": []map[string]any{{"filename": "a.txt", "content": "aGk="}}}
	calls := []call{
		{"accepted", "POST", "/v1/messages", good, nil, 202, true},
		{"raw", "POST", "/v1/messages", map[string]any{"from": "a@src.example", "to": []string{"b@one.example"}, "raw": "Subject: x\n\nhi\n"}, nil, 202, true},
		{"idempotent", "POST", "/v1/messages", good, map[string]string{"Idempotency-Key": "k1"}, 202, true},
		{"idempotent repeat", "POST", "/v1/messages", good, map[string]string{"Idempotency-Key": "k1"}, 202, true},
		{"key reused", "POST", "/v1/messages", map[string]any{"from": "a@src.example", "to": []string{"c@one.example"}, "text": "x"}, map[string]string{"Idempotency-Key": "k1"}, 422, true},
		{"bad address", "POST", "/v1/messages", map[string]any{"from": "a@src.example", "to": []string{"nope"}, "text": "x"}, nil, 422, true},
		{"bad json", "POST", "/v1/messages", "{", nil, 400, false},
		{"unknown field", "POST", "/v1/messages", map[string]any{"from": "a@src.example", "to": []string{"b@one.example"}, "txt": "x"}, nil, 400, false},
		{"missing to", "POST", "/v1/messages", map[string]any{"from": "a@src.example", "text": "x"}, nil, 400, false},
		{"media type", "POST", "/v1/messages", "x", map[string]string{"Content-Type": "text/plain"}, 415, false},
		{"no key", "POST", "/v1/messages", good, map[string]string{"Authorization": ""}, 401, true}, // keys are checked by the handler, not the document
		{"status", "GET", "/v1/messages/{first}", nil, nil, 200, true},
		{"unknown id", "GET", "/v1/messages/nosuch", nil, nil, 404, true},
		{"suppress", "POST", "/v1/suppressions", map[string]any{"address": "Gone@one.example", "reason": "complaint"}, nil, 201, true},
		{"suppression list", "GET", "/v1/suppressions", nil, nil, 200, true},
		{"unsubscribes since", "GET", "/v1/suppressions?source=unsubscribe&since=2026-12-06T00:00:00Z", nil, nil, 200, true},
		{"none since", "GET", "/v1/suppressions?since=2999-01-01T00:00:00Z", nil, nil, 200, true},
		{"bad source", "GET", "/v1/suppressions?source=spam", nil, nil, 400, false},
		{"suppression page", "GET", "/v1/suppressions?limit=1", nil, nil, 200, true},
		{"suppressions over the limit", "GET", "/v1/suppressions?limit=5000", nil, nil, 400, false},
		{"bad cursor", "GET", "/v1/suppressions?cursor=nonsense", nil, nil, 400, true},
		{"events of a recipient", "GET", "/v1/events?recipient=b@one.example&type=queued,delivered&limit=10", nil, nil, 200, true},
		{"events without a recipient", "GET", "/v1/events", nil, nil, 400, false},
		{"events over the limit", "GET", "/v1/events?recipient=b@one.example&limit=5000", nil, nil, 400, false},
		{"suppressed recipient", "POST", "/v1/messages", map[string]any{"from": "a@src.example", "to": []string{"b@one.example", "gone@one.example"}, "text": "x"}, nil, 422, true},
		{"unsuppress", "DELETE", "/v1/suppressions/gone@one.example", nil, nil, 204, true},
		{"not suppressed", "DELETE", "/v1/suppressions/gone@one.example", nil, nil, 404, true},
		{"no unsubscribe links", "POST", "/v1/messages", map[string]any{"from": "a@src.example", "to": []string{"b@one.example"}, "text": "x", "list_unsubscribe": true}, nil, 422, true},
		{"store down", "POST", "/v1/messages", good, nil, 503, true},
		{"rate limited", "POST", "/v1/messages", good, nil, 429, true},
	}
	var first string
	for _, c := range calls {
		t.Run(c.name, func(t *testing.T) {
			f.fq.fail.Store(c.status == 503)
			var raw []byte
			switch b := c.body.(type) {
			case nil:
			case string:
				raw = []byte(b)
			default:
				raw, _ = json.Marshal(b)
			}
			path := c.path
			if path == "/v1/messages/{first}" {
				path = "/v1/messages/" + first
			}
			req := httptest.NewRequest(c.method, "http://127.0.0.1:8025"+path, bytes.NewReader(raw))
			if raw != nil {
				req.Header.Set("Content-Type", "application/json")
			}
			req.Header.Set("Authorization", "Bearer "+f.key)
			for k, v := range c.hdr {
				if v == "" {
					req.Header.Del(k)
				} else {
					req.Header.Set(k, v)
				}
			}
			route, params, err := router.FindRoute(req)
			if err != nil {
				t.Fatalf("no route in the document: %v", err)
			}
			in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route,
				Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc}}
			if err := openapi3filter.ValidateRequest(ctx, in); (err == nil) != c.validRequest {
				t.Fatalf("request valid per document: %v, want %v", err, c.validRequest)
			}
			req.Body = io.NopCloser(bytes.NewReader(raw))
			rec := httptest.NewRecorder()
			f.srv.Handler().ServeHTTP(rec, req)
			if rec.Code != c.status {
				t.Fatalf("status %d, want %d: %s", rec.Code, c.status, rec.Body)
			}
			if c.name == "accepted" {
				var a Accepted
				_ = json.Unmarshal(rec.Body.Bytes(), &a)
				first = a.IDs[0]
			}
			out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: rec.Code, Header: rec.Header(),
				Options: &openapi3filter.Options{IncludeResponseStatus: true}}
			out.SetBodyBytes(rec.Body.Bytes())
			if err := openapi3filter.ValidateResponse(ctx, out); err != nil {
				t.Fatalf("response does not match docs/openapi.yaml: %v\n%s", err, rec.Body)
			}
		})
	}
}

// TestUnsubscribeMatchesOpenAPI checks the recipients' side of the
// listener, the unsubscribe links, against docs/openapi.yaml: the page,
// the one-click POST, a token that does not open; without a key.
func TestUnsubscribeMatchesOpenAPI(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	doc, err := openapi3.NewLoader().LoadFromFile("../docs/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	router, err := legacy.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}
	links, err := unsubscribe.New(bytes.Repeat([]byte{7}, 32), "http://127.0.0.1:8025/unsubscribe")
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, func(c *Config) {
		c.Unsubscribe = unsubscribe.NewHandler(unsubscribe.HandlerConfig{Links: links, Store: c.Buckets.(*queue.Queue),
			Suppressions: c.Suppressions.(*queue.Suppressions), ID: "test/api"})
	})
	token := links.Token(unsubscribe.Target{Tenant: "acme", Rcpt: "ann@one.example", ID: "m1"})
	// The pages are HTML, which the validator reads as a string.
	openapi3filter.RegisterBodyDecoder("text/html", func(r io.Reader, _ http.Header, _ *openapi3.SchemaRef, _ openapi3filter.EncodingFn) (any, error) {
		b, err := io.ReadAll(r)
		return string(b), err
	})
	defer openapi3filter.UnregisterBodyDecoder("text/html")
	for _, c := range []struct {
		name, method, token, body string
		status                    int
	}{
		{"page", "GET", token, "", 200},
		{"one-click", "POST", token, "List-Unsubscribe=One-Click", 200},
		{"again", "POST", token, "List-Unsubscribe=One-Click", 200},
		{"forged", "POST", token[:len(token)-2] + "AA", "List-Unsubscribe=One-Click", 404},
		{"forged page", "GET", "nosuch", "", 404},
	} {
		t.Run(c.name, func(t *testing.T) {
			var body io.Reader
			if c.body != "" {
				body = strings.NewReader(c.body)
			}
			req := httptest.NewRequest(c.method, "http://127.0.0.1:8025/unsubscribe/"+c.token, body)
			if c.body != "" {
				req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			}
			route, params, err := router.FindRoute(req)
			if err != nil {
				t.Fatalf("no route in the document: %v", err)
			}
			in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route}
			if err := openapi3filter.ValidateRequest(ctx, in); err != nil {
				t.Fatalf("request not valid per document: %v", err)
			}
			if c.body != "" {
				req.Body = io.NopCloser(strings.NewReader(c.body))
			}
			rec := httptest.NewRecorder()
			f.srv.Handler().ServeHTTP(rec, req)
			if rec.Code != c.status {
				t.Fatalf("status %d, want %d: %s", rec.Code, c.status, rec.Body)
			}
			out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: rec.Code, Header: rec.Header(),
				Options: &openapi3filter.Options{IncludeResponseStatus: true}}
			out.SetBodyBytes(rec.Body.Bytes())
			if err := openapi3filter.ValidateResponse(ctx, out); err != nil {
				t.Fatalf("response does not match docs/openapi.yaml: %v", err)
			}
		})
	}
	if s, err := f.srv.cfg.Suppressions.Suppressed(ctx, "acme", "ann@one.example"); err != nil || s == nil || s.Source != queue.SuppressUnsubscribe {
		t.Fatalf("after the one-click POST: %+v, %v", s, err)
	}
}

// TestOpenAPIEnumsCoverTheCode: every problem type the code can answer
// (each Problem constant) is in the document's Problem.type enum, and
// every suppression source in Suppression.source, so that a client
// generated with strict enums can read every answer. A listing of
// unsubscribes, and query-too-broad, were once answered outside them.
func TestOpenAPIEnumsCoverTheCode(t *testing.T) {
	doc, err := openapi3.NewLoader().LoadFromFile("../docs/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	enum := func(schema, prop string) map[string]bool {
		s := doc.Components.Schemas[schema].Value.Properties[prop].Value
		out := map[string]bool{}
		for _, v := range s.Enum {
			out[fmt.Sprint(v)] = true
		}
		return out
	}
	fs := token.NewFileSet()
	f, err := parser.ParseFile(fs, "problem.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	types := enum("Problem", "type")
	n := 0
	for _, decl := range f.Decls {
		g, ok := decl.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, spec := range g.Specs {
			for i, name := range spec.(*ast.ValueSpec).Names {
				if !strings.HasPrefix(name.Name, "Problem") {
					continue
				}
				lit, ok := spec.(*ast.ValueSpec).Values[i].(*ast.BinaryExpr).Y.(*ast.BasicLit)
				if !ok {
					t.Fatalf("%s: not typePrefix + a string", name.Name)
				}
				n++
				if v := typePrefix + strings.Trim(lit.Value, `"`); !types[v] {
					t.Errorf("%s (%s) is not in docs/openapi.yaml's Problem.type enum", name.Name, v)
				}
			}
		}
	}
	if n < 20 {
		t.Fatalf("found %d problem constants in problem.go", n)
	}
	sources := enum("Suppression", "source")
	for _, s := range queue.SuppressionSources {
		if !sources[s] {
			t.Errorf("suppression source %q is not in docs/openapi.yaml's Suppression.source enum", s)
		}
	}
}
