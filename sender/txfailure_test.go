package sender

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/emersion/go-smtp"

	"github.com/outflow/outflow/classify"
	"github.com/outflow/outflow/internal/fakemx"
)

// A refused DATA is the outcome of that transaction's recipients only:
// with RCPTMAX=1, a 554 to the first DATA once bounced all three
// recipients, though b and c were never offered (only MAIL, RCPT a and
// DATA went out). They now go in transactions of their own.
func TestDataRefusalStaysWithItsTransaction(t *testing.T) {
	for _, tc := range []struct {
		name      string
		ext       []string
		everyData bool // every DATA refused, not only the first
	}{
		{"pipelining", []string{"PIPELINING", "LIMITS RCPTMAX=1"}, false},
		{"no-pipelining", []string{"LIMITS RCPTMAX=1"}, false},
		{"every-DATA-refused", []string{"PIPELINING", "LIMITS RCPTMAX=1"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var datas atomic.Int32
			p := startPeer(t, tc.ext, func(_ int, cmd string) string {
				if cmd == "DATA" && (datas.Add(1) == 1 || tc.everyData) {
					return "554 5.7.1 transaction refused\r\n"
				}
				return ""
			})
			w := peerMX(t, p)
			s := w.sender(w.config())
			r := s.Send(ctxT(t), msg("example.test", "a@example.test", "b@example.test", "c@example.test"))
			for i, rr := range r.Rcpts {
				o := rr.Outcome
				refused := i == 0 || tc.everyData
				switch {
				case refused && (o.Stage != classify.StageData || o.Code != 554 || o.Enhanced != "5.7.1"):
					t.Errorf("%s: %+v, want 554 5.7.1 at StageData", rr.Rcpt, o)
				case !refused && (o.Stage != classify.StageDataEnd || o.Code != 250):
					t.Errorf("%s: %+v, want 250 at StageDataEnd (its own transaction)", rr.Rcpt, o)
				}
			}
			// Each recipient's outcome comes from a transaction it was in.
			for _, rcpt := range []string{"a", "b", "c"} {
				if n := p.count("RCPT TO:<" + rcpt + "@"); n != 1 {
					t.Errorf("RCPT %s sent %d times; commands %q", rcpt, n, p.commands())
				}
			}
			if r.Transactions != 3 || p.connections() != 1 {
				t.Errorf("Transactions=%d connections=%d; want 3 on one connection", r.Transactions, p.connections())
			}
		})
	}
}

// stallFirstDot makes a fake MX whose first reply to a final dot never
// comes (until the test ends); later ones are 250.
func stallFirstDot(t *testing.T, opts fakemx.Options) (*world, *fakemx.Server) {
	release := make(chan struct{})
	var dots atomic.Int32
	opts.Hook = func(st fakemx.Stage, _ string) *smtp.SMTPError {
		if st == fakemx.StageDot && dots.Add(1) == 1 {
			<-release
		}
		return nil
	}
	w, fake := oneMX(t, opts)
	t.Cleanup(func() { close(release) })
	return w, fake
}

// No reply to the final dot is the unknown outcome of the recipients that
// were in that transaction (accepted at RCPT), not of those in the next
// batch or put off by a 452, which were never sent: they go on a new
// connection. Four recipients with RCPTMAX 2 were once all reported as a
// timeout at StageDataEnd.
func TestFinalDotTimeoutLeavesTheRestPending(t *testing.T) {
	for _, tc := range []struct {
		limits, chunking bool
	}{{true, true}, {false, true}, {true, false}, {false, false}} {
		t.Run(fmt.Sprintf("LIMITS=%v/CHUNKING=%v", tc.limits, tc.chunking), func(t *testing.T) {
			opts := fakemx.Options{MaxRecipients: 2}
			if !tc.limits {
				// c and d get 452 4.5.3 in the first transaction.
				opts.HideExtensions = append(opts.HideExtensions, "LIMITS")
			}
			if !tc.chunking {
				opts.HideExtensions = append(opts.HideExtensions, "CHUNKING")
			}
			w, fake := stallFirstDot(t, opts)
			cfg := w.config()
			cfg.FinalDotTimeout = 300 * time.Millisecond
			s := w.sender(cfg)
			r := s.Send(ctxT(t), msg("example.test", "a@example.test", "b@example.test", "c@example.test", "d@example.test"))
			for _, rr := range r.Rcpts[:2] {
				if o := rr.Outcome; o.Stage != classify.StageDataEnd || o.Event != classify.EventTimeout {
					t.Errorf("%s: %+v, want a timeout at StageDataEnd", rr.Rcpt, o)
				}
			}
			for _, rr := range r.Rcpts[2:] {
				if o := rr.Outcome; o.Stage != classify.StageDataEnd || o.Code != 250 {
					t.Errorf("%s: %+v, want 250 on the next connection", rr.Rcpt, o)
				}
			}
			got := fake.Messages()
			if len(got) != 1 || !slices.Equal(got[0].Rcpts, []string{"c@example.test", "d@example.test"}) || fake.Connections() != 2 {
				t.Errorf("fake got %+v on %d connections", got, fake.Connections())
			}
		})
	}
}

