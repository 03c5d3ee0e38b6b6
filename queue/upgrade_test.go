package queue

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// previousLayout is the stream layout of the release before the deferred
// lanes republished their due messages (on firedSubjects): streamConfigs
// without RePublish, the one field added to any stream since.
func previousLayout(o Options) []jetstream.StreamConfig {
	cfgs := streamConfigs(o)
	for i := range cfgs {
		cfgs[i].RePublish = nil
	}
	return cfgs
}

// TestUpgradeFromPreviousLayout: a daemon of the previous release leaves
// fresh, deferred and throttled mail in its streams and stops; the
// current release starts on the same data dir. Its setup must give the
// lanes their RePublish, keep every envelope where it was, and a schedule
// that comes due afterwards must reach the lane's workers and be
// republished on the fired subject, which the daemon's watch syncs (the
// lanes' sweep is off, so only the watch can sync them).
func TestUpgradeFromPreviousLayout(t *testing.T) {
	dir := t.TempDir()
	cfg := EmbeddedConfig{DataDir: dir, SweepEvery: -1}
	prev, err := StartEmbedded(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(prev.Shutdown)
	old, err := connectLayout(prev, Options{}, previousLayout)
	if err != nil {
		t.Fatal(err)
	}
	before := leaveMail(t, old)
	old.Close()
	prev.Shutdown()

	emb, err := StartEmbedded(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emb.Shutdown)
	ci := emb.InProcessInfo()
	watch, err := nats.Connect("", nats.InProcessServer(emb.Server()), nats.UserInfo(ci.User, ci.Password), nats.Timeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(watch.Close)
	fired := watchFired(t, watch)
	q, err := connectTo(emb, Options{Syncer: emb.Syncer()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	checkUpgraded(t, q, before, fired, time.Now())
	waitLaneSynced(t, emb, StreamRetry)
	waitLaneSynced(t, emb, StreamRateLimit)
	checkRollback(t, func(layout func(Options) []jetstream.StreamConfig) *Queue {
		q, err := connectLayout(emb, Options{}, layout)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { q.Close() })
		return q
	})
}

// TestUpgradeFromPreviousLayoutR3 is TestUpgradeFromPreviousLayout on a
// fleet's NATS: three clustered servers, every stream with three replicas,
// a worker of the previous release still connected while a worker of the
// current one starts (a rolling upgrade). The cluster stays up; there is
// no in-process syncer, so only the republish itself is checked.
func TestUpgradeFromPreviousLayoutR3(t *testing.T) {
	if os.Getenv("OUTFLOW_LONG") != "1" {
		t.Skip("starts a three-node cluster; OUTFLOW_LONG=1 (make test-long)")
	}
	user, password := "outflow", "upgrade-test-password"
	urls := startCluster(t, user, password)
	o := Options{URL: urls, User: user, Password: password, Replicas: 3, Logger: zerolog.Nop()}
	old := connectCluster(t, o, previousLayout)
	before := leaveMail(t, old)

	watch, err := nats.Connect(urls, nats.UserInfo(user, password), nats.Timeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(watch.Close)
	fired := watchFired(t, watch)
	q := connectCluster(t, o, streamConfigs)
	upgraded := time.Now()
	old.Close() // the old worker goes once the new one is up
	checkUpgraded(t, q, before, fired, upgraded)
	checkRollback(t, func(layout func(Options) []jetstream.StreamConfig) *Queue { return connectCluster(t, o, layout) })
}

// firing is a schedule the previous release left on a lane.
type firing struct {
	lane     Lane
	dest, id string
	at       time.Time
}

// oldMail is what leaveMail stored: every envelope's state by id, the
// messages in each stream that no schedule moves within, and the
// schedules that come due within seconds (others wait an hour).
type oldMail struct {
	states map[string]State
	msgs   map[string]uint64
	fires  []firing
}

// fixedStreams are the streams whose message count no firing changes.
var fixedStreams = []string{StreamWork, StreamDead, StreamEvents, bodyStreamName, kvStream(BucketSent)}

// leaveMail stores, through q, what a running daemon holds: three fresh
// envelopes, schedules on both deferred lanes coming due over the next
// seconds, and one on each an hour away.
func leaveMail(t *testing.T, q *Queue) oldMail {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var m oldMail
	base := time.Now()
	// Spread so that, however long the upgrade takes on a loaded
	// machine, some schedules of each lane come due soon after it.
	deferred := 0
	for l, ms := range map[Lane][]int{
		LaneRetry:     {1200, 1800, 2500, 3500, 5000, 8000, 13000},
		LaneRateLimit: {1400, 2000, 3000, 4000, 6000, 10000, 15000},
	} {
		for _, in := range ms {
			at := base.Add(time.Duration(in) * time.Millisecond)
			e := deferOne(t, q, l, at)
			m.fires = append(m.fires, firing{l, e.Dest, e.ID, at})
		}
		deferOne(t, q, l, base.Add(time.Hour)) // still waiting when the test ends
		deferred += len(ms) + 1
	}
	if _, err := q.Enqueue(ctx, &Submission{Tenant: "t", From: "a@b.example", Rcpts: []string{"x@one.example", "y@two.example", "z@three.example"},
		Body: []byte("Subject: fresh\r\n\r\nbody\r\n")}); err != nil {
		t.Fatal(err)
	}
	m.states = listStates(t, q)
	if n := len(m.states); n != 3+deferred {
		t.Fatalf("the previous release holds %d envelopes, want %d (3 fresh, %d deferred)", n, 3+deferred, deferred)
	}
	m.msgs = streamMsgs(t, q)
	return m
}

// checkUpgraded checks q, the current release started on the streams
// leaveMail filled: the stream configs are the current layout, every
// envelope is still there in the same state, and every schedule that
// came due after upgraded (by when the fired subjects were watched and
// the streams updated) was both handed to the lane's workers and
// republished on fired.
func checkUpgraded(t *testing.T, q *Queue, before oldMail, fired <-chan *nats.Msg, upgraded time.Time) {
	t.Helper()
	checkRePublish(t, q, streamConfigs, "after the upgrade")
	if after := listStates(t, q); !reflect.DeepEqual(after, before.states) {
		t.Errorf("envelopes after the upgrade:\n%v\nwant (before it):\n%v", after, before.states)
	}
	if after := streamMsgs(t, q); !reflect.DeepEqual(after, before.msgs) {
		t.Errorf("messages per stream after the upgrade: %v, want %v", after, before.msgs)
	}

	// Per lane, wait for the first schedule due after the upgrade and
	// every one before it.
	type want struct {
		delivered, fired bool
		afterUpgrade     bool
	}
	wants := map[string]*want{} // by due subject
	var firstDue time.Time      // the latest of the lanes' first firings after the upgrade
	for _, l := range []Lane{LaneRetry, LaneRateLimit} {
		var first, last time.Time
		for _, f := range before.fires {
			if f.lane == l && f.at.After(upgraded) && (first.IsZero() || f.at.Before(first)) {
				first = f.at
			}
			if f.lane == l && f.at.After(last) {
				last = f.at
			}
		}
		if first.IsZero() {
			t.Fatalf("the upgrade ended %s after the last %s schedule came due: no firing after it to check", upgraded.Sub(last).Round(time.Millisecond), l)
		}
		firstDue = later(firstDue, first)
		for _, f := range before.fires {
			if f.lane == l && !f.at.After(first) {
				wants[dueSubject(l, f.dest, f.id)] = &want{afterUpgrade: f.at.After(upgraded)}
			}
		}
	}
	ctx, cancel := context.WithDeadline(context.Background(), firstDue.Add(30*time.Second))
	defer cancel()
	deliveries := make(chan *Delivery, 32)
	for _, l := range []Lane{LaneRetry, LaneRateLimit} {
		ch, err := q.Messages(ctx, l, 16)
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			for d := range ch {
				deliveries <- d
			}
		}()
	}
	done := func() bool {
		for _, w := range wants {
			if !w.delivered || (w.afterUpgrade && !w.fired) {
				return false
			}
		}
		return true
	}
	for !done() {
		select {
		case d := <-deliveries:
			if w := wants[d.msg.Subject()]; w != nil {
				w.delivered = true
			}
		case m := <-fired:
			if w := wants[m.Header.Get(jetstream.SubjectHeader)]; w != nil {
				w.fired = true
			}
		case <-ctx.Done():
			var missing []string
			for subj, w := range wants {
				if !w.delivered {
					missing = append(missing, subj+" not delivered")
				}
				if w.afterUpgrade && !w.fired {
					missing = append(missing, subj+" not republished")
				}
			}
			t.Fatalf("30s after the first schedule due since the upgrade: %s", strings.Join(missing, "; "))
		}
	}
}

// watchFired subscribes nc to both lanes' fired subjects before the
// upgrade starts, so that no republish after it is missed.
func watchFired(t *testing.T, nc *nats.Conn) <-chan *nats.Msg {
	t.Helper()
	ch := make(chan *nats.Msg, 64)
	for _, l := range []Lane{LaneRetry, LaneRateLimit} {
		if _, err := nc.ChanSubscribe(firedSubjects(l), ch); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return ch
}

// listStates is every envelope q lists, by id, with its state.
func listStates(t *testing.T, q *Queue) map[string]State {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	items, err := q.List(ctx, Filter{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	states := map[string]State{}
	for _, it := range items {
		states[it.Env.ID] = it.State
	}
	return states
}

// streamMsgs is the message count of each of fixedStreams.
func streamMsgs(t *testing.T, q *Queue) map[string]uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	msgs := map[string]uint64{}
	for _, name := range fixedStreams {
		s, err := q.js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		msgs[name] = info.State.Msgs
	}
	return msgs
}

// connectCluster connects to a cluster with o, the streams laid out by
// layout, retrying while the cluster settles (a stream's leader election
// after a create answers "temporarily unavailable"), for up to a minute.
func connectCluster(t *testing.T, o Options, layout func(Options) []jetstream.StreamConfig) *Queue {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		q, err := connect(ctx, o, layout)
		if err == nil {
			t.Cleanup(func() { q.Close() })
			return q
		}
		if ctx.Err() != nil {
			t.Fatal(err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// startCluster starts three JetStream servers in this process, clustered
// over loopback routes, each with a loopback client listener that takes
// user and password, and waits until the cluster places an R3 stream. It
// returns the three client URLs, comma-separated.
func startCluster(t *testing.T, user, password string) string {
	t.Helper()
	dir := t.TempDir()
	routePorts := make([]int, 3)
	var routes []*url.URL
	for i := range routePorts {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		routePorts[i] = ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		routes = append(routes, &url.URL{Scheme: "nats-route", Host: fmt.Sprintf("127.0.0.1:%d", routePorts[i])})
	}
	var urls []string
	for i, port := range routePorts {
		name := fmt.Sprintf("n%d", i+1)
		srv, err := server.NewServer(&server.Options{
			ServerName: name,
			Host:       "127.0.0.1",
			Port:       server.RANDOM_PORT,
			Username:   user,
			Password:   password,
			JetStream:  true,
			StoreDir:   filepath.Join(dir, name),
			Cluster:    server.ClusterOpts{Name: "outflow-upgrade", Host: "127.0.0.1", Port: port},
			Routes:     routes,
			NoLog:      true,
			NoSigs:     true,
		})
		if err != nil {
			t.Fatal(err)
		}
		srv.Start()
		t.Cleanup(srv.Shutdown)
		if !srv.ReadyForConnections(30 * time.Second) {
			t.Fatalf("nats-server %s not ready after 30s", name)
		}
		urls = append(urls, srv.ClientURL())
	}
	nc, err := nats.Connect(strings.Join(urls, ","), nats.UserInfo(user, password))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: "PROBE", Subjects: []string{"probe"}, Replicas: 3})
		if err == nil {
			err = js.DeleteStream(ctx, "PROBE")
		}
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cluster did not place an R3 stream within a minute: %v", err)
		}
		time.Sleep(100 * time.Millisecond) // polling with a deadline: no event announces a meta leader
	}
	return strings.Join(urls, ",")
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// checkRePublish checks that every stream's RePublish is as layout lays
// it out for q's options.
func checkRePublish(t *testing.T, q *Queue, layout func(Options) []jetstream.StreamConfig, when string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, want := range layout(q.opts) {
		s, err := q.js.Stream(ctx, want.Name)
		if err != nil {
			t.Fatal(err)
		}
		if got := s.CachedInfo().Config.RePublish; !reflect.DeepEqual(got, want.RePublish) {
			t.Errorf("stream %s: republish %+v %s, want %+v", want.Name, got, when, want.RePublish)
		}
	}
}

// checkRollback: a process of the previous release that starts after the
// upgrade (an old worker restarting during a rolling upgrade, or a
// rollback) takes the lanes back to its layout, and the next process of
// the current release restores it; neither is refused.
func checkRollback(t *testing.T, open func(layout func(Options) []jetstream.StreamConfig) *Queue) {
	t.Helper()
	checkRePublish(t, open(previousLayout), previousLayout, "after a previous release started again")
	checkRePublish(t, open(streamConfigs), streamConfigs, "after the current release started again")
}
