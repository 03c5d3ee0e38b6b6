package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/emersion/go-smtp"
	"github.com/rs/zerolog"

	"github.com/outflow/outflow/backoff"
	"github.com/outflow/outflow/internal/fakemx"
	"github.com/outflow/outflow/internal/testutil/testqueue"
	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/sender"
	"github.com/outflow/outflow/throttle"
)

// logLines parses the JSON lines of logs.
func logLines(t *testing.T, logs string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(logs, "\n") {
		if !strings.HasPrefix(l, "{") {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line is not JSON: %v: %s", err, l)
		}
		out = append(out, m)
	}
	return out
}

// linesOf returns the lines of id whose message starts with msg.
func linesOf(lines []map[string]any, id, msg string) []map[string]any {
	var out []map[string]any
	for _, m := range lines {
		if m["msg_id"] == id && strings.HasPrefix(fmt.Sprint(m["message"]), msg) {
			out = append(out, m)
		}
	}
	return out
}

// jsonType names a decoded JSON value's type; "" for null.
func jsonType(v any) string {
	switch v.(type) {
	case nil:
		return ""
	case float64:
		return "number"
	case string:
		return "string"
	case bool:
		return "bool"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	}
	return fmt.Sprintf("%T", v)
}

// assertOneTypePerKey fails when a key has two JSON types across the
// lines: a log store that types a field by its first value (Elasticsearch)
// rejects the lines of the other type.
func assertOneTypePerKey(t *testing.T, lines []map[string]any) {
	t.Helper()
	type seen struct{ typ, msg string }
	first := map[string]seen{}
	for _, m := range lines {
		for k, v := range m {
			typ := jsonType(v)
			if typ == "" {
				continue
			}
			if f, ok := first[k]; !ok {
				first[k] = seen{typ, fmt.Sprint(m["message"])}
			} else if f.typ != typ {
				t.Errorf("key %q is a %s on %q and a %s on %q", k, f.typ, f.msg, typ, m["message"])
			}
		}
	}
}

// TestLogKeysHaveOneType: every key of the pool's lines has one JSON type.
// The line about an envelope of several recipients sent with its own
// sender counted them as "rcpts", which the decision lines give as the
// list of addresses; the count is rcpt_count.
func TestLogKeysHaveOneType(t *testing.T) {
	e := newEnv(t, nil)
	var logs syncBuf
	e.startPool(func(c *Config) {
		c.ReturnPath = prefixReturnPath{}
		c.Logger = zerolog.New(&logs)
	})
	id := e.submit("a@dest.test", "b@dest.test")
	e.waitEvent(id, queue.EventDelivered)
	lines := logLines(t, logs.String())
	assertOneTypePerKey(t, lines)
	several := linesOf(lines, id, "envelope of several recipients")
	if len(several) != 1 || several[0]["rcpt_count"] != 2.0 {
		t.Fatalf("several-recipients lines %v, want one with rcpt_count 2\n%s", several, logs.String())
	}
	if d := linesOf(lines, id, backoff.DecisionMessage); len(d) != 1 || jsonType(d[0]["rcpts"]) != "array" {
		t.Fatalf("decision lines %v, want one with the list of rcpts", d)
	}
}

