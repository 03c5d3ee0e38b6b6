package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/outflow/outflow/backoff"
	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/throttle"
)

// adminFlags are shared by every verb that reaches a running daemon.
type adminFlags struct {
	data    string
	natsURL string
	creds   string
	json    bool
	timeout time.Duration
}

func (a *adminFlags) bind(cmd *cobra.Command) {
	f := cmd.PersistentFlags()
	f.StringVar(&a.data, "data", "./data", "data dir of the running outflow serve (its NATS address and credentials)")
	f.StringVar(&a.natsURL, "nats-url", "", "NATS server or cluster to reach instead of the one recorded in --data")
	f.StringVar(&a.creds, "nats-creds", "", "NATS credentials file for --nats-url")
	f.BoolVar(&a.json, "json", false, "print JSON instead of a table or a sentence (a list: one object a line)")
	f.DurationVar(&a.timeout, "timeout", 15*time.Second, "give up on the daemon after this long")
}

// connect reaches the daemon's NATS: --nats-url, or the address serve wrote
// into --data.
func (a *adminFlags) connect(ctx context.Context) (*queue.Queue, error) {
	// RemoteSync: a submission or replay is on the daemon's disk before
	// the command reports it (--durability disk).
	opts := queue.Options{Name: "outflow admin", NoSetup: true, RemoteSync: true, Logger: zerolog.Nop()}
	if a.natsURL != "" {
		opts.URL, opts.CredsFile = a.natsURL, a.creds
	} else {
		ci, err := queue.ReadClientInfo(a.data)
		if err != nil {
			return nil, err
		}
		if ci.URL == "" {
			return nil, fmt.Errorf("the daemon using %s has no client listener (started with --nats-addr \"\"); restart it with --nats-addr or pass --nats-url", a.data)
		}
		opts.URL, opts.User, opts.Password = ci.URL, ci.User, ci.Password
	}
	q, err := queue.Connect(ctx, opts)
	if err != nil && errors.Is(err, context.DeadlineExceeded) {
		return nil, fmt.Errorf("the outflow daemon's NATS did not answer within --timeout %v: %w (a cluster that lost a node answers once it has elected new leaders: try again, or raise --timeout)", a.timeout, err)
	}
	if err != nil {
		return nil, fmt.Errorf("cannot reach the outflow daemon: %w", err)
	}
	return q, nil
}

// run connects, runs fn with a deadline, and closes.
func (a *adminFlags) run(cmd *cobra.Command, fn func(ctx context.Context, q *queue.Queue) error) error {
	if a.timeout <= 0 {
		return usageError{fmt.Errorf("--timeout %v: want a positive duration (e.g. 15s)", a.timeout)}
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), a.timeout)
	defer cancel()
	q, err := a.connect(ctx)
	if err != nil {
		return err
	}
	defer q.Close()
	return fn(ctx, q)
}

// runWith is a.run with something opened from the queue first (a KV
// bucket, a store), handed to fn beside the queue.
func runWith[T any](a *adminFlags, cmd *cobra.Command, open func(context.Context, *queue.Queue) (T, error),
	fn func(ctx context.Context, q *queue.Queue, v T) error) error {
	return a.run(cmd, func(ctx context.Context, q *queue.Queue) error {
		v, err := open(ctx, q)
		if err != nil {
			return err
		}
		return fn(ctx, q, v)
	})
}

// printList prints rows as one JSON object a line with --json, else as a
// table: header, then line's tab-separated columns for each row.
func printList[T any](out io.Writer, asJSON bool, rows []T, header string, line func(T) string) error {
	if asJSON {
		for _, r := range rows {
			if err := printJSON(out, r); err != nil {
				return err
			}
		}
		return nil
	}
	tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, header)
	for _, r := range rows {
		fmt.Fprintln(tw, line(r))
	}
	return tw.Flush()
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

