package sender

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/emersion/go-smtp"
	"github.com/foxcpp/go-mockdns"
	"github.com/rs/zerolog"

	"github.com/outflow/outflow/classify"
	asciipkg "github.com/outflow/outflow/internal/ascii"
	"github.com/outflow/outflow/internal/fakemx"
)

// oneMX builds a world where example.test has one MX, mx.example.test at
// 127.0.0.2, served by a fake with opts.
func oneMX(t testing.TB, opts fakemx.Options) (*world, *fakemx.Server) {
	w := newWorld(t)
	fake := fakemx.Start(t, opts)
	w.zones["example.test."] = mockdns.Zone{MX: []net.MX{{Host: "mx.example.test.", Pref: 10}}}
	w.host("mx.example.test", "127.0.0.2")
	w.route("127.0.0.2", fake)
	return w, fake
}

func TestSendDelivers(t *testing.T) {
	w, fake := oneMX(t, fakemx.Options{})
	s := w.sender(w.config())
	m := msg("example.test", "bob@example.test")
	r := s.Send(ctxT(t), m)
	checkDelivered(t, r)
	if r.Host != "mx.example.test" || r.Addr != "127.0.0.2:25" || r.Reused || r.TLS {
		t.Errorf("result = %+v", r)
	}
	got := fake.Messages()
	if len(got) != 1 {
		t.Fatalf("fake got %d messages", len(got))
	}
	if !bytes.Equal(got[0].Data, m.Body) {
		t.Errorf("body changed on the wire (dot stuffing?):\n%q\n%q", got[0].Data, m.Body)
	}
	if got[0].From != m.From || !slices.Equal(got[0].Rcpts, m.Rcpts) || got[0].Hostname != testHostname {
		t.Errorf("fake saw %+v", got[0])
	}
}

// A Send's log lines carry the message's id and destination, and nothing
// is logged at a level the logger leaves out.
func TestSendLogFields(t *testing.T) {
	w, _ := oneMX(t, fakemx.Options{})
	s := w.sender(w.config())
	checkDelivered(t, s.Send(ctxT(t), msg("example.test", "bob@example.test")))
	logs := w.logBuf.String()
	for _, want := range []string{`"component":"sender","msg_id":"m1","dest":"example.test"`, `"message":"connected"`, `"message":"send finished"`} {
		if !strings.Contains(logs, want) {
			t.Errorf("log lacks %s:\n%s", want, logs)
		}
	}
	var quiet syncBuffer
	cfg := w.config()
	cfg.Logger = zerolog.New(&quiet).Level(zerolog.InfoLevel)
	checkDelivered(t, w.sender(cfg).Send(ctxT(t), msg("example.test", "bob@example.test")))
	if quiet.String() != "" {
		t.Errorf("logged at info level:\n%s", quiet.String())
	}
}

func TestMXPreference(t *testing.T) {
	w := newWorld(t)
	best, worse := fakemx.Start(t, fakemx.Options{}), fakemx.Start(t, fakemx.Options{})
	w.zones["example.test."] = mockdns.Zone{MX: []net.MX{
		{Host: "mx2.example.test.", Pref: 20}, {Host: "mx1.example.test.", Pref: 10},
	}}
	w.host("mx1.example.test", "127.0.0.2")
	w.host("mx2.example.test", "127.0.0.3")
	w.route("127.0.0.2", best)
	w.route("127.0.0.3", worse)
	s := w.sender(w.config())
	r := s.Send(ctxT(t), msg("example.test", "bob@example.test"))
	checkDelivered(t, r)
	if r.Host != "mx1.example.test" || len(best.Messages()) != 1 || len(worse.Messages()) != 0 {
		t.Errorf("went to %s; best got %d, worse %d", r.Host, len(best.Messages()), len(worse.Messages()))
	}
}

func TestMXFallbackToNextHost(t *testing.T) {
	w := newWorld(t)
	backup := fakemx.Start(t, fakemx.Options{})
	down := fakemx.Start(t, fakemx.Options{Greeting: "421 4.3.2 Service shutting down"})
	w.zones["example.test."] = mockdns.Zone{MX: []net.MX{
		{Host: "mx1.example.test.", Pref: 10}, {Host: "mx2.example.test.", Pref: 20}, {Host: "mx3.example.test.", Pref: 30},
	}}
	w.host("mx1.example.test", "127.0.0.2") // refuses connections
	w.host("mx2.example.test", "127.0.0.3") // 421 greeting
	w.host("mx3.example.test", "127.0.0.4")
	w.route("127.0.0.3", down)
	w.route("127.0.0.4", backup)
	s := w.sender(w.config())
	r := s.Send(ctxT(t), msg("example.test", "bob@example.test"))
	checkDelivered(t, r)
	if r.Host != "mx3.example.test" {
		t.Errorf("delivered via %s", r.Host)
	}
	if d := w.dials(); !slices.Equal(d, []string{"127.0.0.2:25", "127.0.0.3:25", "127.0.0.4:25"}) {
		t.Errorf("dialled %v", d)
	}
}

func TestMXEqualPreferenceIsRandom(t *testing.T) {
	w := newWorld(t)
	a, b := fakemx.Start(t, fakemx.Options{}), fakemx.Start(t, fakemx.Options{})
	w.zones["example.test."] = mockdns.Zone{MX: []net.MX{
		{Host: "a.example.test.", Pref: 10}, {Host: "b.example.test.", Pref: 10},
	}}
	w.host("a.example.test", "127.0.0.2")
	w.host("b.example.test", "127.0.0.3")
	w.route("127.0.0.2", a)
	w.route("127.0.0.3", b)
	cfg := w.config()
	cfg.MaxMsgsPerConn = 1 // a new connection, and a new choice, per message
	s := w.sender(cfg)
	for i := 0; i < 40 && (len(a.Messages()) == 0 || len(b.Messages()) == 0); i++ {
		checkDelivered(t, s.Send(ctxT(t), msg("example.test", "bob@example.test")))
	}
	if len(a.Messages()) == 0 || len(b.Messages()) == 0 {
		t.Errorf("equal-preference MX hosts not randomised: a=%d b=%d", len(a.Messages()), len(b.Messages()))
	}
}

func TestNoMXFallsBackToAddress(t *testing.T) {
	w := newWorld(t)
	fake := fakemx.Start(t, fakemx.Options{})
	w.host("example.test", "127.0.0.5") // no MX: the implicit MX (RFC 5321 5.1)
	w.route("127.0.0.5", fake)
	s := w.sender(w.config())
	r := s.Send(ctxT(t), msg("example.test", "bob@example.test"))
	checkDelivered(t, r)
	if r.Host != "example.test" || len(fake.Messages()) != 1 {
		t.Errorf("host %q, fake got %d", r.Host, len(fake.Messages()))
	}
}

