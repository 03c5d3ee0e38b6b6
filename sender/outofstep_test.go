package sender

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outflow/outflow/classify"
)

// TestReplyOutOfStepIsNoDelivery: a positive or intermediate reply that is
// not the one a step asked for (a 250 to DATA, a 220 to EHLO, a 250 to
// STARTTLS, a 354 to MAIL or RCPT) is no outcome of the step: the session
// is confused and the attempt ends as a lost connection, retried. Taken
// for the step's outcome, a 2xx read as delivered a message the server
// never got.
func TestReplyOutOfStepIsNoDelivery(t *testing.T) {
	for _, tc := range []struct {
		name string
		ext  []string
		cmd  string
		rep  string
	}{
		{"250 to DATA, pipelined", []string{"PIPELINING"}, "DATA", "250 2.0.0 ok\r\n"},
		{"250 to DATA", nil, "DATA", "250 2.0.0 ok\r\n"},
		{"220 to EHLO", nil, "EHLO", "220 again\r\n"},
		{"250 to STARTTLS", []string{"STARTTLS"}, "STARTTLS", "250 ok\r\n"},
		{"354 to MAIL", nil, "MAIL", "354 go ahead\r\n"},
		{"354 to MAIL, pipelined", []string{"PIPELINING"}, "MAIL", "354 go ahead\r\n"},
		{"354 to RCPT", nil, "RCPT", "354 go ahead\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := startPeer(t, tc.ext, func(_ int, cmd string) string {
				if strings.HasPrefix(cmd, tc.cmd) {
					return tc.rep
				}
				return ""
			})
			w := peerMX(t, p)
			s := w.sender(w.config())
			defer s.Close()
			r := s.Send(ctxT(t), msg("example.test", "a@example.test"))
			o := r.Rcpts[0].Outcome
			res := classify.Default().Classify(o)
			if p.count(".") > 0 {
				// Opportunistic TLS: the next connection went without
				// STARTTLS, and the server got the message there.
				if res.Class != classify.Delivered {
					t.Fatalf("outcome %+v classified %v after the message went out (%q)", o, res.Class, p.commands())
				}
				return
			}
			if res.Class == classify.Delivered || res.Class == classify.Permanent {
				t.Fatalf("outcome %+v classified %v; the server never got the message (%q)", o, res.Class, p.commands())
			}
			if !strings.Contains(o.Text, "out of step") {
				t.Fatalf("outcome %+v: want the reply named out of step", o)
			}
		})
	}
}

// TestUnaskedReplyRetiresAPooledConnection: a server that answers a final
// dot twice leaves a reply nobody asked for on the connection. Pooled and
// taken up, the connection read each reply one step late: with CHUNKING
// the next message's BDAT read its RCPT's 250 as the message's, the
// server's refusal of it was never seen, and the message counted
// delivered. The connection is retired instead, whether the second reply
// came with the first or after the connection went back to the pool.
func TestUnaskedReplyRetiresAPooledConnection(t *testing.T) {
	for _, ext := range [][]string{nil, {"PIPELINING"}, {"PIPELINING", "CHUNKING"}} {
		for _, late := range []bool{false, true} {
			name := strings.Join(ext, "+") + "/together"
			if late {
				name = strings.Join(ext, "+") + "/late"
			}
			t.Run(name, func(t *testing.T) {
				n := 0
				answer := func(_ int, cmd string) string {
					if cmd == "." || strings.HasPrefix(cmd, "BDAT") {
						n++
						switch {
						case n > 1:
							return "554 5.7.1 rejected as spam\r\n"
						case !late:
							return "250 2.0.0 queued\r\n250 2.0.0 queued again\r\n"
						}
					}
					return ""
				}
				// The second reply, written once the first message's Send
				// has returned (its connection back in the pool).
				sent, written := make(chan struct{}), make(chan struct{})
				var once sync.Once
				var lateReply func(int) string
				if late {
					lateReply = func(int) string {
						rep := ""
						once.Do(func() {
							<-sent
							rep = "250 2.0.0 queued again\r\n"
							close(written)
						})
						return rep
					}
				}
				p := startPeerLate(t, ext, answer, lateReply)
				var sentOnce sync.Once
				send := func() { sentOnce.Do(func() { close(sent) }) }
				t.Cleanup(send) // before the peer closes: a blocked late writer returns
				w := peerMX(t, p)
				s := w.sender(w.config())
				defer s.Close()
				if r := s.Send(ctxT(t), msg("example.test", "a@example.test")); classify.Default().Classify(r.Rcpts[0].Outcome).Class != classify.Delivered {
					t.Fatalf("first message: %+v", r.Rcpts[0].Outcome)
				}
				if late {
					send()
					<-written
				}
				r := s.Send(ctxT(t), msg("example.test", "b@example.test"))
				res := classify.Default().Classify(r.Rcpts[0].Outcome)
				if res.Class != classify.Permanent || !strings.Contains(r.Rcpts[0].Outcome.Text+r.Rcpts[0].Outcome.Raw, "rejected as spam") {
					t.Fatalf("second message: %+v classified %v, want the server's refusal (%q)", r.Rcpts[0].Outcome, res.Class, p.commands())
				}
			})
		}
	}
}

