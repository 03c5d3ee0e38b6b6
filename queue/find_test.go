package queue

import (
	"context"
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// FindEvents finds the events naming a recipient, in any case, across
// tenants and types, and narrows by tenant, type, time and count.
func TestFindEvents(t *testing.T) {
	q, _ := startQueue(t)
	ctx := context.Background()
	pub := func(typ, tenant, id string, rcpts ...string) {
		t.Helper()
		if err := q.PublishEvent(ctx, typ, &Event{ID: id, Tenant: tenant, Dest: "dest.example", Recipients: rcpts}); err != nil {
			t.Fatal(err)
		}
	}
	pub(EventQueued, "shop", "q1") // names nobody
	pub(EventDelivered, "shop", "d1", "Ann@Dest.example", "bob@dest.example")
	pub(EventBounced, "shop", "b1", "ann@dest.example")
	pub(EventDelivered, "news", "d2", "ann@dest.example")
	pub(EventDelivered, "shop", "d3", "anne@dest.example")  // a longer address is not ann's
	pub(EventDelivered, "shop", "d4", "joann@dest.example") // contains ann@dest.example
	// A tenant in shop's shard, and an event of the layout before tenant
	// shards (every tenant's subjects): neither is shop's.
	twin := ""
	for i := 0; twin == ""; i++ {
		if n := "t" + strconv.Itoa(i); eventTenantShard(n) == eventTenantShard("shop") {
			twin = n
		}
	}
	pub(EventDelivered, twin, "s1", "ann@dest.example")
	legacy, _ := json.Marshal(&Event{Type: EventDelivered, Time: time.Now().UTC(), ID: "l1", Tenant: "other", Recipients: []string{"ann@dest.example"}})
	if _, err := q.js.Publish(ctx, subjEvents+EventDelivered+"."+legacyEventShard("l1"), legacy); err != nil {
		t.Fatal(err)
	}
	mid := time.Now()
	pub(EventDeferred, "news", "f1", "<ANN@dest.example>")

	for _, tc := range []struct {
		q    EventQuery
		want string
	}{
		{EventQuery{Rcpt: "ann@dest.example"}, "d1,b1,d2,s1,l1,f1"},
		{EventQuery{Rcpt: " <ANN@DEST.EXAMPLE> "}, "d1,b1,d2,s1,l1,f1"},
		{EventQuery{Rcpt: "ann@dest.example", Tenant: "shop"}, "d1,b1"},
		{EventQuery{Rcpt: "ann@dest.example", Tenant: "other"}, "l1"},
		{EventQuery{Rcpt: "ann@dest.example", Types: []string{EventDelivered, EventDeferred}}, "d1,d2,s1,l1,f1"},
		{EventQuery{Rcpt: "ann@dest.example", Tenant: "news", Types: []string{EventDeferred}}, "f1"},
		{EventQuery{Rcpt: "ann@dest.example", Since: mid}, "f1"},
		{EventQuery{Rcpt: "ann@dest.example", Limit: 2}, "l1,f1"},
		{EventQuery{Rcpt: "ann@dest.example", Limit: 5}, "b1,d2,s1,l1,f1"},
		{EventQuery{Rcpt: "nobody@dest.example"}, ""},
	} {
		evs, scanned, err := q.FindEvents(ctx, tc.q)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, ev := range evs {
			got = append(got, ev.ID)
		}
		if strings.Join(got, ",") != tc.want || scanned == 0 {
			t.Errorf("%+v: %v (%d scanned), want %s", tc.q, got, scanned, tc.want)
		}
	}
	// A message not yet tried is found by its queued event.
	ids, err := q.Enqueue(ctx, &Submission{Tenant: "shop", From: "a@src.example", Rcpts: []string{"Zed@dest.example"},
		Body: []byte("Subject: x\r\n\r\nx\r\n")})
	if err != nil {
		t.Fatal(err)
	}
	if evs, _, err := q.FindEvents(ctx, EventQuery{Rcpt: "zed@dest.example", Tenant: "shop"}); err != nil || len(evs) != 1 ||
		evs[0].Type != EventQueued || evs[0].ID != ids[0] {
		t.Fatalf("a queued message by its recipient: %+v, %v", evs, err)
	}
	if _, _, err := q.FindEvents(ctx, EventQuery{Rcpt: " "}); err == nil {
		t.Error("no recipient: no error")
	}
	for _, bad := range []string{"*", ">", "deli.vered", "Delivered", "", "bounce", "bogus"} {
		if _, _, err := q.FindEvents(ctx, EventQuery{Rcpt: "ann@dest.example", Types: []string{EventDelivered, bad}}); err == nil {
			t.Errorf("type %q: no error", bad)
		}
	}
	// A tenant's query reads its shard only.
	_, all, _ := q.FindEvents(ctx, EventQuery{Rcpt: "ann@dest.example"})
	_, shop, _ := q.FindEvents(ctx, EventQuery{Rcpt: "ann@dest.example", Tenant: "shop"})
	if shop >= all {
		t.Errorf("the tenant's query read %d events of %d", shop, all)
	}
	// Another tenant of the same shard: its events are not counted in
	// shop's figure, which would tell shop how much mail it sends.
	neighbour := ""
	for i := 0; neighbour == ""; i++ {
		if n := "t" + strconv.Itoa(i); eventTenantShard(n) == eventTenantShard("shop") {
			neighbour = n
		}
	}
	for i := range 5 {
		pub(EventBounced, neighbour, "n"+strconv.Itoa(i), "zed@dest.example")
	}
	if _, again, _ := q.FindEvents(ctx, EventQuery{Rcpt: "ann@dest.example", Tenant: "shop"}); again != shop {
		t.Errorf("shop's query read %d events after its neighbour %s published 5, %d before", again, neighbour, shop)
	}
}

func TestContainsFoldASCII(t *testing.T) {
	for _, tc := range []struct {
		b, needle string
		want      bool
	}{
		{`"Ann@Dest.Example"`, "ann@dest.example", true},
		{`"ann@dest.example"`, "ann@dest.example", true},
		{`"an@dest.example"`, "ann@dest.example", false},
		{`xxA`, "a", true},
		{`ann@dest.exampl`, "ann@dest.example", false},
		{``, "a", false},
		{`x`, "", true},
		{`[ann@dest.example`, "{ann@dest.example", false},
	} {
		if got := containsFoldASCII([]byte(tc.b), []byte(tc.needle)); got != tc.want {
			t.Errorf("containsFoldASCII(%q, %q) = %v", tc.b, tc.needle, got)
		}
	}
}

// go test -run '^$' -bench FindEvents -benchmem ./queue: a look-up
// through 20,000 events, and its cost per event read (ns/event).
func BenchmarkFindEvents(b *testing.B) {
	q, _ := startQueueWith(b, Options{})
	ctx := context.Background()
	const n = 20000
	for i := range n {
		q.Event(EventDelivered, &Event{ID: "id" + strconv.Itoa(i), Tenant: "t" + strconv.Itoa(i%50), Dest: "dest.example",
			Recipients: []string{"user" + strconv.Itoa(i) + "@dest.example"}, Reason: strings.Repeat("x", 400)})
	}
	if err := q.asyncStored(ctx); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		if _, scanned, err := q.FindEvents(ctx, EventQuery{Rcpt: "user77@dest.example"}); err != nil || scanned != n {
			b.Fatal(scanned, err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/event")
}

// TestEventTypesListsEveryType: every Event* type constant of the package
// is in EventTypes (a look-up refuses a type not there) and can be a
// subject token.
func TestEventTypesListsEveryType(t *testing.T) {
	fset := token.NewFileSet()
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(node ast.Node) bool {
			vs, ok := node.(*ast.ValueSpec)
			if !ok || len(vs.Values) != 1 {
				return true
			}
			lit, ok := vs.Values[0].(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING || !strings.HasPrefix(vs.Names[0].Name, "Event") {
				return true
			}
			typ, _ := strconv.Unquote(lit.Value)
			if !regexp.MustCompile(`^[a-z][a-z0-9-]*$`).MatchString(typ) {
				return true // not a type (a subject prefix, a header)
			}
			n++
			if !slices.Contains(EventTypes, typ) {
				t.Errorf("%s = %q is not in EventTypes", vs.Names[0].Name, typ)
			}
			return true
		})
	}
	if n < len(EventTypes) {
		t.Errorf("found %d type constants, EventTypes has %d", n, len(EventTypes))
	}
}
