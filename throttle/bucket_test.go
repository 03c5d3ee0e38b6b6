package throttle

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outflow/outflow/classify"
)

func TestBucketReservations(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	var b bucket
	b.setRate(t0, 10)
	if at := b.reserve(t0); !at.Equal(t0) {
		t.Fatalf("first token due %s, want now", at.Sub(t0))
	}
	for i := 1; i <= 5; i++ {
		if at := b.reserve(t0); !at.Equal(ms(100 * i)) {
			t.Fatalf("reservation %d due at %s, want %dms", i, at.Sub(t0), 100*i)
		}
	}
	// A refund of the latest reservation gives its place to the next.
	b.refund(ms(500))
	if at := b.reserve(t0); !at.Equal(ms(500)) {
		t.Fatalf("after a refund: %s, want 500ms", at.Sub(t0))
	}
	// A refund of an older one leaves the chain alone.
	b.refund(ms(300))
	if at := b.reserve(t0); !at.Equal(ms(600)) {
		t.Fatalf("after an older refund: %s, want 600ms", at.Sub(t0))
	}
	// Idle for long: the bucket holds one token, no more.
	if at := b.reserve(ms(10000)); !at.Equal(ms(10000)) {
		t.Fatal("no token after idling")
	}
	if at := b.reserve(ms(10000)); !at.Equal(ms(10100)) {
		t.Fatalf("burst beyond one token: %s", at.Sub(t0))
	}
}

// sixReserved is a bucket at 10/s with six reservations made at t0, due at
// 0, 100, …, 500 ms, and ms(n), n milliseconds after t0.
func sixReserved() (t0 time.Time, ms func(int) time.Time, b *bucket) {
	t0 = time.Unix(1000, 0)
	ms = func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	b = &bucket{}
	b.setRate(t0, 10)
	for range 6 {
		b.reserve(t0)
	}
	return t0, ms, b
}

// TestBucketStepUpKeepsThePeriod: a faster rate, with reservations waiting
// at the old one, puts the next reservation one new period after the
// latest. Counted as a debt of tokens repaid at the new rate it was due at
// 300 ms, beside the reservation already due then; against a provider
// whose burst is one message, that pair is a throttle on every step up.
func TestBucketStepUpKeepsThePeriod(t *testing.T) {
	t0, ms, b := sixReserved()
	if slower := b.setRate(t0, 20); slower {
		t.Fatal("a faster rate reported as slower")
	}
	if at := b.reserve(t0); !at.Equal(ms(550)) {
		t.Fatalf("first reservation at the new rate due %s, want 550ms (one new period after the latest, 500ms)", at.Sub(t0))
	}
	if at := b.reserve(t0); !at.Equal(ms(600)) {
		t.Fatalf("second at the new rate due %s, want 600ms", at.Sub(t0))
	}
}

// TestBucketSlowerRateRestarts: a slower rate restarts the chain one new
// period from now and counts in gen, so that admissions waiting on
// reservations at the old spacing take them again (Throttle.admit).
func TestBucketSlowerRateRestarts(t *testing.T) {
	t0, ms, b := sixReserved()
	gen := b.gen
	if slower := b.setRate(ms(50), 5); !slower {
		t.Fatal("a halved rate not reported as slower")
	}
	if b.gen == gen {
		t.Fatal("gen did not count the slower rate")
	}
	if at := b.reserve(ms(150)); !at.Equal(ms(250)) {
		t.Fatalf("after halving at 50ms: due %s, want 250ms (one new period from the change)", at.Sub(t0))
	}
	// With nothing waiting, a slower rate counts from the latest
	// reservation, which was sent.
	var c bucket
	c.setRate(t0, 10)
	c.reserve(t0)
	c.setRate(ms(30), 5)
	if at := c.reserve(ms(30)); !at.Equal(ms(200)) {
		t.Fatalf("halved with nothing waiting: due %s, want 200ms", at.Sub(t0))
	}
}