func TestNullMX(t *testing.T) {
	w := newWorld(t)
	w.zones["example.test."] = mockdns.Zone{MX: []net.MX{{Host: ".", Pref: 0}}, A: []string{"127.0.0.2"}}
	s := w.sender(w.config())
	r := s.Send(ctxT(t), msg("example.test", "bob@example.test", "carol@example.test"))
	checkAll(t, r, classify.StageDNS, 0, classify.EventNullMX)
	if len(w.dials()) != 0 {
		t.Errorf("dialled %v for a null MX domain", w.dials())
	}
}

func TestNXDomain(t *testing.T) {
	w := newWorld(t)
	s := w.sender(w.config())
	r := s.Send(ctxT(t), msg("nowhere.test", "bob@nowhere.test"))
	checkAll(t, r, classify.StageDNS, 0, classify.EventDNSNXDomain)
}

func TestDNSTemporaryFailure(t *testing.T) {
	w := newWorld(t)
	w.zones["example.test."] = mockdns.Zone{Err: &net.DNSError{Err: "server misbehaving", Name: "example.test", IsTemporary: true}}
	s := w.sender(w.config())
	r := s.Send(ctxT(t), msg("example.test", "bob@example.test"))
	checkAll(t, r, classify.StageDNS, 0, classify.EventDNSServFail)
}

func TestSeveralAddressesPerHost(t *testing.T) {
	w := newWorld(t)
	fake := fakemx.Start(t, fakemx.Options{})
	w.zones["example.test."] = mockdns.Zone{MX: []net.MX{{Host: "mx.example.test.", Pref: 10}}}
	w.host("mx.example.test", "127.0.0.2", "127.0.0.3") // the first refuses
	w.route("127.0.0.3", fake)
	s := w.sender(w.config())
	r := s.Send(ctxT(t), msg("example.test", "bob@example.test"))
	checkDelivered(t, r)
	if r.Addr != "127.0.0.3:25" {
		t.Errorf("addr %s", r.Addr)
	}
}

func TestAllAddressesRefuse(t *testing.T) {
	w := newWorld(t)
	w.zones["example.test."] = mockdns.Zone{MX: []net.MX{{Host: "mx.example.test.", Pref: 10}}}
	w.host("mx.example.test", "127.0.0.2", "127.0.0.3")
	s := w.sender(w.config())
	r := s.Send(ctxT(t), msg("example.test", "bob@example.test"))
	checkAll(t, r, classify.StageConnect, 0, classify.EventConnRefused)
	if len(w.dials()) != 2 {
		t.Errorf("dialled %v, want both addresses", w.dials())
	}
}

func TestGreeting421(t *testing.T) {
	w, _ := oneMX(t, fakemx.Options{Greeting: "421 4.3.2 Too busy, try later"})
	s := w.sender(w.config())
	r := s.Send(ctxT(t), msg("example.test", "bob@example.test"))
	checkAll(t, r, classify.StageGreeting, 421, classify.EventNone)
	if o := r.Rcpts[0].Outcome; o.Enhanced != "4.3.2" || o.Text != "Too busy, try later" || o.Raw != "421 4.3.2 Too busy, try later" {
		t.Errorf("outcome %+v", o)
	}
}

func TestMailFromRejected(t *testing.T) {
	for _, pipelining := range []bool{true, false} {
		t.Run(fmt.Sprint("pipelining=", pipelining), func(t *testing.T) {
			opts := fakemx.Options{Hook: func(st fakemx.Stage, arg string) *smtp.SMTPError {
				if st == fakemx.StageMail {
					return &smtp.SMTPError{Code: 550, EnhancedCode: smtp.EnhancedCode{5, 7, 1}, Message: "sender blocked"}
				}
				return nil
			}}
			if !pipelining {
				opts.HideExtensions = []string{"PIPELINING"}
			}
			w, fake := oneMX(t, opts)
			s := w.sender(w.config())
			r := s.Send(ctxT(t), msg("example.test", "bob@example.test", "carol@example.test"))
			checkAll(t, r, classify.StageMail, 550, classify.EventNone)
			if r.Rcpts[1].Outcome.Enhanced != "5.7.1" || len(fake.Messages()) != 0 {
				t.Errorf("outcome %+v, fake got %d", r.Rcpts[1].Outcome, len(fake.Messages()))
			}
			// The connection stays usable for the next message.
			r = s.Send(ctxT(t), msg("example.test", "dave@example.test"))
			if !r.Reused {
				t.Errorf("connection not reused after a refused MAIL")
			}
		})
	}
}

func TestMixedRecipientResults(t *testing.T) {
	for _, pipelining := range []bool{true, false} {
		t.Run(fmt.Sprint("pipelining=", pipelining), func(t *testing.T) {
			opts := fakemx.Options{Hook: func(st fakemx.Stage, arg string) *smtp.SMTPError {
				switch {
				case st == fakemx.StageRcpt && strings.HasPrefix(arg, "unknown@"):
					return &smtp.SMTPError{Code: 550, EnhancedCode: smtp.EnhancedCode{5, 1, 1}, Message: "no such user"}
				case st == fakemx.StageRcpt && strings.HasPrefix(arg, "full@"):
					return &smtp.SMTPError{Code: 452, EnhancedCode: smtp.EnhancedCode{4, 2, 2}, Message: "mailbox full"}
				case st == fakemx.StageRcpt && strings.HasPrefix(arg, "grey@"):
					return &smtp.SMTPError{Code: 450, EnhancedCode: smtp.EnhancedCode{4, 7, 1}, Message: "greylisted"}
				}
				return nil
			}}
			if !pipelining {
				opts.HideExtensions = []string{"PIPELINING"}
			}
			w, fake := oneMX(t, opts)
			s := w.sender(w.config())
			m := msg("example.test", "bob@example.test", "unknown@example.test", "full@example.test", "grey@example.test", "carol@example.test")
			r := s.Send(ctxT(t), m)
			want := []struct {
				stage    classify.Stage
				code     int
				enhanced string
			}{
				{classify.StageDataEnd, 250, "2.0.0"},
				{classify.StageRcpt, 550, "5.1.1"},
				{classify.StageRcpt, 452, "4.2.2"}, // a 452 that is not the recipient limit
				{classify.StageRcpt, 450, "4.7.1"},
				{classify.StageDataEnd, 250, "2.0.0"},
			}
			for i, wnt := range want {
				o := r.Rcpts[i].Outcome
				if r.Rcpts[i].Rcpt != m.Rcpts[i] || o.Stage != wnt.stage || o.Code != wnt.code || o.Enhanced != wnt.enhanced {
					t.Errorf("%s: %+v, want %+v", r.Rcpts[i].Rcpt, o, wnt)
				}
			}
			got := fake.Messages()
			if len(got) != 1 || !slices.Equal(got[0].Rcpts, []string{"bob@example.test", "carol@example.test"}) {
				t.Errorf("fake got %+v", got)
			}
		})
	}
}