func init() {
	a := &adminFlags{}
	qc := &cobra.Command{Use: "queue", Short: "inspect and operate on queued, deferred, throttled, unknown (held) and dead messages"}
	a.bind(qc)

	var f queue.Filter
	var state string
	var idsOnly bool
	list := &cobra.Command{
		Use:   "list",
		Short: "list messages: id, tenant, destination, attempt, last class and reply, next attempt",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f.State = queue.State(state)
			if state != "" && !slices.Contains(queue.States, f.State) {
				return usageError{fmt.Errorf("--state %q: want queued, deferred, throttled, unknown or dead", state)}
			}
			if f.Limit < 0 {
				return usageError{fmt.Errorf("--limit %d: want 0 (all) or more", f.Limit)}
			}
			if f.Limit == 0 {
				f.Limit = -1 // --limit 0: all
			}
			return a.run(cmd, func(ctx context.Context, q *queue.Queue) error {
				items, err := q.List(ctx, f)
				if err != nil {
					return err
				}
				if f.Limit > 0 && len(items) == f.Limit {
					// A count (| wc -l) would otherwise read the limit as
					// the total.
					defer fmt.Fprintf(cmd.ErrOrStderr(), "outflow: the first %d listed; there may be more (--limit 0 lists all)\n", f.Limit)
				}
				out := cmd.OutOrStdout()
				if idsOnly {
					for _, it := range items {
						fmt.Fprintln(out, it.Env.ID)
					}
					return nil
				}
				rows := make([]row, len(items))
				for i, it := range items {
					rows[i] = listRow(it)
				}
				return printList(out, a.json, rows, "ID\tSTATE\tTENANT\tDEST\tRCPTS\tATTEMPT\tLAST CLASS\tNEXT ATTEMPT\tLAST REPLY", func(r row) string {
					return fmt.Sprintf("%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s", r.ID, r.State, r.Tenant, r.Dest, r.Rcpts, r.attempts(),
						dash(r.LastClass), dash(r.Next), dash(short(r.LastReply, 60)))
				})
			})
		},
	}
	list.Flags().StringVar(&state, "state", "", "queued, deferred, throttled, unknown or dead (default all)")
	list.Flags().StringVar(&f.Dest, "dest", "", "only this destination domain")
	list.Flags().StringVar(&f.Tenant, "tenant", "", "only this tenant")
	list.Flags().StringVar(&f.Rcpt, "rcpt", "", "only the messages to this recipient, in any case (queue find has those that left)")
	list.Flags().IntVar(&f.Limit, "limit", 100, "at most this many; 0 for all (a script that drops or replays everything)")
	list.Flags().BoolVarP(&idsOnly, "quiet", "q", false, "print only the ids, one per line (for scripts)")

	inspect := &cobra.Command{
		Use:   "inspect ID",
		Short: "show one message: envelope, recipients, headers, attempt metadata and where it is",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.run(cmd, func(ctx context.Context, q *queue.Queue) error {
				it, err := q.Find(ctx, args[0])
				if err != nil {
					return err
				}
				in := inspectMessage(ctx, q, it)
				// As the other verbs: lines for a person, one JSON
				// object with --json for a script.
				if a.json {
					return printJSON(cmd.OutOrStdout(), in.view())
				}
				return in.writeText(cmd.OutOrStdout())
			})
		},
	}

	var since time.Duration
	var histTenant string
	history := &cobra.Command{
		Use:   "history ID",
		Short: "every attempt of a message with its decision record, oldest first",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if since < 0 {
				return usageError{fmt.Errorf("--since %v: want a positive duration", since)}
			}
			return a.run(cmd, func(ctx context.Context, q *queue.Queue) error {
				var from time.Time
				if since > 0 {
					from = time.Now().Add(-since)
				}
				// A message still in a lane names its tenant: only that
				// tenant's events are read then.
				tenant := histTenant
				if it, err := q.Find(ctx, args[0]); tenant == "" && err == nil {
					tenant = it.Env.Tenant
				}
				var evs []queue.Event
				var err error
				if tenant != "" {
					evs, err = q.TenantHistory(ctx, tenant, args[0], from)
				} else {
					evs, err = q.History(ctx, args[0], from)
				}
				if err != nil {
					return err
				}
				return printList(cmd.OutOrStdout(), a.json, evs, "TIME\tEVENT\tATTEMPT\tWORKER\tCLASS\tRULE\tDELAY\tSEED\tOFFSET\tREPLY", historyLine)
			})
		},
	}
	history.Flags().DurationVar(&since, "since", 0, "only events stored in this last stretch of time, e.g. 6h (default all the events stream keeps; a shorter look-up is faster on a busy stream)")
	history.Flags().StringVar(&histTenant, "tenant", "", "the message's tenant: only its events are read, much faster with many tenants (a message of another tenant is not found; default: the tenant of the message when it still waits in a lane)")

	var find queue.EventQuery
	var findSince time.Duration
	var findTypes []string
	findCmd := &cobra.Command{
		Use:   "find ADDRESS",
		Short: "what became of mail to an address: the events that name it (delivered, bounced, deferred...), oldest first",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if findSince < 0 {
				return usageError{fmt.Errorf("--since %v: want a positive duration, or 0 for all the events stream keeps", findSince)}
			}
			find.Rcpt, find.Types = args[0], nil
			for _, t := range findTypes {
				if t = strings.TrimSpace(t); t != "" {
					find.Types = append(find.Types, t)
				}
			}
			if err := queue.CheckEventTypes(find.Types); err != nil {
				return usageError{fmt.Errorf("--type: %w", err)}
			}
			if findSince > 0 {
				find.Since = time.Now().Add(-findSince)
			}
			return a.run(cmd, func(ctx context.Context, q *queue.Queue) error {
				evs, scanned, err := q.FindEvents(ctx, find)
				if errors.Is(err, context.DeadlineExceeded) {
					return fmt.Errorf("read %d events in %v without reaching the end: narrow the look-up (--since, --tenant, --type) or allow it longer (--timeout)", scanned, a.timeout)
				}
				if err != nil {
					return err
				}
				if err := printList(cmd.OutOrStdout(), a.json, evs, "TIME\tEVENT\tID\tTENANT\tDEST\tATTEMPT\tREASON", findLine); err != nil {
					return err
				}
				if !a.json {
					fmt.Fprintf(cmd.ErrOrStderr(), "%d event(s) of %d read\n", len(evs), scanned)
				}
				return nil
			})
		},
	}
	findCmd.Flags().StringVar(&find.Tenant, "tenant", "", "only this tenant's events (reads a sixty-fourth of them)")
	findCmd.Flags().StringSliceVar(&findTypes, "type", nil, "only these event types, comma-separated (e.g. delivered,bounced)")
	findCmd.Flags().DurationVar(&findSince, "since", 24*time.Hour, "only events stored in this last stretch of time; 0 reads all the events stream keeps")
	findCmd.Flags().IntVar(&find.Limit, "limit", queue.DefaultFindLimit, "at most this many, the newest")

	ff := &cobra.Command{
		Use:   "fast-forward ID",
		Short: "make a deferred or throttled message due now (atomic: its old schedule cannot also fire)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.run(cmd, func(ctx context.Context, q *queue.Queue) error {
				by := adminBy()
				it, err := q.FastForwardBy(ctx, args[0], by)
				if err != nil {
					return err
				}
				if it.Due {
					return report(cmd, a.json, map[string]any{"id": args[0], "result": "already due", "was": it.State},
						"%s: already due (%s), waiting for a worker", args[0], it.State)
				}
				defer noteAction(ctx, cmd, q, queue.EventFastFwd, args[0], by)
				return report(cmd, a.json, map[string]any{"id": args[0], "result": "due now", "was": it.State, "was_next_attempt_at": it.NextAt},
					"%s: due now (was %s, next attempt %s)", args[0], it.State, it.NextAt.Format(time.RFC3339))
			})
		},
	}

	var editFile string
	var includeSuppressed bool
	replay := &cobra.Command{
		Use:   "replay ID",
		Short: "move a dead or held message back to fresh work with a new budget",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var edits []byte
			if editFile != "" {
				b, err := os.ReadFile(editFile)
				if err != nil {
					return usageError{fmt.Errorf("--edit-headers: %w", err)}
				}
				edits = b
			}
			return a.run(cmd, func(ctx context.Context, q *queue.Queue) error {
				by := adminBy()
				e, err := q.ReplayWith(ctx, args[0], queue.ReplayOptions{EditHeaders: edits, IncludeSuppressed: includeSuppressed, By: by})
				if err != nil {
					return err
				}
				defer noteAction(ctx, cmd, q, queue.EventReplayed, e.ID, by)
				return report(cmd, a.json, map[string]any{"id": e.ID, "result": "queued", "replays": e.Replays, "rcpts": e.Rcpts},
					"%s: queued again for %d recipient(s) (replay %d)", e.ID, len(e.Rcpts), e.Replays)
			})
		},
	}
	replay.Flags().StringVar(&editFile, "edit-headers", "", "file of header lines to set (\"Name: value\") or remove (\"Name:\") first")
	replay.Flags().BoolVar(&includeSuppressed, "include-suppressed", false, "replay even when a recipient is on the tenant's suppression list now (refused by default, naming them)")

	drop := &cobra.Command{
		Use:   "drop ID",
		Short: "remove a message wherever it waits (records a dropped event)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.run(cmd, func(ctx context.Context, q *queue.Queue) error {
				by := adminBy()
				it, err := q.DropBy(ctx, args[0], by)
				if err != nil {
					return err
				}
				defer noteAction(ctx, cmd, q, queue.EventDropped, args[0], by)
				return report(cmd, a.json, map[string]any{"id": args[0], "result": "dropped", "was": it.State},
					"%s: dropped (was %s)", args[0], it.State)
			})
		},
	}
	qc.AddCommand(list, inspect, history, findCmd, ff, replay, drop)
	rootCmd.AddCommand(qc)
}

