package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/emersion/go-smtp"
	"github.com/rs/zerolog"

	"github.com/outflow/outflow/backoff"
	"github.com/outflow/outflow/internal/fakemx"
	"github.com/outflow/outflow/internal/testutil"
	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/sender"
)

func TestTenantSlotShares(t *testing.T) {
	s := newTenantSlots(32, map[string]float64{"heavy": 3})
	take := func(tenant string, n int) {
		for range n {
			s.Started(tenant)
		}
	}
	// Alone, a tenant takes all but the reserve (32/8 = 4).
	take("a", 27)
	if !s.Admits("a") {
		t.Fatal("a refused its 28th slot while alone")
	}
	take("a", 1)
	if s.Admits("a") {
		t.Fatal("a admitted past the reserve")
	}
	// Another tenant comes: it is under its share (16), a is over it.
	if !s.Admits("b") {
		t.Fatal("b refused with a holding 28 of 32")
	}
	take("b", 1)
	if s.Admits("a") {
		t.Fatal("a admitted over its share of two")
	}
	for range 12 {
		s.end("a", 0)
	}
	if got := s.inflight["a"]; got != 16 || s.Admits("a") {
		t.Fatalf("a holds %d and is admitted: %v, want 16 and refused (its share)", got, s.Admits("a"))
	}
	s.end("a", 0)
	if !s.Admits("a") {
		t.Fatal("a refused below its share")
	}
	// Weights: heavy (3) against a and b (1 each) gets 32×3/5 = 20.
	take("heavy", 20)
	if s.Admits("heavy") {
		t.Fatal("heavy admitted past its weighted share of 20")
	}
	s.end("heavy", 0)
	if !s.Admits("heavy") {
		t.Fatal("heavy refused below its weighted share")
	}
	// Everyone gone: back to the start, the weights' sum without drift.
	for tenant, n := range map[string]int{"a": 15, "b": 1, "heavy": 19} {
		for range n {
			s.end(tenant, 0)
		}
	}
	if len(s.inflight) != 0 || s.sum != 0 {
		t.Fatalf("inflight %v, sum %v after every end", s.inflight, s.sum)
	}
	// Fewer than 8 workers: no reserve, but shares still hold.
	small := newTenantSlots(4, nil)
	small.Started("a")
	small.Started("a")
	small.Started("a")
	if !small.Admits("a") {
		t.Fatal("a alone refused its 4th of 4 slots")
	}
	small.Started("b")
	if small.Admits("a") || !small.Admits("b") {
		t.Fatal("shares of 4 slots between two: a holds 3, b 1; a must wait and b may start")
	}
}

// The hand-off counts a delivery started after the slot has taken it, so
// the slot may count it ended first. The counts come out right whatever
// the order: no delivery left counted, no tenant refused for good.
func TestTenantSlotsEndBeforeStarted(t *testing.T) {
	s := newTenantSlots(32, nil)
	s.Started("b")
	s.end("a", 0) // a's slot ended before its hand-off counted it
	s.Started("a")
	s.end("b", 0)
	if len(s.inflight) != 0 || s.sum != 0 {
		t.Fatalf("inflight %v, sum %v after every delivery ended", s.inflight, s.sum)
	}
	// From a shared lane, alone, all but the reserve (28 of 32); the next
	// ones wait in a slot, up to 4 slots (32/8), and the rest go back.
	for range 28 {
		if v := s.TryStart("a"); v != slotStart {
			t.Fatalf("a got %v with %d in flight, alone", v, s.inflight["a"])
		}
	}
	for range 4 {
		if v := s.TryStart("a"); v != slotWait {
			t.Fatalf("a past the reserve got %v, want to wait", v)
		}
	}
	if v := s.TryStart("a"); v != slotBack {
		t.Fatalf("a past the reserve with 4 slots waiting got %v, want back", v)
	}
	if s.StartWaiting("a") {
		t.Fatal("a waiting started past the reserve")
	}
	if v := s.TryStart("b"); v != slotStart {
		t.Fatalf("b got %v with a holding its share and more", v)
	}
	// a's share is now 16: its waiting envelopes start only below it.
	for range 12 {
		s.end("a", 0)
	}
	if s.StartWaiting("a") {
		t.Fatalf("a waiting started holding %d, its share 16", s.inflight["a"])
	}
	s.end("a", 0)
	if !s.StartWaiting("a") {
		t.Fatalf("a waiting refused holding %d, under its share 16", s.inflight["a"])
	}
	for range 3 {
		s.StopWaiting()
	}
	if v := s.TryStart("a"); v != slotWait || s.waiting != 1 {
		t.Fatalf("a got %v with %d waiting, want to wait, the only one", v, s.waiting)
	}
}

