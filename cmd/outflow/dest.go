package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/outflow/outflow/internal/destname"
	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/throttle"
)

// adminBy names who made an admin change, for the shared state and logs.
func adminBy() string {
	h, _ := os.Hostname()
	u := os.Getenv("USER")
	if u == "" {
		u = "admin"
	}
	return "admin:" + u + "@" + h
}

func init() {
	a := &adminFlags{}
	dc := &cobra.Command{Use: "dest", Short: "destination throttle state: list, status, suspend, resume, rate, forget"}
	a.bind(dc)

	list := &cobra.Command{
		Use:   "list",
		Short: "destinations with shared throttle state (suspensions, rate factors, breakers, overrides)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.runState(cmd, func(ctx context.Context, q *queue.Queue, kv jetstream.KeyValue) error {
				states, err := throttle.ListStates(ctx, kv)
				if err != nil {
					return err
				}
				now := time.Now()
				return printList(cmd.OutOrStdout(), a.json, states, "DEST\tSUSPENDED UNTIL\tRATE FACTOR\tRATE OVERRIDE\tLEARNED\tBREAKER\tREASON\tUPDATED BY", func(s throttle.DestState) string {
					susp := "-"
					if s.Suspended(now) {
						susp = s.SuspendedUntil.UTC().Format(time.RFC3339)
					}
					over := "-"
					if ov, ok := s.RateOverrideAt(now); ok { // a cap whose end has passed is none
						over = fmt.Sprintf("%g/s", ov)
					}
					return fmt.Sprintf("%s\t%s\t%.2f\t%s\t%s\t%s\t%s\t%s", s.Dest, susp, s.RateFactor(), over, learnedShort(s), s.BreakerAt(now), dash(destReason(s, now)), dash(s.UpdatedBy))
				})
			})
		},
	}

	status := &cobra.Command{
		Use:   "status DEST",
		Short: "one destination as every running worker applies it: limits, effective rate, shares, breaker",
		Args:  destArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.runState(cmd, func(ctx context.Context, q *queue.Queue, kv jetstream.KeyValue) error {
				st, err := throttle.GetState(ctx, kv, args[0])
				if err != nil {
					return err
				}
				views, err := throttle.AskStatus(q, args[0], throttle.DefaultStatusWait)
				if err != nil {
					return err
				}
				// An envelope takes its source address at each attempt, so
				// a (destination, source) pair's waiting mail is the
				// destination's.
				base, source := throttle.SplitPair(args[0])
				// A count that could not be made says so: "0 waiting" in
				// the middle of an incident, from a list that timed out,
				// would send the operator the wrong way.
				deferred, derr := q.List(ctx, queue.Filter{State: queue.StateDeferred, Dest: base, Limit: waitingMax})
				throttled, terr := q.List(ctx, queue.Filter{State: queue.StateThrottled, Dest: base, Limit: waitingMax})
				// From one source, what is set on the whole destination
				// (and on the group a domain is in) holds too, on the
				// total from every source (throttle/own.go).
				var whole []throttle.DestState
				var wholeErr error
				if source != "" {
					whole, wholeErr = wholeStates(ctx, kv, base, groupOf(views, base))
				}
				if a.json {
					out := map[string]any{"dest": args[0], "state": st, "workers": views,
						"deferred": len(deferred), "throttled": len(throttled)}
					if source != "" {
						out["whole"] = whole
						if wholeErr != nil {
							out["whole"], out["whole_error"] = nil, wholeErr.Error()
						}
					}
					var errs []string
					if derr != nil {
						out["deferred"], errs = nil, append(errs, derr.Error())
					}
					if terr != nil {
						out["throttled"], errs = nil, append(errs, terr.Error())
					}
					if errs != nil {
						out["waiting_error"] = strings.Join(errs, "; ")
					}
					return printJSON(cmd.OutOrStdout(), out)
				}
				out := cmd.OutOrStdout()
				now := time.Now()
				fmt.Fprintf(out, "destination:   %s\n", args[0])
				if g := groupOf(views, base); g != "" {
					// Its own suspension, pin and connection limit (the
					// lines below) hold on top of the group's (the
					// workers' table): throttle/own.go.
					fmt.Fprintf(out, "group:         %s (%s's mail is also held to what is set on %s itself)\n", g, base, base)
				}
				if st.Suspended(now) {
					fmt.Fprintf(out, "suspended:     until %s (%s) by %s\n", st.SuspendedUntil.UTC().Format(time.RFC3339), dash(st.Reason), dash(st.UpdatedBy))
				} else {
					fmt.Fprintf(out, "suspended:     no\n")
				}
				for _, t := range st.TenantsSuspended(now) {
					// A rule's suspend fired by replies about one
					// tenant's own mail holds that tenant's part only.
					h, _ := st.TenantSuspended(t, now)
					fmt.Fprintf(out, "  tenant %s:  suspended until %s (%s); other tenants' mail goes on\n", t, h.Until.UTC().Format(time.RFC3339), dash(h.Reason))
				}
				fmt.Fprintf(out, "rate factor:   %.2f", st.RateFactor())
				if st.RateFactor() < 1 && st.FactorBy != "" {
					fmt.Fprintf(out, " (%s)", st.FactorBy)
				}
				if !st.FactorUntil.IsZero() {
					fmt.Fprintf(out, " (next ramp step not before %s)", st.FactorUntil.UTC().Format(time.RFC3339))
				}
				fmt.Fprintln(out)
				// Only a cap in force: one whose end has passed holds
				// nothing, and was shown as if it did.
				if ov, ok := st.RateOverrideAt(now); ok {
					until := "changed"
					if !st.RateUntil.IsZero() {
						until = st.RateUntil.UTC().Format(time.RFC3339)
					}
					fmt.Fprintf(out, "rate override: %g/s until %s%s\n", ov, until, byText(st.RateBy))
				}
				if ov, ok := st.ConnsOverrideAt(now); ok {
					until := "changed"
					if !st.ConnsUntil.IsZero() {
						until = st.ConnsUntil.UTC().Format(time.RFC3339)
					}
					fmt.Fprintf(out, "conns:         %d (override) until %s%s\n", ov, until, byText(st.ConnsBy))
				}
				if r, c := st.OwnLimits(now); source == "" && (r > 0 || c > 0) && hasSources(views) {
					// The workers send from egress addresses: each address
					// keeps its own limits (the per-source table), and the
					// override holds on their total.
					fmt.Fprintf(out, "all sources:   %s on the total from every source address, on top of each address's own limits\n", ownLimitsText(r, c))
				}
				if source != "" {
					if wholeErr != nil {
						fmt.Fprintf(out, "whole dest:    unknown (%s)\n", strings.Join(strings.Fields(wholeErr.Error()), " "))
					}
					for _, w := range whole {
						if r, c := w.OwnLimits(now); r > 0 || c > 0 {
							fmt.Fprintf(out, "whole dest:    %s: %s on the total from every source, on top of this address's own\n", w.Dest, ownLimitsText(r, c))
						}
					}
				}
				if st.LearnedRate > 0 || st.LearnedConns > 0 {
					fmt.Fprintf(out, "learned:       %s since %s\n", learnedShort(st), st.LearnedSince.UTC().Format(time.RFC3339))
					if st.LearnedReason != "" {
						fmt.Fprintf(out, "  rate:        %s\n", st.LearnedReason)
					}
					if st.LearnedPlateau > 0 {
						fmt.Fprintf(out, "  plateau:     %s\n", plateauLine(st, now))
					}
					if st.LearnedConnsReason != "" {
						fmt.Fprintf(out, "  conns:       %s\n", st.LearnedConnsReason)
					}
				} else {
					fmt.Fprintf(out, "learned:       nothing (no throttle has taught a limit)\n")
				}
				fmt.Fprintf(out, "breaker:       %s\n", st.BreakerAt(now))
				fmt.Fprintf(out, "waiting:       %s deferred, %s throttled", waitingCount(deferred, derr), waitingCount(throttled, terr))
				if source != "" {
					fmt.Fprintf(out, " (all of %s's mail, from any source: an envelope takes its source at each attempt)", base)
				}
				fmt.Fprintln(out)
				tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "WORKER\tGROUP\tCONFIGURED\tFLEET RATE\tFROM\tWORKER RATE\tLIVE\tCONNS\tIN FLIGHT\tBREAKER")
				for _, v := range views {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%d\t%s\n", v.Worker, v.Dest, rate(v.Limits.Rate), rate(v.FleetRate), dash(rateFrom(v.DestStatus, now)),
						rate(v.WorkerRate), v.LiveWorkers, conns(v.FleetConns), v.InFlight, v.Breaker)
				}
				if len(views) == 0 {
					fmt.Fprintln(tw, "(no running worker answered)")
				}
				if err := tw.Flush(); err != nil {
					return err
				}
				if n := unanswered(views); n > 0 {
					// A killed worker stays live in the registry until its
					// record expires (worker-ttl): its share of the rate
					// goes unused meanwhile, and its row is missing.
					fmt.Fprintf(out, "%d of the %d live workers did not answer (killed, stopped or slow): their rows are missing, and their shares of FLEET RATE are not being sent until their registry records expire\n",
						n, maxLive(views))
				}
				return printSources(out, sourcesByRule(views, now))
			})
		},
	}

	var forDur time.Duration
	var reason string
	suspend := &cobra.Command{
		Use:   "suspend DEST --for DUR",
		Short: "stop every worker from contacting DEST until the time is up (or dest resume)",
		Args:  destArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			if forDur < 0 {
				return usageError{fmt.Errorf("--for %s: must be positive (e.g. --for 30m)", forDur)}
			}
			if forDur == 0 {
				return usageError{errors.New("--for is required (e.g. --for 30m)")}
			}
			return a.runState(cmd, func(ctx context.Context, q *queue.Queue, kv jetstream.KeyValue) error {
				until := time.Now().Add(forDur)
				if err := throttle.Suspend(ctx, kv, args[0], until, reason, adminBy()); err != nil {
					return err
				}
				warnUnknownSource(cmd, q, args[0])
				return report(cmd, a.json, map[string]any{"dest": args[0], "suspended_until": until.UTC()},
					"%s: suspended until %s", args[0], until.UTC().Format(time.RFC3339))
			})
		},
	}
	suspend.Flags().DurationVar(&forDur, "for", 0, "how long (required; dest resume ends it sooner)")
	suspend.Flags().StringVar(&reason, "reason", "suspended by an operator", "why (shown in dest list and status)")

	resume := &cobra.Command{
		Use:   "resume DEST",
		Short: "end a suspension now; deferred mail for DEST is released at its rate, oldest first",
		Args:  destArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.runState(cmd, func(ctx context.Context, q *queue.Queue, kv jetstream.KeyValue) error {
				held, err := throttle.Resume(ctx, kv, args[0], adminBy())
				if err != nil {
					return err
				}
				msg := "%s: resumed"
				if !held {
					msg = "%s: was neither suspended nor held by its breaker; nothing to resume"
				}
				return report(cmd, a.json, map[string]any{"dest": args[0], "resumed": held}, msg, args[0])
			})
		},
	}

	var maxRate float64
	var rateFor time.Duration
	var clearRate bool
	rateCmd := &cobra.Command{
		Use:   "rate DEST --max R --for DUR | --clear",
		Short: "cap DEST at R messages per second across the fleet for a while, or --clear the cap",
		Args:  destArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			if clearRate {
				if cmd.Flags().Changed("max") || cmd.Flags().Changed("for") {
					return usageError{errors.New("--clear takes neither --max nor --for")}
				}
				return a.runState(cmd, func(ctx context.Context, q *queue.Queue, kv jetstream.KeyValue) error {
					before, err := throttle.GetState(ctx, kv, args[0])
					if err != nil {
						return err
					}
					if _, ok := before.RateOverrideAt(time.Now()); !ok {
						// Said as resume and forget say it: a cap
						// mistyped, cleared already or ended is not
						// "cleared".
						msg := "%s: had no rate cap; nothing to clear"
						if before.RateOverride > 0 {
							msg = "%s: had no rate cap in force (the last one ended at " + before.RateUntil.UTC().Format(time.RFC3339) + "); nothing to clear"
						}
						return report(cmd, a.json, map[string]any{"dest": args[0], "rate": 0, "cleared": false}, msg, args[0])
					}
					if err := throttle.SetRate(ctx, kv, args[0], 0, time.Time{}, adminBy()); err != nil {
						return err
					}
					return report(cmd, a.json, map[string]any{"dest": args[0], "rate": 0, "cleared": true},
						"%s: rate cap cleared (the configured or learned rate applies)", args[0])
				})
			}
			if maxRate <= 0 {
				return usageError{errors.New("--max must be > 0 messages per second (--clear removes a cap)")}
			}
			if rateFor < 0 {
				return usageError{errors.New("--for must be > 0 (without it the cap stands until changed)")}
			}
			return a.runState(cmd, func(ctx context.Context, q *queue.Queue, kv jetstream.KeyValue) error {
				var until time.Time
				if rateFor > 0 {
					until = time.Now().Add(rateFor)
				}
				if err := throttle.SetRate(ctx, kv, args[0], maxRate, until, adminBy()); err != nil {
					return err
				}
				warnUnknownSource(cmd, q, args[0])
				v := map[string]any{"dest": args[0], "rate": maxRate} // no "until": until changed
				when := "until changed"
				if !until.IsZero() {
					v["until"] = until.UTC()
					when = "until " + until.UTC().Format(time.RFC3339)
				}
				return report(cmd, a.json, v, "%s: at most %g/s %s", args[0], maxRate, when)
			})
		},
	}
	rateCmd.Flags().Float64Var(&maxRate, "max", 0, "messages per second for the whole fleet")
	rateCmd.Flags().DurationVar(&rateFor, "for", 0, "how long (default: until changed)")
	rateCmd.Flags().BoolVar(&clearRate, "clear", false, "remove the cap now: the configured or learned rate applies again")

	forget := &cobra.Command{
		Use:   "forget DEST",
		Short: "clear the rate and connection limit DEST has learned from throttles; its next throttle seeds them afresh",
		Args:  destArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.runState(cmd, func(ctx context.Context, q *queue.Queue, kv jetstream.KeyValue) error {
				had, err := throttle.Forget(ctx, kv, args[0], adminBy())
				if err != nil {
					return err
				}
				msg := "%s: learned limits cleared"
				if !had {
					msg = "%s: had learned nothing"
				}
				return report(cmd, a.json, map[string]any{"dest": args[0], "forgotten": had}, msg, args[0])
			})
		},
	}

	dc.AddCommand(list, status, suspend, resume, rateCmd, forget)
	rootCmd.AddCommand(dc)
}

