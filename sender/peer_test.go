package sender

import (
	"bufio"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/foxcpp/go-mockdns"
)

// peer is a hand-written SMTP server on loopback, for what fakemx (a
// go-smtp server) cannot script: a refusal of the DATA command itself, a
// garbled reply, a login answered only when the test says so. answer gives
// the reply to each command line but QUIT (one or more lines, each ending
// in CRLF; "" for the usual one, for EHLO the extensions ext) and to the
// end of each message, asked as "."
// after DATA's body and as the BDAT line once its chunk is read; conn is
// the connection's 1-based number. answer may block, but must return once
// the test's cleanup releases it (cleanups registered after startPeer run
// before the peer closes).
type peer struct {
	ln     net.Listener
	ext    []string
	answer func(conn int, cmd string) string
	// late, when set, is asked after each reply to the end of a message
	// (".", or a BDAT chunk), may block, and what it returns is written then: a reply
	// nobody asked for, arriving after the client read the real one.
	late func(conn int) string

	mu    sync.Mutex
	conns int
	cmds  []string // "conn: command", in the order received
	live  map[net.Conn]bool
	wg    sync.WaitGroup
}

// startPeer starts a peer whose EHLO offers ext (keywords with their
// parameters, e.g. "PIPELINING", "LIMITS RCPTMAX=1", "AUTH PLAIN").
func startPeer(t testing.TB, ext []string, answer func(conn int, cmd string) string) *peer {
	t.Helper()
	return startPeerLate(t, ext, answer, nil)
}

// startPeerLate is startPeer with a late writer (peer.late).
func startPeerLate(t testing.TB, ext []string, answer func(conn int, cmd string) string, late func(conn int) string) *peer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("peer: %v", err)
	}
	p := &peer{ln: ln, ext: ext, answer: answer, late: late, live: map[net.Conn]bool{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *peer) addr() string { return p.ln.Addr().String() }

func (p *peer) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		p.conns++
		n := p.conns
		p.live[c] = true
		p.mu.Unlock()
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer func() {
				p.mu.Lock()
				delete(p.live, c)
				p.mu.Unlock()
				_ = c.Close()
			}()
			p.serve(n, c)
		}()
	}
}

func (p *peer) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	for c := range p.live {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *peer) serve(n int, c net.Conn) {
	br := bufio.NewReader(c)
	if _, err := io.WriteString(c, "220 peer.test ESMTP\r\n"); err != nil {
		return
	}
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return
		}
		cmd := strings.TrimRight(line, "\r\n")
		p.note(n, cmd)
		verb, arg, _ := strings.Cut(cmd, " ")
		verb = strings.ToUpper(verb)
		var rep string
		switch verb {
		case "EHLO":
			if rep = p.answer(n, cmd); rep != "" {
				break
			}
			rep = "250"
			if len(p.ext) > 0 {
				rep += "-"
			} else {
				rep += " "
			}
			rep += "peer.test\r\n"
			for i, e := range p.ext {
				sep := "-"
				if i == len(p.ext)-1 {
					sep = " "
				}
				rep += "250" + sep + e + "\r\n"
			}
		case "QUIT":
			_, _ = io.WriteString(c, "221 2.0.0 bye\r\n")
			return
		case "BDAT":
			size, _, _ := strings.Cut(arg, " ")
			k, err := strconv.Atoi(size)
			if err != nil {
				return
			}
			if _, err := io.CopyN(io.Discard, br, int64(k)); err != nil {
				return
			}
			if rep = p.answer(n, cmd); rep == "" {
				rep = "250 2.0.0 queued\r\n"
			}
		default:
			if rep = p.answer(n, cmd); rep == "" {
				rep = "250 2.0.0 ok\r\n"
				if verb == "DATA" {
					rep = "354 go ahead\r\n"
				}
			}
		}
		if _, err := io.WriteString(c, rep); err != nil {
			return
		}
		if verb == "BDAT" && p.late != nil {
			if _, err := io.WriteString(c, p.late(n)); err != nil {
				return
			}
		}
		if verb != "DATA" || !strings.HasPrefix(rep, "354") {
			continue
		}
		for {
			l, err := br.ReadString('\n')
			if err != nil {
				return
			}
			if l == ".\r\n" {
				break
			}
		}
		p.note(n, ".")
		if rep = p.answer(n, "."); rep == "" {
			rep = "250 2.0.0 queued\r\n"
		}
		if _, err := io.WriteString(c, rep); err != nil {
			return
		}
		if p.late != nil {
			if _, err := io.WriteString(c, p.late(n)); err != nil {
				return
			}
		}
	}
}

func (p *peer) note(n int, cmd string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cmds = append(p.cmds, strconv.Itoa(n)+": "+cmd)
}

// commands returns every command received so far, "conn: command" (an
// AUTH line with its credentials), "." for the end of a DATA body.
func (p *peer) commands() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.cmds...)
}

// connections is the number of connections accepted so far.
func (p *peer) connections() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.conns
}

// count is how many commands received so far start with prefix.
func (p *peer) count(prefix string) int {
	n := 0
	for _, c := range p.commands() {
		_, cmd, _ := strings.Cut(c, ": ")
		if strings.HasPrefix(cmd, prefix) {
			n++
		}
	}
	return n
}

// peerMX is a world where example.test has one MX host, mx.example.test at
// 127.0.0.2, served by p.
func peerMX(t testing.TB, p *peer) *world {
	w := newWorld(t)
	w.zones["example.test."] = mockdns.Zone{MX: []net.MX{{Host: "mx.example.test.", Pref: 10}}}
	w.host("mx.example.test", "127.0.0.2")
	w.mu.Lock()
	w.routes["127.0.0.2:25"] = p.addr()
	w.mu.Unlock()
	return w
}
