package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/outflow/outflow/backoff"
	"github.com/outflow/outflow/internal/plot"
	"github.com/outflow/outflow/webhook"
)

func init() { rootCmd.AddCommand(newScheduleCmd()) }

// maxScheduleDecisions bounds --runs × --attempts: every decision is kept
// in memory (about 130 bytes) to compute the spread, so this is about 650 MB
// at most, far more than a plot or a preview needs.
const maxScheduleDecisions = 5_000_000

// scheduleOpts holds the flags of `outflow schedule`.
type scheduleOpts struct {
	lane       string
	base       time.Duration
	min        time.Duration
	cap        time.Duration
	multiplier float64
	window     time.Duration
	hint       time.Duration
	attempts   int
	worker     string
	seed       string
	runs       int
	json       bool
	plot       string
}

// scheduleLine is one attempt of one run in --json output. jitter_seed is a
// decimal string, as in the daemon's decision record.
type scheduleLine struct {
	Run        int    `json:"run"`
	Attempt    int    `json:"attempt"`
	NominalMs  int64  `json:"nominal_ms"`
	CapMs      int64  `json:"cap_ms"`
	JitterSeed string `json:"jitter_seed"`
	JitterMs   int64  `json:"jitter_ms"`
	OffsetMs   int64  `json:"offset_ms"`
	DelayMs    int64  `json:"delay_ms"`
	AtMs       int64  `json:"at_ms"`
}

// newScheduleCmd builds the schedule command. It is a constructor rather
// than a package variable so that tests get fresh flag values on each run.
func newScheduleCmd() *cobra.Command {
	var o scheduleOpts
	c := &cobra.Command{
		Use:   "schedule",
		Short: "print the retry timeline a backoff policy produces",
		Long: `schedule is the retry calculator. It computes, with the daemon's own code,
the delays of attempts 1..N (attempt 1 is the first retry after the first
failure) for a worker id and a jitter seed, so that it can:

  - replay a logged decision: take jitter_seed, worker_id and backoff_attempt
    from a "backoff decision" log line, pass them as --seed, --worker and
    --attempts with the lane parameters (base_ms, min_ms, cap_ms, multiplier,
    window_ms, hint_ms are in the same line), and the last line printed has
    the logged delay_ms;
  - show what a policy does before it is deployed: --runs R prints R
    independent timelines (seeds S, S+1, ...) and --plot FILE.svg draws the
    spread of retry times per attempt over those R runs.

A "webhook deferred" line replays the same way with --lane webhook (the
webhook retry schedule's defaults): its jitter_seed, worker_id and
backoff_attempt (the POST's attempt number) as --seed, --worker and
--attempts, its hint_ms as --hint.

Parameters not given take the lane's defaults (--lane retry, ratelimit or
webhook). Without --seed a random seed is drawn and printed.`,
		Example: `  outflow schedule --attempts 8 --worker host-a/3 --seed 42
  outflow schedule --lane ratelimit --attempts 5 --seed 0x2a --json
  outflow schedule --lane webhook --attempts 3 --worker host-a --seed 42 --hint 1s
  outflow schedule --runs 1000 --attempts 10 --plot retry.svg`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runSchedule(cmd, &o) },
	}
	f := c.Flags()
	f.StringVar(&o.lane, "lane", backoff.LaneRetry, "lane whose defaults fill the parameters not given: retry, ratelimit or webhook")
	f.DurationVar(&o.base, "base", 0, "nominal delay of attempt 0; attempt n's is base*multiplier^n (default: the lane's, 5s retry, 30s ratelimit, 2s webhook)")
	f.DurationVar(&o.min, "min", 0, "floor of the jittered delay (default: the lane's, 1s retry, 15s ratelimit)")
	f.DurationVar(&o.cap, "cap", 0, "ceiling of the jitter range and of the jittered delay (default: the lane's, 15m retry, 30m ratelimit, 5m webhook)")
	f.Float64Var(&o.multiplier, "multiplier", 0, "growth factor per attempt (default: the lane's, 2)")
	f.DurationVar(&o.window, "window", 0, "contention window the per-worker offset is spread over (default: the lane's, 2s retry, 30s ratelimit, 2s webhook)")
	f.DurationVar(&o.hint, "hint", 0, "server retry hint applied to every attempt; wins when longer than the computed delay")
	f.IntVar(&o.attempts, "attempts", 10, "number of retries to compute (1..N)")
	f.StringVar(&o.worker, "worker", "", "worker id whose contention offset is added (as in the log's worker_id)")
	f.StringVar(&o.seed, "seed", "", "jitter seed, decimal or 0x hex, as in the log's jitter_seed (default: random, printed)")
	f.IntVar(&o.runs, "runs", 1, "number of independent timelines, with seeds S, S+1, ...")
	f.BoolVar(&o.json, "json", false, "print one JSON object per attempt instead of a table")
	f.StringVar(&o.plot, "plot", "", "write an SVG of the spread of retry times per attempt over the runs to this file")
	return c
}