func TestAllRecipientsRejected(t *testing.T) {
	w, fake := oneMX(t, fakemx.Options{Hook: func(st fakemx.Stage, arg string) *smtp.SMTPError {
		if st == fakemx.StageRcpt && !strings.HasPrefix(arg, "c@") {
			return &smtp.SMTPError{Code: 550, EnhancedCode: smtp.EnhancedCode{5, 1, 1}, Message: "no such user"}
		}
		return nil
	}})
	s := w.sender(w.config())
	r := s.Send(ctxT(t), msg("example.test", "a@example.test", "b@example.test"))
	checkAll(t, r, classify.StageRcpt, 550, classify.EventNone)
	if len(fake.Messages()) != 0 {
		t.Error("a message was delivered")
	}
	// The session is still in step: the next message goes through.
	checkDelivered(t, s.Send(ctxT(t), msg("example.test", "c@example.test")))
}

func TestRcptMaxSplitsTransactions(t *testing.T) {
	for _, advertised := range []bool{true, false} {
		t.Run(fmt.Sprint("LIMITS=", advertised), func(t *testing.T) {
			opts := fakemx.Options{MaxRecipients: 2}
			if !advertised {
				// Only the 452 4.5.3 at the third RCPT tells.
				opts.HideExtensions = []string{"LIMITS"}
			}
			w, fake := oneMX(t, opts)
			s := w.sender(w.config())
			rcpts := []string{"r1@example.test", "r2@example.test", "r3@example.test", "r4@example.test", "r5@example.test"}
			r := s.Send(ctxT(t), msg("example.test", rcpts...))
			checkDelivered(t, r)
			got := fake.Messages()
			var all []string
			for _, m := range got {
				if len(m.Rcpts) > 2 {
					t.Errorf("transaction with %d recipients", len(m.Rcpts))
				}
				all = append(all, m.Rcpts...)
			}
			slices.Sort(all)
			if !slices.Equal(all, rcpts) || len(got) != 3 || r.Transactions != 3 {
				t.Errorf("fake got %d messages for %v; Transactions=%d", len(got), all, r.Transactions)
			}
			if fake.Connections() != 1 {
				t.Errorf("%d connections, want 1", fake.Connections())
			}
		})
	}
}

func TestConnectionReuseAndRSET(t *testing.T) {
	w, fake := oneMX(t, fakemx.Options{})
	s := w.sender(w.config())
	const n = 10
	for i := range n {
		r := s.Send(ctxT(t), msg("example.test", fmt.Sprintf("r%d@example.test", i)))
		checkDelivered(t, r)
		if r.Reused != (i > 0) {
			t.Errorf("message %d: Reused=%v", i, r.Reused)
		}
	}
	if c, tx, rs := fake.Connections(), fake.Transactions(), fake.Resets(); c != 1 || tx != n || rs != n-1 {
		t.Errorf("connections=%d transactions=%d resets=%d; want 1, %d, %d", c, tx, rs, n, n-1)
	}
}

// With PIPELINING, the RSET that starts a reused connection's transaction
// goes out in one write with MAIL, RCPT and DATA: no round trip of its own.
func TestRSETPipelinedWithMail(t *testing.T) {
	w, fake := oneMX(t, fakemx.Options{HideExtensions: []string{"CHUNKING"}})
	w.recordWrites = true
	s := w.sender(w.config())
	for i := range 3 {
		checkDelivered(t, s.Send(ctxT(t), msg("example.test", fmt.Sprintf("r%d@example.test", i))))
	}
	grouped := 0
	for _, wr := range w.writesSeen() {
		if wr == "RSET\r\n" {
			t.Errorf("RSET written on its own: %q", wr)
		}
		if strings.HasPrefix(wr, "RSET\r\nMAIL FROM:<") && strings.HasSuffix(wr, "DATA\r\n") {
			grouped++
		}
	}
	if grouped != 2 || fake.Resets() != 2 || fake.Connections() != 1 {
		t.Errorf("RSET+MAIL+RCPT+DATA writes=%d resets=%d connections=%d; want 2, 2, 1", grouped, fake.Resets(), fake.Connections())
	}
}

// With CHUNKING and PIPELINING a message is one write: the RSET of a
// reused connection, MAIL, RCPT, "BDAT n LAST" and the message itself, not
// dot-stuffed; it arrives octet for octet, a line starting with a dot and
// a body larger than one 64 KiB block included. NoChunking keeps to DATA,
// and without PIPELINING the chunk follows the RCPT replies.
func TestBDAT(t *testing.T) {
	dotted := msg("example.test", "dots@example.test")
	dotted.Body = append(testBody("dots"), ".leading dot\r\n..two\r\n.\r\nend\r\n"...)
	large := msg("example.test", "large@example.test")
	large.Body = append(testBody("large"), bytes.Repeat([]byte("0123456789abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstu\r\n"), 1500)...)
	send := func(t *testing.T, opts fakemx.Options, cfg func(*Config)) (writes []string, fake *fakemx.Server) {
		t.Helper()
		w, fake := oneMX(t, opts)
		w.recordWrites = true
		c := w.config()
		if cfg != nil {
			cfg(&c)
		}
		s := w.sender(c)
		for _, m := range []*Message{msg("example.test", "a@example.test"), dotted, large} {
			checkDelivered(t, s.Send(ctxT(t), m))
		}
		got := fake.Messages()
		if len(got) != 3 || !bytes.Equal(got[1].Data, dotted.Body) || !bytes.Equal(got[2].Data, large.Body) {
			t.Fatalf("%d messages arrived, or not as sent", len(got))
		}
		if fake.Connections() != 1 {
			t.Errorf("%d connections, want 1", fake.Connections())
		}
		return w.writesSeen(), fake
	}
	bdatWrites := func(writes []string) (n int) {
		for _, wr := range writes {
			if strings.Contains(wr, "BDAT ") {
				n++
			}
			if strings.HasSuffix(wr, "DATA\r\n") || strings.HasSuffix(wr, "\r\n.\r\n") {
				t.Errorf("DATA or a final dot written with CHUNKING offered: %q", wr)
			}
		}
		return n
	}

	t.Run("pipelined", func(t *testing.T) {
		writes, _ := send(t, fakemx.Options{}, nil)
		var whole []string
		for _, wr := range writes {
			if strings.Contains(wr, "MAIL FROM:<") && strings.Contains(wr, " LAST\r\n") && strings.HasSuffix(wr, "\r\n") {
				whole = append(whole, wr)
			}
		}
		// The two small messages are one write each, commands and
		// message; the large one's commands are a write of their own,
		// before its 64 KiB blocks.
		if len(whole) != 3 || !strings.HasPrefix(whole[1], "RSET\r\nMAIL FROM:<") || !strings.HasSuffix(whole[1], "\r\nend\r\n") ||
			!strings.Contains(whole[1], "\r\n.leading dot\r\n..two\r\n.\r\n") {
			t.Errorf("writes carrying MAIL and the BDAT line: %q", whole)
		}
		if n := bdatWrites(writes); n != 3 {
			t.Errorf("%d writes with BDAT, want 3", n)
		}
	})
	t.Run("without pipelining", func(t *testing.T) {
		writes, _ := send(t, fakemx.Options{HideExtensions: []string{"PIPELINING"}}, nil)
		if n := bdatWrites(writes); n != 3 {
			t.Errorf("%d writes with BDAT, want 3", n)
		}
		for _, wr := range writes {
			if strings.HasPrefix(wr, "MAIL FROM:<") && strings.Contains(wr, "BDAT ") {
				t.Errorf("BDAT sent before the RCPT replies without PIPELINING: %q", wr)
			}
		}
	})
	t.Run("NoChunkingFor another domain", func(t *testing.T) {
		writes, _ := send(t, fakemx.Options{}, func(c *Config) { c.NoChunkingFor = map[string]bool{"other.test": true} })
		if n := bdatWrites(writes); n != 3 {
			t.Errorf("%d writes with BDAT, want 3", n)
		}
	})
	for name, cfg := range map[string]func(*Config){
		"NoChunking":                func(c *Config) { c.NoChunking = true },
		"NoChunkingFor this domain": func(c *Config) { c.NoChunkingFor = map[string]bool{"example.test": true} },
		"NoChunkingFor its MX host": func(c *Config) { c.NoChunkingFor = map[string]bool{"mx.example.test": true} },
		"NoChunkingFor as written":  func(c *Config) { c.NoChunkingFor = map[string]bool{" Example.TEST.": true} },
	} {
		t.Run(name, func(t *testing.T) {
			writes, _ := send(t, fakemx.Options{}, cfg)
			data := 0
			for _, wr := range writes {
				if strings.Contains(wr, "BDAT ") {
					t.Errorf("BDAT with NoChunking: %q", wr)
				}
				if strings.HasSuffix(wr, "DATA\r\n") {
					data++
				}
			}
			if data != 3 {
				t.Errorf("%d writes ending in DATA, want 3", data)
			}
		})
	}
}

