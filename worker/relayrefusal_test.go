package worker

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/emersion/go-smtp"
	"github.com/foxcpp/go-mockdns"
	"github.com/rs/zerolog"

	"github.com/outflow/outflow/backoff"
	"github.com/outflow/outflow/classify"
	"github.com/outflow/outflow/internal/fakemx"
	"github.com/outflow/outflow/internal/testutil"
	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/sender"
)

// TestRefusalsOfOutflowThroughARelayDefer: through a smarthost, a
// permanent answer about outflow itself (its address, its session, the
// relay account, the AUTH it did not give) is deferred, since every
// message of every tenant would get the same; one about a recipient or the
// message still bounces. Without a relay only AUTH is deferred: an MX
// host's refusal is its destination's.
func TestRefusalsOfOutflowThroughARelayDefer(t *testing.T) {
	reply := func(stage classify.Stage, code int, enh, text string) classify.Input {
		return classify.Input{Stage: stage, Code: code, Enhanced: enh, Text: text}
	}
	for _, c := range []struct {
		name      string
		in        classify.Input
		relay, mx bool // deferred through a relay, deferred to an MX host
	}{
		{"account suspended at MAIL", reply(classify.StageMail, 421, "4.7.0", "Your account has been suspended"), true, false},
		{"client host rejected at the greeting", reply(classify.StageGreeting, 554, "5.7.1", "Client host rejected: access denied"), true, false},
		{"EHLO refused", reply(classify.StageEHLO, 550, "5.7.1", "Access denied"), true, false},
		{"HELO refused without enhanced code", reply(classify.StageEHLO, 554, "", "Go away"), true, false},
		{"STARTTLS refused", reply(classify.StageTLS, 554, "5.7.3", "TLS not available"), true, false},
		{"authentication required at MAIL", reply(classify.StageMail, 530, "5.7.0", "Authentication required"), true, false},
		{"go-smtp's authenticate first at MAIL", reply(classify.StageMail, 502, "5.7.0", "Please authenticate first"), true, false},
		{"Office 365's client not authenticated at MAIL", reply(classify.StageMail, 530, "5.7.57", "Client not authenticated to send mail"), true, false},
		{"encryption required at MAIL", reply(classify.StageMail, 538, "5.7.11", "Encryption required for requested authentication mechanism"), true, false},
		{"sender identity not verified at the final dot", reply(classify.StageDataEnd, 554, "", "Message rejected: Email address is not verified."), true, false},
		{"AUTH refused", reply(classify.StageAuth, 535, "5.7.8", "Authentication credentials invalid"), true, true},

		{"user unknown at RCPT", reply(classify.StageRcpt, 550, "5.1.1", "user unknown"), false, false},
		{"message too big at the final dot", reply(classify.StageDataEnd, 552, "5.3.4", "message too big"), false, false},
		{"message too big for the relay's SIZE", reply(classify.StageMail, 552, "5.3.4", "outflow (synthetic, no server reply): message larger than the server's SIZE"), false, false},
		{"spam content at the final dot", reply(classify.StageDataEnd, 554, "5.7.1", "spam content"), false, false},
		{"sender domain refused at MAIL", reply(classify.StageMail, 553, "5.1.8", "Sender address rejected: Domain not found"), false, false},
		{"relay access denied at RCPT", reply(classify.StageRcpt, 554, "5.7.1", "<r@dest.test>: Relay access denied"), true, false},
		{"relaying denied at RCPT without enhanced code", reply(classify.StageRcpt, 550, "", "relaying denied for <r@dest.test>"), true, false},
		{"Exchange Online's unable to relay at RCPT", reply(classify.StageRcpt, 550, "5.7.54", "SMTP; Unable to relay recipient in non-accepted domain"), true, false},
		{"user unknown in the relay's recipient table", reply(classify.StageRcpt, 550, "5.1.1", "<r@dest.test>: Recipient address rejected: User unknown in relay recipient table"), false, false},
	} {
		for _, relay := range []bool{true, false} {
			name := c.name + "/mx"
			want := c.mx
			cfg := Config{Classifier: classify.Default()}
			if relay {
				name, want, cfg.Relay = c.name+"/relay", c.relay, "relay.test:587"
			}
			t.Run(name, func(t *testing.T) {
				if r := classify.Default().Classify(c.in); r.Class != classify.Permanent {
					t.Fatalf("the case is no permanent refusal: %+v", r)
				}
				w := &deliverer{Pool: &Pool{cfg: cfg}, id: "w-test/0"}
				e := &queue.Envelope{ID: "m1", Tenant: "t1", Rcpts: []string{"r@dest.test"}}
				o := w.outcomeOf(e, sender.Result{Rcpts: []sender.RcptResult{{Rcpt: "r@dest.test", Outcome: c.in}}}, nil)
				deferred := len(o.again) == 1 && len(o.bounced) == 0
				if deferred != want || len(o.again)+len(o.bounced) != 1 {
					t.Fatalf("deferred %v (again %v, bounced %v), want deferred %v", deferred, o.again, o.bounced, want)
				}
				if !want {
					if o.relayRefusal != nil {
						t.Fatalf("bounced, yet noted as a relay refusal: %+v", o.relayRefusal)
					}
					return
				}
				if o.lead.Class != classify.Transient || !strings.HasSuffix(o.lead.Rule, "/soft-bounce") || o.relayRefusal == nil {
					t.Fatalf("deferral's lead %+v, relay refusal %+v; want transient, rule …/soft-bounce, noted", o.lead, o.relayRefusal)
				}
				if len(o.results) != 1 || o.results[0].Class != classify.Transient {
					// The throttle is given these: a bounce class there
					// would read as the destination's answer.
					t.Fatalf("results for the throttle %+v, want the deferral", o.results)
				}
			})
		}
	}
}

