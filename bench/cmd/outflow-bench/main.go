// Command outflow-bench runs outflow's benchmark suite against Postfix on
// the same machine: each scenario alternates an outflow run and a Postfix
// run, repeats, and prints medians and the outflow/Postfix ratio. Traffic is
// loopback only. See docs/benchmarks.md for what each scenario measures;
// bench/run.sh is the entry point `make bench` uses.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/outflow/outflow/internal/gcpolicy"
	"github.com/outflow/outflow/queue"
)

type config struct {
	outflow   string
	quick     bool
	runs      int
	scenarios map[string]bool
	results   string
	// rates for scenario 2 when scenario 1 is not part of the run
	rateOutflow, ratePostfix float64
	// noAnchor skips scenario 6's Postfix anchor (30 minutes).
	noAnchor bool
	// learnParts are the parts of scenario 6 to run ("1,2,3,4": 6.1 and
	// 6.2 share one table).
	learnParts string
	// learnTrace, when set, is a directory for scenario 6's traces: each
	// daemon's debug log and each 6.1/6.2 run's arrivals and throttles.
	learnTrace string
	// learnLimit is the provider's limit in 6.1 and 6.2 (msgs/s),
	// learnBurst its bucket (0: a fifth of the limit, at least 1), and
	// learnSecs how many seconds of it their messages are.
	learnLimit float64
	learnBurst float64
	learnSecs  float64
	// hookOthers is how many endpoints of other tenants scenario 7
	// registers beside the measured tenant's whenever webhooks are on.
	hookOthers int
}

func main() {
	var c config
	var scen string
	var profDir string
	var profMsgs, profSize, profWorkers, profBacklog int
	var profDurability string
	var profGCPercent int
	var profGCMinHeap int64
	flag.StringVar(&c.outflow, "outflow", "bin/outflow", "outflow binary")
	flag.BoolVar(&c.quick, "quick", os.Getenv("BENCH_QUICK") == "1", "quick mode: fewer messages and runs (BENCH_QUICK=1)")
	flag.IntVar(&c.runs, "runs", 0, "alternating runs per scenario (default 3, quick 1)")
	flag.StringVar(&scen, "scenarios", "1,2,3,4,5,6,7", "comma-separated scenarios to run")
	flag.StringVar(&c.results, "results", "", "also write the result tables (markdown) to this file")
	flag.Float64Var(&c.rateOutflow, "max-rate-outflow", 0, "scenario 2 without scenario 1: outflow's maximum rate (msg/s)")
	flag.Float64Var(&c.ratePostfix, "max-rate-postfix", 0, "scenario 2 without scenario 1: Postfix's maximum rate (msg/s)")
	flag.BoolVar(&c.noAnchor, "no-anchor", os.Getenv("BENCH_NO_ANCHOR") == "1", "scenario 6 without its Postfix anchor, which takes 30 minutes (BENCH_NO_ANCHOR=1)")
	flag.IntVar(&c.hookOthers, "hook-others", 0, "scenario 7: with webhooks on, also register this many endpoints of other tenants, which get none of the mail's events")
	flag.StringVar(&c.learnParts, "learn-parts", "1,2,3,4", "parts of scenario 6 to run (6.1 and 6.2 drain, 6.3 halving, 6.4 tenants)")
	flag.Float64Var(&c.learnLimit, "learn-limit", learnLimit, "scenario 6.1 and 6.2 (and their Postfix anchor): the provider's limit in msg/s (burst a fifth of it, at least 1); the messages are -learn-secs of it, at least 60 (6.3 and 6.4 keep 20)")
	flag.Float64Var(&c.learnBurst, "learn-burst", 0, "scenario 6.1 and 6.2: the provider's bucket in messages (0: a fifth of -learn-limit, at least 1); a larger one is a limit per minute or per hour")
	flag.Float64Var(&c.learnSecs, "learn-secs", 30, "scenario 6.1 and 6.2: the messages are this many seconds of the provider's limit (at least 60 messages); longer runs show the steady state after first contact")
	flag.StringVar(&c.learnTrace, "learn-trace", "", "scenario 6: write each daemon's debug log and each 6.1/6.2 run's arrivals and throttles per half second to this directory")
	flag.StringVar(&profDir, "profile", "", "instead of the suite: profile scenario 1 in-process and write cpu.pprof, allocs.pprof and heap.pprof here")
	flag.IntVar(&profMsgs, "profile-msgs", 20000, "messages for -profile")
	flag.IntVar(&profSize, "profile-size", 2048, "message size for -profile")
	flag.IntVar(&profWorkers, "profile-workers", 32, "delivery workers for -profile (serve's default)")
	flag.StringVar(&profDurability, "profile-durability", "disk", "for -profile: --durability of the pipeline (disk, serve's default, or none)")
	flag.IntVar(&profBacklog, "profile-backlog", 0, "for -profile: first defer this many envelopes (due in 7 days) and let them settle, as in scenario 3")
	flag.DurationVar(&profSyncWindow, "profile-sync-window", queue.DefaultSyncWindow, "for -profile: serve's --sync-window (durability disk)")
	flag.IntVar(&profGCPercent, "profile-gc-percent", gcpolicy.DefaultPercent, "for -profile: serve's --gc-percent (GOGC in the environment wins)")
	flag.Int64Var(&profGCMinHeap, "profile-gc-min-heap", gcpolicy.DefaultMinHeap, "for -profile: serve's --gc-min-heap (0: none)")
	flag.Parse()
	if profDir != "" {
		gcpolicy.Apply(profGCPercent, profGCMinHeap)
		if err := runProfile(profDir, profMsgs, profSize, profWorkers, profBacklog, profDurability); err != nil {
			fmt.Fprintln(os.Stderr, "outflow-bench:", err)
			os.Exit(1)
		}
		return
	}
	if c.runs <= 0 {
		c.runs = 3
		if c.quick {
			c.runs = 1
		}
	}
	c.scenarios = map[string]bool{}
	for _, s := range strings.Split(scen, ",") {
		c.scenarios[strings.TrimSpace(s)] = true
	}
	if err := runSuite(&c); err != nil {
		fmt.Fprintln(os.Stderr, "outflow-bench:", err)
		os.Exit(1)
	}
}

// burst is scenario 6.1 and 6.2's bucket, as ratedmx fills it in.
func (c *config) burst() float64 {
	if c.learnBurst > 0 {
		return c.learnBurst
	}
	return max(1, c.learnLimit/5)
}