// Without PIPELINING, RSET is its own command and its reply is awaited.
func TestRSETWithoutPipelining(t *testing.T) {
	w, fake := oneMX(t, fakemx.Options{HideExtensions: []string{"PIPELINING"}})
	w.recordWrites = true
	s := w.sender(w.config())
	for i := range 3 {
		checkDelivered(t, s.Send(ctxT(t), msg("example.test", fmt.Sprintf("r%d@example.test", i))))
	}
	alone := 0
	for _, wr := range w.writesSeen() {
		if wr == "RSET\r\n" {
			alone++
		}
	}
	if alone != 2 || fake.Resets() != 2 || len(fake.Messages()) != 3 {
		t.Errorf("RSET writes=%d resets=%d messages=%d; want 2, 2, 3", alone, fake.Resets(), len(fake.Messages()))
	}
}

// The end of the body leaves in one write with the final dot: a small body
// and its dot together, a large one in blocks whose last carries the dot.
func TestFinalDotLeavesWithBody(t *testing.T) {
	w, fake := oneMX(t, fakemx.Options{HideExtensions: []string{"CHUNKING"}})
	w.recordWrites = true
	s := w.sender(w.config())
	small := msg("example.test", "small@example.test")
	large := msg("example.test", "large@example.test")
	large.Body = append(testBody("large"), bytes.Repeat([]byte("0123456789abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstu\r\n"), 1500)...)
	for _, m := range []*Message{small, large} {
		checkDelivered(t, s.Send(ctxT(t), m))
	}
	var ends []string
	for _, wr := range w.writesSeen() {
		if wr == ".\r\n" {
			t.Errorf("final dot written on its own")
		}
		if strings.HasSuffix(wr, "\r\n.\r\n") {
			ends = append(ends, wr)
		}
	}
	if len(ends) != 2 || !strings.Contains(ends[0], "Subject: test\r\n") || len(ends[1]) > dataBlock {
		t.Errorf("writes ending in the final dot: %d (want 2, the first the whole small body, the second at most 64 KiB)", len(ends))
	}
	if got := len(fake.Messages()); got != 2 {
		t.Fatalf("%d messages arrived", got)
	}
	if got := fake.Messages()[1].Data; !bytes.Equal(got, large.Body) {
		t.Errorf("large body arrived as %d bytes, sent %d", len(got), len(large.Body))
	}
}

// A write that fails before the whole body has left is a failure at DATA
// (the server cannot have the message); one that fails after is at the
// final dot, where the message may have been delivered.
func TestBodyWriteFailureStage(t *testing.T) {
	small := []byte("Subject: x\r\n\r\nhello\r\n")
	// medium does not fit the 4 KiB write buffer: it goes out from the
	// block buffer, still in one write with the dot.
	medium := append([]byte("Subject: y\r\n\r\n"), bytes.Repeat([]byte("0123456789abcdef\r\n"), 600)...)
	for _, body := range [][]byte{small, medium} {
		for _, tc := range []struct {
			room  int
			stage classify.Stage
		}{
			{0, classify.StageData},
			{len(body) - 1, classify.StageData},
			{len(body), classify.StageDataEnd},
			{len(body) + 2, classify.StageDataEnd},
		} {
			fc := &failingConn{room: tc.room}
			c := &client{cfg: &Config{DataBlockTimeout: time.Second}, raw: fc}
			c.setConn(fc)
			err := c.writeBody(context.Background(), body)
			var se *stepErr
			if !errors.As(err, &se) || se.in.Stage != tc.stage || se.in.Event != classify.EventConnLost {
				t.Errorf("%d bytes, room %d: %v, want a lost connection at %v", len(body), tc.room, err, tc.stage)
			}
		}
		fc := &failingConn{room: 1 << 20}
		c := &client{cfg: &Config{DataBlockTimeout: time.Second}, raw: fc}
		c.setConn(fc)
		if err := c.writeBody(context.Background(), body); err != nil || fc.writes != 1 || string(fc.got) != string(body)+".\r\n" {
			t.Errorf("%d bytes: err %v, %d writes of %d bytes; want one write of the body and the dot", len(body), err, fc.writes, len(fc.got))
		}
	}
}

// failingConn accepts room bytes, then fails every write with a reset.
type failingConn struct {
	net.Conn
	room   int
	got    []byte
	writes int
}

func (f *failingConn) Write(p []byte) (int, error) {
	f.writes++
	n := min(len(p), f.room-len(f.got))
	f.got = append(f.got, p[:n]...)
	if n < len(p) {
		return n, syscall.ECONNRESET
	}
	return n, nil
}

func (f *failingConn) SetDeadline(time.Time) error { return nil }

func TestMaxMsgsPerConn(t *testing.T) {
	w, fake := oneMX(t, fakemx.Options{})
	cfg := w.config()
	cfg.MaxMsgsPerConn = 3
	s := w.sender(cfg)
	for i := range 10 {
		checkDelivered(t, s.Send(ctxT(t), msg("example.test", fmt.Sprintf("r%d@example.test", i))))
	}
	if c := fake.Connections(); c != 4 {
		t.Errorf("%d connections for 10 messages at 3 per connection", c)
	}
}

