package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outflow/outflow/internal/fakemx"
	"github.com/outflow/outflow/queue"
)

// natsNode is one nats-server process of a test cluster.
type natsNode struct {
	name        string
	clientAddr  string
	monitorAddr string // the monitoring endpoint, when clusterSetup.monitor
	cmd         *exec.Cmd
	exited      chan struct{}
	log         *os.File
}

// start runs the node's server with its config file, on its store.
func (n *natsNode) start(bin, conf string) error {
	cmd := exec.Command(bin, "-c", conf)
	cmd.Stdout, cmd.Stderr = n.log, n.log
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	n.cmd, n.exited = cmd, exited
	go func() { _ = cmd.Wait(); close(exited) }()
	return nil
}

// restart kills the node with SIGKILL and starts it again on the same
// config and store, then waits until it listens for clients.
func (n *natsNode) restart(t *testing.T) {
	t.Helper()
	n.kill()
	if err := n.start(n.cmd.Path, n.cmd.Args[len(n.cmd.Args)-1]); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "nats-server "+n.name+" listening again", func() bool {
		c, err := net.DialTimeout("tcp", n.clientAddr, time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
}

func (n *natsNode) kill() {
	select {
	case <-n.exited:
		return
	default:
	}
	_ = n.cmd.Process.Kill()
	<-n.exited
}

// buildNATSServer builds the nats-server pinned in go.mod into dir.
func buildNATSServer(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "nats-server")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/nats-io/nats-server/v2")
	cmd.Dir = ".."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build nats-server: %v\n%s", err, out)
	}
	return bin
}

// startNATSCluster starts three JetStream nats-servers clustered over
// loopback routes, with client auth user/password, and waits until
// JetStream answers.
func startNATSCluster(t *testing.T, user, password string) []*natsNode {
	t.Helper()
	return startNATSClusterWith(t, user, password, clusterSetup{})
}

// clusterSetup changes how startNATSClusterWith wires the nodes.
type clusterSetup struct {
	// routeVia, when set, returns the address node from dials to reach
	// node to's route listener at addr (a proxy the test controls). Each
	// node then lists only the other two, and advertises a route address
	// that refuses every connection, so that no node learns a way around
	// the proxies from the cluster's gossip. Nil: every node lists the
	// three route listeners themselves.
	routeVia func(from, to int, addr string) string
	// monitor serves each node's monitoring endpoint (natsNode.monitorAddr).
	monitor bool
	// routePing, when set, is the routes' ping interval (cluster
	// ping_interval, with ping_max 2), instead of nats-server's 2 minutes.
	routePing time.Duration
}

