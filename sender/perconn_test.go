package sender

import (
	"strings"
	"testing"
	"time"

	"github.com/outflow/outflow/internal/fakemx"
)

// TestLearnedMessagesPerConnection: a relay that takes 5 messages on a
// connection and refuses the sixth MAIL with Yahoo's "421 Max message per
// connection reached" costs one refusal, not one deferral in six: the
// refused message goes at once on a fresh connection, and the
// connections after it carry 5 each and end before the refusal. A rate
// throttle at MAIL teaches nothing and gets no fresh connection.
func TestLearnedMessagesPerConnection(t *testing.T) {
	for _, c := range []struct {
		ext   []string
		reply string
	}{
		{nil, ""},
		{[]string{"PIPELINING", "CHUNKING"}, ""},
		{nil, "452 4.5.3 Too many messages on this connection"},
	} {
		t.Run("hide "+strings.Join(c.ext, ",")+" "+c.reply, func(t *testing.T) {
			w, fake, cfg := relayWorld(t, fakemx.Options{MaxMsgsPerConn: 5, HideExtensions: c.ext, MaxMsgsReply: c.reply})
			cfg.RelayTLS, cfg.RelayUsername = RelayNoTLS, ""
			s := w.sender(cfg)
			for i := range 17 {
				r := s.Send(ctxT(t), msg("anywhere.test", "a@anywhere.test"))
				checkDelivered(t, r)
				if t.Failed() {
					t.Fatalf("message %d not delivered", i+1)
				}
			}
			if n := fake.PerConnRefused(); n != 1 {
				t.Errorf("%d MAILs refused for the connection's limit, want 1 (then learned)", n)
			}
			if got := len(fake.Messages()); got != 17 {
				t.Errorf("%d messages at the relay, want 17", got)
			}
			if n := s.learnedPerConn("relay:" + cfg.Relay); n != 5 {
				t.Errorf("learned %d messages per connection, want 5", n)
			}
			if !strings.Contains(w.logBuf.String(), `"msgs_per_conn":5`) {
				t.Errorf("no line saying what was learned:\n%s", w.logBuf.String())
			}
		})
	}
	t.Run("a rate throttle at MAIL", func(t *testing.T) {
		w, fake, cfg := relayWorld(t, fakemx.Options{MaxMsgsPerConn: 2,
			MaxMsgsReply: "421 4.7.28 Our system has detected an unusual rate of unsolicited mail originating from your IP address"})
		cfg.RelayTLS, cfg.RelayUsername = RelayNoTLS, ""
		s := w.sender(cfg)
		checkDelivered(t, s.Send(ctxT(t), msg("anywhere.test", "a@anywhere.test")))
		checkDelivered(t, s.Send(ctxT(t), msg("anywhere.test", "a@anywhere.test")))
		r := s.Send(ctxT(t), msg("anywhere.test", "a@anywhere.test"))
		if c := r.Rcpts[0].Outcome.Code; c != 421 {
			t.Errorf("the throttled message got %d, want the 421 as its outcome", c)
		}
		if n := fake.Connections(); n != 1 || s.learnedPerConn("relay:"+cfg.Relay) != 0 {
			t.Errorf("%d connections, learned %d: a rate throttle got a fresh connection or taught a limit", n, s.learnedPerConn("relay:"+cfg.Relay))
		}
	})
}

// A learned limit is kept for perConnKeep, not for ever: a server that
// raised its limit is not held to the old one.
func TestLearnedPerConnExpires(t *testing.T) {
	w, _, cfg := relayWorld(t, fakemx.Options{})
	s := w.sender(cfg)
	s.cfg.perConn.Store("k", learnedLimit{n: 3, until: time.Now().Add(-time.Second)})
	s.cfg.perConn.Store("j", learnedLimit{n: 4, until: time.Now().Add(time.Minute)})
	if s.learnedPerConn("k") != 0 || s.learnedPerConn("j") != 4 {
		t.Fatalf("k %d (ended), j %d (kept)", s.learnedPerConn("k"), s.learnedPerConn("j"))
	}
}