// maxLive is the most live workers an answering worker counted.
func maxLive(views []throttle.WorkerStatus) int {
	n := 0
	for _, v := range views {
		n = max(n, v.LiveWorkers)
	}
	return n
}

// unanswered is how many of the live workers the answering ones count
// did not answer the status request.
func unanswered(views []throttle.WorkerStatus) int {
	answered := map[string]bool{}
	for _, v := range views {
		answered[v.Worker] = true
	}
	return max(0, maxLive(views)-len(answered))
}

// destReason is what `dest list` says a destination is held by at now:
// the suspension's reason, the tenants a rule suspended, and the
// automation rules that set the rate override, the connection override
// or the factor in force ("automation: NAME"); "" for none. Suspensions
// said their rule already, the others "-".
func destReason(s throttle.DestState, now time.Time) string {
	var parts []string
	add := func(p string) {
		if p != "" && !slices.Contains(parts, p) {
			parts = append(parts, p)
		}
	}
	if s.Suspended(now) {
		add(s.Reason)
	}
	if t := s.TenantsSuspended(now); len(t) > 0 {
		h, _ := s.TenantSuspended(t[0], now)
		add("tenant " + strings.Join(t, ", ") + " suspended (" + dash(h.Reason) + ")")
	}
	if _, ok := s.RateOverrideAt(now); ok {
		add(s.RateBy)
	}
	if _, ok := s.ConnsOverrideAt(now); ok {
		add(s.ConnsBy)
	}
	if s.RateFactor() < 1 {
		add(s.FactorBy)
	}
	return strings.Join(parts, "; ")
}