// findLine is one event of `queue find` as table columns.
func findLine(ev queue.Event) string {
	attempt := "-"
	if ev.Attempt > 0 {
		attempt = strconv.Itoa(ev.Attempt)
	}
	return fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s\t%s", ev.Time.Format(time.RFC3339), ev.Type, ev.ID, dash(ev.Tenant), dash(ev.Dest),
		attempt, dash(short(ev.Reason, 80)))
}

// historyLine is one event of `queue history` as table columns: its
// decision record's class, rule, delay and draw beside the event.
func historyLine(ev queue.Event) string {
	var d backoff.Record
	_ = json.Unmarshal(ev.Decision, &d)
	reply := ev.Reason
	// A dead letter's reason names the spent budget before the last reply
	// ("max-attempts: 451 4.3.0 …"); any other event's reason is the
	// reply's text alone, which the record has with its codes.
	if d.Code != 0 && ev.Type != queue.EventDead && ev.Type != queue.EventExpired {
		reply = strings.TrimSpace(fmt.Sprintf("%d %s %s", d.Code, d.EnhancedCode, d.Reply))
	}
	if ev.Async {
		// Mailed back after the destination's 250: which recipient, and
		// that it is not a reply to an attempt.
		reply = "later, " + strings.Join(ev.Recipients, ",") + ": " + reply
	}
	delay := "-"
	if d.DelayMs > 0 {
		delay = (time.Duration(d.DelayMs) * time.Millisecond).String()
		if d.PacedBy != "" {
			// The delay is the envelope's place at the destination's rate,
			// not the backoff draw that SEED and OFFSET (and `outflow
			// schedule`) reproduce.
			delay += " paced"
		}
	}
	seed, offset := "", "-" // final outcomes draw no delay
	if d.JitterSeed != 0 {
		seed = strconv.FormatUint(d.JitterSeed, 10)
		offset = (time.Duration(d.OffsetMs) * time.Millisecond).String()
	}
	return fmt.Sprintf("%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s", ev.Time.Format(time.RFC3339Nano), ev.Type, ev.Attempt,
		dash(ev.Worker), dash(d.Class), dash(d.Rule), delay, dash(seed), offset, dash(short(reply, 70)))
}