// TestDestinationMaxMsgsPerConn: a destination's own, lower limit (from the
// coordinator's config) applies to the connection its messages use.
func TestDestinationMaxMsgsPerConn(t *testing.T) {
	w, fake := oneMX(t, fakemx.Options{})
	s := w.sender(w.config()) // default 100 per connection
	for i := range 10 {
		m := msg("example.test", fmt.Sprintf("r%d@example.test", i))
		m.MaxMsgsPerConn = 2
		checkDelivered(t, s.Send(ctxT(t), m))
	}
	if c := fake.Connections(); c != 5 {
		t.Errorf("%d connections for 10 messages at 2 per connection", c)
	}
}

func TestDeadPooledConnectionIsReplaced(t *testing.T) {
	w, fake := oneMX(t, fakemx.Options{})
	s := w.sender(w.config())
	checkDelivered(t, s.Send(ctxT(t), msg("example.test", "a@example.test")))
	w.mu.Lock()
	_ = w.conns[0].Close() // the pooled connection dies while idle
	w.mu.Unlock()
	r := s.Send(ctxT(t), msg("example.test", "b@example.test"))
	checkDelivered(t, r)
	if fake.Connections() != 2 || len(fake.Messages()) != 2 {
		t.Errorf("connections=%d messages=%d", fake.Connections(), len(fake.Messages()))
	}
}

// A pooled connection the server closed while it was idle: with BDAT the
// next message has left with the RSET before the sender can know, and the
// closed connection (not a timeout) is what lets it try a fresh one, the
// message delivered once.
func TestServerClosedPooledConnection(t *testing.T) {
	for _, chunking := range []bool{true, false} {
		t.Run(fmt.Sprint("chunking=", chunking), func(t *testing.T) {
			w, fake := oneMX(t, fakemx.Options{})
			cfg := w.config()
			cfg.NoChunking = !chunking
			s := w.sender(cfg)
			checkDelivered(t, s.Send(ctxT(t), msg("example.test", "a@example.test")))
			fake.DropConnections()
			checkDelivered(t, s.Send(ctxT(t), msg("example.test", "b@example.test")))
			got := fake.Messages()
			if len(got) != 2 || fake.Connections() != 2 || !slices.Equal(got[1].Rcpts, []string{"b@example.test"}) {
				t.Errorf("messages=%d connections=%d; want each message once, on two connections", len(got), fake.Connections())
			}
		})
	}
}

func TestIdleTimeoutClosesConnections(t *testing.T) {
	w, fake := oneMX(t, fakemx.Options{})
	cfg := w.config()
	cfg.IdleTimeout = 50 * time.Millisecond
	s := w.sender(cfg)
	checkDelivered(t, s.Send(ctxT(t), msg("example.test", "a@example.test")))
	eventually(t, "the reaper to close the idle connection", func() bool {
		s.pool.mu.Lock()
		defer s.pool.mu.Unlock()
		return len(s.pool.hosts) == 0
	})
	r := s.Send(ctxT(t), msg("example.test", "b@example.test"))
	checkDelivered(t, r)
	if r.Reused || fake.Connections() != 2 {
		t.Errorf("reused=%v connections=%d", r.Reused, fake.Connections())
	}
}

func TestMaxConnsPerHost(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	w, fake := oneMX(t, fakemx.Options{Hook: func(st fakemx.Stage, _ string) *smtp.SMTPError {
		if st == fakemx.StageDot {
			<-release
		}
		return nil
	}})
	cfg := w.config()
	cfg.MaxConnsPerHost = 1
	s := w.sender(cfg)
	results := make(chan Result, 3)
	for i := range 3 {
		go func() { results <- s.Send(ctxT(t), msg("example.test", fmt.Sprintf("r%d@example.test", i))) }()
	}
	eventually(t, "the first message to reach the final dot", func() bool { return fake.Transactions() >= 1 })
	once.Do(func() { close(release) })
	for range 3 {
		checkDelivered(t, <-results)
	}
	if fake.Connections() != 1 {
		t.Errorf("%d connections with MaxConnsPerHost=1", fake.Connections())
	}
}

func TestStalledBodyWriteTimesOut(t *testing.T) {
	done := make(chan struct{})
	w, _ := oneMX(t, fakemx.Options{ReadBuffer: 4096, Hook: func(st fakemx.Stage, _ string) *smtp.SMTPError {
		if st == fakemx.StageBody {
			<-done // never reads the body
		}
		return nil
	}})
	t.Cleanup(func() { close(done) })
	w.sndBuf = 4096 // small buffers on both ends: the stall shows after a few KiB
	cfg := w.config()
	cfg.DataBlockTimeout = 300 * time.Millisecond
	s := w.sender(cfg)
	m := msg("example.test", "bob@example.test")
	m.Body = append(testBody("big"), bytes.Repeat([]byte("0123456789abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstu\r\n"), 60_000)...)
	start := time.Now()
	r := s.Send(ctxT(t), m)
	checkAll(t, r, classify.StageData, 0, classify.EventTimeout)
	if el := time.Since(start); el > 10*time.Second {
		t.Errorf("took %v", el)
	}
}

func TestFinalDotTimeout(t *testing.T) {
	done := make(chan struct{})
	w, _ := oneMX(t, fakemx.Options{Hook: func(st fakemx.Stage, _ string) *smtp.SMTPError {
		if st == fakemx.StageDot {
			<-done
		}
		return nil
	}})
	t.Cleanup(func() { close(done) })
	cfg := w.config()
	cfg.FinalDotTimeout = 200 * time.Millisecond
	s := w.sender(cfg)
	r := s.Send(ctxT(t), msg("example.test", "bob@example.test", "carol@example.test"))
	checkAll(t, r, classify.StageDataEnd, 0, classify.EventTimeout)
}

func TestConnectionLostAfterFinalDot(t *testing.T) {
	w, _ := oneMX(t, fakemx.Options{Hook: func(st fakemx.Stage, _ string) *smtp.SMTPError {
		if st == fakemx.StageDot {
			return fakemx.Drop
		}
		return nil
	}})
	s := w.sender(w.config())
	r := s.Send(ctxT(t), msg("example.test", "bob@example.test"))
	checkAll(t, r, classify.StageDataEnd, 0, classify.EventConnLost)
}

func TestContextDeadlineStopsSend(t *testing.T) {
	done := make(chan struct{})
	w, _ := oneMX(t, fakemx.Options{Hook: func(st fakemx.Stage, _ string) *smtp.SMTPError {
		if st == fakemx.StageDot {
			<-done
		}
		return nil
	}})
	t.Cleanup(func() { close(done) })
	s := w.sender(w.config()) // step timeouts of 5s
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	r := s.Send(ctx, msg("example.test", "bob@example.test"))
	checkAll(t, r, classify.StageDataEnd, 0, classify.EventTimeout)
	if el := time.Since(start); el > 3*time.Second {
		t.Errorf("took %v; the context deadline should cut it", el)
	}
}