// startNATSClusterWith is startNATSCluster wired as setup says.
func startNATSClusterWith(t *testing.T, user, password string, setup clusterSetup) []*natsNode {
	t.Helper()
	dir := t.TempDir()
	bin := buildNATSServer(t, dir)
	clientPorts := []string{freeAddr(t), freeAddr(t), freeAddr(t)}
	routePorts := []string{freeAddr(t), freeAddr(t), freeAddr(t)}
	var routes []string
	for _, r := range routePorts {
		routes = append(routes, "nats-route://"+r)
	}
	nodes := make([]*natsNode, 3)
	for i := range 3 {
		name := fmt.Sprintf("n%d", i+1)
		nodeRoutes, extra := routes, ""
		if setup.routeVia != nil {
			nodeRoutes = nil
			for j, r := range routePorts {
				if j != i {
					nodeRoutes = append(nodeRoutes, "nats-route://"+setup.routeVia(i, j, r))
				}
			}
			extra = "  advertise: " + refusingAddr(t) + "\n"
		}
		if setup.routePing > 0 {
			extra += fmt.Sprintf("  ping_interval: %q\n  ping_max: 2\n", setup.routePing.String())
		}
		var monitorAddr, monitor string
		if setup.monitor {
			monitorAddr = freeAddr(t)
			monitor = "http: " + monitorAddr + "\n"
		}
		conf := fmt.Sprintf(`server_name: %s
listen: %s
%sjetstream { store_dir: %q, max_file_store: 1G, max_memory_store: 64M }
cluster {
  name: outflow-test
  listen: %s
  routes: [%s]
%s}
authorization { user: %q, password: %q }
`, name, clientPorts[i], monitor, filepath.Join(dir, name), routePorts[i], strings.Join(nodeRoutes, ", "), extra, user, password)
		cf := filepath.Join(dir, name+".conf")
		if err := os.WriteFile(cf, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		lf, err := os.Create(filepath.Join(dir, name+".log"))
		if err != nil {
			t.Fatal(err)
		}
		n := &natsNode{name: name, clientAddr: clientPorts[i], monitorAddr: monitorAddr, log: lf}
		if err := n.start(bin, cf); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.kill(); lf.Close() })
		nodes[i] = n
	}
	for _, n := range nodes {
		waitFor(t, 60*time.Second, "nats-server "+n.name+" listening", func() bool {
			c, err := net.DialTimeout("tcp", n.clientAddr, time.Second)
			if err == nil {
				c.Close()
			}
			return err == nil
		})
	}
	// JetStream is usable once a meta leader is elected and an R3 stream
	// can be created.
	nc, err := nats.Connect(clusterURL(nodes, user, password), nats.MaxReconnects(-1), nats.RetryOnFailedConnect(true))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	// Generous: under `make test` two clusters start while the rest of the
	// e2e suite loads both cores, and a meta leader election can take long.
	waitFor(t, 180*time.Second, "the NATS cluster's JetStream", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: "PROBE", Subjects: []string{"probe"}, Replicas: 3})
		return err == nil
	})
	return nodes
}

// refusingAddr is a loopback address the test holds and whose every
// connection is closed at once.
func refusingAddr(t *testing.T) string {
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
			c.Close()
		}
	}()
	return ln.Addr().String()
}

func clusterURL(nodes []*natsNode, user, password string) string {
	var urls []string
	for _, n := range nodes {
		urls = append(urls, "nats://"+user+":"+password+"@"+n.clientAddr)
	}
	return strings.Join(urls, ",")
}