// When no connection is left for the recipients never offered (here the
// MX session limit), they are reported as not attempted: transient, and
// outflow's own signal, never the unknown outcome of the transaction
// before them (which --unknown-policy hold would hold, and an operator
// might drop).
func TestNotAttemptedWhenNoSessionLeft(t *testing.T) {
	w, fake := stallFirstDot(t, fakemx.Options{MaxRecipients: 2})
	cfg := w.config()
	cfg.FinalDotTimeout = 300 * time.Millisecond
	cfg.MXSessionLimit = 1
	s := w.sender(cfg)
	r := s.Send(ctxT(t), msg("example.test", "a@example.test", "b@example.test", "c@example.test", "d@example.test"))
	checkNotAttempted(t, r, "session limit")
	if fake.Connections() != 1 {
		t.Errorf("%d connections, want 1 (session limit)", fake.Connections())
	}
}

// The same when the attempt's context ends with the failed transaction.
func TestNotAttemptedWhenTimeRunsOut(t *testing.T) {
	w, fake := stallFirstDot(t, fakemx.Options{MaxRecipients: 2})
	s := w.sender(w.config()) // FinalDotTimeout 5 s: the context ends first
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	r := s.Send(ctx, msg("example.test", "a@example.test", "b@example.test", "c@example.test", "d@example.test"))
	checkNotAttempted(t, r, "ran out of time")
	if fake.Connections() != 1 {
		t.Errorf("%d connections, want 1", fake.Connections())
	}
}

// checkNotAttempted checks r for four recipients whose first two timed
// out after the final dot, and whose last two were not attempted, for a
// reason saying why.
func checkNotAttempted(t *testing.T, r Result, why string) {
	t.Helper()
	cl := classify.Default()
	for _, rr := range r.Rcpts[:2] {
		if res := cl.Classify(rr.Outcome); res.Class != classify.Unknown {
			t.Errorf("%s: %+v classified %v, want unknown", rr.Rcpt, rr.Outcome, res.Class)
		}
	}
	for _, rr := range r.Rcpts[2:] {
		o := rr.Outcome
		res := cl.Classify(o)
		if o.Event != classify.EventLocal || !strings.HasPrefix(o.Text, "outflow (synthetic, no server reply): recipient not attempted") ||
			!strings.Contains(o.Text, why) || res.Class != classify.Transient {
			t.Errorf("%s: %+v classified %+v; want not attempted (%s), transient", rr.Rcpt, o, res, why)
		}
	}
}

// A reply to the final dot that cannot be read may be the server's
// acceptance: unknown, with the reply kept, not transient (a retry would
// send the message twice with nothing recording why). The same for the
// reply to BDAT LAST.
func TestGarbledReplyAfterMessageIsUnknown(t *testing.T) {
	const garbled = "250-2.0.0 queued as X\r\n251 2.0.0 ok\r\n"
	for _, tc := range []struct {
		name string
		ext  []string
		end  string // the command whose reply is garbled
	}{
		{"DATA", []string{"PIPELINING"}, "."},
		{"DATA-no-pipelining", nil, "."},
		{"BDAT", []string{"PIPELINING", "CHUNKING"}, "BDAT"},
		{"BDAT-no-pipelining", []string{"CHUNKING"}, "BDAT"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := startPeer(t, tc.ext, func(_ int, cmd string) string {
				if strings.HasPrefix(cmd, tc.end) {
					return garbled
				}
				return ""
			})
			w := peerMX(t, p)
			s := w.sender(w.config())
			r := s.Send(ctxT(t), msg("example.test", "a@example.test", "b@example.test"))
			if p.count(tc.end) != 1 {
				t.Fatalf("commands %q", p.commands())
			}
			for _, rr := range r.Rcpts {
				o := rr.Outcome
				if o.Stage != classify.StageDataEnd || o.Event != classify.EventConnLost || o.Code != 0 ||
					o.Raw != strings.TrimSuffix(garbled, "\r\n") || !strings.Contains(o.Text, "queued as X") {
					t.Errorf("%s: %+v; want a lost connection at StageDataEnd with the reply kept", rr.Rcpt, o)
				}
				if res := classify.Default().Classify(o); res.Class != classify.Unknown {
					t.Errorf("%s: classified %+v, want unknown", rr.Rcpt, res)
				}
			}
		})
	}
}

// Before the message has left, a garbled reply stays what it was: the
// server cannot have taken the message.
func TestGarbledReplyToRcptIsNotUnknown(t *testing.T) {
	p := startPeer(t, []string{"PIPELINING"}, func(_ int, cmd string) string {
		if strings.HasPrefix(cmd, "RCPT") {
			return "250-2.1.5 ok\r\n251 2.1.5 ok\r\n"
		}
		return ""
	})
	w := peerMX(t, p)
	s := w.sender(w.config())
	r := s.Send(ctxT(t), msg("example.test", "a@example.test"))
	o := r.Rcpts[0].Outcome
	if o.Stage != classify.StageRcpt || o.Event != classify.EventNone {
		t.Errorf("outcome %+v", o)
	}
	if res := classify.Default().Classify(o); res.Class == classify.Unknown || res.Class == classify.Delivered {
		t.Errorf("classified %+v", res)
	}
}