// relayEnv is an env whose pool delivers through snd, a sender to the
// smarthost at addr, and knows it (Config.Relay); its attempt budget is
// two, so a deferred message reaches dead letters within the test.
func relayEnv(t *testing.T, addr string, cfg sender.Config, logs *testutil.SyncBuffer) *env {
	t.Helper()
	e := newEnv(t, nil)
	cfg.Hostname, cfg.Relay = "outflow.test", addr
	if cfg.RelayTLS == "" {
		cfg.RelayTLS = sender.RelayNoTLS
	}
	cfg.CommandTimeout = 2 * time.Second
	snd, err := sender.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { snd.Close() })
	e.snd = snd
	e.startPool(func(c *Config) {
		c.Relay = addr
		c.Budget = backoff.Budget{MaxAttempts: 2, MaxAge: time.Hour}
		c.Logger = zerolog.New(logs)
	})
	return e
}

// waitEnd waits for id to be bounced or dead, whichever comes first, and
// returns its events: a test that wants one learns of the other at once
// rather than after waiting for an event that will not come.
func waitEnd(t *testing.T, e *env, id string) []string {
	t.Helper()
	var evs []string
	testutil.WaitFor(t, 30*time.Second, "the message's end (dead or bounced)", func() bool {
		evs = e.events(id)
		return countPrefix(evs, queue.EventDead)+countPrefix(evs, queue.EventBounced) > 0
	})
	return evs
}

// wantDeferredThenDead checks that id was deferred, never bounced, and
// ended in dead letters when its budget ran out (not deferred for ever),
// and that the log has the error line naming the relay and the rule.
func wantDeferredThenDead(t *testing.T, e *env, id, relay string, logs *testutil.SyncBuffer, rule string) {
	t.Helper()
	evs := waitEnd(t, e, id)
	if countPrefix(evs, queue.EventBounced) != 0 || countPrefix(evs, queue.EventDeferred) == 0 {
		t.Fatalf("events %v: want deferred then dead, never bounced", evs)
	}
	it, err := e.q.Find(context.Background(), id)
	if err != nil || it.State != queue.StateDead {
		t.Fatalf("after the budget: %+v, %v; want dead", it, err)
	}
	alarms := 0
	for _, l := range strings.Split(logs.String(), "\n") {
		var line struct {
			Level, Message, Relay, Rule string
			Refusals                    int
		}
		if json.Unmarshal([]byte(l), &line) != nil || !strings.Contains(line.Message, "refuses outflow itself") {
			continue
		}
		alarms++
		if line.Level != "error" || line.Relay == "" || line.Rule != rule+"/soft-bounce" || line.Refusals != 1 {
			t.Errorf("alarm line %s: want level error, the relay %s, rule %s/soft-bounce, 1 refusal", l, relay, rule)
		}
	}
	// Two refusals within a minute: the second is counted, not written.
	if alarms != 1 {
		t.Fatalf("%d alarm lines, want 1; logs:\n%s", alarms, logs.String())
	}
}

