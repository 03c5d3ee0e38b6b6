package queue

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// TestTenantBacklogDoesNotDelayOthers: tenant A has 200 messages waiting
// when tenant B submits one; B's message must be among the first handed
// out, not behind A's backlog.
//
// The test starts reading once the server has handed B's message to this
// worker's pull: reading at once would measure only how soon B's pull got
// its first answer while A's flowed, and on a machine loaded with other
// test binaries that is long enough for dozens of A's messages to reach a
// reader that does nothing with them.
func TestTenantBacklogDoesNotDelayOthers(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for range 200 {
		if _, err := q.Enqueue(ctx, &Submission{Tenant: "bulk", From: "a@a.example", Rcpts: []string{"r@d.example"}, Body: []byte("x\r\n")}); err != nil {
			t.Fatal(err)
		}
	}
	ids, err := q.Enqueue(ctx, &Submission{Tenant: "urgent", From: "b@b.example", Rcpts: []string{"r@d.example"}, Body: []byte("y\r\n")})
	if err != nil {
		t.Fatal(err)
	}
	work, err := q.Messages(ctx, LaneWork, 2)
	if err != nil {
		t.Fatal(err)
	}
	urgent, err := q.lanes[LaneWork].Consumer(ctx, tenantConsumer("urgent"))
	if err != nil {
		t.Fatal(err)
	}
	for {
		ci, err := urgent.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ci.NumAckPending == 1 {
			break // handed to the pull, not yet to the reader
		}
		select {
		case <-ctx.Done():
			t.Fatal("tenant urgent's message was never handed to the worker's pull")
		case <-time.After(time.Millisecond):
		}
	}
	for i := 1; i <= 10; i++ {
		d := next(t, work)
		if err := d.Skip(ctx); err != nil {
			t.Fatal(err)
		}
		if d.Env.ID == ids[0] {
			t.Logf("tenant urgent's message handed out at position %d of 201", i)
			return
		}
	}
	t.Fatal("tenant urgent's message was not among the first 10 handed out: it waited behind tenant bulk's backlog")
}

// TestNewTenantIsPulledAtOnce: a worker already pulling learns of a new
// tenant's consumer from the announcement, not from its periodic look
// (made an hour long here, so only the announcement can deliver).
func TestNewTenantIsPulledAtOnce(t *testing.T) {
	q, _ := startQueue(t)
	q.times.refresh = time.Hour
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// A tenant that exists before the worker starts: receiving its mail
	// proves the worker's first look is over.
	if _, err := q.Enqueue(ctx, &Submission{Tenant: "early", From: "a@a.example", Rcpts: []string{"r@d.example"}, Body: []byte("x\r\n")}); err != nil {
		t.Fatal(err)
	}
	work, err := q.Messages(ctx, LaneWork, 1)
	if err != nil {
		t.Fatal(err)
	}
	_ = next(t, work).Skip(ctx)
	ids, err := q.Enqueue(ctx, &Submission{Tenant: "newcomer", From: "a@a.example", Rcpts: []string{"r@d.example"}, Body: []byte("x\r\n")})
	if err != nil {
		t.Fatal(err)
	}
	d := next(t, work)
	if d.Env.ID != ids[0] {
		t.Fatalf("got %s, want %s", d.Env.ID, ids[0])
	}
	_ = d.Skip(ctx)
}