// TestUnsolicited: a connection with a byte to read, or closed by its
// peer, is unsolicited, also when the last command's read deadline has
// passed; a quiet one is not, and the look does not wait.
func TestUnsolicited(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	server := <-accepted
	defer server.Close()
	c := &client{raw: nc}
	c.setConn(nc)
	_ = nc.SetReadDeadline(time.Now().Add(-time.Second)) // the last command's, passed
	start := time.Now()
	if c.unsolicited() {
		t.Fatal("a quiet connection is unsolicited")
	}
	if took := time.Since(start); took > 100*time.Millisecond {
		t.Fatalf("the look waited %v", took)
	}
	waitSeen := func(what string) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); !c.unsolicited(); {
			if time.Now().After(deadline) {
				t.Fatalf("%s not seen within 5s", what)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	if _, err := server.Write([]byte("250 again\r\n")); err != nil {
		t.Fatal(err)
	}
	waitSeen("a reply nobody asked for")
	if _, err := c.br.ReadString('\n'); err != nil { // read: quiet again
		t.Fatal(err)
	}
	if c.unsolicited() {
		t.Fatal("unsolicited after the reply was read")
	}
	server.Close()
	waitSeen("the peer's close")
}

// BenchmarkUnsolicited: the look at a pooled connection before it is taken
// up (client.unsolicited), on a quiet loopback connection.
func BenchmarkUnsolicited(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			defer c.Close()
			_, _ = c.Read(make([]byte, 1))
		}
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	c := &client{raw: nc}
	c.setConn(nc)
	_ = nc.SetReadDeadline(time.Now().Add(time.Hour))
	b.ReportAllocs()
	for b.Loop() {
		if c.unsolicited() {
			b.Fatal("unsolicited")
		}
	}
}

// TestQuietPooledConnection: a pooled connection the server has gone
// quiet on (no close, no reply) costs the RSET's short timeout, not a
// command timeout, before the message goes to a fresh connection. The
// Send's deadline here is shorter than the command timeout: waited for
// that, the message was not sent at all.
func TestQuietPooledConnection(t *testing.T) {
	for _, ext := range [][]string{nil, {"PIPELINING"}} {
		t.Run(strings.Join(ext, "+"), func(t *testing.T) {
			quiet := make(chan struct{})
			p := startPeer(t, ext, func(conn int, cmd string) string {
				if conn == 1 && cmd == "RSET" {
					<-quiet // the first connection says nothing more
				}
				return ""
			})
			t.Cleanup(func() { close(quiet) })
			w := peerMX(t, p)
			cfg := w.config()
			cfg.CommandTimeout, cfg.ResetTimeout = time.Minute, 200*time.Millisecond
			s := w.sender(cfg)
			if r := s.Send(ctxT(t), msg("example.test", "a@example.test")); classify.Default().Classify(r.Rcpts[0].Outcome).Class != classify.Delivered {
				t.Fatalf("first message: %+v", r.Rcpts[0].Outcome)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			r := s.Send(ctx, msg("example.test", "b@example.test"))
			p.mu.Lock()
			conns := p.conns
			p.mu.Unlock()
			if res := classify.Default().Classify(r.Rcpts[0].Outcome); res.Class != classify.Delivered || conns < 2 {
				t.Fatalf("second message: %+v (%v) on %d connections (%q)", r.Rcpts[0].Outcome, res.Class, conns, p.commands())
			}
		})
	}
}

// TestBDATRefusedAsUnknown: a server that offers CHUNKING and then
// answers BDAT "500 unrecognized command" never took the message: the
// attempt is retried, not bounced, and the host gets DATA from then on.
// Read as the message's reply, the 500 bounced every message to it.
func TestBDATRefusedAsUnknown(t *testing.T) {
	for _, ext := range [][]string{{"CHUNKING"}, {"PIPELINING", "CHUNKING"}} {
		t.Run(strings.Join(ext, "+"), func(t *testing.T) {
			p := startPeer(t, ext, func(_ int, cmd string) string {
				if strings.HasPrefix(cmd, "BDAT") {
					return "500 5.5.1 unrecognized command\r\n"
				}
				return ""
			})
			w := peerMX(t, p)
			s := w.sender(w.config())
			r := s.Send(ctxT(t), msg("example.test", "a@example.test"))
			if res := classify.Default().Classify(r.Rcpts[0].Outcome); res.Class != classify.Transient {
				t.Fatalf("first attempt: %+v classified %v, want transient", r.Rcpts[0].Outcome, res.Class)
			}
			r = s.Send(ctxT(t), msg("example.test", "a@example.test"))
			if res := classify.Default().Classify(r.Rcpts[0].Outcome); res.Class != classify.Delivered || p.count("DATA") == 0 {
				t.Fatalf("the retry: %+v classified %v, want delivered with DATA (%q)", r.Rcpts[0].Outcome, res.Class, p.commands())
			}
		})
	}
}