// TestRelayAccountSuspendedDefers: the relay answers MAIL with "421 4.7.0
// Your account has been suspended" (permanent, the tenant's:
// relay-account-state). The mail waits for the account to be restored, and
// goes to dead letters when its budget ends, instead of bouncing.
func TestRelayAccountSuspendedDefers(t *testing.T) {
	relay := fakemx.Start(t, fakemx.Options{Hook: func(stage fakemx.Stage, arg string) *smtp.SMTPError {
		if stage == fakemx.StageMail {
			return &smtp.SMTPError{Code: 421, EnhancedCode: smtp.EnhancedCode{4, 7, 0}, Message: "Your account has been suspended"}
		}
		return nil
	}})
	var logs testutil.SyncBuffer
	e := relayEnv(t, relay.Addr(), sender.Config{}, &logs)
	id := e.submit("r@dest.test")
	wantDeferredThenDead(t, e, id, relay.Addr(), &logs, "relay-account-state")
	if n := len(relay.Messages()); n != 0 {
		t.Fatalf("the relay took %d messages", n)
	}
}

// TestRelayGreetingRefusalDefers: the relay's allowlist no longer has our
// address and it greets with "554 5.7.1 Client host rejected: access
// denied". That is about outflow, not about the message.
func TestRelayGreetingRefusalDefers(t *testing.T) {
	relay := fakemx.Start(t, fakemx.Options{Greeting: "554 5.7.1 Client host rejected: access denied"})
	var logs testutil.SyncBuffer
	e := relayEnv(t, relay.Addr(), sender.Config{}, &logs)
	id := e.submit("r@dest.test")
	wantDeferredThenDead(t, e, id, relay.Addr(), &logs, "rfc3463-permanent")
}

// TestRelayWantsAuthDefers: the relay wants AUTH and outflow has no relay
// user configured, so MAIL is refused: with go-smtp's "502 5.7.0 Please
// authenticate first", or "530 5.7.0 Authentication required".
func TestRelayWantsAuthDefers(t *testing.T) {
	for _, c := range []struct {
		name string
		opts fakemx.Options
	}{
		{"502 please authenticate first", fakemx.Options{Users: map[string]string{"outflow": "secret"}, RequireAuth: true}},
		{"530 authentication required", fakemx.Options{Hook: func(stage fakemx.Stage, arg string) *smtp.SMTPError {
			if stage == fakemx.StageMail {
				return &smtp.SMTPError{Code: 530, EnhancedCode: smtp.EnhancedCode{5, 7, 0}, Message: "Authentication required"}
			}
			return nil
		}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			relay := fakemx.Start(t, c.opts)
			var logs testutil.SyncBuffer
			e := relayEnv(t, relay.Addr(), sender.Config{}, &logs)
			id := e.submit("r@dest.test")
			wantDeferredThenDead(t, e, id, relay.Addr(), &logs, "rfc3463-permanent")
		})
	}
}