// byText is " (automation: NAME)" for an override a rule set (by), ""
// for an operator's.
func byText(by string) string {
	if by == "" {
		return ""
	}
	return " (" + by + ")"
}

// rateFrom is a worker's FROM column: its rate source, or for a pin that
// an automation rule set, "automation: NAME" (an operator's pin stays
// "pinned").
func rateFrom(v throttle.DestStatus, now time.Time) string {
	if v.RateSource == "pinned" && v.State.RateBy != "" {
		if _, ok := v.State.RateOverrideAt(now); ok {
			return v.State.RateBy
		}
	}
	return v.RateSource
}

// sourcesByRule are views with each per-source view's rate source as
// rateFrom says it, for the per-source table.
func sourcesByRule(views []throttle.WorkerStatus, now time.Time) []throttle.WorkerStatus {
	out := make([]throttle.WorkerStatus, len(views))
	for i, v := range views {
		out[i] = v
		out[i].Sources = make([]throttle.DestStatus, len(v.Sources))
		for j, s := range v.Sources {
			s.RateSource = rateFrom(s, now)
			out[i].Sources[j] = s
		}
	}
	return out
}

// destArg takes exactly one DEST: a recipient domain, a provider group,
// or DEST@SOURCE. The shared state accepts any name, so a typo such as
// "gmail.com,yahoo.com" or a name with a space would be suspended or
// rated without matching any mail; it is refused before NATS is reached.
func destArg(_ *cobra.Command, args []string) error {
	if len(args) != 1 {
		return usageError{fmt.Errorf("want one DEST (a domain, a provider group, or DEST@SOURCE), got %d arguments", len(args))}
	}
	if strings.TrimSpace(args[0]) == "" {
		return usageError{errors.New("empty DEST: want a domain, a provider group, or DEST@SOURCE")}
	}
	// As it is stored and listed ("Gmail.COM." is gmail.com, bücher.example
	// is xn--bcher-kva.example), so that what a command prints names the
	// destination it changed, and the one mail to it is queued under. The
	// console checks the destinations in its URLs with the same function.
	d, err := destname.Check(args[0])
	if err != nil {
		return usageError{fmt.Errorf("DEST %w", err)}
	}
	args[0] = d
	return nil
}