// TestBucketSpendAtTurn: a token used later than it was due (the worker
// waited for its turn on the grid) is owed from then: the wait earns no
// tokens for a burst afterwards.
func TestBucketSpendAtTurn(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var b bucket
	b.setRate(t0, 10)
	if due := b.reserve(t0); !due.Equal(t0) {
		t.Fatalf("first token due %s", due.Sub(t0))
	}
	turn := t0.Add(time.Second)
	b.spend(turn)
	// Without spend the second, idle in the bucket's view, would make the
	// next token due at once.
	next := b.reserve(t0.Add(500 * time.Millisecond))
	if want := turn.Add(100*time.Millisecond - spendSlack); !next.Equal(want) {
		t.Fatalf("next token due %s, want %s (one period after the turn)", next.Sub(t0), want.Sub(t0))
	}
	// A turn earlier than the token's due time changes nothing.
	b.spend(t0)
	if again := b.reserve(t0.Add(500 * time.Millisecond)); !again.Equal(next.Add(100 * time.Millisecond)) {
		t.Fatalf("after an early spend: %s, want %s", again.Sub(t0), next.Add(100*time.Millisecond).Sub(t0))
	}
}

// TestBucketStartsAfterTheLastSend: a destination's first rate (a seed,
// milliseconds after the send that was throttled) starts its bucket one
// period after that send, not with a token ready.
func TestBucketStartsAfterTheLastSend(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	var b bucket
	b.setRate(t0, 2)
	b.startAfter(ms(-4))
	if at := b.reserve(t0); !at.Equal(ms(496)) {
		t.Fatalf("first token due %s, want 496ms (one period after the send 4ms ago)", at.Sub(t0))
	}
	// A bucket in use keeps its chain.
	b.startAfter(ms(300))
	if at := b.reserve(t0); !at.Equal(ms(996)) {
		t.Fatalf("second token due %s, want 996ms", at.Sub(t0))
	}
	// Without a send before, a token is ready.
	var c bucket
	c.setRate(t0, 2)
	c.startAfter(time.Time{})
	if at := c.reserve(t0); !at.Equal(t0) {
		t.Fatalf("first token with no send before: %s, want now", at.Sub(t0))
	}
}

// TestWaitingAdmissionTakesItsTurnAgainAfterACut: admissions waiting for
// their tokens when the rate is cut do not go out at the old spacing: each
// takes a new turn at the new rate when it wakes, in the order of the old
// turns, and none whose new turn lies within max-wait is sent away (one
// beyond it is: TestWaitingAdmissionBeyondMaxWaitAfterACut). Before, the
// five below went out 100 ms apart after the cut to 2.5/s, as throttled as
// the send that caused the cut.
func TestWaitingAdmissionTakesItsTurnAgainAfterACut(t *testing.T) {
	env := startKV(t)
	a := newThrottle(t, env, "a", func(c *Config) {
		c.Defaults.Rate = 10
		c.DecreaseFactor = 0.25
		c.MaxWait = 2 * time.Second // the last new turn is 1.6 s from its wake-up
	})
	first := mustAdmit(t, a, "w.test") // the bucket's one token
	admitted := make(chan time.Time, 5)
	for range 5 {
		go func() {
			p, r := a.Admit(context.Background(), "w.test", "", "")
			if p == nil {
				t.Errorf("refused: %+v", r)
				admitted <- time.Time{}
				return
			}
			admitted <- time.Now()
			p.Done([]classify.Result{resDelivered})
		}()
	}
	d := a.getDest("w.test")
	eventually(t, 5*time.Second, "five admissions waiting for tokens 100 to 500 ms ahead", func() bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		return d.inflight == 6
	})
	cut := time.Now()
	first.Done([]classify.Result{resThrottled}) // 10/s × 0.25: one send per 400 ms
	var times []time.Time
	for range 5 {
		times = append(times, <-admitted)
	}
	slices.SortFunc(times, func(x, y time.Time) int { return x.Compare(y) })
	if times[0].IsZero() {
		t.Fatal("an admission was refused")
	}
	if el := times[0].Sub(cut); el < 300*time.Millisecond {
		t.Fatalf("first admission %s after the cut, want one period of the new rate (400ms)", el)
	}
	if el := times[4].Sub(cut); el < 1900*time.Millisecond {
		t.Fatalf("fifth admission %s after the cut, want five periods of the new rate (2s)", el)
	}
}