// blockingSender holds every send to slow.test until release closes (a
// host that accepts a connection and never answers), and counts them.
type blockingSender struct {
	Sender
	release chan struct{}
	blocked atomic.Int32
}

func (b *blockingSender) Send(ctx context.Context, m *sender.Message) sender.Result {
	if m.Domain == "slow.test" {
		b.blocked.Add(1)
		select {
		case <-b.release:
		case <-ctx.Done():
		}
	}
	return b.Sender.Send(ctx, m)
}

// A tenant whose mail goes to a host that holds every session does not
// take every delivery slot: another tenant's message, coming after the
// first filled all it may hold, is delivered at once, not once a slow
// session ends (the command timeout, 5 minutes by default).
func TestSlowTenantLeavesSlotsForOthers(t *testing.T) {
	e := newEnvMX(t, fakemx.Options{})
	bs := &blockingSender{Sender: e.snd, release: make(chan struct{})}
	t.Cleanup(func() {
		select {
		case <-bs.release:
		default:
			close(bs.release)
		}
	})
	const workers = 8 // a tenant alone holds 7
	e.startPool(func(c *Config) { c.Workers, c.Sender = workers, bs })
	submit := e.submitAs
	for range 12 {
		submit("campaign", "r@slow.test")
	}
	for end := time.Now().Add(20 * time.Second); bs.blocked.Load() < workers-1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("only %d sends to the slow host started", bs.blocked.Load())
		}
	}
	id := submit("shop", "r@fast.test")
	e.waitEvent(id, queue.EventDelivered)
	if n := bs.blocked.Load(); n != workers-1 {
		t.Fatalf("%d slow sends in flight, want the campaign's %d (all but the reserve)", n, workers-1)
	}
	close(bs.release)
}

// BenchmarkTenantSlots is what each delivery adds to the hand-off: the
// pull asks, counts it started, and the slot counts it ended.
func BenchmarkTenantSlots(b *testing.B) {
	s := newTenantSlots(32, nil)
	tenants := []string{"a", "b", "c", "d"}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			t := tenants[i%len(tenants)]
			i++
			if s.Admits(t) {
				s.Started(t)
				s.end(t, 0)
			}
		}
	})
}