// scriptedRelay is a smarthost that greets with greeting and answers each
// command by its verb from replies ("250 ok" for any other, "221" to
// QUIT): for the steps internal/fakemx does not script (EHLO, STARTTLS).
func scriptedRelay(t *testing.T, greeting string, replies map[string]string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				br := bufio.NewReader(c)
				fmt.Fprintf(c, "%s\r\n", greeting)
				for {
					line, err := br.ReadString('\n')
					if err != nil {
						return
					}
					verb, _, _ := strings.Cut(strings.TrimSpace(line), " ")
					verb = strings.ToUpper(verb)
					if verb == "QUIT" {
						fmt.Fprint(c, "221 bye\r\n")
						return
					}
					r, ok := replies[verb]
					if !ok {
						r = "250 ok"
					}
					fmt.Fprintf(c, "%s\r\n", r)
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// TestRelaySessionRefusalsDefer: a relay that refuses our EHLO and HELO,
// or the STARTTLS outflow requires of it, refuses every message alike.
func TestRelaySessionRefusalsDefer(t *testing.T) {
	for _, c := range []struct {
		name    string
		replies map[string]string
		tls     sender.RelayTLS
	}{
		{"EHLO and HELO", map[string]string{"EHLO": "550 5.7.1 Access denied", "HELO": "550 5.7.1 Access denied"}, sender.RelayNoTLS},
		{"STARTTLS", map[string]string{"EHLO": "250-relay.test\r\n250 STARTTLS", "STARTTLS": "554 5.7.3 TLS not available"}, sender.RelaySTARTTLS},
	} {
		t.Run(c.name, func(t *testing.T) {
			addr := scriptedRelay(t, "220 relay.test ESMTP", c.replies)
			var logs testutil.SyncBuffer
			e := relayEnv(t, addr, sender.Config{RelayTLS: c.tls}, &logs)
			id := e.submit("r@dest.test")
			wantDeferredThenDead(t, e, id, addr, &logs, "rfc3463-permanent")
		})
	}
}

// TestRelayStillBouncesMessageRefusals: through a relay, a refusal of one
// recipient or of the message itself bounces as before, without an alarm.
func TestRelayStillBouncesMessageRefusals(t *testing.T) {
	relay := fakemx.Start(t, fakemx.Options{Hook: func(stage fakemx.Stage, arg string) *smtp.SMTPError {
		switch {
		case stage == fakemx.StageRcpt && strings.HasPrefix(arg, "gone@"):
			return &smtp.SMTPError{Code: 550, EnhancedCode: smtp.EnhancedCode{5, 1, 1}, Message: "user unknown"}
		case stage == fakemx.StageDot && strings.HasPrefix(arg, "big@"):
			return &smtp.SMTPError{Code: 552, EnhancedCode: smtp.EnhancedCode{5, 3, 4}, Message: "message too big"}
		case stage == fakemx.StageDot && strings.HasPrefix(arg, "spam@"):
			return &smtp.SMTPError{Code: 554, EnhancedCode: smtp.EnhancedCode{5, 7, 1}, Message: "spam content"}
		}
		return nil
	}})
	var logs testutil.SyncBuffer
	e := relayEnv(t, relay.Addr(), sender.Config{}, &logs)
	for _, rcpt := range []string{"gone@dest.test", "big@dest.test", "spam@dest.test"} {
		id := e.submit(rcpt)
		if evs := waitEnd(t, e, id); countPrefix(evs, queue.EventBounced) != 1 || countPrefix(evs, queue.EventDeferred) != 0 {
			t.Fatalf("%s: events %v, want bounced without a deferral", rcpt, evs)
		}
	}
	if strings.Contains(logs.String(), "refuses outflow itself") {
		t.Fatalf("alarm for a message's refusal:\n%s", logs.String())
	}
}

// TestMXGreetingRefusalBounces: without a relay, a destination whose only
// MX host greets with 554 refuses that destination's mail: it bounces (the
// sender moves on to a domain's other MX hosts first, and defers when one
// of them failed temporarily), and no alarm about a relay is raised.
func TestMXGreetingRefusalBounces(t *testing.T) {
	mx := fakemx.Start(t, fakemx.Options{Greeting: "554 5.7.1 Client host rejected: access denied"})
	_, portStr, _ := net.SplitHostPort(mx.Addr())
	port, _ := strconv.Atoi(portStr)
	e := newEnv(t, nil)
	snd, err := sender.New(sender.Config{Hostname: "outflow.test", Port: port, MXAllowLoopback: true, CommandTimeout: 2 * time.Second,
		Resolver: &mockdns.Resolver{Zones: map[string]mockdns.Zone{
			"dest.test.":    {MX: []net.MX{{Host: "mx.dest.test.", Pref: 10}}},
			"mx.dest.test.": {A: []string{"127.0.0.1"}},
		}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { snd.Close() })
	e.snd = snd
	var logs testutil.SyncBuffer
	e.startPool(func(c *Config) { c.Logger = zerolog.New(&logs) })
	id := e.submit("r@dest.test")
	if evs := waitEnd(t, e, id); countPrefix(evs, queue.EventBounced) != 1 || countPrefix(evs, queue.EventDeferred) != 0 {
		t.Fatalf("events %v, want bounced without a deferral", evs)
	}
	if strings.Contains(logs.String(), "refuses outflow itself") {
		t.Fatalf("relay alarm without a relay:\n%s", logs.String())
	}
}

// TestRelayAlarmPaces: the error line is written at most once a minute,
// and the next one counts the refusals not written in between.
func TestRelayAlarmPaces(t *testing.T) {
	var a relayAlarm
	t0 := time.Unix(1_700_000_000, 0)
	for i, c := range []struct {
		at   time.Duration
		n    int
		line bool
	}{
		{0, 1, true},
		{time.Second, 0, false},
		{59 * time.Second, 0, false},
		{61 * time.Second, 3, true},
		{62 * time.Second, 0, false},
		{3 * time.Minute, 2, true},
	} {
		n, line := a.note(t0.Add(c.at))
		if n != c.n || line != c.line {
			t.Fatalf("refusal %d at +%v: (%d, %v), want (%d, %v)", i, c.at, n, line, c.n, c.line)
		}
	}
}