// runState is a.run with the shared destination state bucket opened.
func (a *adminFlags) runState(cmd *cobra.Command, fn func(ctx context.Context, q *queue.Queue, kv jetstream.KeyValue) error) error {
	return runWith(a, cmd, func(ctx context.Context, q *queue.Queue) (jetstream.KeyValue, error) {
		return throttle.OpenState(ctx, q)
	}, fn)
}

// groupOf is the provider group the workers that answered put domain in
// (their view's destination), or "" when it is its own destination.
func groupOf(views []throttle.WorkerStatus, domain string) string {
	for _, v := range views {
		if g, _ := throttle.SplitPair(v.Dest); g != "" && g != domain {
			return g
		}
	}
	return ""
}

// wholeStates are the states of what holds above the pair base@SOURCE on
// the total from every source: the destination base itself, and the
// provider group it is in (group; "" for none).
func wholeStates(ctx context.Context, kv jetstream.KeyValue, base, group string) ([]throttle.DestState, error) {
	names := []string{base}
	if group != "" {
		names = append(names, group)
	}
	var out []throttle.DestState
	for _, n := range names {
		s, err := throttle.GetState(ctx, kv, n)
		if err != nil {
			return nil, err
		}
		s.Dest = n
		out = append(out, s)
	}
	return out, nil
}