// lateDeadline is a context whose deadline passes between the first look
// at Err and the next: the socket's deadline, set to the context's, can
// cut a read a moment before the context's own timer marks it done.
type lateDeadline struct {
	context.Context
	looks int
}

func (c *lateDeadline) Err() error {
	c.looks++
	if c.looks == 1 {
		return nil
	}
	return context.DeadlineExceeded
}

// A read cut by the socket's deadline while the context's timer has not
// yet fired is a timeout, not a lost connection (after the final dot both
// are unknown outcomes, but the record must say which happened). CI once
// saw "i/o timeout (context deadline exceeded)" reported as a lost
// connection in TestContextDeadlineStopsSend.
func TestTimeoutAsTheDeadlinePasses(t *testing.T) {
	c := &client{host: "mx.example.test", addr: "127.0.0.2:25"}
	err := c.netFail(&lateDeadline{Context: context.Background()}, classify.StageDataEnd, "reading reply to BDAT",
		&net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded})
	var se *stepErr
	if !errors.As(err, &se) || se.in.Event != classify.EventTimeout {
		t.Fatalf("netFail = %v, want a timeout", err)
	}
}

func TestContextCancelStopsSend(t *testing.T) {
	done := make(chan struct{})
	reached := make(chan struct{}, 1)
	w, _ := oneMX(t, fakemx.Options{Hook: func(st fakemx.Stage, _ string) *smtp.SMTPError {
		if st == fakemx.StageDot {
			reached <- struct{}{}
			<-done
		}
		return nil
	}})
	t.Cleanup(func() { close(done) })
	s := w.sender(w.config())
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-reached; cancel() }()
	r := s.Send(ctx, msg("example.test", "bob@example.test"))
	checkAll(t, r, classify.StageDataEnd, 0, classify.EventConnLost)
}

func TestDataRejected(t *testing.T) {
	w, _ := oneMX(t, fakemx.Options{Hook: func(st fakemx.Stage, arg string) *smtp.SMTPError {
		switch {
		case st == fakemx.StageRcpt && strings.HasPrefix(arg, "bad@"):
			return &smtp.SMTPError{Code: 550, EnhancedCode: smtp.EnhancedCode{5, 1, 1}, Message: "no such user"}
		case st == fakemx.StageDot:
			return &smtp.SMTPError{Code: 554, EnhancedCode: smtp.EnhancedCode{5, 7, 1}, Message: "spam"}
		}
		return nil
	}})
	s := w.sender(w.config())
	r := s.Send(ctxT(t), msg("example.test", "bob@example.test", "bad@example.test"))
	if o := r.Rcpts[0].Outcome; o.Stage != classify.StageDataEnd || o.Code != 554 || o.Enhanced != "5.7.1" {
		t.Errorf("bob: %+v", o)
	}
	if o := r.Rcpts[1].Outcome; o.Stage != classify.StageRcpt || o.Code != 550 {
		t.Errorf("bad: %+v", o)
	}
}

func TestSMTPUTF8(t *testing.T) {
	utf8Msg := func() *Message {
		m := msg("example.test", "bob@example.test", "用户@example.test")
		m.Body = []byte("From: alice@sender.test\r\nTo: 用户@example.test\r\nSubject: héllo\r\n\r\nbody\r\n")
		return m
	}
	t.Run("not offered", func(t *testing.T) {
		w, fake := oneMX(t, fakemx.Options{})
		s := w.sender(w.config())
		r := s.Send(ctxT(t), utf8Msg())
		checkAll(t, r, classify.StageMail, 553, classify.EventNone)
		if o := r.Rcpts[0].Outcome; o.Enhanced != "5.6.7" || !contains(o.Text, "synthetic") || !contains(o.Text, "SMTPUTF8") {
			t.Errorf("outcome %+v", o)
		}
		if fake.Transactions() != 0 {
			t.Error("MAIL was sent")
		}
	})
	// The refusal names what needs it: an 8-bit header is often not
	// UTF-8 at all (Latin-1 from an old application), and an address is
	// not the message's to fix.
	t.Run("says why", func(t *testing.T) {
		w, _ := oneMX(t, fakemx.Options{})
		s := w.sender(w.config())
		latin1 := msg("example.test", "bob@example.test")
		latin1.Body = []byte("From: alice@sender.test\r\nSubject: caf\xe9\r\n\r\nbody\r\n")
		addr := msg("example.test", "用户@example.test")
		for _, c := range []struct {
			name string
			m    *Message
			want string
		}{{"latin-1 header", latin1, "8-bit octets in the header section"}, {"address", addr, "non-ASCII recipient address"}} {
			r := s.Send(ctxT(t), c.m)
			if o := r.Rcpts[0].Outcome; o.Enhanced != "5.6.7" || !contains(o.Text, c.want) || contains(o.Text, "UTF-8 in") {
				t.Errorf("%s: outcome %+v, want its text to say %q", c.name, o, c.want)
			}
		}
	})
	t.Run("offered", func(t *testing.T) {
		w, fake := oneMX(t, fakemx.Options{SMTPUTF8: true})
		s := w.sender(w.config())
		checkDelivered(t, s.Send(ctxT(t), utf8Msg()))
		if got := fake.Messages(); len(got) != 1 || !got[0].UTF8 || got[0].Body != smtp.Body8BitMIME {
			t.Errorf("fake got %+v", got)
		}
	})
	t.Run("ascii needs nothing", func(t *testing.T) {
		w, fake := oneMX(t, fakemx.Options{})
		s := w.sender(w.config())
		checkDelivered(t, s.Send(ctxT(t), msg("example.test", "bob@example.test")))
		if got := fake.Messages(); got[0].UTF8 || got[0].Body != "" {
			t.Errorf("fake got %+v", got[0])
		}
	})
}

func TestEightBitMIME(t *testing.T) {
	w, fake := oneMX(t, fakemx.Options{})
	s := w.sender(w.config())
	m := msg("example.test", "bob@example.test")
	m.Body = []byte("From: alice@sender.test\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: 8bit\r\n\r\nGrüße\r\n")
	checkDelivered(t, s.Send(ctxT(t), m))
	if got := fake.Messages(); got[0].Body != smtp.Body8BitMIME || got[0].UTF8 || got[0].Size != int64(len(m.Body)) {
		t.Errorf("fake got body=%q utf8=%v size=%d", got[0].Body, got[0].UTF8, got[0].Size)
	}
}