// TestRedeliveredAttemptIsLogged: a holder killed during its attempt (here
// after the server took the message, before anything was recorded) leaves
// nothing in the log; the envelope's next holder, handed it again by the
// server after the ack wait, says that the earlier holder's attempt may
// have reached the server, and its decision line carries the server's
// delivery count. Before, the redelivered attempt logged "attempt":1 as
// any first attempt, and the duplicate had no trace.
func TestRedeliveredAttemptIsLogged(t *testing.T) {
	e := newEnv(t, nil)
	id := e.submit("r@dest.test")
	// The first holder, on its own connection: sends, then "dies".
	q1 := connect(t, e.emb, 2*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d, stopPull := testqueue.Take(t, ctx, q1, queue.LaneWork)
	if d.Redelivered {
		t.Fatal("first hand-out marked redelivered")
	}
	body, _ := q1.EnvelopeBody(ctx, d.Env)
	res := e.snd.Send(ctx, &sender.Message{ID: id, From: d.Env.From, Rcpts: d.Env.Rcpts, Domain: d.Env.Dest, Body: body})
	if res.Rcpts[0].Outcome.Code != 250 {
		t.Fatalf("send: %+v", res.Rcpts[0].Outcome)
	}
	stopPull()
	q1.Close() // killed: no SENT marker, no ack

	var logs syncBuf
	e.startPool(func(c *Config) { c.Logger = zerolog.New(&logs) })
	evs := e.waitEvent(id, queue.EventDelivered)
	fresh := e.submit("s@dest.test")
	e.waitEvent(fresh, queue.EventDelivered)

	lines := logLines(t, logs.String())
	said := linesOf(lines, id, "redelivered: an earlier holder did not finish its attempt")
	if len(said) != 1 {
		t.Fatalf("%d redelivery lines for %s, want 1\n%s", len(said), id, logs.String())
	}
	l := said[0]
	if n, _ := l["deliveries"].(float64); n < 2 || l["level"] != "info" || l["attempts_made"] != 0.0 ||
		!strings.HasPrefix(fmt.Sprint(l["worker_id"]), "w-test/") {
		t.Errorf("redelivery line %v: want info, deliveries ≥ 2, attempts_made 0, the deliverer's worker_id", l)
	}
	dec := linesOf(lines, id, backoff.DecisionMessage)
	if len(dec) != 1 || dec[0]["attempt"] != 1.0 {
		t.Fatalf("decision lines %v, want one of attempt 1", dec)
	}
	if n, _ := dec[0]["deliveries"].(float64); n < 2 {
		t.Errorf("decision line without the delivery count: %v", dec[0])
	}
	var rec backoff.Record
	for _, ev := range evs {
		if ev.Type == queue.EventDelivered {
			if err := rec.UnmarshalJSON(ev.Decision); err != nil {
				t.Fatal(err)
			}
		}
	}
	if rec.Deliveries < 2 {
		t.Errorf("delivered event's record has deliveries %d, want ≥ 2", rec.Deliveries)
	}
	// A first hand-out says nothing of the kind.
	if n := len(linesOf(lines, fresh, "redelivered")); n != 0 {
		t.Errorf("%d redelivery lines for a first hand-out", n)
	}
	if dec := linesOf(lines, fresh, backoff.DecisionMessage); len(dec) != 1 || dec[0]["deliveries"] != nil {
		t.Errorf("first hand-out's decision lines %v, want one without deliveries", dec)
	}
	if n := e.mx.Transactions(); n != 3 {
		t.Errorf("%d SMTP transactions, want 3 (the killed holder's, the redelivery's, the fresh message's)", n)
	}
}

// TestAdmitWaitInDecisionRecord: an attempt held back by its admission
// (a learned rate's turn, up to 1/rate) says how long in its decision
// record, on the line and in the event: its time is otherwise later than
// any logged time by that much.
func TestAdmitWaitInDecisionRecord(t *testing.T) {
	e := newEnv(t, nil)
	const wait = 700 * time.Millisecond
	gate := &slowGate{wait: wait}
	var logs syncBuf
	e.startPool(func(c *Config) {
		c.Gate, c.Workers = gate, 1
		c.Logger = zerolog.New(&logs)
	})
	id := e.submit("r@dest.test")
	evs := e.waitEvent(id, queue.EventDelivered)
	quick := e.submit("q@dest.test")
	e.waitEvent(quick, queue.EventDelivered)

	lines := logLines(t, logs.String())
	dec := linesOf(lines, id, backoff.DecisionMessage)
	if len(dec) != 1 {
		t.Fatalf("%d decision lines for %s\n%s", len(dec), id, logs.String())
	}
	if ms, _ := dec[0]["admit_wait_ms"].(float64); ms < float64(wait.Milliseconds()) || ms > 10_000 {
		t.Errorf("admit_wait_ms %v, want the admission's %v", dec[0]["admit_wait_ms"], wait)
	}
	var rec backoff.Record
	for _, ev := range evs {
		if ev.Type == queue.EventDelivered {
			if err := rec.UnmarshalJSON(ev.Decision); err != nil {
				t.Fatal(err)
			}
		}
	}
	if rec.AdmitWaitMs < wait.Milliseconds() {
		t.Errorf("delivered event's record has admit_wait_ms %d, want ≥ %d", rec.AdmitWaitMs, wait.Milliseconds())
	}
	// An admission that did not wait leaves the field out.
	if dec := linesOf(lines, quick, backoff.DecisionMessage); len(dec) != 1 || dec[0]["admit_wait_ms"] != nil {
		t.Errorf("unwaited attempt's decision lines %v, want one without admit_wait_ms", dec)
	}
}

// refuseSecondGate admits, except its second admission, which it refuses
// as a rate's turn to come back to shortly.
type refuseSecondGate struct {
	throttle.OpenGate
	admits atomic.Int32
}

func (g *refuseSecondGate) Admit(ctx context.Context, domain, tenant, source string) (throttle.Permit, throttle.Refusal) {
	if g.admits.Add(1) == 2 {
		return nil, throttle.Refusal{Until: time.Now().Add(200 * time.Millisecond), Reason: "rate"}
	}
	return g.OpenGate.Admit(ctx, domain, tenant, source)
}

// TestRefusalLineMatchesDecisionLines: the line of a refusal (no attempt)
// uses the decision lines' keys with their meanings: the deliverer's own
// worker_id, the recipients as rcpts, next_attempt_at in UTC. It has no
// attempt number, as no attempt was made: attempts_made counts those
// before, and the attempt made after it has attempts_made+1 as its
// number. Before, its "attempt" was the count (one less than the number
// the next decision line gave the same attempt) and its worker_id the
// process's.
func TestRefusalLineMatchesDecisionLines(t *testing.T) {
	var calls atomic.Int32
	e := newEnv(t, func(stage fakemx.Stage, arg string) *smtp.SMTPError {
		if stage == fakemx.StageRcpt && calls.Add(1) == 1 {
			return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "try again later"}
		}
		return nil
	})
	var logs syncBuf
	e.startPool(func(c *Config) {
		c.Gate = &refuseSecondGate{}
		c.Logger = zerolog.New(&logs)
	})
	id := e.submit("r@dest.test")
	e.waitEvent(id, queue.EventDelivered)

	lines := logLines(t, logs.String())
	ref := linesOf(lines, id, "coordinator refused")
	if len(ref) != 1 {
		t.Fatalf("%d refusal lines, want 1\n%s", len(ref), logs.String())
	}
	dec := linesOf(lines, id, backoff.DecisionMessage)
	if len(dec) != 2 || dec[0]["outcome"] != "deferred" || dec[1]["outcome"] != "delivered" {
		t.Fatalf("decision lines %v, want deferred then delivered", dec)
	}
	r := ref[0]
	if _, ok := r["attempt"]; ok {
		t.Errorf("refusal line has an attempt number, but no attempt was made: %v", r)
	}
	if r["attempts_made"] != 1.0 || dec[1]["attempt"] != 2.0 {
		t.Errorf("refusal's attempts_made %v, next attempt %v: want 1, then attempt 2", r["attempts_made"], dec[1]["attempt"])
	}
	if w := fmt.Sprint(r["worker_id"]); !strings.HasPrefix(w, "w-test/") {
		t.Errorf("refusal's worker_id %q, want the deliverer's, as the decision lines' %v", w, dec[0]["worker_id"])
	}
	if rc, _ := r["rcpts"].([]any); len(rc) != 1 || rc[0] != "r@dest.test" {
		t.Errorf("refusal's rcpts %v, want the list of recipients", r["rcpts"])
	}
	if at, err := time.Parse(time.RFC3339Nano, fmt.Sprint(r["next_attempt_at"])); err != nil || at.Location() != time.UTC {
		t.Errorf("refusal's next_attempt_at %v (%v), want RFC 3339 in UTC", r["next_attempt_at"], err)
	}
	// Every key the refusal shares with a decision line has its type.
	for k, v := range r {
		if dv, ok := dec[0][k]; ok && jsonType(dv) != jsonType(v) {
			t.Errorf("%q: %s on the refusal, %s on the decision line", k, jsonType(v), jsonType(dv))
		}
	}
	assertOneTypePerKey(t, lines)
}

