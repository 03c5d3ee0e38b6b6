package e2e

import (
	"bufio"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// connCapMX is a fake provider that takes at most cap connections at once
// and refuses the rest at the greeting, as Gmail and Exchange do ("421
// 4.7.0 Too many concurrent connections"), and takes each message in
// dataDelay: cap connections take cap/dataDelay messages a second, and
// nothing else limits them.
type connCapMX struct {
	ln        net.Listener
	cap       int
	dataDelay time.Duration

	mu        sync.Mutex
	active    int
	maxActive int
	refused   int
	accepted  []time.Time
}

func startConnCapMX(t *testing.T, cap int, dataDelay time.Duration) *connCapMX {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &connCapMX{ln: ln, cap: cap, dataDelay: dataDelay}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.handle(c)
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return p
}

func (p *connCapMX) handle(c net.Conn) {
	defer c.Close()
	p.mu.Lock()
	if p.active >= p.cap {
		p.refused++
		p.mu.Unlock()
		io.WriteString(c, "421 4.7.0 Too many concurrent connections from your IP, try again later\r\n")
		return
	}
	p.active++
	p.maxActive = max(p.maxActive, p.active)
	p.mu.Unlock()
	defer func() { p.mu.Lock(); p.active--; p.mu.Unlock() }()
	c.SetDeadline(time.Now().Add(5 * time.Minute))
	r := bufio.NewReader(c)
	w := func(s string) { io.WriteString(c, s+"\r\n") }
	w("220 capped.test ESMTP")
	rcpts := 0
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		up := strings.ToUpper(strings.TrimRight(line, "\r\n"))
		switch {
		case strings.HasPrefix(up, "EHLO"):
			w("250-capped.test\r\n250-PIPELINING\r\n250 8BITMIME")
		case strings.HasPrefix(up, "HELO"):
			w("250 capped.test")
		case strings.HasPrefix(up, "MAIL"):
			rcpts = 0
			w("250 2.1.0 ok")
		case strings.HasPrefix(up, "RCPT"):
			rcpts++
			w("250 2.1.5 ok")
		case up == "DATA":
			if rcpts == 0 {
				w("554 5.5.1 no valid recipients")
				continue
			}
			w("354 go")
			for {
				l, err := r.ReadString('\n')
				if err != nil {
					return
				}
				if l == ".\r\n" {
					break
				}
			}
			time.Sleep(p.dataDelay)
			p.mu.Lock()
			for range rcpts {
				p.accepted = append(p.accepted, time.Now())
			}
			p.mu.Unlock()
			rcpts = 0
			w("250 2.0.0 queued")
		case up == "RSET":
			rcpts = 0
			w("250 ok")
		case up == "NOOP":
			w("250 ok")
		case up == "QUIT":
			w("221 bye")
			return
		default:
			w("502 5.5.2 what")
		}
	}
}

// counts is what the provider saw: messages accepted, connections refused,
// the most connections at once, and the last acceptance.
func (p *connCapMX) counts() (accepted, refused, maxActive int, last time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n := len(p.accepted); n > 0 {
		last = p.accepted[n-1]
	}
	return len(p.accepted), p.refused, p.maxActive, last
}

// TestLearnedConnsDrainsAConnectionCappedProvider: a provider that takes
// two connections at once, each a message per 200 ms (10/s), and refuses
// more at the greeting. One daemon learns the connection limit and
// drains the backlog near the provider's pace, and the provider refuses
// few connections against the messages it takes.
//
// Before: no rate is learned from "too many connections", so every
// refused envelope was paced at first contact's 1/s, its places reaching
// as far ahead as the backlog (600 messages: 307 delivered in 60 s, 1/s
// from 44 s on); and the learned limit climbed back over the cap every
// 2 s (a step held the cuts back for 2 s), each probe costing dozens of
// refused connections: more refused than delivered.
func TestLearnedConnsDrainsAConnectionCappedProvider(t *testing.T) {
	const (
		cap   = 2
		data  = 200 * time.Millisecond
		total = 200
	)
	ideal := time.Duration(total) * data / cap // 20 s
	p := startConnCapMX(t, cap, data)
	dir := t.TempDir()
	d := startDaemon(t, dir+"/a", learnedArgs(writeUsers(t, dir), p.ln.Addr().String())...)
	start := time.Now()
	submitThrough(t, []*daemon{d}, total, "c", "r@capped.test")
	deadline := start.Add(3*ideal + 10*time.Second)
	for {
		if n, _, _, _ := p.counts(); n >= total || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	n, refused, maxActive, last := p.counts()
	drain := last.Sub(start)
	t.Logf("%d/%d messages in %.1fs (ideal %.0fs), %d connections refused, at most %d at once", n, total, drain.Seconds(), ideal.Seconds(), refused, maxActive)
	t.Logf("learned-conns changes:\n%s", grepLines(d.Logs(), `"change":"learned-conns"`))
	if n < total {
		t.Fatalf("%d of %d delivered in %s; paced_by of the deferrals:\n%s", n, total, time.Since(start).Round(time.Second), lastLines(grepLines(d.Logs(), `"paced_by"`), 5))
	}
	// A wide margin over the ideal: a shared machine, a race build, and
	// the limit learned from one at the seed.
	if drain > 2*ideal+5*time.Second {
		t.Errorf("drained in %.1fs, over twice the ideal %.0fs", drain.Seconds(), ideal.Seconds())
	}
	// Each probe over the cap costs a refused connection or a few; a
	// limit that climbs back over the cap costs one for every message.
	if refused > total/10 {
		t.Errorf("%d connections refused for %d messages", refused, total)
	}
	if strings.Contains(d.Logs(), `first-contact"`) && !strings.Contains(d.Logs(), `"change":"learned-rate"`) {
		t.Errorf("throttled mail paced at first contact's rate with no rate coming:\n%s", lastLines(grepLines(d.Logs(), `first-contact"`), 3))
	}
}