// TestSizeCountsTheAddedLineEnd: a body without its final line ending
// goes out with one (bdatChunk, dotStuffTo), and SIZE= says so (RFC 1870:
// the octets transmitted, line ends included), so that a server whose
// limit lies between the two does not take MAIL and then refuse the data.
func TestSizeCountsTheAddedLineEnd(t *testing.T) {
	for _, noChunking := range []bool{false, true} {
		w, fake := oneMX(t, fakemx.Options{})
		c := w.config()
		c.NoChunking = noChunking
		s := w.sender(c)
		m := msg("example.test", "bob@example.test")
		m.Body = []byte("From: alice@sender.test\r\nSubject: s\r\n\r\nlast line")
		checkDelivered(t, s.Send(ctxT(t), m))
		got := fake.Messages()
		if len(got) != 1 || got[0].Size != int64(len(got[0].Data)) || !bytes.HasSuffix(got[0].Data, []byte("last line\r\n")) {
			t.Errorf("NoChunking %v: declared SIZE=%d for %d octets received: %q", noChunking, got[0].Size, len(got[0].Data), got[0].Data)
		}
	}
}

func TestSizeLimitCheckedBeforeData(t *testing.T) {
	w, fake := oneMX(t, fakemx.Options{MaxMessageBytes: 100})
	s := w.sender(w.config())
	m := msg("example.test", "bob@example.test")
	m.Body = append(testBody("big"), bytes.Repeat([]byte("x"), 200)...)
	r := s.Send(ctxT(t), m)
	checkAll(t, r, classify.StageMail, 552, classify.EventNone)
	if o := r.Rcpts[0].Outcome; o.Enhanced != "5.3.4" || !contains(o.Text, "synthetic") {
		t.Errorf("outcome %+v", o)
	}
	if fake.Transactions() != 0 {
		t.Error("MAIL was sent")
	}
}

func TestDotStuff(t *testing.T) {
	for in, want := range map[string]string{
		"":                   "",
		"a\r\n":              "a\r\n",
		".a\r\n":             "..a\r\n",
		"a\r\n.\r\n.b\r\n":   "a\r\n..\r\n..b\r\n",
		"no final newline":   "no final newline\r\n",
		"x\r\n..already\r\n": "x\r\n...already\r\n",
	} {
		if got := string(dotStuff([]byte(in))); got != want {
			t.Errorf("dotStuff(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestReplyParsing(t *testing.T) {
	for raw, want := range map[string]reply{
		"250 ok\r\n":                                   {code: 250, text: "ok"},
		"550 5.1.1 no such user\r\n":                   {code: 550, enhanced: "5.1.1", text: "no such user"},
		"421-4.7.0 slow\r\n421 4.7.0 down\r\n":         {code: 421, enhanced: "4.7.0", text: "slow\ndown"},
		"452 4.5.3 Too many recipients\r\n":            {code: 452, enhanced: "4.5.3", text: "Too many recipients"},
		"550 4.1.1 class mismatch is not enhanced\r\n": {code: 550, text: "4.1.1 class mismatch is not enhanced"},
	} {
		c := &client{}
		c.setConn(&readOnlyConn{r: strings.NewReader(raw)})
		got, err := c.readReply()
		if err != nil {
			t.Errorf("%q: %v", raw, err)
			continue
		}
		want.raw = strings.TrimSuffix(strings.ReplaceAll(raw, "\r\n", "\r\n"), "\r\n")
		if got != want {
			t.Errorf("%q: got %+v, want %+v", raw, got, want)
		}
	}
	for _, bad := range []string{"hello\r\n", "25\r\n", "250-a\r\n251 b\r\n", "2500 x\r\n"} {
		c := &client{}
		c.setConn(&readOnlyConn{r: strings.NewReader(bad)})
		if _, err := c.readReply(); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

type readOnlyConn struct {
	net.Conn
	r *strings.Reader
}

func (c *readOnlyConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// dotStuffOctets is the octet-at-a-time definition of dotStuff.
func dotStuffOctets(body []byte) []byte {
	var out []byte
	atLineStart := true
	for _, b := range body {
		if atLineStart && b == '.' {
			out = append(out, '.')
		}
		out = append(out, b)
		atLineStart = b == '\n'
	}
	if len(out) > 0 && !bytes.HasSuffix(out, []byte("\r\n")) {
		out = append(out, '\r', '\n')
	}
	return out
}

// FuzzDotStuff checks dotStuff, indexLFDot and isASCII, which search with
// vectorised byte functions, against their octet-at-a-time definitions
// (indexLFDot against bytes.Index).
func FuzzDotStuff(f *testing.F) {
	for _, s := range []string{"", ".", "a\r\n.\r\n", "\n.\n..", "x\r\n..y", "caf\xc3\xa9 au lait\r\n", "12345678\x80",
		strings.Repeat("a.", 40) + "\r\n.x", strings.Repeat(".", 90) + "\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if got, want := indexLFDot(body), bytes.Index(body, lfDot); got != want {
			t.Fatalf("indexLFDot(%q) = %d, want %d", body, got, want)
		}
		if got, want := dotStuff(body), dotStuffOctets(body); !bytes.Equal(got, want) {
			t.Fatalf("dotStuff(%q) = %q, want %q", body, got, want)
		}
		ascii := true
		for _, c := range body {
			ascii = ascii && c < 0x80
		}
		if isASCII := asciipkg.Is(body); isASCII != ascii {
			t.Fatalf("isASCII(%q) = %v", body, !ascii)
		}
	})
}

// BenchmarkInspect is the per-message scan before sending with DATA:
// dot-stuffing and the 8-bit checks of a 100 KiB message: a header and
// 76-octet lines.
func BenchmarkInspect(b *testing.B) {
	line := strings.Repeat("x", 76) + "\r\n"
	hdr := "From: a@example.com\r\nTo: b@example.net\r\nSubject: inspect\r\n\r\n"
	m := &Message{From: "a@example.com", Rcpts: []string{"b@example.net"}, Body: []byte(hdr + strings.Repeat(line, 100<<10/len(line)))}
	b.SetBytes(int64(len(m.Body)))
	for b.Loop() {
		info := inspect(m)
		if info.eightBit {
			b.Fatal("8-bit")
		}
		info.dataWire(m.Body)
		info.release()
	}
}

// replyByLines is the line-by-line definition of readReply: every line
// parsed on its own, the texts and raw lines joined afterwards.
func replyByLines(br *bufio.Reader) (*reply, error) {
	var r reply
	var texts, raws []string
	for n := 0; ; n++ {
		if n == maxReplyLines {
			return nil, errMalformed
		}
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) || len(line) > maxReplyLine {
			return nil, errMalformed
		}
		if err != nil {
			return nil, err
		}
		s := strings.TrimRight(string(line), "\r\n")
		raws = append(raws, s)
		if len(s) < 3 {
			return nil, errMalformed
		}
		code, err := strconv.Atoi(s[:3])
		if err != nil || code < 200 || code > 599 || (r.code != 0 && code != r.code) {
			return nil, errMalformed
		}
		r.code = code
		more := len(s) > 3 && s[3] == '-'
		if len(s) > 3 && s[3] != '-' && s[3] != ' ' {
			return nil, errMalformed
		}
		text := ""
		if len(s) > 4 {
			text = s[4:]
		}
		if n == 0 {
			tok, _, _ := strings.Cut(text, " ")
			parts := strings.Split(tok, ".")
			ok := len(parts) == 3 && parts[0] == strconv.Itoa(code/100)
			for _, p := range parts[1:] {
				ok = ok && p != "" && len(p) <= 3 && strings.Trim(p, "0123456789") == ""
			}
			if ok {
				r.enhanced = tok
			}
		}
		if r.enhanced != "" {
			text = strings.TrimPrefix(strings.TrimPrefix(text, r.enhanced), " ")
		}
		texts = append(texts, text)
		if !more {
			break
		}
	}
	r.text = strings.Join(texts, "\n")
	r.raw = strings.Join(raws, "\r\n")
	return &r, nil
}

// FuzzReplyParsing checks readReply, which parses within one buffer,
// against replyByLines, reply after reply on the same input.
func FuzzReplyParsing(f *testing.F) {
	for _, s := range []string{"250 ok\r\n", "550 5.1.1 no such user\r\n", "421-4.7.0 slow\r\n421 4.7.0 down\r\n",
		"250-a\r\n251 b\r\n", "2500 x\r\n", "25\r\n", "250\r\n354 go\r\n", "550 5.1.1x\r\n", "452-4.5.3 a\r\n452-4.5.3\r\n452 b\r\n",
		"250 2.0.0 Ok\r\r\n250-x\n250 y\r\n", "550 5.1.12345 long\r\n", "250 2..1 x\r\n", "+25 x\r\n", "250-\r\n250 \r\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		c := &client{}
		c.setConn(&readOnlyConn{r: strings.NewReader(string(in))})
		ref := bufio.NewReaderSize(bytes.NewReader(in), 4096)
		for range 10 {
			got, err := c.readReply()
			want, wantErr := replyByLines(ref)
			if (err != nil) != (wantErr != nil) || (errors.Is(err, errMalformed) != errors.Is(wantErr, errMalformed)) {
				t.Fatalf("%q: error %v, want %v", in, err, wantErr)
			}
			if err != nil {
				return
			}
			if got != *want {
				t.Fatalf("%q: got %+v, want %+v", in, got, *want)
			}
		}
	})
}

// BenchmarkIsASCII is the 8-bit check of a 100 KiB body, which inspect
// makes of every message before its MAIL FROM.
func BenchmarkIsASCII(b *testing.B) {
	body := bytes.Repeat([]byte(strings.Repeat("x", 76)+"\r\n"), 100<<10/78)
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if !asciipkg.Is(body) {
			b.Fatal("8-bit")
		}
	}
}

// BenchmarkDotStuff is the dot-stuffing copy of a 100 KiB body before its
// send, for three kinds of body: base64 (no dots), prose (a dot a
// sentence, none at a line's start) and a line in eight that starts with
// a dot.
func BenchmarkDotStuff(b *testing.B) {
	lines := map[string][]string{
		"base64": {strings.Repeat("QUJD", 19) + "\r\n"},
		"prose":  {"It was late. The queue had drained, and the lanes were quiet. Nobody\r\n"},
		"dots": {"..a line that starts with a dot, stuffed on the wire as three of them\r\n",
			"x\r\n", "y\r\n", "z\r\n", "w\r\n", "v\r\n", "u\r\n", "t\r\n"},
	}
	for _, kind := range []string{"base64", "prose", "dots"} {
		b.Run(kind, func(b *testing.B) {
			var body []byte
			for len(body) < 100<<10 {
				for _, l := range lines[kind] {
					body = append(body, l...)
				}
			}
			dst := make([]byte, 0, 2*len(body))
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				dst = dotStuffTo(dst, body)
			}
		})
	}
}