// TestWaitingAdmissionBeyondMaxWaitAfterACut: an admission waiting for its
// turn when the rate drops takes a new turn at the new spacing, but one
// whose new turn lies further than max-wait is refused as a new admission
// would be: "rate", with its tenant's place in the virtual queue, its place
// in flight given back. Before, all ten below, waiting at 10/s when an
// operator pinned 1/s, were granted, the last 9 s after it asked with
// max-wait 2 s, each holding a delivery slot and a connection meanwhile
// (30 at 20/s: 27 s).
func TestWaitingAdmissionBeyondMaxWaitAfterACut(t *testing.T) {
	env := startKV(t)
	a := newThrottle(t, env, "a", func(c *Config) { c.Defaults.Rate = 10 }) // max-wait 2 s
	type result struct {
		p  Permit
		r  Refusal
		el time.Duration
	}
	results := make(chan result, 10)
	start := time.Now()
	for range 10 {
		go func() {
			p, r := a.Admit(context.Background(), "cw.test", "", "")
			results <- result{p, r, time.Since(start)}
		}()
	}
	d := a.getDest("cw.test")
	eventually(t, 5*time.Second, "ten admissions, turns 100 ms apart", func() bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		return d.inflight == 10
	})
	if err := SetRate(ctxT(t), env.state, "cw.test", 1, time.Time{}, "ops"); err != nil {
		t.Fatal(err)
	}
	var granted int
	var places []time.Time
	for range 10 {
		res := <-results
		// Its old turn (at most 0.9 s) and max-wait from there, at most.
		if res.el > 3500*time.Millisecond {
			t.Errorf("an admission answered %s after it asked (%q), beyond its turn and max-wait", res.el.Round(time.Millisecond), res.r.Reason)
		}
		switch res.r.Reason {
		case "":
			granted++
			defer res.p.Done([]classify.Result{resDelivered})
		case "rate":
			places = append(places, res.r.Until)
		default:
			t.Errorf("refused: %+v, want granted or refused for the rate", res.r)
		}
	}
	if len(places) < 3 {
		t.Fatalf("%d granted, %d refused for the rate at 1/s: want the turns beyond max-wait refused", granted, len(places))
	}
	slices.SortFunc(places, func(x, y time.Time) int { return x.Compare(y) })
	for i := 1; i < len(places); i++ {
		if gap := places[i].Sub(places[i-1]); gap < 900*time.Millisecond {
			t.Errorf("places %d and %d in the virtual queue %s apart, want the pinned rate's 1 s", i-1, i, gap)
		}
	}
	if n := a.Snapshot("cw.test").InFlight; n != granted {
		t.Errorf("%d in flight with %d granted: the refused did not give theirs back", n, granted)
	}
}