// warnUnknownSource says on stderr when name is DEST@SOURCE and none of
// the running workers that answer sends from SOURCE: the state is written
// (a worker started later may have the address), but as things stand it
// matches no mail, and a mistyped address leaves the blocked one sending
// (runbook section 11). Nothing is said when no worker answers.
func warnUnknownSource(cmd *cobra.Command, q *queue.Queue, name string) {
	base, source := throttle.SplitPair(name)
	if source == "" {
		return
	}
	views, err := throttle.AskStatus(q, base, throttle.DefaultStatusWait)
	if err != nil || len(views) == 0 {
		return
	}
	if known, ok := unknownSource(views, source); !ok {
		have := "no [[egress]] addresses"
		if len(known) > 0 {
			have = "only " + strings.Join(known, ", ")
		}
		fmt.Fprintf(cmd.ErrOrStderr(), "warning: no running worker sends from %s (they have %s): %s matches no mail unless a worker with that address starts\n", source, have, name)
	}
}

// unknownSource reports the source addresses the workers of views send
// from, sorted, and whether source is one of them.
func unknownSource(views []throttle.WorkerStatus, source string) ([]string, bool) {
	seen := map[string]bool{}
	for _, v := range views {
		for _, s := range v.Sources {
			if _, src := throttle.SplitPair(s.Dest); src != "" {
				seen[src] = true
			}
		}
	}
	known := make([]string, 0, len(seen))
	for s := range seen {
		known = append(known, s)
	}
	slices.Sort(known)
	return known, seen[source]
}