// An envelope of a tenant at its share (another tenant has deliveries in
// flight) that comes due on the retry lane, which every tenant shares, is
// not sent past the share: it waits in a slot, without an attempt, until
// one of its tenant's deliveries ends, and then goes at once (it used to
// go back to its lane for 30 s); the other tenant's mail still finds a
// slot free meanwhile.
func TestSharedLaneEnvelopeWaitsForItsTenantsTurn(t *testing.T) {
	var tries atomic.Int32
	e := newEnv(t, func(stage fakemx.Stage, arg string) *smtp.SMTPError {
		if stage == fakemx.StageRcpt && strings.Contains(arg, "retry.test") && tries.Add(1) == 1 {
			return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "try again later"}
		}
		return nil
	})
	bs := &blockingSender{Sender: e.snd, release: make(chan struct{})}
	t.Cleanup(func() {
		select {
		case <-bs.release:
		default:
			close(bs.release)
		}
	})
	var logs syncBuf
	const workers = 8 // a tenant alone holds 7
	slowRetry := backoff.Backoff{Lane: backoff.LaneRetry, Base: time.Second, Min: time.Second, Cap: time.Second, Multiplier: 2, ContentionWindow: 10 * time.Millisecond}
	e.startPool(func(c *Config) { c.Workers, c.Sender, c.Retry, c.Logger = workers, bs, slowRetry, zerolog.New(&logs) })
	submit := e.submitAs
	deferred := submit("campaign", "r@retry.test")
	e.waitEvent(deferred, queue.EventDeferred) // due again in a second
	// shop in flight too: the campaign's share is 4 of the 8 slots, and
	// it holds them.
	submit("shop", "r@slow.test")
	for range workers / 2 {
		submit("campaign", "r@slow.test")
	}
	for end := time.Now().Add(20 * time.Second); bs.blocked.Load() < workers/2+1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("only %d sends to the slow host started", bs.blocked.Load())
		}
	}
	testutil.WaitFor(t, 20*time.Second, "the retry waiting in a slot for its tenant's turn", func() bool {
		return strings.Contains(logs.String(), `"msg_id":"`+deferred+`"`) && strings.Contains(logs.String(), "waiting in a slot")
	})
	if n := tries.Load(); n != 1 {
		t.Fatalf("retry.test tried %d times while its tenant held its share", n)
	}
	id := submit("shop", "r@fast.test")
	e.waitEvent(id, queue.EventDelivered)
	bs.release <- struct{}{} // one slow session ends: the campaign is under its share
	e.waitEvent(deferred, queue.EventDelivered)
	if strings.Contains(logs.String(), "local-tenant-share") {
		t.Fatalf("an envelope went back to its lane, with no other slot waiting:\n%s", logs.String())
	}
	close(bs.release)
}

// retryBlocker passes each message's first send to Sender and holds its
// later ones to slow.test until release closes: mail that a host deferred
// and that, due again, finds the host answering no more.
type retryBlocker struct {
	Sender
	release chan struct{}
	blocked atomic.Int32
	mu      sync.Mutex
	seen    map[string]bool
}

func (b *retryBlocker) Send(ctx context.Context, m *sender.Message) sender.Result {
	b.mu.Lock()
	again := b.seen[m.ID]
	b.seen[m.ID] = true
	b.mu.Unlock()
	if again && m.Domain == "slow.test" {
		b.blocked.Add(1)
		select {
		case <-b.release:
		case <-ctx.Done():
		}
	}
	return b.Sender.Send(ctx, m)
}

// A tenant alone whose retries go to a host that holds every session keeps
// the reserve free as its fresh mail does: another tenant's message,
// coming after the retries filled all the first may hold, is delivered at
// once, not once a held session ends (up to the command timeout). The
// retry past the reserve waits in a slot, which delivers the other
// tenant's message meanwhile.
func TestLoneTenantsRetriesKeepTheReserve(t *testing.T) {
	e := newEnv(t, func(stage fakemx.Stage, arg string) *smtp.SMTPError {
		if stage == fakemx.StageRcpt && strings.Contains(arg, "slow.test") {
			return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "try again later"}
		}
		return nil
	})
	rb := &retryBlocker{Sender: e.snd, release: make(chan struct{}), seen: map[string]bool{}}
	t.Cleanup(func() { close(rb.release) })
	var logs syncBuf
	const workers = 8 // a tenant alone holds 7, one slot waits
	slowRetry := backoff.Backoff{Lane: backoff.LaneRetry, Base: time.Second, Min: time.Second, Cap: time.Second, Multiplier: 2, ContentionWindow: 10 * time.Millisecond}
	e.startPool(func(c *Config) { c.Workers, c.Sender, c.Retry, c.Logger = workers, rb, slowRetry, zerolog.New(&logs) })
	submit := e.submitAs
	for i := range 12 {
		submit("campaign", fmt.Sprintf("r%d@slow.test", i))
	}
	testutil.WaitFor(t, 20*time.Second, "the campaign's retries to hold all it may, and one more to wait (or every slot)", func() bool {
		n := rb.blocked.Load()
		return n == workers-1 && strings.Contains(logs.String(), "waiting in a slot") || n == workers
	})
	id := submit("shop", "r@fast.test")
	e.waitEvent(id, queue.EventDelivered)
	if n := rb.blocked.Load(); n != workers-1 {
		t.Fatalf("%d of the campaign's retries in flight, want %d (all but the reserve)", n, workers-1)
	}
}