// aboveInfo keeps the log lines of level warn, error or fatal.
func aboveInfo(logs string) string {
	var out []string
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, `"level":"warn"`) || strings.Contains(l, `"level":"error"`) || strings.Contains(l, `"level":"fatal"`) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// consumerStates describes every consumer of the outflow streams as the
// cluster sees it now: what is waiting, handed out, and which pulls wait.
func consumerStates(url string) string {
	nc, err := nats.Connect(url, nats.Timeout(5*time.Second))
	if err != nil {
		return "consumer states: " + err.Error()
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return "consumer states: " + err.Error()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var b strings.Builder
	for _, stream := range []string{"OUTFLOW_WORK", "OUTFLOW_RETRY", "OUTFLOW_RATELIMIT"} {
		st, err := js.Stream(ctx, stream)
		if err != nil {
			fmt.Fprintf(&b, "%s: %v\n", stream, err)
			continue
		}
		l := st.ListConsumers(ctx)
		for ci := range l.Info() {
			leader := ""
			if ci.Cluster != nil {
				leader = ci.Cluster.Leader
			}
			fmt.Fprintf(&b, "%s/%s leader=%s pending=%d ack_pending=%d waiting_pulls=%d redelivered=%d\n",
				stream, ci.Name, leader, ci.NumPending, ci.NumAckPending, ci.NumWaiting, ci.NumRedelivered)
		}
		if err := l.Err(); err != nil {
			fmt.Fprintf(&b, "%s consumers: %v\n", stream, err)
		}
	}
	return b.String()
}

// TestClusterFailover runs two outflow workers against a three-node NATS
// cluster with every stream replicated three times, submits through both,
// then SIGKILLs one NATS server and one outflow worker mid-run. Every
// message answered with 250 must be delivered; duplicates are bounded by
// what the two processes can have had in flight; the survivor keeps
// delivering; and the NATS password in the URL never reaches a log line.
func TestClusterFailover(t *testing.T) {
	t.Parallel()
	const natsUser, natsPassword = "outflow", "cluster-secret-pw-7c1f"
	nodes := startNATSCluster(t, natsUser, natsPassword)
	url := clusterURL(nodes, natsUser, natsPassword)

	mx := fakemx.Start(t, fakemx.Options{})
	dir := t.TempDir()
	users := writeUsers(t, dir)
	const workers = 4
	common := append([]string{"--users", users, "--relay", mx.Addr(), "--nats-url", url, "--nats-replicas", "3",
		"--workers", fmt.Sprint(workers)}, fastRetry...)
	// Distinct EHLO names tell at the sink which worker delivered what.
	w1 := startDaemon(t, dir+"/w1", append(common, "--worker-id", "w1", "--hostname", "w1.test")...)
	w2 := startDaemon(t, dir+"/w2", append(common, "--worker-id", "w2", "--hostname", "w2.test")...)
	deliveredBy := func(host string) int {
		n := 0
		for _, m := range mx.Messages() {
			if m.Hostname == host {
				n++
			}
		}
		return n
	}
	logs := func() string { return "--- w1 ---\n" + tail(w1.Logs(), 40) + "\n--- w2 ---\n" + tail(w2.Logs(), 40) }
	// problems is what the daemons logged above info level: the busy info
	// lines of an unpaced load would push it out of a plain tail.
	problems := func() string {
		return "--- w1 warnings and errors ---\n" + tail(aboveInfo(w1.Logs()), 40) + "\n--- w2 warnings and errors ---\n" + tail(aboveInfo(w2.Logs()), 40)
	}

	per := 30
	if longMode() {
		per = 200
	}
	l1 := startLoad(t, "cl1", w1.SMTPAddr, 1, 0)
	l2 := startLoad(t, "cl2", w2.SMTPAddr, 1, 0)
	accepted := func() int { return l1.NumAccepted() + l2.NumAccepted() }
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("at failure: accepted=%d (cl1 %d, cl2 %d) at the sink=%d (w1 %d, w2 %d) codes cl1=%v cl2=%v\n%s\n%s",
				accepted(), l1.NumAccepted(), l2.NumAccepted(), len(mx.Messages()), deliveredBy("w1.test"), deliveredBy("w2.test"),
				l1.Codes(), l2.Codes(), consumerStates(url), problems())
		}
	})
	waitFor(t, 120*time.Second, "submissions through both workers, and deliveries by both", func() bool {
		return l1.NumAccepted() >= per && l2.NumAccepted() >= per && deliveredBy("w1.test") >= 5 && deliveredBy("w2.test") >= 5
	})

	// Kill the NATS server both workers most likely talk to (the first URL).
	t.Logf("SIGKILL nats %s with %d accepted, %d at the sink", nodes[0].name, accepted(), len(mx.Messages()))
	nodes[0].kill()
	n := accepted()
	byW2 := deliveredBy("w2.test")
	waitFor(t, 120*time.Second, "submissions and deliveries after the NATS kill", func() bool {
		return accepted() >= n+per && deliveredBy("w2.test") >= byW2+5
	})

	// Kill one worker; its submitter moves to the survivor.
	t.Logf("SIGKILL worker w2 with %d accepted, %d at the sink (%d delivered by w2)", accepted(), len(mx.Messages()), deliveredBy("w2.test"))
	w2.Kill()
	l2.SetAddr(w1.SMTPAddr)
	n = accepted()
	waitFor(t, 120*time.Second, "submissions after the worker kill", func() bool { return accepted() >= n+per })
	l1.Stop()
	l2.Stop()

	all := l1.Accepted()
	for id := range l2.Accepted() {
		all[id] = true
	}
	// w2's in-flight envelopes come back to w1 after the ack wait (60 s).
	deadline := time.Now().Add(240 * time.Second)
	for !allDelivered(all, mx) && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond) // polling for delivery with a deadline
	}
	r := compare(all, sinkCounts(mx))
	if r.missing != 0 {
		out, _ := runCLI(t, "queue", "list", "--nats-url", url, "--limit", "50")
		t.Logf("queue after 240s:\n%s\n%s", out, logs())
	}
	codes := l1.Codes()
	for c, v := range l2.Codes() {
		codes[c] += v
	}
	// How often a lane's pull failed (in the NATS kill) and was started
	// again by queue.pull.
	restarts := strings.Count(w1.Logs(), "pull ended; starting again") + strings.Count(w2.Logs(), "pull ended; starting again")
	t.Logf("FIGURES cluster: nats_kills=1 worker_kills=1 submissions=%d %s codes=%v pull_restarts=%d",
		l1.attempts.Load()+l2.attempts.Load(), r, codes, restarts)
	if r.missing != 0 {
		t.Errorf("lost %d accepted messages: %v", r.missing, r.missingIDs)
	}
	// In flight: a killed worker's deliveries, and during the NATS kill the
	// steps of both workers whose acknowledgement was lost.
	if bound := 3 * workers; r.dups > bound {
		t.Errorf("%d duplicates, more than the %d envelopes that can have been in flight", r.dups, bound)
	}
	for _, w := range []*daemon{w1, w2} {
		if strings.Contains(w.Logs(), natsPassword) {
			t.Errorf("the NATS password appears in a worker's log")
		}
		requireNoPanic(t, w.Logs())
	}
	// Delivery continues on the survivor.
	cl := dialAuth(t, w1.SMTPAddr, testUser, testPassword)
	if err := submit(cl, "app@sender.test", []string{"z@dest.test"}, message("after-failover", "")); err != nil {
		t.Fatal(err)
	}
	_ = cl.Quit()
	waitAllDelivered(t, map[string]bool{"<after-failover@e2e.test>": true}, mx, 60*time.Second, logs)
	// The other submission path, and a message's history, on the R3
	// streams of the cluster that lost a node.
	// The streams may still be electing leaders on a loaded machine; the
	// command asks again within its --timeout (queue.lookUp).
	cmd := exec.Command(binary, "submit", "--nats-url", url, "--timeout", "60s", "--from", "app@sender.test", "--to", "z@dest.test")
	cmd.Stdin = strings.NewReader("Subject: via nats\nMessage-ID: <cluster-nats@e2e.test>\n\nhello\n")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("submit over NATS: %v\n%s", err, out)
	}
	id := strings.TrimSpace(string(out))
	waitAllDelivered(t, map[string]bool{"<cluster-nats@e2e.test>": true}, mx, 60*time.Second, logs)
	var hist string
	waitFor(t, 30*time.Second, "queued and delivered in the history of "+id, func() bool {
		hist, _ = runCLI(t, "queue", "history", id, "--nats-url", url)
		return strings.Contains(hist, "queued") && strings.Contains(hist, "delivered")
	})
	w1.Stop()

	// A worker started without --nats-replicas 3 is refused rather than
	// allowed to drop the fleet's streams to one copy.
	sctx, scancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer scancel()
	out, err = exec.CommandContext(sctx, binary, "serve", "--data", dir+"/w3", "--smtp-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
		"--users", users, "--relay", mx.Addr(), "--nats-url", url).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "has 3 replicas and this process asks for 1") {
		t.Fatalf("a worker with --nats-replicas 1 on R3 streams: %v\n%s", err, tail(string(out), 10))
	}
	nc, err := nats.Connect(url, nats.Timeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, name := range []string{queue.StreamWork, queue.StreamEvents, "KV_" + queue.BucketSent} {
		st, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if r := st.CachedInfo().Config.Replicas; r != 3 {
			t.Errorf("stream %s has %d replicas after the refused worker, want 3", name, r)
		}
	}
}