// hasSources reports whether a worker that answered sends from egress
// addresses (it listed the destination per source).
func hasSources(views []throttle.WorkerStatus) bool {
	for _, v := range views {
		if len(v.Sources) > 0 {
			return true
		}
	}
	return false
}

// ownLimitsText is a pin and a connection limit set on a destination
// (DestState.OwnLimits: msgs/s, connections; 0 = none) in a few words:
// "at most 5/s and 2 connections".
func ownLimitsText(r float64, c int) string {
	var parts []string
	if r > 0 {
		parts = append(parts, rate(r))
	}
	switch {
	case c == 1:
		parts = append(parts, "1 connection")
	case c > 1:
		parts = append(parts, fmt.Sprintf("%d connections", c))
	}
	return "at most " + strings.Join(parts, " and ")
}

// learnedShort is a state's learned limits in a few words ("12.5/s, 4 conns").
func learnedShort(s throttle.DestState) string {
	var parts []string
	if s.LearnedRate > 0 {
		parts = append(parts, fmt.Sprintf("%.2f/s", s.LearnedRate))
	}
	if s.LearnedConns > 0 {
		parts = append(parts, fmt.Sprintf("%d conns", s.LearnedConns))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}

// rate prints a fleet or worker rate for a table: a learned rate, or a
// share of one, to two decimals (a learned 4.134160073737176/s is 4.13/s),
// a configured one as written (20/s, 0.5/s).
func rate(r float64) string {
	if r <= 0 {
		return "unlimited"
	}
	if r >= 0.01 {
		return strconv.FormatFloat(math.Round(r*100)/100, 'f', -1, 64) + "/s"
	}
	return fmt.Sprintf("%.2g/s", r)
}

func conns(n int) string {
	if n <= 0 {
		return "unlimited"
	}
	return fmt.Sprint(n)
}

// plateauLine describes where a learned rate's steps stop after a cut
// (throttle/learn.go): the rate, and when the next probe over it may come.
func plateauLine(s throttle.DestState, now time.Time) string {
	line := fmt.Sprintf("%.2f/s, under the rate the last throttle answered", s.LearnedPlateau)
	switch {
	case s.LearnedProbeAt.IsZero():
		line += "; the steps climb to it"
	case now.Before(s.LearnedProbeAt):
		line += "; next probe over it not before " + s.LearnedProbeAt.UTC().Format(time.RFC3339)
	default:
		line += "; probing over it"
	}
	if s.LearnedProbes > 0 {
		line += fmt.Sprintf(" (%d probe(s) over it met a throttle)", s.LearnedProbes)
	}
	return line
}

// waitingMax is how many waiting envelopes of a destination `dest status`
// counts; past it the count says "at least".
const waitingMax = 100000

// waitingCount is a count of at most waitingMax envelopes, as a reader
// should take it, or what kept it from being made.
func waitingCount[T any](list []T, err error) string {
	if err != nil {
		return "unknown (" + strings.Join(strings.Fields(err.Error()), " ") + ")"
	}
	if len(list) >= waitingMax {
		return fmt.Sprintf("at least %d", len(list))
	}
	return strconv.Itoa(len(list))
}