// TestWaitingAdmissionOverItsShareAfterACut: an admission that takes a new
// turn after a cut is asked again whether its tenant is over its share of
// the destination, as a new admission is: a tenant whose twelve
// admissions wait for turns while another tenant's one waits too gives
// up those beyond its share, into its virtual queue, rather than take
// every new turn. Before, all twelve took new turns at the cut's spacing
// (the last 2.4 s after the cut, within max-wait), ahead of the other
// tenant's.
func TestWaitingAdmissionOverItsShareAfterACut(t *testing.T) {
	env := startKV(t)
	a := newThrottle(t, env, "a", func(c *Config) {
		c.Defaults.Rate = 10         // turns 100 ms apart; the cut below halves it
		c.MaxWait = 10 * time.Second // no new turn lies beyond it
	})
	const dom = "fair.test"
	first, r := a.Admit(ctxT(t), dom, "campaign", "") // the bucket's one token
	if first == nil {
		t.Fatalf("refused: %+v", r)
	}
	type result struct {
		tenant string
		r      Refusal
	}
	results := make(chan result, 13)
	ask := func(tenant string) {
		p, r := a.Admit(context.Background(), dom, tenant, "")
		if p != nil {
			p.Done([]classify.Result{resDelivered})
		}
		results <- result{tenant, r}
	}
	d := a.getDest(dom)
	inflight := func(n int) func() bool {
		return func() bool {
			d.mu.Lock()
			defer d.mu.Unlock()
			return d.inflight == n
		}
	}
	for range 12 {
		go ask("campaign")
	}
	eventually(t, 5*time.Second, "twelve of the campaign's admissions waiting, 100 ms to 1.2 s ahead", inflight(13))
	go ask("resets")
	eventually(t, 5*time.Second, "the other tenant's admission waiting behind them", inflight(14))
	first.Done([]classify.Result{resThrottled}) // 10/s × 0.5: one send per 200 ms
	refused := map[string]int{}
	for range 13 {
		res := <-results
		switch res.r.Reason {
		case "":
		case "rate":
			refused[res.tenant]++
		default:
			t.Errorf("%s refused: %+v, want granted or refused for the rate", res.tenant, res.r)
		}
	}
	if refused["resets"] != 0 {
		t.Errorf("the other tenant's one admission refused")
	}
	// At 5/s a period is 200 ms: the campaign is over its share while
	// its others waiting reach more than a second past the other
	// tenant's one (200 ms): seven or more of them.
	if n := refused["campaign"]; n < 3 {
		t.Fatalf("%d of the campaign's 12 waiting admissions refused after the cut: want those over its share sent to the virtual queue", n)
	}
	if n := a.Snapshot(dom).InFlight; n != 0 {
		t.Errorf("%d in flight after every admission was done or refused", n)
	}
}

// TestRateThatComesBackSpacesFromTheLastSend: a destination that loses its
// rate (forgotten, or cleared by an operator) drops its bucket, so a rate
// that comes back later starts one period after the last send, made
// without a rate, not where the old chain left off: that was half a period
// after the send here, two messages closer than the rate allows.
func TestRateThatComesBackSpacesFromTheLastSend(t *testing.T) {
	env := startKV(t)
	var ahead atomic.Int64
	th := newThrottle(t, env, "a", func(c *Config) {
		c.MaxWait = time.Hour
		c.Now = func() time.Time { return time.Now().Add(time.Duration(ahead.Load())) }
	})
	d := th.getDest("back.test")
	setRate := func(r float64) {
		d.mu.Lock()
		defer d.mu.Unlock()
		d.state.LearnedRate, d.state.Grid = r, nil
		if r > 0 {
			d.state.Grid = []GridSegment{{From: th.now().Add(-time.Minute), Rate: r}}
		}
	}
	setRate(10)
	mustAdmit(t, th, "back.test").Done(nil) // on the chain at 10/s: the next token 100 ms on
	ahead.Store(int64(50 * time.Millisecond))
	setRate(0)
	mustAdmit(t, th, "back.test").Done(nil) // no rate: at once
	d.mu.Lock()
	sent := d.lastSent
	d.mu.Unlock()
	setRate(10)
	mustAdmit(t, th, "back.test").Done(nil)
	d.mu.Lock()
	turn := d.lastTurn
	d.mu.Unlock()
	if gap := turn.Sub(sent); gap < 100*time.Millisecond-spendSlack {
		t.Fatalf("the rate's first send %s after the last send without it, want a period of 10/s", gap)
	}
}
