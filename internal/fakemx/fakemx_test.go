package fakemx

import (
	"crypto/tls"
	"errors"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/emersion/go-smtp"
)

func TestRecordsAndScripts(t *testing.T) {
	s := Start(t, Options{STARTTLS: true, LowercaseExtensions: true, ExtraExtensions: []string{"X-TEST"},
		Hook: func(st Stage, arg string) *smtp.SMTPError {
			if st == StageRcpt && strings.HasPrefix(arg, "no@") {
				return &smtp.SMTPError{Code: 550, EnhancedCode: smtp.EnhancedCode{5, 1, 1}, Message: "no"}
			}
			return nil
		}})
	c, err := smtp.Dial(s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Hello("client.test"); err != nil {
		t.Fatal(err)
	}
	// go-smtp's client matches extensions as spelled: lower case hides them.
	if ok, _ := c.Extension("STARTTLS"); ok {
		t.Error("STARTTLS advertised in upper case")
	}
	if ok, _ := c.Extension("x-test"); ok {
		t.Error("extra extension not lower-cased")
	}
	if err := c.Mail("a@x.test", nil); err != nil {
		t.Fatal(err)
	}
	if err := c.Rcpt("b@y.test", nil); err != nil {
		t.Fatal(err)
	}
	var se *smtp.SMTPError
	if err := c.Rcpt("no@y.test", nil); !errors.As(err, &se) || se.Code != 550 {
		t.Errorf("scripted RCPT: %v", err)
	}
	wc, err := c.Data()
	if err != nil {
		t.Fatal(err)
	}
	_, _ = wc.Write([]byte("Subject: x\r\n\r\nbody\r\n"))
	if err := wc.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.WaitForMessages(1, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := c.Reset(); err != nil {
		t.Fatal(err)
	}
	resets := s.Resets()
	_ = c.Quit() // go-smtp's client says EHLO again after RSET: one more "reset"
	m := s.Messages()[0]
	if m.From != "a@x.test" || !slices.Equal(m.Rcpts, []string{"b@y.test"}) || string(m.Data) != "Subject: x\r\n\r\nbody\r\n" || m.Hostname != "client.test" || m.Conn != 1 {
		t.Errorf("message %+v", m)
	}
	if s.Connections() != 1 || s.Transactions() != 1 || resets != 1 || !slices.Equal(s.EHLONames(), []string{"client.test"}) {
		t.Errorf("conns=%d txs=%d resets=%d ehlos=%v", s.Connections(), s.Transactions(), resets, s.EHLONames())
	}
	if err := s.WaitForMessages(2, 50*time.Millisecond); err == nil {
		t.Error("WaitForMessages(2) succeeded with one message")
	}
}

func TestGreetingAndImplicitTLS(t *testing.T) {
	s := Start(t, Options{Greeting: "421 4.3.2 go away"})
	c, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	n, _ := c.Read(buf)
	_ = c.Close()
	if string(buf[:n]) != "421 4.3.2 go away\r\n" {
		t.Errorf("greeting %q", buf[:n])
	}

	ts := Start(t, Options{ImplicitTLS: true, Users: map[string]string{"u": "p"}})
	tc, err := tls.Dial("tcp", ts.Addr(), &tls.Config{RootCAs: ts.CertPool(), ServerName: "localhost"})
	if err != nil {
		t.Fatal(err)
	}
	sc := smtp.NewClient(tc)
	defer sc.Close()
	if err := sc.Hello("client.test"); err != nil {
		t.Fatal(err)
	}
	if !sc.SupportsAuth("PLAIN") || !sc.SupportsAuth("LOGIN") {
		t.Error("AUTH mechanisms not offered")
	}
}

func TestCloseReleasesBlockedHooks(t *testing.T) {
	reached := make(chan struct{})
	var s *Server
	s = Start(t, Options{Hook: func(st Stage, _ string) *smtp.SMTPError {
		if st == StageMail {
			close(reached)
			<-s.Done()
		}
		return nil
	}})
	c, err := smtp.Dial(s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	mailErr := make(chan error, 1)
	go func() { mailErr <- c.Mail("a@x.test", nil) }()
	<-reached
	if err := s.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := <-mailErr; err == nil {
		t.Error("MAIL succeeded on a closed server")
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}