// TestDecisionRecordSaysWhereItWent: a delivered attempt's decision line
// and event name the server it went to (the relay here: mx, mx_addr) and
// the egress address it went out from (source). Without them a postmortem
// of an abuse complaint could not tell which address sent a message.
func TestDecisionRecordSaysWhereItWent(t *testing.T) {
	e := newEnv(t, nil)
	eg, err := sender.NewEgress([]sender.EgressEntry{{Source: sender.Source{Addr: netip.MustParseAddr("127.0.0.2")}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var logs syncBuf
	e.startPool(func(c *Config) {
		c.Workers, c.Egress, c.Sender = 1, eg, &v4OnlySender{next: e.snd}
		c.Logger = zerolog.New(&logs)
	})
	id := e.submit("r@dest.test")
	evs := e.waitEvent(id, queue.EventDelivered)
	host, _, _ := net.SplitHostPort(e.mx.Addr())
	dec := linesOf(logLines(t, logs.String()), id, backoff.DecisionMessage)
	if len(dec) != 1 || dec[0]["mx"] != host || dec[0]["mx_addr"] != e.mx.Addr() || dec[0]["source"] != "127.0.0.2" {
		t.Fatalf("decision lines %v: want mx %s, mx_addr %s, source 127.0.0.2", dec, host, e.mx.Addr())
	}
	for _, ev := range evs {
		if ev.Type != queue.EventDelivered {
			continue
		}
		var rec backoff.Record
		if err := rec.UnmarshalJSON(ev.Decision); err != nil || rec.MXAddr != e.mx.Addr() || rec.Source != "127.0.0.2" {
			t.Errorf("delivered event's record %+v, %v", rec, err)
		}
	}
}