// TestWorkOrphans: mail published straight to the work stream for a tenant
// without a consumer is noticed (and adopted, after which it is handed
// out); mail covered by consumers, pending or pulled and not yet
// acknowledged, is not mistaken for orphaned.
func TestWorkOrphans(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	orphans := func() bool {
		t.Helper()
		o, err := q.workOrphans(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
	// nats-server updates a consumer's pending count after the store
	// returns, so right after a publish the check may answer "maybe";
	// covered mail must stop looking orphaned within a moment.
	covered := func(what string) {
		t.Helper()
		for end := time.Now().Add(5 * time.Second); orphans(); {
			if time.Now().After(end) {
				t.Fatal(what)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if orphans() {
		t.Fatal("an empty work stream has orphans")
	}
	if _, err := q.Enqueue(ctx, &Submission{Tenant: "known", From: "a@a.example", Rcpts: []string{"r@d.example"}, Body: []byte("x\r\n")}); err != nil {
		t.Fatal(err)
	}
	covered("mail of a tenant with a consumer counted as orphaned")
	// Published by a client straight to NATS, for a tenant nobody has
	// created a consumer for.
	env := &Envelope{ID: "direct1", MsgID: "direct1", Tenant: "stranger", From: "a@a.example", Rcpts: []string{"r@d.example"},
		Dest: "d.example", BodyRef: "direct1", Size: 3, Parts: 1}
	m, err := env.Encode(workSubject("stranger", "d.example", "direct1"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	if !orphans() {
		t.Fatal("mail of a tenant without a consumer was not noticed")
	}
	if _, err := q.adoptTenants(ctx); err != nil {
		t.Fatal(err)
	}
	covered("orphans remain after adoption")
	// Both envelopes are handed out; while they are held unacknowledged
	// they are still covered (ack pending), not orphaned.
	work, err := q.Messages(ctx, LaneWork, 2)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*Delivery{}
	for len(got) < 2 {
		d := next(t, work)
		got[d.Env.Tenant] = d
	}
	if got["stranger"] == nil || got["known"] == nil {
		t.Fatalf("handed out %v", got)
	}
	covered("envelopes awaiting their ack counted as orphaned")
	for _, d := range got {
		_ = d.Skip(ctx)
	}
}

// BenchmarkAdoptTenantsBacklog: the periodic look for tenants without a
// consumer, with 100,000 fresh envelopes waiting, all covered.
func BenchmarkAdoptTenantsBacklog(b *testing.B) {
	q, _ := startQueueWith(b, Options{})
	ctx := context.Background()
	const n = 100000
	for i := range n {
		if _, err := q.js.PublishAsync("outflow.work.app.d_test.x"+strconv.Itoa(i), []byte("x")); err != nil {
			b.Fatal(err)
		}
	}
	<-q.js.PublishAsyncComplete()
	if _, err := q.adoptTenants(ctx); err != nil { // creates the consumer
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := q.adoptTenants(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// TestClientTenantConsumerFollowsDaemon: a client that sets nothing up
// (outflow submit, with default options) creates a new tenant's consumer
// with the daemon's ack wait and max ack pending, not its own defaults,
// and leaves a consumer the daemon made as it was.
func TestClientTenantConsumerFollowsDaemon(t *testing.T) {
	daemon, emb := startQueueWith(t, Options{AckWait: 5 * time.Minute, MaxAckPending: 77})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client, err := connectTo(emb, Options{NoSetup: true})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	submit := func(q *Queue, tenant string) {
		t.Helper()
		if _, err := q.Enqueue(ctx, &Submission{Tenant: tenant, From: "a@a.example", Rcpts: []string{"r@d.example"}, Body: []byte("x\r\n")}); err != nil {
			t.Fatal(err)
		}
	}
	check := func(tenant string) {
		t.Helper()
		c, err := daemon.js.Consumer(ctx, StreamWork, tenantConsumer(tenant))
		if err != nil {
			t.Fatal(err)
		}
		if cfg := c.CachedInfo().Config; cfg.AckWait != 5*time.Minute || cfg.MaxAckPending != 77 {
			t.Errorf("tenant %s: ack wait %v, max ack pending %d; want the daemon's 5m and 77", tenant, cfg.AckWait, cfg.MaxAckPending)
		}
	}
	submit(client, "fresh") // no consumer yet: the client creates it
	check("fresh")
	submit(daemon, "known") // the daemon's
	submit(client, "known")
	check("known")
}

// workOrphans reports whether the work stream may hold messages that no
// consumer covers.
func (q *Queue) workOrphans(ctx context.Context) (bool, error) {
	msgs, _, err := q.workState(ctx, false)
	if err != nil {
		return true, err
	}
	if msgs == 0 {
		return false, nil
	}
	c, err := q.workConsumers(ctx)
	if err != nil {
		return true, err
	}
	return msgs > c.covered, nil
}

// waitConsumers polls the tenants' work consumers until ok holds for every
// one of them, or fails with what after 15 s.
func waitConsumers(t *testing.T, q *Queue, tenants []string, what string, ok func(*jetstream.ConsumerInfo) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	for _, tenant := range tenants {
		for {
			c, err := q.lanes[LaneWork].Consumer(ctx, tenantConsumer(tenant))
			if err != nil {
				t.Fatal(err)
			}
			if ci := c.CachedInfo(); ok(ci) {
				break
			}
			select {
			case <-ctx.Done():
				t.Fatalf("%s: tenant %s: %+v", what, tenant, c.CachedInfo())
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
}

// waitIdle polls until q pulls no tenant.
func waitIdle(t *testing.T, q *Queue) {
	t.Helper()
	for end := time.Now().Add(15 * time.Second); q.pulling.Load() != 0; {
		if time.Now().After(end) {
			t.Fatalf("%d tenants still pulled", q.pulling.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func tenantNames(n int) []string {
	s := make([]string, n)
	for i := range s {
		s[i] = "t" + strconv.Itoa(i)
	}
	return s
}

// TestIdleTenantsWaitAtNoServer: once a tenant's mail is out, the worker
// stops pulling it, so a thousand tenants that sent once leave no pull
// request waiting at the server and no loop in the worker; a tenant's next
// message starts its loop again at once, by its wake-up (the periodic look
// is an hour here).
func TestIdleTenantsWaitAtNoServer(t *testing.T) {
	q, _ := startQueue(t)
	q.times.wait, q.times.refresh = 300*time.Millisecond, time.Hour
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	tenants := tenantNames(20)
	work, err := q.Messages(ctx, LaneWork, 4)
	if err != nil {
		t.Fatal(err)
	}
	submit := func(tenant string) string {
		t.Helper()
		ids, err := q.Enqueue(ctx, &Submission{Tenant: tenant, From: "a@a.example", Rcpts: []string{"r@d.example"}, Body: []byte("x\r\n")})
		if err != nil {
			t.Fatal(err)
		}
		return ids[0]
	}
	for _, tenant := range tenants {
		submit(tenant)
	}
	for range tenants {
		if err := next(t, work).Skip(ctx); err != nil {
			t.Fatal(err)
		}
	}
	waitIdle(t, q)
	waitConsumers(t, q, tenants, "a pull request still waits for a tenant with no mail", func(ci *jetstream.ConsumerInfo) bool {
		return ci.NumWaiting == 0 && ci.NumAckPending == 0
	})
	id := submit("t7")
	if d := next(t, work); d.Env.ID != id {
		t.Fatalf("got %s, want %s", d.Env.ID, id)
	} else {
		_ = d.Skip(ctx)
	}
}

// unannouncedMail has q's worker deliver one message of tenant and go
// idle, then stores mail for the tenant with no wake-up (as a client
// publishing straight to the work stream would, or a process of an earlier
// release, or one whose wake-up was lost): envelope id, to come out of the
// returned channel.
func unannouncedMail(t *testing.T, ctx context.Context, q *Queue, tenant, id string) <-chan *Delivery {
	t.Helper()
	if _, err := q.Enqueue(ctx, &Submission{Tenant: tenant, From: "a@a.example", Rcpts: []string{"r@d.example"}, Body: []byte("x\r\n")}); err != nil {
		t.Fatal(err)
	}
	work, err := q.Messages(ctx, LaneWork, 1)
	if err != nil {
		t.Fatal(err)
	}
	_ = next(t, work).Skip(ctx)
	waitIdle(t, q)
	env := &Envelope{ID: id, MsgID: id, Tenant: tenant, From: "a@a.example", Rcpts: []string{"r@d.example"},
		Dest: "d.example", Body: []byte("x\r\n"), Size: 3, Parts: 1}
	m, err := env.Encode(workSubject(tenant, "d.example", id))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	return work
}

// TestMailWithoutWakeUpIsFound: mail stored with no wake-up for a tenant
// nobody pulls is found by the periodic look at the consumers' pending
// counts.
func TestMailWithoutWakeUpIsFound(t *testing.T) {
	q, _ := startQueue(t)
	q.times.wait, q.times.refresh = 300*time.Millisecond, 200*time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	work := unannouncedMail(t, ctx, q, "quiet", "direct2")
	if d := next(t, work); d.Env.ID != "direct2" {
		t.Fatalf("got %s", d.Env.ID)
	}
}

// TestPulledMailStaysNearTheBuffer: with 30 tenants' mail waiting, a
// buffer of 8 and nothing started yet (no rate to allow more), the
// worker's pulls ask for the buffer shared among the tenants' loops, so
// what it holds pulled and not started stays near the buffer (each loop's
// first pull asks for 8 divided by the loops running then: at most 8, 4,
// 2, 2, 1, ...: 42 in all), not 30 times the buffer.
func TestPulledMailStaysNearTheBuffer(t *testing.T) {
	q, _ := startQueue(t)
	q.times.refresh = time.Hour
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	tenants := tenantNames(30)
	for _, tenant := range tenants {
		for range 5 {
			if _, err := q.Enqueue(ctx, &Submission{Tenant: tenant, From: "a@a.example", Rcpts: []string{"r@d.example"}, Body: []byte("x\r\n")}); err != nil {
				t.Fatal(err)
			}
		}
	}
	const buffer, bound = 8, 42
	if _, err := q.Messages(ctx, LaneWork, buffer); err != nil {
		t.Fatal(err)
	}
	// Each loop's pull is complete when its request no longer waits at
	// the server or the tenant has nothing left to hand out.
	held := 0
	waitConsumers(t, q, tenants, "a tenant's loop did not pull", func(ci *jetstream.ConsumerInfo) bool {
		if ci.NumAckPending > 0 && (ci.NumWaiting == 0 || ci.NumPending == 0) {
			held += ci.NumAckPending
			return true
		}
		return false
	})
	if held > bound {
		t.Fatalf("%d envelopes pulled and not started, want at most %d", held, bound)
	}
	t.Logf("%d envelopes pulled and not started for %d tenants, buffer %d", held, len(tenants), buffer)
}

// blockingConsumer answers each pull request when the test says so, with
// no mail.
type blockingConsumer struct {
	jetstream.Consumer
	fetches chan chan struct{} // each pull request: closed to end it
}

func (c *blockingConsumer) Fetch(int, ...jetstream.FetchOpt) (jetstream.MessageBatch, error) {
	end := make(chan struct{})
	c.fetches <- end
	<-end
	return emptyBatch{}, nil
}

// A wake-up that comes while a tenant's loop waits in a pull that then ends
// empty sends the loop round once more (the mail it announces may have been
// stored just after that pull ended at the server); without one, the loop
// stops after the empty pull.
func TestWakeUpDuringAnEmptyPull(t *testing.T) {
	q := &Queue{log: zerolog.Nop()}
	c := &blockingConsumer{fetches: make(chan chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p := &workPuller{q: q, ctx: ctx, buffer: 4, out: make(chan *Delivery), tenants: map[string]*tenantPull{"work-a": {cons: c}},
		look: make(chan struct{}, 1), unknown: make(chan string, 1)}
	pull := func() chan struct{} {
		t.Helper()
		select {
		case end := <-c.fetches:
			return end
		case <-time.After(10 * time.Second):
			t.Fatal("no pull request")
			return nil
		}
	}
	p.wake("work-a")
	end := pull()
	p.wake("work-a") // while the pull waits
	close(end)
	close(pull()) // the second pull, for the wake-up
	p.wg.Wait()   // and then the loop stops
	select {
	case <-c.fetches:
		t.Fatal("a third pull without a wake-up")
	default:
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.running != 0 || p.tenants["work-a"].running {
		t.Fatalf("loop still counted as running: %d", p.running)
	}
}

// Every wake-up call is followed by a wake-up sent at or after it: the first
// at once, the calls within wakeGap of it by one trailing wake-up at the
// gap's end.
func TestWakeUpsTrail(t *testing.T) {
	q, _ := startQueue(t)
	q.times.wakeGap = 300 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got := make(chan time.Time, 10)
	sub, err := q.nc.Subscribe(subjWorkWake, func(m *nats.Msg) {
		if string(m.Data) == tenantConsumer("w") {
			got <- time.Now()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	meta, err := q.ensureTenant(ctx, "w")
	if err != nil {
		t.Fatal(err)
	}
	recv := func() time.Time {
		t.Helper()
		select {
		case at := <-got:
			return at
		case <-ctx.Done():
			t.Fatal("no wake-up")
			return time.Time{}
		}
	}
	start := time.Now()
	var last time.Time
	for range 4 {
		last = time.Now()
		q.wake(meta)
	}
	first, trailing := recv(), recv()
	if trailing.Before(last) || trailing.Sub(start) < 300*time.Millisecond {
		t.Fatalf("wake-ups %v and %v after the first call, the last call %v after it", first.Sub(start), trailing.Sub(start), last.Sub(start))
	}
	if err := q.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-got:
		t.Fatal("a wake-up per call within the gap")
	case <-time.After(500 * time.Millisecond):
	}
	if n := q.Ops()["wake"]; n != 2 {
		t.Fatalf("%d wake-ups counted, want 2", n)
	}
}

// TestIdleTenantConsumerGoesAndComesBack: the server removes the work
// consumer of a tenant nobody has pulled for tenantIdle (a second here),
// and the tenant's next mail makes it again and is delivered. And mail that
// finds the consumer gone while this process still remembers it (removed
// by hand here, an hour being the idle time) is adopted by the workers'
// periodic look, not left without a consumer.
func TestIdleTenantConsumerGoesAndComesBack(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// start returns a queue whose work consumers go after idle, and a
	// function that enqueues for a tenant and takes the envelope out.
	start := func(idle time.Duration) (*Queue, func(tenant string)) {
		q, _ := startQueue(t)
		q.times.wait, q.times.refresh, q.times.tenantIdle = 200*time.Millisecond, 100*time.Millisecond, idle
		work, err := q.Messages(ctx, LaneWork, 2)
		if err != nil {
			t.Fatal(err)
		}
		return q, func(tenant string) {
			t.Helper()
			ids, err := q.Enqueue(ctx, &Submission{Tenant: tenant, From: "a@a.example", Rcpts: []string{"r@d.example"}, Body: []byte("x\r\n")})
			if err != nil {
				t.Fatal(err)
			}
			d := next(t, work)
			if d.Env.ID != ids[0] {
				t.Fatalf("got %s, want %s", d.Env.ID, ids[0])
			}
			if err := d.Skip(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}

	q, deliver := start(time.Second)
	deliver("brief")
	for {
		_, err := q.lanes[LaneWork].Consumer(ctx, tenantConsumer("brief"))
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the idle tenant's consumer is still there: %v", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	deliver("brief")

	q, deliver = start(time.Hour)
	deliver("kept")
	if err := q.js.DeleteConsumer(ctx, StreamWork, tenantConsumer("kept")); err != nil {
		t.Fatal(err)
	}
	deliver("kept")
}

// BenchmarkLookAtTenants: the workers' periodic look (lookEvery, while the
// work stream holds mail) with 1,000 tenant consumers, one of them with
// mail.
func BenchmarkLookAtTenants(b *testing.B) {
	q, _ := startQueueWith(b, Options{})
	ctx := context.Background()
	for i := range 1000 {
		if _, err := q.ensureTenant(ctx, "t"+strconv.Itoa(i)); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := q.Enqueue(ctx, &Submission{Tenant: "t1", From: "a@a.example", Rcpts: []string{"r@d.example"}, Body: []byte("x\r\n")}); err != nil {
		b.Fatal(err)
	}
	p := &workPuller{q: q, ctx: ctx, buffer: 1, out: make(chan *Delivery), tenants: map[string]*tenantPull{},
		look: make(chan struct{}, 1), unknown: make(chan string, 1), closed: true}
	for b.Loop() {
		if _, err := p.lookAll(); err != nil {
			b.Fatal(err)
		}
	}
}

// The look at every consumer comes every refresh with few of them, and
// less often with many, up to a minute.
func TestLookEvery(t *testing.T) {
	for _, c := range []struct {
		n    int
		want time.Duration
	}{{0, 2 * time.Second}, {150, 2 * time.Second}, {1000, 10 * time.Second}, {6000, time.Minute}, {100000, time.Minute}} {
		if got := lookEvery(c.n, 2*time.Second); got != c.want {
			t.Errorf("lookEvery(%d) = %v, want %v", c.n, got, c.want)
		}
	}
}

// A worker that reconnects to NATS looks at every consumer at once: the
// wake-ups sent while it was away are lost (mail published with none
// here, the look an hour apart otherwise).
func TestLookAfterReconnecting(t *testing.T) {
	q, _ := startQueue(t)
	q.times.wait, q.times.refresh, q.times.look = 200*time.Millisecond, 50*time.Millisecond, time.Hour
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	work := unannouncedMail(t, ctx, q, "away", "direct3")
	if err := q.nc.ForceReconnect(); err != nil {
		t.Fatal(err)
	}
	if d := next(t, work); d.Env.ID != "direct3" {
		t.Fatalf("got %s", d.Env.ID)
	}
}

// BenchmarkPullTenants: the work lane's pull path per envelope (the pull
// requests, the hand-off, the ack) when the mail waiting belongs to 1, 10
// or 100 tenants: each pull asks for the buffer (32) shared among the
// tenants' loops, so more tenants mean more, smaller pulls. Enqueueing is
// outside the timing.
func BenchmarkPullTenants(b *testing.B) {
	for _, tenants := range []int{1, 10, 100} {
		b.Run(strconv.Itoa(tenants), func(b *testing.B) {
			q, _ := startQueueWith(b, Options{})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			n := b.N
			for i := range n {
				env := &Envelope{ID: "b" + strconv.Itoa(i), MsgID: "b", Tenant: "t" + strconv.Itoa(i%tenants), From: "a@a.example",
					Rcpts: []string{"r@d.example"}, Dest: "d.example", Body: []byte("x\r\n"), Size: 3, Parts: 1}
				m, err := env.Encode(workSubject(env.Tenant, "d.example", env.ID))
				if err != nil {
					b.Fatal(err)
				}
				if _, err := q.js.PublishMsgAsync(m); err != nil {
					b.Fatal(err)
				}
			}
			<-q.js.PublishAsyncComplete()
			for i := range tenants {
				if _, err := q.ensureTenant(ctx, "t"+strconv.Itoa(i)); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			defer reportCPU(b)()
			work, err := q.Messages(ctx, LaneWork, 32)
			if err != nil {
				b.Fatal(err)
			}
			for range n {
				if err := (<-work).Skip(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(q.Ops()["fetch"])/float64(n), "fetches/op")
		})
	}
}

// TestAdoptionMakesOnlyMissingConsumers: adopting orphaned mail creates the
// consumer of a tenant that has none, once however many of its envelopes
// wait, and leaves alone the tenants whose consumers exist (a creation per
// envelope listed cost a consumer update, and its state write, each).
func TestAdoptionMakesOnlyMissingConsumers(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for range 5 {
		if _, err := q.Enqueue(ctx, &Submission{Tenant: "present", From: "a@a.example", Rcpts: []string{"r@d.example"}, Body: []byte("x\r\n")}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 5 {
		id := "orphan" + strconv.Itoa(i)
		env := &Envelope{ID: id, MsgID: id, Tenant: "absent", From: "a@a.example", Rcpts: []string{"r@d.example"},
			Dest: "d.example", Body: []byte("x\r\n"), Size: 3, Parts: 1}
		m, err := env.Encode(workSubject("absent", "d.example", id))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := q.js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	// One subscription, so that its messages arrive in the order they
	// were published: the sentinel after every kick adoption published.
	const sentinel = "outflow.ctl.test-sentinel"
	kicks := make(chan string, 100)
	sub, err := q.nc.Subscribe("outflow.ctl.>", func(m *nats.Msg) {
		if m.Subject == subjTenantKick || m.Subject == sentinel {
			kicks <- m.Subject + " " + string(m.Data)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if _, err := q.adoptTenants(ctx); err != nil {
		t.Fatal(err)
	}
	if err := q.nc.Publish(sentinel, nil); err != nil {
		t.Fatal(err)
	}
	var got []string
	for {
		select {
		case k := <-kicks:
			if k == sentinel+" " {
				if want := []string{subjTenantKick + " " + tenantConsumer("absent")}; !slices.Equal(got, want) {
					t.Fatalf("consumers made: %v, want %v", got, want)
				}
				return
			}
			got = append(got, k)
		case <-ctx.Done():
			t.Fatal("no sentinel")
		}
	}
}

// A pull's batch is an equal share of the larger of the buffer and what the
// process starts in a quarter of the ack wait, between one and the buffer.
func TestPullBatch(t *testing.T) {
	p := &workPuller{q: &Queue{opts: Options{AckWait: time.Minute}}, buffer: 32}
	for _, c := range []struct {
		running int
		rate    float64
		want    int
	}{{1, 0, 32}, {2, 0, 16}, {100, 0, 1}, {100, 20, 3}, {100, 1000, 32}, {10, 100, 32}} {
		p.running, p.rate = c.running, c.rate
		if got := p.batch(); got != c.want {
			t.Errorf("%d loops at %.0f/s: batch %d, want %d", c.running, c.rate, got, c.want)
		}
	}
}

// lineCounter counts the log lines that contain a string.
type lineCounter struct {
	sub string
	n   atomic.Int32
}

func (c *lineCounter) Write(p []byte) (int, error) {
	if strings.Contains(string(p), c.sub) {
		c.n.Add(1)
	}
	return len(p), nil
}

// A wake-up naming a consumer that is gone (removed as idle since) is
// looked up once and left to the periodic look, not looked up again and
// again.
func TestWakeUpForAGoneConsumer(t *testing.T) {
	warn := &lineCounter{sub: `"tenant consumer"`}
	emb, err := StartEmbedded(EmbeddedConfig{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emb.Shutdown)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ci := emb.InProcessInfo()
	q, err := connect(ctx, Options{InProcess: emb.Server(), User: ci.User, Password: ci.Password, Logger: zerolog.New(warn)}, streamConfigs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = q.Close() })
	if _, err := q.Messages(ctx, LaneWork, 1); err != nil {
		t.Fatal(err)
	}
	// Sent again until one arrives: the worker subscribes once Messages
	// has started.
	sent := int32(0)
	for end := time.Now().Add(10 * time.Second); warn.n.Load() == 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the gone consumer was never looked up")
		}
		if err := q.nc.Publish(subjWorkWake, []byte(tenantConsumerPrefix+"gone")); err != nil {
			t.Fatal(err)
		}
		sent++
	}
	time.Sleep(300 * time.Millisecond) // a loop would look it up hundreds of times meanwhile
	if n := warn.n.Load(); n > sent {
		t.Fatalf("the gone consumer was looked up %d times for %d wake-ups", n, sent)
	}
}

// TestLookWakesPastAGoneConsumer: the look's list of consumers with mail
// names one removed since; the tenants after it are still woken at this
// look, not left for the next (up to a minute away with many tenants),
// and the gone one is no error.
func TestLookWakesPastAGoneConsumer(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := q.Enqueue(ctx, &Submission{Tenant: "after", From: "a@a.example", Rcpts: []string{"r@d.example"}, Body: []byte("x\r\n")}); err != nil {
		t.Fatal(err)
	}
	out := make(chan *Delivery, 4)
	p := &workPuller{q: q, ctx: ctx, buffer: 4, out: out,
		tenants: map[string]*tenantPull{}, look: make(chan struct{}, 1), unknown: make(chan string, 64)}
	t.Cleanup(func() {
		cancel()
		p.wg.Wait()
	})
	if err := p.wakeEach([]string{tenantConsumerPrefix + "gone", tenantConsumer("after")}); err != nil {
		t.Fatalf("a gone consumer made the look fail: %v", err)
	}
	if d := next(t, out); d.Env.Tenant != "after" {
		t.Fatalf("got tenant %q's envelope", d.Env.Tenant)
	}
}

// noResponders is a consumer whose pull nobody answers (a cluster electing
// its leader, or a consumer deleted), with a wake-up arriving meanwhile.
type noResponders struct {
	jetstream.Consumer
	during func()
}

func (c noResponders) Fetch(int, ...jetstream.FetchOpt) (jetstream.MessageBatch, error) {
	c.during()
	return nil, nats.ErrNoResponders
}

// A pull answered "no responders" while a wake-up came: the loop stops
// and forgets the handle, but the wake-up is not lost with it. The name
// goes to be looked up again, as a wake-up for an unknown consumer does,
// not left for the periodic look (up to a minute).
func TestWakeUpDuringNoRespondersKept(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name := tenantConsumer("electing")
	p := &workPuller{q: q, ctx: ctx, buffer: 4, out: make(chan *Delivery, 4),
		tenants: map[string]*tenantPull{}, look: make(chan struct{}, 1), unknown: make(chan string, 64)}
	t.Cleanup(func() {
		cancel()
		p.wg.Wait()
	})
	p.tenants[name] = &tenantPull{name: name, cons: noResponders{during: func() { p.wake(name) }}}
	p.wake(name)
	select {
	case got := <-p.unknown:
		if got != name {
			t.Fatalf("%q looked up, want %q", got, name)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the wake-up that came during the failed pull was lost")
	}
}
