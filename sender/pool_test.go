package sender

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/foxcpp/go-mockdns"

	"github.com/outflow/outflow/internal/fakemx"
)

// TestPoolIdleCapEvictsTheOldest: past maxIdle the connection idle longest
// goes, whichever its host, and its host's open count with it; one taken
// and put back is the newest again. The order of puts stays in proportion
// to the idle connections.
func TestPoolIdleCapEvictsTheOldest(t *testing.T) {
	p := newPool(0, 3, time.Minute)
	ctx := context.Background()
	open := func(key string) *client {
		t.Helper()
		c, slot, _, err := p.get(ctx, key)
		if err != nil || c != nil || !slot {
			t.Fatalf("get %s: %v %v %v, want a slot", key, c, slot, err)
		}
		return &client{key: key}
	}
	var cs []*client
	for i := range 5 {
		c := open(fmt.Sprintf("h%d", i))
		cs = append(cs, c)
		keep, evicted := p.put(c, true)
		if !keep {
			t.Fatalf("h%d not kept", i)
		}
		switch {
		case i < 3 && evicted != nil:
			t.Fatalf("h%d evicted %s under the cap", i, evicted.key)
		case i >= 3 && evicted != cs[i-3]:
			t.Fatalf("put of h%d evicted %v, want h%d, idle longest", i, evicted, i-3)
		}
	}
	// h2 is now the oldest; taken and put back, it is the newest.
	if c, _, _, _ := p.get(ctx, "h2"); c != cs[2] {
		t.Fatalf("h2's idle connection not handed out: %v", c)
	}
	p.put(cs[2], true)
	c5 := open("h5")
	if _, evicted := p.put(c5, true); evicted != cs[3] {
		t.Fatalf("evicted %v, want h3 (h2 was used since)", evicted)
	}
	if p.idle != 3 {
		t.Fatalf("idle %d, want 3", p.idle)
	}
	for _, k := range []string{"h0", "h1", "h3"} {
		if hp := p.hosts[k]; hp.open != 0 || len(hp.idle) != 0 {
			t.Errorf("%s: open %d, idle %d after its eviction", k, hp.open, len(hp.idle))
		}
	}
	for range 1000 {
		c, _, _, _ := p.get(ctx, "h5")
		p.put(c, true)
	}
	if len(p.order) > 2*p.idle+64 {
		t.Errorf("order holds %d entries for %d idle connections", len(p.order), p.idle)
	}
}

// TestIdleConnectionsCapped: a sender that reaches many MX hosts keeps at
// most MaxIdleConns of their connections open between messages, the most
// recently used: the host used longest ago connects afresh.
func TestIdleConnectionsCapped(t *testing.T) {
	w := newWorld(t)
	fake := fakemx.Start(t, fakemx.Options{})
	w.route("127.0.0.2", fake)
	for i := range 6 {
		d := fmt.Sprintf("d%d.test", i)
		w.zones[d+"."] = mockdns.Zone{MX: []net.MX{{Host: "mx." + d + ".", Pref: 10}}}
		w.host("mx."+d, "127.0.0.2")
	}
	cfg := w.config()
	cfg.MaxIdleConns = 3
	s := w.sender(cfg)
	send := func(i int) bool {
		t.Helper()
		d := fmt.Sprintf("d%d.test", i)
		r := s.Send(ctxT(t), msg(d, "bob@"+d))
		checkDelivered(t, r)
		return r.Reused
	}
	for i := range 6 {
		send(i)
	}
	if send(0) {
		t.Fatal("d0's connection, idle longest, was kept past the cap")
	}
	if !send(5) || !send(4) {
		t.Fatal("the most recently used connections were not kept")
	}
	if got := fake.Connections(); got != 7 {
		t.Errorf("%d connections, want 7 (six hosts, and d0's again)", got)
	}
}

// BenchmarkPoolGetPut is the pool's share of every send that reuses a
// connection: a get that finds it idle and the put after the message.
func BenchmarkPoolGetPut(b *testing.B) {
	p := newPool(0, DefaultMaxIdleConns, time.Minute)
	ctx := context.Background()
	for i := range 100 {
		p.get(ctx, fmt.Sprintf("h%d", i))
		p.put(&client{key: fmt.Sprintf("h%d", i), dest: fmt.Sprintf("d%d.test", i)}, true)
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		c, _, _, _ := p.get(ctx, "h7")
		p.put(c, true)
	}
}