type row struct {
	ID        string    `json:"id"`
	State     string    `json:"state"`
	Tenant    string    `json:"tenant"`
	Dest      string    `json:"dest"`
	Rcpts     int       `json:"rcpts"`
	Attempt   int       `json:"attempt"`
	Throttled int       `json:"throttle_count"`
	LastClass string    `json:"last_class,omitempty"`
	LastReply string    `json:"last_reply,omitempty"`
	Next      string    `json:"next_attempt_at,omitempty"`
	Submitted time.Time `json:"submitted_at"`
	Reason    string    `json:"dead_reason,omitempty"`
}

// attempts is the list's ATTEMPT cell: the attempts made, and of them the
// throttled ones, which do not spend the retry budget (a message held back
// by a provider for hours climbs without being near its end).
func (r row) attempts() string {
	if r.Throttled == 0 {
		return strconv.Itoa(r.Attempt)
	}
	return fmt.Sprintf("%d (%d throttled)", r.Attempt, r.Throttled)
}

func listRow(it queue.Item) row {
	r := row{ID: it.Env.ID, State: string(it.State), Tenant: it.Env.Tenant, Dest: it.Env.Dest, Rcpts: len(it.Env.Rcpts),
		Attempt: it.Env.Attempt, Throttled: it.Env.ThrottleCount, LastClass: it.Env.LastClass, LastReply: it.Env.LastReply, Submitted: it.Env.SubmittedAt, Reason: it.DeadReason}
	switch {
	case it.Due:
		r.Next = "due"
	case !it.NextAt.IsZero():
		r.Next = it.NextAt.UTC().Format(time.RFC3339)
	}
	if it.State == queue.StateDead && r.LastReply == "" {
		r.LastReply = it.DeadReason
	}
	return r
}

