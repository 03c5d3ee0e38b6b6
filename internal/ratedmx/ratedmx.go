package ratedmx

import (
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-smtp"

	"github.com/outflow/outflow/internal/fakemx"
)

// Options configures a Provider.
type Options struct {
	// Rate is the limit, accepted messages (RCPTs) per second; it must be
	// > 0.
	Rate float64
	// Burst is the bucket's capacity in messages. Default Rate/5 (at least
	// 1): a fifth of a second's worth, so that what a sender gets in any
	// one second stays within 1.2 times the rate.
	Burst float64
	// Limited picks the recipients (RCPT arguments) the limit applies to,
	// so that one server can be a throttling provider for one domain and
	// a plain MX for the rest. Nil: every recipient. The others are
	// accepted as they come and not recorded as arrivals.
	Limited func(rcpt string) bool
}

// Arrival is one accepted recipient.
type Arrival struct {
	At   time.Time
	Rcpt string
}

// Provider is a running rate-limited fake MX. Its methods are safe for
// concurrent use.
type Provider struct {
	*fakemx.Server

	mu        sync.Mutex
	rate      float64
	burst     float64
	limited   func(rcpt string) bool
	tokens    float64
	last      time.Time
	arrivals  []Arrival
	throttles []time.Time
}

// Reply is the throttle reply, Gmail's wording for 4.7.28.
var Reply = &smtp.SMTPError{Code: 421, EnhancedCode: smtp.EnhancedCode{4, 7, 28},
	Message: "Our system has detected an unusual rate of unsolicited mail originating from your IP address. To protect our users from spam, mail sent from your IP address has been temporarily rate limited."}

// Start starts a Provider for a test and closes it when the test ends.
func Start(tb testing.TB, opts Options) *Provider {
	tb.Helper()
	p := newProvider(opts)
	p.Server = fakemx.Start(tb, fakemx.Options{Hook: p.hook})
	return p
}

// New starts a Provider outside a test (the benchmark suite); Close it.
func New(opts Options) (*Provider, error) {
	p := newProvider(opts)
	s, err := fakemx.New(fakemx.Options{Hook: p.hook})
	if err != nil {
		return nil, err
	}
	p.Server = s
	return p, nil
}

func newProvider(opts Options) *Provider {
	burst := opts.Burst
	if burst <= 0 {
		burst = defaultBurst(opts.Rate)
	}
	return &Provider{rate: opts.Rate, burst: burst, tokens: burst, limited: opts.Limited}
}

// SetRate changes the limit from now on (the bucket keeps its tokens, up
// to the new burst when the burst was defaulted from the rate).
func (p *Provider) SetRate(rate float64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refill(time.Now())
	p.rate = rate
}

// SetLimit changes the rate and the burst from now on; the bucket keeps
// its tokens up to the new burst.
func (p *Provider) SetLimit(rate, burst float64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refill(time.Now())
	p.rate, p.burst = rate, burst
	p.tokens = min(p.tokens, burst)
}

// defaultBurst is Options.Burst's default for rate.
func defaultBurst(rate float64) float64 { return max(1, rate/5) }

// refill adds the tokens earned since last; p.mu held.
func (p *Provider) refill(now time.Time) {
	if !p.last.IsZero() {
		p.tokens += now.Sub(p.last).Seconds() * p.rate
		if p.tokens > p.burst {
			p.tokens = p.burst
		}
	}
	p.last = now
}

func (p *Provider) hook(stage fakemx.Stage, arg string) *smtp.SMTPError {
	if stage != fakemx.StageRcpt || (p.limited != nil && !p.limited(arg)) {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	p.refill(now)
	if p.tokens < 1 {
		p.throttles = append(p.throttles, now)
		return Reply
	}
	p.tokens--
	p.arrivals = append(p.arrivals, Arrival{At: now, Rcpt: arg})
	return nil
}

// Arrivals returns the accepted recipients in order.
func (p *Provider) Arrivals() []Arrival {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Arrival(nil), p.arrivals...)
}

// Times returns the arrival times, sorted.
func (p *Provider) Times() []time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	ts := make([]time.Time, len(p.arrivals))
	for i, a := range p.arrivals {
		ts[i] = a.At
	}
	return ts
}

// Throttles returns the times of the throttle replies, in order.
func (p *Provider) Throttles() []time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]time.Time(nil), p.throttles...)
}

// Peak is the most arrivals in any one-second window starting at an
// arrival, among ts (sorted in place).
func Peak(ts []time.Time) int {
	sort.Slice(ts, func(i, j int) bool { return ts[i].Before(ts[j]) })
	peak, j := 0, 0
	for i := range ts {
		for j < len(ts) && ts[j].Sub(ts[i]) < time.Second {
			j++
		}
		peak = max(peak, j-i)
	}
	return peak
}

// Count is the number of ts within [from, to).
func Count(ts []time.Time, from, to time.Time) int {
	n := 0
	for _, t := range ts {
		if !t.Before(from) && t.Before(to) {
			n++
		}
	}
	return n
}