// TestBackForFollowsTheTenantsDeliveries: an envelope no slot could take
// waits on its lane about twice as long as its tenant's deliveries hold a
// slot (1 s at least), not a fixed half minute: a tenant whose
// deliveries wait 1.6 s for the rate's turns is taken again within
// seconds, one whose hosts hold sessions for minutes after 30 s.
func TestBackForFollowsTheTenantsDeliveries(t *testing.T) {
	s := newTenantSlots(32, nil)
	if got := s.BackFor("new"); got != tenantShareRetry {
		t.Fatalf("a tenant with no delivery ended: %v, want %v", got, tenantShareRetry)
	}
	for range 20 {
		s.Started("fast")
		s.end("fast", 1600*time.Millisecond)
		s.Started("slow")
		s.end("slow", 5*time.Minute)
		s.Started("instant")
		s.end("instant", time.Millisecond)
	}
	s.Started("fast")
	s.end("fast", 0) // not started: does not count
	if got := s.BackFor("fast"); got < 3*time.Second || got > 3400*time.Millisecond {
		t.Errorf("fast: %v, want about 3.2 s", got)
	}
	if got := s.BackFor("slow"); got != tenantShareRetry {
		t.Errorf("slow: %v, want %v", got, tenantShareRetry)
	}
	if got := s.BackFor("instant"); got != backMin {
		t.Errorf("instant: %v, want %v", got, backMin)
	}
}

// TestSentBackForAsLongAsTheTenantsDeliveries: retries of a tenant at its
// share that no slot may take, past the one waiting in a slot, go back to
// their lane for twice as long as the tenant's deliveries hold a slot
// (here their first attempts, milliseconds: the least, a second), not for
// half a minute while the slots stand idle.
func TestSentBackForAsLongAsTheTenantsDeliveries(t *testing.T) {
	var tries atomic.Int32
	e := newEnv(t, func(stage fakemx.Stage, arg string) *smtp.SMTPError {
		if stage == fakemx.StageRcpt && strings.Contains(arg, "retry.test") && tries.Add(1) <= 4 {
			return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "try again later"}
		}
		return nil
	})
	bs := &blockingSender{Sender: e.snd, release: make(chan struct{})}
	t.Cleanup(func() { close(bs.release) })
	var logs syncBuf
	const workers = 8
	slowRetry := backoff.Backoff{Lane: backoff.LaneRetry, Base: time.Second, Min: time.Second, Cap: time.Second, Multiplier: 2, ContentionWindow: 10 * time.Millisecond}
	e.startPool(func(c *Config) { c.Workers, c.Sender, c.Retry, c.Logger = workers, bs, slowRetry, zerolog.New(&logs) })
	submit := e.submitAs
	for i := range 4 {
		e.waitEvent(submit("campaign", fmt.Sprintf("r%d@retry.test", i)), queue.EventDeferred) // due again in a second
	}
	// shop in flight: the campaign's share is 4 of the 8 slots, and it
	// holds them; 3 are free for its 4 retries, one of which waits.
	submit("shop", "r@slow.test")
	for range workers / 2 {
		submit("campaign", "r@slow.test")
	}
	testutil.WaitFor(t, 20*time.Second, "a retry sent back", func() bool { return strings.Contains(logs.String(), "local-tenant-share") })
	for _, l := range strings.Split(logs.String(), "\n") {
		var line struct {
			Rule string    `json:"rule"`
			Next time.Time `json:"next_attempt_at"`
		}
		if json.Unmarshal([]byte(l), &line) != nil || line.Rule != "local-tenant-share" {
			continue
		}
		if wait := time.Until(line.Next); wait > 5*time.Second {
			t.Fatalf("a retry sent back for %v", wait)
		}
	}
}