// inspection is what `queue inspect` shows of one message: the item, and
// what its stored body says. The message's own headers are shown; the
// body and any credentials never are.
type inspection struct {
	it *queue.Item
	// headers are the message's own header lines; nil when its body was
	// not read.
	headers []string
	bodyErr string // why the body could not be read
	// keptUntil is when a body stored apart expires with its bucket: a
	// held message replayed after it is a dead letter, "body missing".
	keptUntil time.Time
}

// inspectMessage reads what `queue inspect` shows of it.
func inspectMessage(ctx context.Context, q *queue.Queue, it *queue.Item) inspection {
	in := inspection{it: it}
	if it.Env.BodyRef != "-" {
		if body, err := q.EnvelopeBody(ctx, it.Env); err == nil {
			in.headers = messageHeaders(body, 60)
		} else {
			in.bodyErr = err.Error()
		}
		if until, err := q.BodyKeptUntil(ctx, it.Env); err == nil && !until.IsZero() {
			in.keptUntil = until.UTC()
		}
	}
	return in
}

// meta returns the attempt metadata and schedule headers of the stored
// message.
func (in inspection) meta() map[string]string {
	meta := map[string]string{}
	for k := range in.it.Header {
		if strings.HasPrefix(k, "Outflow-") || strings.HasPrefix(k, "Nats-Schedule") {
			meta[k] = in.it.Header.Get(k)
		}
	}
	return meta
}