// policy resolves the lane defaults and the flags given into a validated
// Backoff.
func (o *scheduleOpts) policy(cmd *cobra.Command) (backoff.Backoff, error) {
	b, err := scheduleLane(o.lane)
	if err != nil {
		return b, err
	}
	set := cmd.Flags().Changed
	if set("base") {
		b.Base = o.base
	}
	if set("min") {
		b.Min = o.min
	}
	if set("cap") {
		b.Cap = o.cap
	}
	if set("multiplier") {
		b.Multiplier = o.multiplier
	}
	if set("window") {
		b.ContentionWindow = o.window
	}
	return b, b.Validate()
}

// scheduleLane is the default backoff of lane: mail's retry and
// ratelimit lanes, or webhook, the schedule of webhook retries
// (webhook.DefaultBackoff, what the daemon's dispatcher uses).
func scheduleLane(lane string) (backoff.Backoff, error) {
	if lane == webhook.DefaultBackoff().Lane {
		return webhook.DefaultBackoff(), nil
	}
	b, err := backoff.ForLane(lane)
	if err != nil {
		return b, fmt.Errorf("unknown lane %q (want %q, %q or %q)", lane, backoff.LaneRetry, backoff.LaneRateLimit, webhook.DefaultBackoff().Lane)
	}
	return b, nil
}

// timeline is one run: its seed and a decision per attempt.
type timeline struct {
	run       int
	seed      uint64
	decisions []backoff.Decision
}

func runSchedule(cmd *cobra.Command, o *scheduleOpts) error {
	b, err := o.policy(cmd)
	if err != nil {
		return usageError{err}
	}
	if o.attempts < 1 {
		return usageError{fmt.Errorf("--attempts %d: must be >= 1", o.attempts)}
	}
	if o.runs < 1 {
		return usageError{fmt.Errorf("--runs %d: must be >= 1", o.runs)}
	}
	if int64(o.runs)*int64(o.attempts) > maxScheduleDecisions {
		return usageError{fmt.Errorf("--runs %d × --attempts %d: at most %d decisions", o.runs, o.attempts, maxScheduleDecisions)}
	}
	if o.hint < 0 {
		return usageError{fmt.Errorf("--hint %v: must be >= 0", o.hint)}
	}
	seed := backoff.NewSeed()
	if o.seed != "" {
		if seed, err = backoff.ParseSeed(o.seed); err != nil {
			return usageError{err}
		}
	}

	runs := make([]timeline, o.runs)
	for r := range runs {
		s := seed + uint64(r) // wraps at 2^64, deliberately
		runs[r] = timeline{run: r, seed: s, decisions: make([]backoff.Decision, o.attempts)}
		for a := 1; a <= o.attempts; a++ {
			runs[r].decisions[a-1] = b.Decide(a, o.worker, s, o.hint)
		}
	}

	out := cmd.OutOrStdout()
	if o.plot != "" {
		if err := writePlotFile(o.plot, b, o, runs); err != nil {
			return err
		}
	}
	switch {
	case o.json:
		return printScheduleJSON(out, runs)
	case o.plot != "":
		printSpread(out, b, o, runs)
		fmt.Fprintf(out, "wrote %s\n", o.plot)
		return nil
	}
	printTimelines(out, b, o, runs)
	return nil
}

func printScheduleJSON(w io.Writer, runs []timeline) error {
	enc := json.NewEncoder(w)
	for _, t := range runs {
		var at int64
		for _, d := range t.decisions {
			at += d.DelayMs
			if err := enc.Encode(scheduleLine{
				Run:        t.run,
				Attempt:    d.Attempt,
				NominalMs:  d.NominalMs,
				CapMs:      d.CapMs,
				JitterSeed: strconv.FormatUint(d.JitterSeed, 10),
				JitterMs:   d.JitterMs,
				OffsetMs:   d.OffsetMs,
				DelayMs:    d.DelayMs,
				AtMs:       at,
			}); err != nil {
				return err
			}
		}
	}
	return nil
}

