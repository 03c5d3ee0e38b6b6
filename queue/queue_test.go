package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/outflow/outflow/internal/testutil"
)

// startQueue starts an embedded server in a temp dir and connects to it.
func startQueue(t *testing.T) (*Queue, *Embedded) {
	t.Helper()
	return startQueueWith(t, Options{})
}

// startQueueWith starts a queue with o (its connection fields filled in).
func startQueueWith(t testing.TB, o Options) (*Queue, *Embedded) {
	t.Helper()
	emb, err := StartEmbedded(EmbeddedConfig{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emb.Shutdown)
	q, err := connectTo(emb, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	return q, emb
}

// connectTo connects to emb with o, its connection fields filled in.
func connectTo(emb *Embedded, o Options) (*Queue, error) {
	return connectLayout(emb, o, streamConfigs)
}

// connectLayout is connectTo with the streams laid out by layout.
func connectLayout(emb *Embedded, o Options, layout func(Options) []jetstream.StreamConfig) (*Queue, error) {
	ci := emb.InProcessInfo()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	o.InProcess, o.User, o.Password, o.Logger = emb.Server(), ci.User, ci.Password, zerolog.Nop()
	return connect(ctx, o, layout)
}

func next(t *testing.T, ch <-chan *Delivery) *Delivery {
	t.Helper()
	select {
	case d := <-ch:
		return d
	case <-time.After(15 * time.Second):
		t.Fatal("no envelope within 15s")
		return nil
	}
}

func TestEnqueueSplitsByDomainAndStoresBodyOnce(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	body := []byte("Subject: hi\r\nMessage-ID: <a@b>\r\n\r\nhello\r\n")
	ids, err := q.Enqueue(ctx, &Submission{Tenant: "t1", From: "a@src.example", Rcpts: []string{"x@one.example", "y@Two.example", "z@one.example"}, Body: body})
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 2 {
		t.Fatalf("ids = %v, want 2 envelopes", ids)
	}
	ch, err := q.Messages(ctx, LaneWork, 4)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	var ref string
	for range 2 {
		d := next(t, ch)
		got[d.Env.Dest] = d.Env.Rcpts
		if ref != "" && d.Env.BodyRef != ref {
			t.Fatalf("body stored twice: %s vs %s", ref, d.Env.BodyRef)
		}
		ref = d.Env.BodyRef
		if d.Env.MessageID != "<a@b>" {
			t.Errorf("message id %q", d.Env.MessageID)
		}
		if d.Env.Deadline.IsZero() {
			t.Error("no deadline stamped")
		}
		if err := d.Skip(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if len(got["one.example"]) != 2 || len(got["two.example"]) != 1 {
		t.Fatalf("split = %v", got)
	}
	b, err := q.Body(ctx, ref)
	if err != nil || string(b) != string(body) {
		t.Fatalf("body = %q, %v", b, err)
	}
}

func TestRescheduleFiresOnDueSubjectWithMetadata(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := q.Enqueue(ctx, &Submission{Tenant: "t", From: "a@b.example", Rcpts: []string{"r@d.example"}, Body: []byte("x\r\n")}); err != nil {
		t.Fatal(err)
	}
	work, _ := q.Messages(ctx, LaneWork, 1)
	retry, _ := q.Messages(ctx, LaneRetry, 1)
	d := next(t, work)
	n := d.Env.Clone()
	n.Attempt = 1
	n.LastClass = "transient"
	n.LastReply = "451 4.3.0 try later\r\nsecond line"
	at := time.Now().Add(700 * time.Millisecond)
	if err := d.Reschedule(ctx, n, LaneRetry, at, true); err != nil {
		t.Fatal(err)
	}
	// Doing the same step again (a second worker after a crash) is absorbed.
	if err := q.schedule(ctx, n.Clone(), LaneRetry, at); err != nil {
		t.Fatal(err)
	}
	r := next(t, retry)
	if time.Now().Before(at) {
		t.Fatalf("fired early: %v before %v", time.Now(), at)
	}
	if r.Env.Attempt != 1 || r.Env.LastClass != "transient" || r.Env.ID != d.Env.ID {
		t.Fatalf("metadata lost: %+v", r.Env)
	}
	if err := r.Skip(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case d2 := <-retry:
		t.Fatalf("schedule fired twice: %+v", d2.Env)
	case <-time.After(1500 * time.Millisecond):
	}
}

func TestTokenRoundTrip(t *testing.T) {
	for _, s := range []string{"example.com", "a_b.example", "x*y>z w", "", "münchen.de"} {
		tok := Token(s)
		for _, c := range tok {
			if c == '.' || c == '*' || c == '>' || c == ' ' {
				t.Fatalf("Token(%q) = %q has a forbidden char", s, tok)
			}
		}
		if Untoken(tok) != s {
			t.Fatalf("Untoken(Token(%q)) = %q", s, Untoken(tok))
		}
	}
}

// TestPullSurvivesConsumerLoss: when a lane's consumer goes away under a
// worker (a failover, a store restarted from disk) and comes back, the
// worker pulls again instead of stranding the lane.
func TestPullSurvivesConsumerLoss(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	retry, err := q.Messages(ctx, LaneRetry, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := q.js.DeleteConsumer(ctx, StreamRetry, consumerRetry); err != nil {
		t.Fatal(err)
	}
	if err := q.setup(ctx, streamConfigs); err != nil { // recreates it, as a restarted store would
		t.Fatal(err)
	}
	e := deferOne(t, q, LaneRetry, time.Now())
	d := next(t, retry)
	if d.Env.ID != e.ID {
		t.Fatalf("got %s, want %s", d.Env.ID, e.ID)
	}
	_ = d.Skip(ctx)
}

// TestSharedBodyReleasedByLastPart: a submission to three domains becomes
// three envelopes sharing one body. It stays while any of them can still
// need it, including one parked in dead letters (it may be replayed), and
// the last envelope to finish deletes it.
func TestSharedBodyReleasedByLastPart(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	body := []byte("Subject: shared\r\n\r\nhello\r\n")
	enqueue := func() string {
		t.Helper()
		ids, err := q.Enqueue(ctx, &Submission{Tenant: "t", From: "a@src.example",
			Rcpts: []string{"x@one.example", "y@two.example", "z@three.example"}, Body: body})
		if err != nil || len(ids) != 3 {
			t.Fatalf("enqueue: %v %v", ids, err)
		}
		return ids[0][:len(ids[0])-2] // the submission's id: "<msgid>-1" less "-1"
	}
	bodyThere := func(msgID string) bool { t.Helper(); return bodyStored(t, ctx, q, msgID) }
	work, err := q.Messages(ctx, LaneWork, 3)
	if err != nil {
		t.Fatal(err)
	}
	take := func(n int) []*Delivery {
		var ds []*Delivery
		for range n {
			ds = append(ds, next(t, work))
		}
		return ds
	}

	msgID := enqueue()
	ds := take(3)
	if err := ds[0].Delivered(ctx, ds[0].Env.Rcpts, true); err != nil {
		t.Fatal(err)
	}
	if err := ds[1].Done(ctx); err != nil { // every recipient bounced
		t.Fatal(err)
	}
	if !bodyThere(msgID) {
		t.Fatal("the body was deleted while the third envelope still needed it")
	}
	if err := ds[2].Delivered(ctx, ds[2].Env.Rcpts, true); err != nil {
		t.Fatal(err)
	}
	if bodyThere(msgID) {
		t.Fatal("the last envelope finished and the shared body is still stored")
	}

	// One envelope dead-lettered: the body stays for its replay.
	msgID = enqueue()
	ds = take(3)
	for _, d := range ds[:2] {
		if err := d.Delivered(ctx, d.Env.Rcpts, true); err != nil {
			t.Fatal(err)
		}
	}
	if err := ds[2].Dead(ctx, ds[2].Env.Clone(), "max-attempts"); err != nil {
		t.Fatal(err)
	}
	if !bodyThere(msgID) {
		t.Fatal("the body of a dead-lettered envelope was deleted")
	}
}

// bodyStored reports whether the body ref is stored.
func bodyStored(t *testing.T, ctx context.Context, q *Queue, ref string) bool {
	t.Helper()
	_, err := q.Body(ctx, ref)
	if err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
		t.Fatal(err)
	}
	return err == nil
}

// TestBodyGone: the leader's answer about a body: present, never stored,
// and deleted.
func TestBodyGone(t *testing.T) {
	q, _ := startQueueWith(t, Options{InlineBodyMax: -1})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ids, err := q.Enqueue(ctx, &Submission{Tenant: "t", From: "a@b.example", Rcpts: []string{"r@d.example"}, Body: []byte("x\r\n")})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		ref  string
		gone bool
	}{{ids[0], false}, {"never-stored", true}} {
		gone, err := q.BodyGone(ctx, c.ref)
		if err != nil || gone != c.gone {
			t.Errorf("BodyGone(%s) = %v, %v; want %v", c.ref, gone, err, c.gone)
		}
	}
	if err := q.deleteBody(ctx, ids[0]); err != nil {
		t.Fatal(err)
	}
	if gone, err := q.BodyGone(ctx, ids[0]); err != nil || !gone {
		t.Errorf("after delete: BodyGone = %v, %v; want true", gone, err)
	}
	for _, ref := range []string{ids[0], "never-stored"} {
		if _, err := q.Body(ctx, ref); !errors.Is(err, ErrBodyMissing) || !errors.Is(err, jetstream.ErrObjectNotFound) {
			t.Errorf("Body(%s) = %v; want ErrBodyMissing wrapping jetstream.ErrObjectNotFound", ref, err)
		}
	}
}

// TestClientWithoutDaemonStreams: an admin client pointed at a NATS where no
// daemon has set anything up says so.
func TestClientWithoutDaemonStreams(t *testing.T) {
	emb, err := StartEmbedded(EmbeddedConfig{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emb.Shutdown)
	_, err = connectTo(emb, Options{NoSetup: true})
	if err == nil || !strings.Contains(err.Error(), "no outflow serve has run against this NATS") {
		t.Fatalf("connect without streams: %v", err)
	}
}

// TestInProcessUserOnlyInProcess: the daemon's own user (a plain password,
// so no bcrypt in the handshake) connects in process, and the client
// listener refuses it; the listener's user still connects there.
func TestInProcessUserOnlyInProcess(t *testing.T) {
	emb, err := StartEmbedded(EmbeddedConfig{DataDir: t.TempDir(), ListenAddr: "127.0.0.1:0", Durability: DurabilityNone})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emb.Shutdown)
	in, ci := emb.InProcessInfo(), emb.ClientInfo()
	if in.User == ci.User || in.Password == "" {
		t.Fatalf("in-process user %q is not a user of its own", in.User)
	}
	nc, err := nats.Connect("", nats.InProcessServer(emb.Server()), nats.UserInfo(in.User, in.Password), nats.Timeout(20*time.Second))
	if err != nil {
		t.Fatalf("in process: %v", err)
	}
	nc.Close()
	if nc, err := nats.Connect(ci.URL, nats.UserInfo(in.User, in.Password), nats.Timeout(20*time.Second)); err == nil {
		nc.Close()
		t.Fatal("the listener accepted the in-process user")
	}
	nc, err = nats.Connect(ci.URL, nats.UserInfo(ci.User, ci.Password), nats.Timeout(20*time.Second))
	if err != nil {
		t.Fatalf("listener user: %v", err)
	}
	nc.Close()
}

// TestEmbeddedStartsWithoutWarnings: a clean start of the embedded server
// logs no warning, so an operator's first look at the log is not a false
// alarm (nats-server warns of the in-process user's plain password, which
// is plain on purpose).
func TestEmbeddedStartsWithoutWarnings(t *testing.T) {
	var logs testutil.SyncBuffer
	emb, err := StartEmbedded(EmbeddedConfig{DataDir: t.TempDir(), ListenAddr: "127.0.0.1:0", Logger: zerolog.New(&logs)})
	if err != nil {
		t.Fatal(err)
	}
	emb.Shutdown()
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		if strings.Contains(line, `"level":"warn"`) || strings.Contains(line, `"level":"error"`) {
			t.Errorf("start logged %s", line)
		}
	}
}

// TestAsyncErrorsAreLogged: an asynchronous NATS error (here a slow
// consumer) is a JSON line of the daemon's log, not nats.go's plain text
// on stderr.
func TestAsyncErrorsAreLogged(t *testing.T) {
	emb, err := StartEmbedded(EmbeddedConfig{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emb.Shutdown)
	var logs testutil.SyncBuffer
	ci := emb.InProcessInfo()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	q, err := connect(ctx, Options{InProcess: emb.Server(), User: ci.User, Password: ci.Password, Logger: zerolog.New(&logs)}, streamConfigs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	release := make(chan struct{})
	defer close(release)
	sub, err := q.nc.Subscribe("test.slow", func(*nats.Msg) { <-release })
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.SetPendingLimits(1, -1); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10; i++ {
		if err := q.nc.Publish("test.slow", []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	if err := q.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "the slow consumer logged", func() bool {
		return strings.Contains(logs.String(), `"message":"nats asynchronous error"`)
	})
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var v map[string]any
		if err := json.Unmarshal([]byte(line), &v); err != nil {
			t.Fatalf("not a JSON line: %q", line)
		}
		if v["message"] == "nats asynchronous error" && (v["subject"] != "test.slow" || !strings.Contains(fmt.Sprint(v["error"]), "slow consumer")) {
			t.Errorf("async error line %s", line)
		}
	}
}

// A message to be sent later waits on the retry lane as a first attempt
// scheduled for its time, with its body and its age counted from then:
// not on the work lane, on disk before Enqueue returns, and handed to a
// worker no earlier than asked. A keyed resubmission adds nothing, before
// or after the firing.
func TestEnqueueSendAt(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	at := time.Now().Add(2 * time.Second)
	sub := &Submission{Tenant: "t", From: "a@b.example", Rcpts: []string{"r@d.example"}, Body: []byte("Subject: later\r\n\r\nx\r\n"),
		SendAt: at, IdempotencyKey: "later-1"}
	ids, err := q.Enqueue(ctx, sub)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := q.Enqueue(ctx, sub); err != nil || again[0] != ids[0] {
		t.Fatalf("keyed resubmission: %v, %v", again, err)
	}
	it, err := q.Find(ctx, ids[0])
	if err != nil {
		t.Fatal(err)
	}
	if it.State != StateDeferred || it.NextAt.Sub(at).Abs() > time.Millisecond ||
		it.Env.Attempt != 0 || it.Env.Deadline.Sub(at) != q.opts.DeadlineAfter {
		t.Fatalf("item %+v (next %v, deadline %v), want deferred until %v, no attempt, deadline from then", it, it.NextAt, it.Env.Deadline, at)
	}
	hist, err := q.History(ctx, ids[0], time.Time{})
	if err != nil || len(hist) == 0 || hist[0].Type != EventQueued || !strings.HasPrefix(hist[0].Reason, "scheduled for ") {
		t.Fatalf("history %+v, %v: want a queued event saying when", hist, err)
	}
	work, _ := q.Messages(ctx, LaneWork, 1)
	retry, _ := q.Messages(ctx, LaneRetry, 2)
	d := next(t, retry)
	if time.Now().Before(at) {
		t.Fatalf("handed out %v before %v", time.Now(), at)
	}
	if d.Env.ID != ids[0] || d.Env.Attempt != 0 || string(d.Env.Body) != string(sub.Body) {
		t.Fatalf("envelope %+v", d.Env)
	}
	if err := d.Skip(ctx); err != nil {
		t.Fatal(err)
	}
	// Resubmitted after it fired (past the schedule's deduplication): the
	// record of the keyed message answers, nothing new is stored.
	if again, err := q.Enqueue(ctx, sub); err != nil || len(again) != 1 || again[0] != ids[0] {
		t.Fatalf("keyed resubmission after the firing: %v, %v", again, err)
	}
	sub.SendAt = time.Time{}
	if again, err := q.Enqueue(ctx, sub); err != nil || len(again) != 1 || again[0] != ids[0] {
		t.Fatalf("keyed resubmission without send_at: %v, %v", again, err)
	}
	select {
	case w := <-work:
		t.Fatalf("also on the work lane: %+v", w.Env)
	case r := <-retry:
		t.Fatalf("scheduled twice: %+v", r.Env)
	case <-time.After(time.Second):
	}
}

// A message with one-click unsubscribe links becomes one envelope per
// recipient (the link names its recipient), each carrying the body, a
// repeated address (in any case) once; without them, one envelope per
// domain. A body too large to carry is stored once and shared.
func TestEnqueueListUnsubscribeOnePerRecipient(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	on := true
	body := []byte("Subject: news\r\n\r\nx\r\n")
	rcpts := []string{"a@d.example", "b@d.example", "A@d.example", "c@e.example"}
	ids, err := q.Enqueue(ctx, &Submission{Tenant: "t", From: "n@b.example", Rcpts: rcpts, Body: body, ListUnsubscribe: &on})
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 3 {
		t.Fatalf("ids %v: want one per distinct recipient", ids)
	}
	want := map[string]string{ids[0]: "a@d.example", ids[1]: "b@d.example", ids[2]: "c@e.example"}
	work, _ := q.Messages(ctx, LaneWork, 4)
	for range 3 {
		d := next(t, work)
		rcpt, ok := want[d.Env.ID]
		if !ok || len(d.Env.Rcpts) != 1 || d.Env.Rcpts[0] != rcpt || !d.Env.ListUnsubscribe || d.Env.Parts != 3 ||
			!d.Env.Inline() || string(d.Env.Body) != string(body) || !d.Env.Alone() {
			t.Fatalf("envelope %+v: want %s alone, marked, one of 3 parts, reporting alone, with the body", d.Env, rcpt)
		}
		if d.Env.Dest != Domain(rcpt) {
			t.Fatalf("dest %q for %s", d.Env.Dest, rcpt)
		}
		delete(want, d.Env.ID)
		if err := d.Skip(ctx); err != nil {
			t.Fatal(err)
		}
	}

	off := false
	ids, err = q.Enqueue(ctx, &Submission{Tenant: "t", From: "n@b.example", Rcpts: rcpts[:2], Body: body, ListUnsubscribe: &off})
	if err != nil || len(ids) != 1 {
		t.Fatalf("without links: %v, %v; want one envelope for the domain", ids, err)
	}
	if d := next(t, work); len(d.Env.Rcpts) != 2 || d.Env.ListUnsubscribe {
		t.Fatalf("envelope %+v", d.Env)
	}

	large := make([]byte, InlineBodyMax+1)
	copy(large, body)
	ids, err = q.Enqueue(ctx, &Submission{Tenant: "t", From: "n@b.example", Rcpts: rcpts[:2], Body: large, ListUnsubscribe: &on})
	if err != nil || len(ids) != 2 {
		t.Fatalf("a large body: %v, %v", ids, err)
	}
	for range 2 {
		if d := next(t, work); d.Env.Inline() || d.Env.BodyRef != d.Env.MsgID || d.Env.Parts != 2 {
			t.Fatalf("a large body's part %+v: want the stored body shared", d.Env)
		}
	}

	// Copies beyond perRecipientInlineMax in all: shared too.
	many := make([]string, perRecipientInlineMax/(100<<10)+1)
	for i := range many {
		many[i] = fmt.Sprintf("r%d@d.example", i)
	}
	ids, err = q.Enqueue(ctx, &Submission{Tenant: "t", From: "n@b.example", Rcpts: many, Body: make([]byte, 100<<10), ListUnsubscribe: &on})
	if err != nil || len(ids) != len(many) {
		t.Fatalf("%d recipients of 100 KiB: %d ids, %v", len(many), len(ids), err)
	}
	if d := next(t, work); d.Env.Inline() || d.Env.BodyRef != d.Env.MsgID {
		t.Fatalf("a part of %d copies of 100 KiB %+v: want the stored body shared", len(many), d.Env)
	}
}

// A message sent later joins its tenant's fresh mail when its time comes:
// the copy on the work lane is the next step, with its body and its age
// counted from send_at. A holder that dies after storing the copy and
// before its ack leaves the original to come again; that is recognised as
// handled, and a second move stores nothing.
func TestScheduledMailMovesToWork(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	at := time.Now().Add(1500 * time.Millisecond)
	body := []byte("Subject: later\r\n\r\nx\r\n")
	ids, err := q.Enqueue(ctx, &Submission{Tenant: "t", From: "a@b.example", Rcpts: []string{"r@d.example"}, Body: body, SendAt: at})
	if err != nil {
		t.Fatal(err)
	}
	work, _ := q.Messages(ctx, LaneWork, 2)
	retry, _ := q.Messages(ctx, LaneRetry, 2)
	d := next(t, retry)
	if !d.Scheduled() || d.Env.ID != ids[0] {
		t.Fatalf("due %+v: want the scheduled message, Scheduled true", d.Env)
	}
	if err := d.copyToWork(ctx); err != nil {
		t.Fatal(err)
	}
	w := next(t, work)
	if w.Env.ID != ids[0] || w.Env.Step != 1 || w.Env.Attempt != 0 || string(w.Env.Body) != string(body) ||
		w.Env.Deadline.Sub(at) != q.opts.DeadlineAfter || w.Scheduled() {
		t.Fatalf("work copy %+v: want step 1, no attempt, its body, deadline from send_at", w.Env)
	}
	// The holder died before its ack: the original comes again.
	if err := d.msg.Nak(); err != nil {
		t.Fatal(err)
	}
	again := next(t, retry)
	if !again.Redelivered || !again.Scheduled() {
		t.Fatalf("redelivered %+v", again)
	}
	if done, err := again.AlreadyHandled(ctx); err != nil || !done {
		t.Fatalf("AlreadyHandled = %v, %v with the copy waiting on the work lane", done, err)
	}
	// The copy delivered (its marker written, acknowledged): still handled.
	if err := w.Delivered(ctx, w.Env.Rcpts, true); err != nil {
		t.Fatal(err)
	}
	if done, err := again.AlreadyHandled(ctx); err != nil || !done {
		t.Fatalf("AlreadyHandled = %v, %v with the copy delivered", done, err)
	}
	// A second move within the deduplication window stores nothing.
	if err := again.ToWork(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case x := <-work:
		t.Fatalf("moved twice: %+v", x.Env)
	case x := <-retry:
		t.Fatalf("the original still waits: %+v", x.Env)
	case <-time.After(time.Second):
	}
	// A fresh message, and a fast-forwarded (probe) one, are not moved.
	fresh := &Delivery{Env: &Envelope{ID: "x", SendAt: at}, Lane: LaneWork}
	probe := &Delivery{Env: &Envelope{ID: "y", SendAt: at, Probe: true}, Lane: LaneRetry}
	tried := &Delivery{Env: &Envelope{ID: "z", SendAt: at, Attempt: 1, Step: 1}, Lane: LaneRetry}
	for _, x := range []*Delivery{fresh, probe, tried} {
		if x.Scheduled() || x.ToWork(ctx) == nil {
			t.Fatalf("%s: Scheduled %v, want false and ToWork refused", x.Env.ID, x.Scheduled())
		}
	}
}

// TestScheduledMailDroppedDuringItsMove: a drop that lands while a
// scheduled message is being moved to the work lane (after the worker's
// look at the marker) takes the copy back, and a worker that fetched the
// copy before that does not send it.
func TestScheduledMailDroppedDuringItsMove(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ids, err := q.Enqueue(ctx, &Submission{Tenant: "t", From: "a@b.example", Rcpts: []string{"r@d.example"},
		Body: []byte("Subject: later\r\n\r\nx\r\n"), SendAt: time.Now().Add(1500 * time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	retry, _ := q.Messages(ctx, LaneRetry, 1)
	d := next(t, retry)
	if d.Dropped(ctx) { // the worker's look: not dropped yet
		t.Fatal("dropped before the drop")
	}
	if _, err := q.DropBy(ctx, ids[0], "api"); err != nil { // then the drop
		t.Fatal(err)
	}
	if err := d.ToWork(ctx); err != nil {
		t.Fatal(err)
	}
	if it, err := q.Find(ctx, ids[0]); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the dropped message's copy waits on the work lane: %+v, %v", it, err)
	}
	// A worker that fetched the copy before it was taken back finds the
	// drop's marker of the copy's step, and does not send it.
	moved := d.Env.Clone()
	moved.Step = 1
	if done, err := (&Delivery{Env: moved, Lane: LaneWork, q: q}).AlreadyHandled(ctx); err != nil || !done {
		t.Fatalf("AlreadyHandled = %v, %v for the dropped message's work copy", done, err)
	}
}

// TestConnectBoundedByContext: a server that accepts and never answers
// holds Connect no longer than its context allows (a command's --timeout),
// not the handshake's 10 s.
func TestConnectBoundedByContext(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	q, err := Connect(ctx, Options{URL: "nats://" + ln.Addr().String(), Logger: zerolog.Nop()})
	if err == nil {
		q.Close()
		t.Fatal("connected to a server that never answers")
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("Connect took %v with a 500ms context: the handshake's own timeout ruled", took)
	}
}

// TestKeyValueWithMessageTTLs: a bucket a build gave message TTLs (marker
// TTLs) is opened as it is: the server refuses to take them away, and the
// daemon would not start.
func TestKeyValueWithMessageTTLs(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cfg := jetstream.KeyValueConfig{Bucket: "ttl_test", History: 5}
	withTTL := cfg
	withTTL.LimitMarkerTTL = time.Hour
	if _, err := q.js.CreateOrUpdateKeyValue(ctx, withTTL); err != nil {
		t.Fatal(err)
	}
	kv, err := q.KeyValue(ctx, cfg)
	if err != nil {
		t.Fatalf("opening a bucket with message TTLs: %v", err)
	}
	if _, err := kv.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
}

// TestDataDirLocked: a second embedded server on a data dir in use is
// refused at once, naming the process that holds it (two servers would
// write one store; the second used to "recover" the first's streams and
// fail 30 s later on the listener); after a shutdown the dir is free. A
// listener address in use is refused at once too.
func TestDataDirLocked(t *testing.T) {
	dir := t.TempDir()
	first, err := StartEmbedded(EmbeddedConfig{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if second, err := StartEmbedded(EmbeddedConfig{DataDir: dir}); err == nil {
		second.Shutdown()
		first.Shutdown()
		t.Fatal("a second server started on a data dir in use")
	} else if !strings.Contains(err.Error(), "in use by another outflow (pid "+strconv.Itoa(os.Getpid())+")") || time.Since(start) > 5*time.Second {
		t.Errorf("second start: %v after %v, want a refusal at once naming this pid", err, time.Since(start))
	}
	first.Shutdown()
	again, err := StartEmbedded(EmbeddedConfig{DataDir: dir})
	if err != nil {
		t.Fatalf("after a shutdown: %v", err)
	}
	again.Shutdown()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	start = time.Now()
	if e, err := StartEmbedded(EmbeddedConfig{DataDir: t.TempDir(), ListenAddr: ln.Addr().String()}); err == nil {
		e.Shutdown()
		t.Fatal("started on a listener address in use")
	} else if !strings.Contains(err.Error(), "another outflow or NATS server") || time.Since(start) > 5*time.Second {
		t.Errorf("address in use: %v after %v", err, time.Since(start))
	}
}

// TestRedeliveredAfterItsNextStepFinished: a holder stores the next step
// (a retry's schedule) and dies before its ack; the retry fires and ends,
// delivered or bounced, and is acknowledged, all before the original
// comes back. The original is then handled already: the retry's schedule
// is gone, and only the later step's marker says so. Before, it was sent
// again (a bounce left no marker at all).
func TestRedeliveredAfterItsNextStepFinished(t *testing.T) {
	for _, end := range []string{"delivered", "bounced"} {
		t.Run(end, func(t *testing.T) {
			q, _ := startQueue(t)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if _, err := q.Enqueue(ctx, &Submission{Tenant: "t", From: "a@b.example", Rcpts: []string{"r@d.example"}, Body: []byte("Subject: x\r\n\r\nx\r\n")}); err != nil {
				t.Fatal(err)
			}
			work, _ := q.Messages(ctx, LaneWork, 1)
			retry, _ := q.Messages(ctx, LaneRetry, 1)
			d := next(t, work)
			n := d.Env.Clone()
			n.Attempt = 1
			if err := d.Reschedule(ctx, n, LaneRetry, time.Now(), false); err != nil {
				t.Fatal(err)
			}
			r := next(t, retry)
			if r.Env.Step != 1 {
				t.Fatalf("retry at step %d", r.Env.Step)
			}
			if end == "delivered" {
				err := r.Delivered(ctx, r.Env.Rcpts, true)
				if err != nil {
					t.Fatal(err)
				}
			} else if err := r.Done(ctx); err != nil {
				t.Fatal(err)
			}
			// The first holder died before its ack: the original comes again.
			if err := d.msg.Nak(); err != nil {
				t.Fatal(err)
			}
			again := next(t, work)
			if !again.Redelivered || again.Env.Step != 0 {
				t.Fatalf("redelivered %+v, step %d", again.Redelivered, again.Env.Step)
			}
			if done, err := again.AlreadyHandled(ctx); err != nil || !done {
				t.Fatalf("AlreadyHandled = %v, %v after its retry was %s", done, err, end)
			}
			// A fresh envelope of another message is not taken for handled.
			if _, err := q.Enqueue(ctx, &Submission{Tenant: "t", From: "a@b.example", Rcpts: []string{"s@d.example"}, Body: []byte("Subject: y\r\n\r\ny\r\n")}); err != nil {
				t.Fatal(err)
			}
			other := next(t, work)
			other.Redelivered = true
			if done, err := other.AlreadyHandled(ctx); err != nil || done {
				t.Fatalf("AlreadyHandled = %v, %v for another message", done, err)
			}
		})
	}
}

// TestPerRecipientSplit: a submission split per recipient (a return path
// of its own for each) gives each recipient an envelope, deduplicated by
// address, carrying the body inline; its parts still join their notices
// (not Alone), unlike a split for unsubscribe links.
func TestPerRecipientSplit(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ids, err := q.Enqueue(ctx, &Submission{Tenant: "t", From: "a@src.example", PerRecipient: true,
		Rcpts: []string{"x@one.example", "y@one.example", "X@one.example", "z@two.example"}, Body: []byte("Subject: hi\r\n\r\nhello\r\n")})
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 3 {
		t.Fatalf("ids %v, want one per recipient", ids)
	}
	work, _ := q.Messages(ctx, LaneWork, 4)
	seen := map[string]bool{}
	for range 3 {
		d := next(t, work)
		if len(d.Env.Rcpts) != 1 || !d.Env.Inline() || d.Env.Parts != 3 || d.Env.Alone() {
			t.Fatalf("envelope %s: rcpts %v, inline %v, parts %d, alone %v", d.Env.ID, d.Env.Rcpts, d.Env.Inline(), d.Env.Parts, d.Env.Alone())
		}
		seen[strings.ToLower(d.Env.Rcpts[0])] = true
	}
	if len(seen) != 3 {
		t.Fatalf("recipients %v", seen)
	}
}

// TestKeyedMessageAgainAfterTheWindow: an idempotency key used again once
// the deduplication window has passed makes a new message, while the
// first message's SENT markers live on. Its id is new as well since ids
// derive from the key and its first use (keyedRecord); this test gives the
// envelope the old id on purpose, as a daemon of an earlier release made
// it. The new one is not taken for handled by them, whether the first was
// delivered or bounced, at its first step or a later one; a marker of its
// own submission still counts.
func TestKeyedMessageAgainAfterTheWindow(t *testing.T) {
	for _, end := range []string{"delivered", "bounced", "delivered at a retry"} {
		t.Run(end, func(t *testing.T) {
			q, _ := startQueue(t)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			ids, err := q.Enqueue(ctx, &Submission{Tenant: "t", From: "a@b.example", Rcpts: []string{"r@d.example"}, IdempotencyKey: "order-1",
				Body: []byte("Subject: x\r\n\r\nx\r\n")})
			if err != nil {
				t.Fatal(err)
			}
			work, _ := q.Messages(ctx, LaneWork, 1)
			retry, _ := q.Messages(ctx, LaneRetry, 1)
			first := next(t, work)
			d := first
			if end == "delivered at a retry" {
				n := d.Env.Clone()
				if err := d.Reschedule(ctx, n, LaneRetry, time.Now(), true); err != nil {
					t.Fatal(err)
				}
				d = next(t, retry)
			}
			if end == "bounced" {
				err = d.Done(ctx)
			} else {
				err = d.Delivered(ctx, d.Env.Rcpts, true)
			}
			if err != nil {
				t.Fatal(err)
			}
			if end == "delivered at a retry" {
				// A day later its retry lane copies are long gone; here the
				// ack's removal of the fired one follows its confirmation,
				// and a later step still there would answer for the new
				// message: waited for, not raced.
				testutil.WaitFor(t, 10*time.Second, "the fired retry removed", func() bool {
					for _, subj := range []string{schedSubject(LaneRetry, d.Env.Dest, d.Env.ID), dueSubject(LaneRetry, d.Env.Dest, d.Env.ID)} {
						if m, err := q.lanes[LaneRetry].GetLastMsgForSubject(ctx, subj); err == nil && m != nil {
							return false
						}
					}
					return true
				})
			}
			// The key again a day later: the same id, a new submission.
			again := first.Env.Clone()
			again.Step, again.Attempt, again.SubmittedAt = 0, 0, first.Env.SubmittedAt.Add(25*time.Hour)
			m, err := again.Encode(workSubject(again.Tenant, again.Dest, again.ID))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := q.js.PublishMsg(ctx, m); err != nil {
				t.Fatal(err)
			}
			d2 := next(t, work)
			if d2.Env.ID != ids[0] {
				t.Fatalf("got %s, want %s again", d2.Env.ID, ids[0])
			}
			for _, redelivered := range []bool{false, true} {
				d2.Redelivered = redelivered
				if done, err := d2.AlreadyHandled(ctx); err != nil || done {
					t.Fatalf("redelivered %v: AlreadyHandled = %v, %v: the new message would be dropped unsent", redelivered, done, err)
				}
			}
			// Its own marker counts.
			if err := d2.Delivered(ctx, d2.Env.Rcpts, false); err != nil {
				t.Fatal(err)
			}
			if done, err := d2.AlreadyHandled(ctx); err != nil || !done {
				t.Fatalf("after its own marker: AlreadyHandled = %v, %v", done, err)
			}
			_ = d2.Skip(ctx)
		})
	}
}