// view is what `queue inspect --json` prints; its keys are those scripts
// read, kept as they were.
func (in inspection) view() map[string]any {
	it := in.it
	v := map[string]any{
		"id": it.Env.ID, "state": it.State, "due": it.Due, "subject": it.Subject, "stream_seq": it.Seq, "stored": it.Stored,
		"envelope": it.Env, "attempt": it.Env.Attempt, "throttle_count": it.Env.ThrottleCount, "replays": it.Env.Replays,
		"first_attempt": it.Env.FirstAttempt, "deadline": it.Env.Deadline, "last_class": it.Env.LastClass, "last_reply": it.Env.LastReply,
	}
	if !it.NextAt.IsZero() {
		v["next_attempt_at"] = it.NextAt
	}
	if it.DeadReason != "" {
		v["dead_reason"] = it.DeadReason
	}
	v["headers"] = in.meta()
	if in.headers != nil {
		v["message_headers"] = in.headers
	}
	if in.bodyErr != "" {
		v["body_error"] = in.bodyErr
	}
	if !in.keptUntil.IsZero() {
		v["body_kept_until"] = in.keptUntil
	}
	return v
}

// writeText prints the inspection for a person, as `dest status` prints a
// destination: a line per field, then the attempts so far as a table (the
// envelope keeps the newest; `queue history` has them all with their
// decision records), the attempt metadata and the message's header lines.
// A reply, a header or an address comes from a remote server or a tenant,
// so each is made printable first.
func (in inspection) writeText(w io.Writer) error {
	it, env := in.it, in.it.Env
	line := func(label, format string, args ...any) {
		fmt.Fprintf(w, "%-17s%s\n", label+":", printable(fmt.Sprintf(format, args...)))
	}
	ts := func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.UTC().Format(time.RFC3339)
	}
	line("id", "%s", env.ID)
	if env.MsgID != "" && env.MsgID != env.ID {
		line("message", "%s (%d part(s), one per destination)", env.MsgID, env.Parts)
	}
	state := string(it.State)
	switch {
	case it.Due:
		state += ", due: waiting for a worker"
	case !it.NextAt.IsZero():
		state += ", next attempt " + ts(it.NextAt)
	}
	line("state", "%s", state)
	line("tenant", "%s", dash(env.Tenant))
	line("from", "%s", dash(env.From))
	line("recipients", "%s", dash(strings.Join(env.Rcpts, ", ")))
	dest := env.Dest
	switch {
	case throttle.IsSite(env.Group):
		dest += " (MX site " + env.Group + ")"
	case env.Group != "":
		dest += " (provider group " + env.Group + ")"
	}
	line("destination", "%s", dest)
	line("message-id", "%s", dash(env.MessageID))
	line("size", "%d bytes", env.Size)
	line("submitted", "%s", ts(env.SubmittedAt))
	if !env.SendAt.IsZero() {
		line("send at", "%s", ts(env.SendAt))
	}
	line("attempt", "%s, replay %d", row{Attempt: env.Attempt, Throttled: env.ThrottleCount}.attempts(), env.Replays)
	line("first attempt", "%s", ts(env.FirstAttempt))
	line("deadline", "%s", ts(env.Deadline))
	line("last class", "%s", dash(env.LastClass))
	// The reply and the dead letter's reason whole: they are the evidence
	// an operator reads inspect for (the list cuts them short).
	line("last reply", "%s", dash(strings.Join(strings.Fields(env.LastReply), " ")))
	if it.DeadReason != "" {
		line("dead reason", "%s", strings.Join(strings.Fields(it.DeadReason), " "))
	}
	line("stored", "%s on %s (sequence %d)", ts(it.Stored), it.Subject, it.Seq)
	switch {
	case env.BodyRef == "-":
		line("body", "none: a parked malformed message, not an envelope")
	case in.bodyErr != "":
		line("body", "cannot be read: %s", in.bodyErr)
	case env.Inline():
		line("body", "in the envelope")
	case !in.keptUntil.IsZero():
		line("body", "stored apart (%s), kept until %s", env.BodyRef, ts(in.keptUntil))
	default:
		line("body", "stored apart (%s)", env.BodyRef)
	}
	if env.DSN != nil {
		line("dsn", "%s", dsnLine(env.DSN))
	}

	if len(env.History) > 0 {
		fmt.Fprintln(w)
		tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "TIME\tATTEMPT\tWORKER\tCLASS\tRULE\tLANE\tDELAY\tREPLY")
		for _, a := range env.History {
			delay := "-"
			if a.DelayMs > 0 {
				delay = (time.Duration(a.DelayMs) * time.Millisecond).String()
			}
			reply := a.Reply
			if a.Code != 0 {
				reply = strings.TrimSpace(fmt.Sprintf("%d %s %s", a.Code, a.Enhanced, a.Reply))
			}
			fmt.Fprintln(tw, printable(fmt.Sprintf("%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s", a.At.UTC().Format(time.RFC3339Nano), a.Attempt,
				dash(a.Worker), dash(a.Class), dash(a.Rule), dash(a.Lane), delay, dash(short(reply, 70)))))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}

	meta := in.meta()
	keys := slices.Sorted(maps.Keys(meta))
	fmt.Fprintln(w)
	fmt.Fprintln(w, "attempt metadata:")
	for _, k := range keys {
		fmt.Fprintf(w, "  %s: %s\n", k, printable(meta[k]))
	}
	if len(keys) == 0 {
		fmt.Fprintln(w, "  (none)")
	}
	if in.headers != nil {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "message headers:")
		for _, h := range in.headers {
			fmt.Fprintf(w, "  %s\n", printable(h))
		}
	}
	return nil
}

