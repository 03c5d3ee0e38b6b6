package e2e

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outflow/outflow/internal/fakemx"
	"github.com/outflow/outflow/queue"
)

// TestHostileNATSInput publishes what a buggy or hostile NATS client could
// put on outflow's work subjects: malformed envelopes of every kind, an
// envelope whose body is missing, one with unknown headers, and payloads
// over the envelope and NATS size limits. Each malformed one must be parked
// in dead letters with its reason logged, the missing body must go to dead
// letters with "body missing", unknown headers must be ignored (delivered),
// oversized payloads must be refused at publish, and the daemon must keep
// running and delivering good mail.
func TestHostileNATSInput(t *testing.T) {
	t.Parallel()
	mx := fakemx.Start(t, fakemx.Options{})
	dir := t.TempDir()
	data := dir + "/data"
	d := startDaemon(t, data, append([]string{"--users", writeUsers(t, dir), "--relay", mx.Addr()}, fastRetry...)...)
	nc := natsFor(t, data)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()

	env := func(mut func(m map[string]any)) []byte {
		m := map[string]any{"id": "hostile1", "msg_id": "hostile1", "tenant": "app", "from": "a@sender.test",
			"rcpts": []string{"h@dest.test"}, "dest": "dest.test", "body_ref": "hostile1", "size": 10, "parts": 1}
		if mut != nil {
			mut(m)
		}
		b, _ := json.Marshal(m)
		return b
	}
	type pub struct {
		name, subject string
		data          []byte
		hdr           map[string]string
	}
	work := func(id string) string { return "outflow.work.app.dest_test." + id }
	malformed := []pub{
		{"not json", work("m1"), []byte("{not json"), nil},
		{"empty payload", work("m2"), nil, nil},
		{"wrong types", work("m3"), []byte(`{"id":123,"rcpts":"x"}`), nil},
		{"deep nesting", work("m4"), []byte(strings.Repeat("[", 100000)), nil},
		{"missing id", work("m5"), env(func(m map[string]any) { delete(m, "id") }), nil},
		{"id not a token", work("m6"), env(func(m map[string]any) { m["id"] = "a.b >c" }), nil},
		{"no recipients", work("m7"), env(func(m map[string]any) { m["rcpts"] = []string{} }), nil},
		{"no destination", work("m8"), env(func(m map[string]any) { delete(m, "dest") }), nil},
		{"no body reference", work("m9"), env(func(m map[string]any) { delete(m, "body_ref") }), nil},
		{"attempt header not a count", work("m10"), env(nil), map[string]string{queue.HdrAttempt: "-1"}},
		{"deadline header not a time", work("m11"), env(nil), map[string]string{queue.HdrDeadline: "yesterday"}},
		{"invalid UTF-8", work("m12"), []byte("{\"id\":\"\xff\xfe\",\"rcpts\":[\"\xc3\x28@x\"]}"), nil},
		{"garbage on the retry lane", "outflow.retry.due.dest_test.m13", []byte("\x00\x01\x02garbage"), nil},
		{"inline body longer than the payload", work("m14"), env(func(m map[string]any) { m["body_ref"] = "" }), map[string]string{queue.HdrInlineBody: "999999"}},
		{"inline body length not a count", work("m15"), env(func(m map[string]any) { m["body_ref"] = "" }), map[string]string{queue.HdrInlineBody: "-1"}},
		{"body reference and inline body", work("m16"), append(env(nil), "Subject: x\r\n\r\n"...), map[string]string{queue.HdrInlineBody: "15"}},
		{"signature longer than the inline body", work("m17"), append(env(func(m map[string]any) { m["body_ref"], m["signed"], m["sig_len"] = "", true, 99 }), "Subject: x\r\n\r\n"...), map[string]string{queue.HdrInlineBody: "15"}},
		{"envelope JSON over its limit", work("m18"), env(func(m map[string]any) { m["pad"] = strings.Repeat("x", queue.MaxEnvelopeBytes+1) }), nil},
	}
	for _, p := range malformed {
		m := nats.NewMsg(p.subject)
		m.Data = p.data
		for k, v := range p.hdr {
			m.Header.Set(k, v)
		}
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatalf("%s: publish: %v", p.name, err)
		}
	}

	// An envelope whose body was never stored.
	missing := nats.NewMsg(work("nobody1"))
	missing.Data = env(func(m map[string]any) { m["id"], m["msg_id"], m["body_ref"] = "nobody1", "nobody1", "nobody1" })
	if _, err := js.PublishMsg(ctx, missing); err != nil {
		t.Fatal(err)
	}

	// A well-formed envelope with unknown headers and fields: ignored, and
	// the message is delivered.
	obs, err := js.ObjectStore(ctx, queue.BucketBodies)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := obs.PutBytes(ctx, "unknownhdr1", message("unknownhdr1", "")); err != nil {
		t.Fatal(err)
	}
	uh := nats.NewMsg(work("unknownhdr1"))
	uh.Data = env(func(m map[string]any) {
		m["id"], m["msg_id"], m["body_ref"], m["x_unknown_field"] = "unknownhdr1", "unknownhdr1", "unknownhdr1", map[string]int{"a": 1}
	})
	uh.Header.Set("X-Unknown", "whatever")
	uh.Header.Set("Outflow-Nonsense", strings.Repeat("z", 4000))
	if _, err := js.PublishMsg(ctx, uh); err != nil {
		t.Fatal(err)
	}

	// Over the envelope message limit (JSON and the largest inline body):
	// the stream refuses it at publish.
	big := nats.NewMsg(work("big1"))
	big.Data = env(func(m map[string]any) { m["id"], m["pad"] = "big1", strings.Repeat("x", queue.MaxMsgBytes+1) })
	if _, err := js.PublishMsg(ctx, big); err == nil {
		t.Errorf("an envelope message over %d bytes was stored", queue.MaxMsgBytes)
	} else {
		t.Logf("oversized envelope refused at publish: %v", err)
	}
	// Over NATS's max payload (8 MiB): refused before it leaves the client.
	huge := nats.NewMsg(work("huge1"))
	huge.Data = make([]byte, 9<<20)
	if err := nc.PublishMsg(huge); err == nil {
		t.Errorf("a 9 MiB payload was accepted by the server")
	} else {
		t.Logf("9 MiB payload refused: %v", err)
	}
	if !nc.IsConnected() {
		t.Fatal("the oversized publish cost the connection")
	}

	waitFor(t, 60*time.Second, "every malformed envelope parked", func() bool {
		return d.countLog(`"malformed envelope parked in dead letters"`) >= len(malformed)
	})
	waitFor(t, 60*time.Second, "the missing body in dead letters", func() bool {
		return d.countLog(`"moved to dead letters"`, "body missing", "nobody1") == 1
	})
	if err := mx.WaitForMessages(1, 60*time.Second); err != nil {
		t.Fatalf("the envelope with unknown headers was not delivered: %v\n%s", err, tail(d.Logs(), 40))
	}
	if n := d.countLog(`"malformed envelope parked in dead letters"`); n != len(malformed) {
		t.Errorf("%d envelopes parked as malformed, want %d", n, len(malformed))
	}
	for _, line := range strings.Split(d.Logs(), "\n") {
		if strings.Contains(line, `"malformed envelope parked in dead letters"`) && !strings.Contains(line, "malformed envelope:") {
			t.Errorf("parked without a reason: %s", line)
		}
	}

	// Still alive and delivering.
	if !d.alive() {
		t.Fatal("the daemon died")
	}
	cl := dialAuth(t, d.SMTPAddr, testUser, testPassword)
	if err := submit(cl, "app@sender.test", []string{"g@dest.test"}, message("after-hostile-nats", "")); err != nil {
		t.Fatal(err)
	}
	_ = cl.Quit()
	waitAllDelivered(t, map[string]bool{"<after-hostile-nats@e2e.test>": true, "<unknownhdr1@e2e.test>": true}, mx, 60*time.Second, d.Logs)
	if n := len(mx.Messages()); n != 2 {
		t.Errorf("the sink got %d messages, want the 2 good ones", n)
	}
	t.Logf("FIGURES hostile-nats: malformed=%d parked=%d missing_body_dead=1 unknown_headers_delivered=1 oversized_refused=2 crashes=0",
		len(malformed), d.countLog(`"malformed envelope parked in dead letters"`))
	requireNoPanic(t, d.Logs())
	d.Stop()
}
