package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-smtp"

	"github.com/outflow/outflow/internal/fakemx"
	"github.com/outflow/outflow/internal/tcpproxy"
)

// TestNATSPartition cuts one node of a three-node NATS cluster off from the
// other two for 30 s without stopping it, then heals the cut. Every route
// between two nodes runs through a TCP proxy the test controls
// (internal/tcpproxy), one per direction; the cut blackholes the four
// proxies that touch the node: nothing is forwarded and every socket stays
// open, so the servers learn of it only from their own timeouts, as on a
// network that drops packets. The node keeps serving its clients.
//
// The routes ping every 2 s (cluster ping_interval, ping_max 2), so a
// dead route is closed within about 6 s. On nats-server's default of 2
// minutes the majority side all but stops until then: the two nodes
// still see the cut node's subscriptions, and requests to a queue group
// (a KV or Object Store direct get, answered by any replica) go to its
// replica at random and vanish, so a third of the SENT checks and body
// reads wait out their timeouts (w2 accepted 4 messages in the 30 s of a
// run on the default). docs/reliability.md says what to configure.
//
// Worker w1 is connected to the node that is cut off (the test finds it in
// the nodes' /connz) and has the whole cluster in its --nats-url; w2 is
// given the other two nodes only, so that it is on the majority side. Both
// take an unpaced submission load. The sink takes 20 ms per message, as a
// real MX does, so that deliveries are in progress at the cut.
//
// Pass means nothing accepted with 250 is lost; w2 accepts and delivers
// during the cut (the majority side goes on: its load, or probes on new
// connections from 5 s into the cut); w1 stays up, waits out the
// cut (or moves to another node) and delivers again after the heal; and
// the duplicates stay within what can have been in flight at the cut:
// the envelopes w1 held (its deliveries in progress plus those pulled and
// not started, --workers per lane, three lanes) and w2's deliveries whose
// SENT marker or ack was lost in the leader elections, per cut.
//
// Default: one 30 s blackhole. OUTFLOW_LONG=1: a blackhole, then a reset
// (every route connection of the node closed with RST, reconnections
// refused), 30 s each.
func TestNATSPartition(t *testing.T) {
	t.Parallel()
	const natsUser, natsPassword = "outflow", "partition-secret-pw-5e2a"
	const workers, cut = 4, 30 * time.Second
	modes := []tcpproxy.Mode{tcpproxy.Blackhole}
	if longMode() {
		modes = append(modes, tcpproxy.Reset)
	}
	var proxies [3][3]*tcpproxy.Proxy
	nodes := startNATSClusterWith(t, natsUser, natsPassword, clusterSetup{monitor: true, routePing: 2 * time.Second,
		routeVia: func(from, to int, addr string) string {
			p, err := tcpproxy.New("127.0.0.1:0", addr)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { p.Close() })
			proxies[from][to] = p
			return p.Addr()
		}})
	setAll := func(k int, m tcpproxy.Mode) {
		for j := range 3 {
			if j != k {
				proxies[k][j].Set(m)
				proxies[j][k].Set(m)
			}
		}
	}
	for i := range 3 {
		for j := range 3 {
			if i != j && proxies[i][j].Conns() == 0 && proxies[j][i].Conns() == 0 {
				t.Fatalf("no route between %s and %s goes through the proxies", nodes[i].name, nodes[j].name)
			}
		}
	}

	mx := fakemx.Start(t, fakemx.Options{Hook: func(stage fakemx.Stage, _ string) *smtp.SMTPError {
		if stage == fakemx.StageDot {
			time.Sleep(20 * time.Millisecond) // the peer's latency, not a wait in the test
		}
		return nil
	}})
	dir := t.TempDir()
	common := append([]string{"--users", writeUsers(t, dir), "--relay", mx.Addr(), "--nats-replicas", "3",
		"--workers", fmt.Sprint(workers), "--ack-wait", "5s"}, fastRetry...)
	w1 := startDaemon(t, dir+"/w1", slices.Concat(common, []string{"--nats-url", clusterURL(nodes, natsUser, natsPassword), "--worker-id", "w1", "--hostname", "w1.test"})...)
	k := -1
	waitFor(t, 30*time.Second, "w1 in a node's connections", func() bool { k = connectedTo(nodes, "outflow w1"); return k >= 0 })
	var others []*natsNode
	for i, n := range nodes {
		if i != k {
			others = append(others, n)
		}
	}
	w2 := startDaemon(t, dir+"/w2", slices.Concat(common, []string{"--nats-url", clusterURL(others, natsUser, natsPassword), "--worker-id", "w2", "--hostname", "w2.test"})...)
	deliveredBy := func(host string) int {
		n := 0
		for _, m := range mx.Messages() {
			if m.Hostname == host {
				n++
			}
		}
		return n
	}
	url := clusterURL(others, natsUser, natsPassword)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("at failure: at the sink %d (w1 %d, w2 %d)\n%s\n--- w1 ---\n%s\n--- w2 ---\n%s", len(mx.Messages()),
				deliveredBy("w1.test"), deliveredBy("w2.test"), consumerStates(url), tail(aboveInfo(w1.Logs()), 40), tail(aboveInfo(w2.Logs()), 40))
		}
	})
	l1 := startLoad(t, "part1", w1.SMTPAddr, 1, 0)
	l2 := startLoad(t, "part2", w2.SMTPAddr, 1, 0)
	waitFor(t, 120*time.Second, "submissions through both workers, and deliveries by both", func() bool {
		return l1.NumAccepted() >= 30 && l2.NumAccepted() >= 30 && deliveredBy("w1.test") >= 10 && deliveredBy("w2.test") >= 10
	})

	var figures []string
	var probes struct {
		mu       sync.Mutex
		accepted map[string]time.Duration // Message-ID -> when, into its cut
		wg       sync.WaitGroup
	}
	probes.accepted = map[string]time.Duration{}
	for ci, mode := range modes {
		if n := connectedTo(nodes, "outflow w1"); n >= 0 {
			k = n // w1 may have moved in an earlier cut: cut the node it is on now
		}
		if connectedTo(nodes, "outflow w2") == k {
			t.Fatalf("w1 and w2 are both on %s", nodes[k].name)
		}
		acc1, acc2, by1, by2 := l1.NumAccepted(), l2.NumAccepted(), deliveredBy("w1.test"), deliveredBy("w2.test")
		t.Logf("cut %d: %s %s off for %v with %d accepted, %d at the sink", ci+1, mode, nodes[k].name, cut, acc1+acc2, len(mx.Messages()))
		began := time.Now()
		setAll(k, mode)
		// The cut is the fault itself: hold it for its length, while the
		// majority side must accept and deliver new mail. The load's
		// submissions that were in flight when the stream's leader was cut
		// off wait out the 30 s enqueue timeout (a publish is not sent
		// again within it), so the majority side is also probed with a
		// new message on a new connection every 2 s from 5 s into the cut.
		var probeFirst time.Duration
		probeSeq := 0
		for time.Since(began) < cut {
			if d := time.Since(began); d >= 5*time.Second && d >= time.Duration(probeSeq)*2*time.Second+5*time.Second {
				probeSeq++
				id := fmt.Sprintf("<probe-%d-%d@e2e.test>", ci+1, probeSeq)
				probes.wg.Add(1)
				go func() {
					defer probes.wg.Done()
					cl, _, err := dialAuthNoFatal(w2.SMTPAddr)
					if err != nil {
						return
					}
					defer cl.Close()
					body := []byte("From: app@sender.test\r\nTo: p@dest.test\r\nSubject: probe\r\nMessage-ID: " + id + "\r\n\r\nprobe\r\n")
					if submit(cl, "app@sender.test", []string{"p@dest.test"}, body) == nil {
						probes.mu.Lock()
						probes.accepted[id] = time.Since(began)
						probes.mu.Unlock()
					}
				}()
			}
			time.Sleep(100 * time.Millisecond) // the cut's clock: probes are due at fixed times
		}
		in1, in2, del1, del2 := l1.NumAccepted()-acc1, l2.NumAccepted()-acc2, deliveredBy("w1.test")-by1, deliveredBy("w2.test")-by2
		probesIn, probesOut := 0, 0
		got := sinkCounts(mx)
		probes.mu.Lock()
		for id, at := range probes.accepted {
			if strings.HasPrefix(id, fmt.Sprintf("<probe-%d-", ci+1)) {
				probesIn++
				if probeFirst == 0 || at < probeFirst {
					probeFirst = at
				}
				if got[id] > 0 {
					probesOut++
				}
			}
		}
		probes.mu.Unlock()
		setAll(k, tcpproxy.Forward)
		healed := time.Now()
		t.Logf("cut %d healed: during it w1 accepted %d and delivered %d, w2 accepted %d and delivered %d; %d of %d probes accepted (the first %v into the cut), %d delivered",
			ci+1, in1, del1, in2, del2, probesIn, probeSeq, probeFirst.Round(100*time.Millisecond), probesOut)
		if (in2 < 10 || del2 < 10) && (probesIn == 0 || probesOut == 0) {
			t.Errorf("cut %d: the majority side stopped: w2 accepted %d and delivered %d in %v, and %d probes were accepted, %d delivered", ci+1, in2, del2, cut, probesIn, probesOut)
		}
		if !w1.alive() {
			t.Fatalf("w1 exited in the cut\n%s", tail(w1.Logs(), 40))
		}
		// w1 takes part again: it accepts and delivers.
		acc1, by1 = l1.NumAccepted(), deliveredBy("w1.test")
		waitFor(t, 120*time.Second, "w1 to accept and deliver after the heal", func() bool {
			return l1.NumAccepted() >= acc1+10 && deliveredBy("w1.test") >= by1+10
		})
		figures = append(figures, fmt.Sprintf("cut%d=%s(node=%s w1_accepted=%d w1_delivered=%d w2_accepted=%d w2_delivered=%d probes_accepted=%d/%d first_probe=%v probes_delivered=%d w1_back_after=%v)",
			ci+1, mode, nodes[k].name, in1, del1, in2, del2, probesIn, probeSeq, probeFirst.Round(100*time.Millisecond), probesOut, time.Since(healed).Round(100*time.Millisecond)))
	}
	l1.Stop()
	l2.Stop()
	probes.wg.Wait()
	all := l1.Accepted()
	for id := range l2.Accepted() {
		all[id] = true
	}
	for id := range probes.accepted {
		all[id] = true
	}
	waitAllDelivered(t, all, mx, 180*time.Second, func() string { return w1.Logs() + w2.Logs() })
	r := compare(all, sinkCounts(mx))
	bound := len(modes) * (workers*(1+3) + workers)
	codes := l1.Codes()
	for c, n := range l2.Codes() {
		codes[c] += n
	}
	t.Logf("FIGURES partition: cuts=%d cut=%v submissions=%d %s bound=%d %s w1_reconnects=%d codes=%v",
		len(modes), cut, l1.attempts.Load()+l2.attempts.Load(), r, bound, strings.Join(figures, " "), w1.countLog(`"nats reconnected"`), codes)
	if r.missing != 0 {
		t.Errorf("lost %d accepted messages: %v", r.missing, r.missingIDs)
	}
	if r.dups > bound {
		t.Errorf("%d duplicates, more than the %d envelopes that can have been in flight at %d cuts", r.dups, bound, len(modes))
	}
	for _, w := range []*daemon{w1, w2} {
		requireNoPanic(t, w.Logs())
		if strings.Contains(w.Logs(), natsPassword) {
			t.Errorf("the NATS password appears in a worker's log")
		}
	}
	w1.Stop()
	w2.Stop()
}

// connectedTo is the index of the node whose client connections include
// one named name (nats.Name; outflow's is "outflow <worker-id>"), or -1.
func connectedTo(nodes []*natsNode, name string) int {
	c := http.Client{Timeout: 5 * time.Second}
	for i, n := range nodes {
		resp, err := c.Get("http://" + n.monitorAddr + "/connz?limit=1024")
		if err != nil {
			continue
		}
		var cz struct {
			Connections []struct {
				Name string `json:"name"`
			} `json:"connections"`
		}
		err = json.NewDecoder(resp.Body).Decode(&cz)
		resp.Body.Close()
		if err != nil {
			continue
		}
		for _, conn := range cz.Connections {
			if conn.Name == name {
				return i
			}
		}
	}
	return -1
}