// dsnLine is an envelope's RFC 3461 parameters on one line.
func dsnLine(d *queue.DSNParams) string {
	parts := []string{"ret " + cmp.Or(d.Ret, "HDRS")}
	if d.EnvID != "" {
		parts = append(parts, "envid "+d.EnvID)
	}
	for _, rcpt := range slices.Sorted(maps.Keys(d.Rcpts)) {
		r := d.Rcpts[rcpt]
		p := rcpt + " notify " + cmp.Or(strings.Join(r.Notify, ","), "default")
		if r.ORcpt != "" {
			p += " orcpt " + cmp.Or(r.ORcptType, "rfc822") + ";" + r.ORcpt
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, "; ")
}

// printable shows the control characters of s (an escape sequence in a
// header a tenant wrote, or in a remote server's reply, would otherwise act
// on the operator's terminal) and any bytes that are not UTF-8 as Go
// escapes them, \x1b; tabs stay, for the tables.
func printable(s string) string {
	if !strings.ContainsFunc(s, func(r rune) bool { return r == utf8.RuneError || r != '\t' && unicode.IsControl(r) }) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n <= 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r != '\t' && unicode.IsControl(r):
			q := strconv.QuoteRuneToASCII(r)
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// messageHeaders returns up to max header lines of an RFC 5322 message.
func messageHeaders(body []byte, max int) []string {
	head := string(body)
	if i := strings.Index(head, "\r\n\r\n"); i >= 0 {
		head = head[:i]
	}
	lines := strings.Split(head, "\r\n")
	if len(lines) > max {
		lines = append(lines[:max], "…")
	}
	return lines
}

// report is how a verb that changes something says what it did: with
// --json, v as one JSON object on one line; else the sentence format makes
// of args, which scripts may parse, so it stays as it is.
func report(cmd *cobra.Command, asJSON bool, v any, format string, args ...any) error {
	if asJSON {
		return printJSON(cmd.OutOrStdout(), v)
	}
	_, err := fmt.Fprintf(cmd.OutOrStdout(), format+"\n", args...)
	return err
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func short(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) <= n {
		return s
	}
	cut := n - 1
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut-- // not inside a character
	}
	return s[:cut] + "…"
}