// policyLine describes the parameters in one line, for the headers of the
// human output and of the plot.
func policyLine(b backoff.Backoff, o *scheduleOpts) string {
	s := fmt.Sprintf("lane %s  base %v  min %v  cap %v  multiplier %g  window %v  worker %q (offset %v)",
		b.Lane, b.Base, b.Min, b.Cap, b.Multiplier, b.ContentionWindow, o.worker,
		backoff.Offset(o.worker, b.ContentionWindow))
	if o.hint > 0 {
		s += fmt.Sprintf("  hint %v", o.hint)
	}
	return s
}

func printTimelines(w io.Writer, b backoff.Backoff, o *scheduleOpts, runs []timeline) {
	fmt.Fprintln(w, policyLine(b, o))
	totals := make([]int64, len(runs))
	for i, t := range runs {
		fmt.Fprintf(w, "\nrun %d  seed %d (%#x)\n", t.run, t.seed, t.seed)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "attempt\tnominal\tcap\tjitter\toffset\tdelay\tat\t")
		var at int64
		for _, d := range t.decisions {
			at += d.DelayMs
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t\n", d.Attempt, fmtMs(d.NominalMs), fmtMs(d.CapMs),
				fmtMs(d.JitterMs), fmtMs(d.OffsetMs), fmtMs(d.DelayMs), fmtMs(at))
		}
		tw.Flush()
		totals[i] = at
		fmt.Fprintf(w, "total window %s over %d attempts\n", fmtMs(at), len(t.decisions))
	}
	if len(runs) > 1 {
		slices.Sort(totals)
		fmt.Fprintf(w, "\ntotal window over %d runs: min %s  median %s  max %s\n", len(runs),
			fmtMs(totals[0]), fmtMs(quantile(totals, 0.5)), fmtMs(totals[len(totals)-1]))
	}
}

// printSpread prints, per attempt, the spread of the time the attempt
// happens (since the first failure) over all runs: the table form of the
// plot.
func printSpread(w io.Writer, b backoff.Backoff, o *scheduleOpts, runs []timeline) {
	fmt.Fprintln(w, policyLine(b, o))
	fmt.Fprintf(w, "%d runs, seeds %d..%d\n", len(runs), runs[0].seed, runs[len(runs)-1].seed)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "attempt\tmin\tp5\tp50\tp95\tmax\t")
	for a, at := range attemptTimes(runs) {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t\n", a+1, fmtMs(at[0]), fmtMs(quantile(at, 0.05)),
			fmtMs(quantile(at, 0.5)), fmtMs(quantile(at, 0.95)), fmtMs(at[len(at)-1]))
	}
	tw.Flush()
}

// attemptTimes returns, for each attempt, the sorted cumulative times (ms
// since the first failure) at which it happens across the runs.
func attemptTimes(runs []timeline) [][]int64 {
	n := len(runs[0].decisions)
	out := make([][]int64, n)
	for a := range out {
		out[a] = make([]int64, 0, len(runs))
	}
	for _, t := range runs {
		var at int64
		for a, d := range t.decisions {
			at += d.DelayMs
			out[a] = append(out[a], at)
		}
	}
	for _, s := range out {
		slices.Sort(s)
	}
	return out
}

// quantile returns the q-quantile of sorted (nearest rank), as the plot
// computes it.
func quantile(sorted []int64, q float64) int64 { return plot.Quantile(sorted, q) }

// fmtMs formats whole milliseconds as a Go duration, and as ">292y" past
// what a time.Duration can hold (a nominal delay of a very late attempt).
func fmtMs(ms int64) string {
	if ms > math.MaxInt64/int64(time.Millisecond) {
		return ">292y"
	}
	return (time.Duration(ms) * time.Millisecond).String()
}

func writePlotFile(path string, b backoff.Backoff, o *scheduleOpts, runs []timeline) (err error) {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	defer func() { err = errors.Join(err, f.Close()) }()
	heading := fmt.Sprintf("Retry times per attempt, %d runs (time since the first failure, log scale)", len(runs))
	if err := plot.Retries(f, heading, policyLine(b, o), attemptTimes(runs)); err != nil {
		return fmt.Errorf("plot %s: %w", path, err)
	}
	return nil
}