// TestSendDataBlockBoundaries: bodies sent with DATA whose length falls
// on either side of the 64 KiB write blocks arrive whole. A body of
// 65,534 or 65,535 octets past a block's start once made writeBody step a
// block past the end of the body: a panic, and the message never sent.
func TestSendDataBlockBoundaries(t *testing.T) {
	w, fake := oneMX(t, fakemx.Options{})
	cfg := w.config()
	cfg.NoChunking = true
	s := w.sender(cfg)
	for _, n := range []int{65531, 65533, 65534, 65535, 65536, 65537, 131070, 131071, 131072, 131075} {
		m := msg("example.test", "bob@example.test")
		head := "From: a@sender.test\r\nSubject: size\r\n\r\n"
		line := strings.Repeat("x", 76) + "\r\n"
		body := []byte(head + strings.Repeat(line, (n-len(head))/len(line)))
		for len(body) < n-2 {
			body = append(body, 'y')
		}
		m.Body = append(body, "\r\n"...)[:n]
		r := s.Send(ctxT(t), m)
		checkDelivered(t, r)
		got := fake.Messages()
		if last := got[len(got)-1]; !bytes.Equal(last.Data, m.Body) {
			t.Fatalf("%d octets: %d arrived, or other octets", n, len(last.Data))
		}
	}
}

// TestBackupMX5xxGreetingDefers: the primary MX cannot be reached and the
// backup greets with 554. The message is deferred (the primary may take
// it next time), whichever host came last; only when every host answers
// 5xx is the answer permanent.
func TestBackupMX5xxGreetingDefers(t *testing.T) {
	w := newWorld(t)
	backup := fakemx.Start(t, fakemx.Options{Greeting: "554 5.7.1 backup.example.test: no relaying for you"})
	w.zones["example.test."] = mockdns.Zone{MX: []net.MX{{Host: "mx1.example.test.", Pref: 10}, {Host: "mx2.example.test.", Pref: 20}}}
	w.host("mx1.example.test", "127.0.0.2") // nothing routed there: refused
	w.host("mx2.example.test", "127.0.0.3")
	w.route("127.0.0.3", backup)
	r := w.sender(w.config()).Send(ctxT(t), msg("example.test", "bob@example.test"))
	if res := classify.Default().Classify(r.Rcpts[0].Outcome); res.Class == classify.Permanent {
		t.Fatalf("bounced on the backup's 554 greeting while the primary was unreachable: %+v (%s)", r.Rcpts[0].Outcome, res.Rule)
	}
	if len(backup.Messages()) != 0 {
		t.Fatal("the backup took the message")
	}

	both := newWorld(t)
	both.zones["example.test."] = mockdns.Zone{MX: []net.MX{{Host: "mx1.example.test.", Pref: 10}, {Host: "mx2.example.test.", Pref: 20}}}
	both.host("mx1.example.test", "127.0.0.2")
	both.host("mx2.example.test", "127.0.0.3")
	both.route("127.0.0.2", fakemx.Start(t, fakemx.Options{Greeting: "554 5.7.1 no"}))
	both.route("127.0.0.3", backup)
	r = both.sender(both.config()).Send(ctxT(t), msg("example.test", "bob@example.test"))
	if res := classify.Default().Classify(r.Rcpts[0].Outcome); res.Class != classify.Permanent {
		t.Fatalf("every MX greets 554: %+v is %v, want permanent", r.Rcpts[0].Outcome, res.Class)
	}
}
