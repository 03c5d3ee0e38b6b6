package main

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"sort"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/sender"
	"github.com/outflow/outflow/submission"
	"github.com/outflow/outflow/worker"
)

// runProfile runs scenario 1 against the pipeline built in this process
// (embedded NATS, queue, submission listener, worker pool, sender: the same
// parts `outflow serve` wires, with its defaults) and writes a CPU profile
// of the run and an allocation profile to outDir. It exists because serve
// has no pprof endpoint; the profile covers exactly outflow's code. With
// backlog > 0 it first defers that many envelopes, as scenario 3 does, and
// waits for the seed's transient server state to expire.
// profSyncWindow is serve's --sync-window for runProfile (-profile-sync-window).
var profSyncWindow time.Duration

func runProfile(outDir string, msgs, size, workers, backlog int, durability string) error {
	dur, err := queue.ParseDurability(durability)
	if err != nil {
		return err
	}
	if err = os.MkdirAll(outDir, 0o755); err != nil {
		return err
	}
	// The sampling rate is set before anything is allocated: the heap
	// profile scales every sample by the rate in force when it is
	// written, so allocations sampled at the default rate (the
	// backlog's, the server's state) would count eight times too little.
	runtime.MemProfileRate = 64 << 10
	data, err := os.MkdirTemp("", "outflow-bench-profile-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(data)
	sk := newSink(freePort())
	if err := sk.Start(); err != nil {
		return err
	}
	defer sk.Stop()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	log := zerolog.New(os.Stderr).Level(zerolog.WarnLevel)
	emb, err := queue.StartEmbedded(queue.EmbeddedConfig{DataDir: data, Durability: dur, SyncWindow: profSyncWindow})
	if err != nil {
		return err
	}
	defer emb.Shutdown()
	ci := emb.InProcessInfo()
	q, err := queue.Connect(ctx, queue.Options{Name: "outflow-bench", InProcess: emb.Server(), User: ci.User, Password: ci.Password, Logger: log, Syncer: emb.Syncer()})
	if err != nil {
		return err
	}
	defer q.Close()
	if backlog > 0 {
		start := time.Now()
		if err := q.SeedDeferred(ctx, backlog, "backlog.example", time.Now().Add(7*24*time.Hour)); err != nil {
			return err
		}
		fmt.Printf("seeded %d deferred envelopes in %v; waiting %v for them to settle\n", backlog, time.Since(start).Round(time.Millisecond), backlogSettle)
		time.Sleep(backlogSettle)
	}
	reg := prometheus.NewRegistry()
	snd, err := sender.New(sender.Config{Hostname: "bench.localdomain", Relay: sk.addr, RelayTLS: sender.RelayTLS("none"), Logger: log})
	if err != nil {
		return err
	}
	defer snd.Close()
	pool, err := worker.New(worker.Config{WorkerID: "bench", Workers: workers, Queue: q, Sender: snd, Logger: log, Metrics: worker.NewMetrics(reg)})
	if err != nil {
		return err
	}
	// serve checks every recipient against the suppression list.
	supp, err := q.Suppressions(ctx)
	if err != nil {
		return err
	}
	smtpAddr := freePort()
	sub, err := submission.New(submission.Config{Addr: smtpAddr, Hostname: "bench.localdomain",
		TrustedNetworks: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, Suppressions: supp, Registerer: reg, Logger: log}, q)
	if err != nil {
		return err
	}
	ln, err := sub.Listen()
	if err != nil {
		return err
	}
	go func() { _ = pool.Run(ctx, 10*time.Second) }()
	go func() { _ = sub.Serve(ln) }()
	defer sub.Shutdown(context.Background())

	// Warm up (stream files, connections), then profile a measured run.
	if _, err := smtpSource(ctx, smtpAddr, 20, 500, size); err != nil {
		return err
	}
	if _, err := sk.WaitCount(500, 2*time.Minute); err != nil {
		return err
	}
	cpu, err := os.Create(filepath.Join(outDir, "cpu.pprof"))
	if err != nil {
		return err
	}
	if err := pprof.StartCPUProfile(cpu); err != nil {
		return err
	}
	start := time.Now()
	cpuStart := processCPU()
	opsStart := q.Ops()
	var syncStart [3]uint64
	if ss := emb.StoreSyncer(); ss != nil {
		syncStart[0], syncStart[1], syncStart[2] = ss.Stats()
	}
	base := sk.Count()
	if _, err := smtpSource(ctx, smtpAddr, 20, msgs, size); err != nil {
		return err
	}
	end, err := sk.WaitCount(base+int64(msgs), 10*time.Minute)
	pprof.StopCPUProfile()
	cpu.Close()
	if err != nil {
		return err
	}
	cpuUsed := processCPU() - cpuStart
	el := end.Sub(start)
	fmt.Printf("in-process pipeline (durability %s): %d messages of %d bytes in %v: %.0f msg/s\n", dur, msgs, size, el.Round(time.Millisecond), float64(msgs)/el.Seconds())
	fmt.Printf("CPU (user+system of this process, smtp-source and smtp-sink excluded): %.2f s, %.0f µs/msg\n", cpuUsed.Seconds(), float64(cpuUsed.Microseconds())/float64(msgs))
	printOps(q.Ops(), opsStart, msgs)
	if ss := emb.StoreSyncer(); ss != nil {
		b, w, f := ss.Stats()
		fmt.Printf("group commits: %.3f batches/msg, %.3f waiters/msg, %.3f fsyncs/msg\n",
			float64(b-syncStart[0])/float64(msgs), float64(w-syncStart[1])/float64(msgs), float64(f-syncStart[2])/float64(msgs))
	}
	// The heap once the last acknowledgements are in: what delivered mail
	// leaves behind (the SENT markers' and events' per-subject index), beside
	// the block caches the streams hold for a while.
	if err := waitAcked(ctx, q, 30*time.Second); err != nil {
		return err
	}
	runtime.GC()
	runtime.GC()
	for _, name := range []string{"heap", "allocs"} {
		if err := writeProfile(filepath.Join(outDir, name+".pprof"), name); err != nil {
			return err
		}
	}
	fmt.Printf("profiles: %s/cpu.pprof %s/allocs.pprof %s/heap.pprof (go tool pprof -top ...)\n", outDir, outDir, outDir)
	return nil
}

// processCPU is the user and system CPU time this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// printOps prints the JetStream operations made since before, per message,
// by kind.
func printOps(now, before map[string]uint64, msgs int) {
	names := make([]string, 0, len(now))
	for k := range now {
		names = append(names, k)
	}
	sort.Strings(names)
	var total float64
	fmt.Print("JetStream ops/msg:")
	for _, k := range names {
		n := float64(now[k]-before[k]) / float64(msgs)
		if n == 0 {
			continue
		}
		if k != "fetched" && k != "sync" && k != "local_get" && k != "wake" {
			total += n
		}
		fmt.Printf(" %s %.3f", k, n)
	}
	fmt.Printf("; total %.3f round trips (without fetched, sync, local_get and wake, a core NATS publish)\n", total)
}

// writeProfile writes the runtime profile name to path.
func writeProfile(path, name string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.Lookup(name).WriteTo(f, 0); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// waitAcked waits until no envelope is in the work stream any more: every
// delivered one has been acknowledged (and its body released).
func waitAcked(ctx context.Context, q *queue.Queue, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		n, err := q.Depth(ctx, queue.LaneWork)
		if err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d envelopes still unacknowledged after %v", n, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
