package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/outflow/outflow/api"
	"github.com/outflow/outflow/bounce"
	"github.com/outflow/outflow/internal/mailhdr"
	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/submission"
)

func init() {
	a := &adminFlags{}
	var from, tenant, key, ret, envID, sendAtArg string
	var to, notify, orcpt []string
	var listUnsub, includeSuppressed bool
	var maxSize int64
	cmd := &cobra.Command{
		Use:   "submit --from A --to B [--to C] [--idempotency-key K] [--ret FULL|HDRS] [--envid ID] [--notify B=LIST] [--orcpt B=TYPE;ADDR] [--send-at TIME] [--list-unsubscribe] < message.eml",
		Short: "submit a message through NATS (the second submission path) and print its id",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(to) == 0 {
				return usageError{errors.New("at least one --to is required")}
			}
			if tenant == "" || tenant == submission.OtherTenants || tenant == queue.PostmasterTenant {
				// "*" names every tenant without a sender-domains section
				// of its own, postmaster the forwarded reports' tenant.
				return usageError{fmt.Errorf("--tenant %q: want a tenant's name (%q and %q are reserved)", tenant, submission.OtherTenants, queue.PostmasterTenant)}
			}
			if from != "" {
				if _, err := submission.ParseAddress(from); err != nil {
					return usageError{fmt.Errorf("--from %q: %w", from, err)}
				}
			}
			for _, r := range to {
				if _, err := submission.ParseAddress(r); err != nil {
					return usageError{fmt.Errorf("--to %q: %w", r, err)}
				}
			}
			dsnp, err := submitDSN(ret, envID, notify, orcpt, to)
			if err != nil {
				return usageError{err}
			}
			var sendAt time.Time
			if sendAtArg != "" {
				if sendAt, err = time.Parse(time.RFC3339, sendAtArg); err != nil {
					return usageError{fmt.Errorf("--send-at %q: not an RFC 3339 time (2026-12-07T09:00:00Z)", sendAtArg)}
				}
				if sendAt.After(time.Now().Add(api.MaxSendAhead)) {
					return usageError{fmt.Errorf("--send-at %s: more than %s ahead", sendAtArg, api.MaxSendAhead)}
				}
			}
			if maxSize <= 0 {
				return usageError{fmt.Errorf("--max-size %d: must be positive", maxSize)}
			}
			tooBig := func(n int) error {
				return usageError{fmt.Errorf("message of %d bytes or more is larger than --max-size %d (the daemon's max-message-size; its SMTP listener answers 552)", n, maxSize)}
			}
			body, err := io.ReadAll(io.LimitReader(cmd.InOrStdin(), maxSize+1))
			if err != nil {
				return fmt.Errorf("read message: %w", err)
			}
			if int64(len(body)) > maxSize {
				return tooBig(len(body))
			}
			if len(body) == 0 {
				return usageError{errors.New("empty message on stdin")}
			}
			body = toCRLF(body)
			if int64(len(body)) > maxSize {
				return tooBig(len(body)) // with its line ends made CRLF
			}
			if err := submission.CheckBody(body, 0); err != nil {
				// Lines ending in LF alone were made CRLF above, as
				// sendmail(1) does; what is left, the SMTP listener
				// refuses too, and a receiver would.
				return usageError{fmt.Errorf("message refused, as the SMTP listener would: %w", err)}
			}
			host, _ := os.Hostname()
			if host == "" {
				host = "localhost"
			}
			seed := ""
			if key != "" {
				seed = tenant + "\x00" + key
			}
			now := time.Now()
			// The trace field of a local submission, as sendmail(1)
			// pickups write one: the machine and user that handed the
			// message over, and when.
			recv := fmt.Sprintf("Received: by %s (outflow submit, from userid %d);\r\n\t%s\r\n",
				host, os.Getuid(), now.Format(time.RFC1123Z))
			if from != "" && submission.HasHeader(body) && len(mailhdr.Values(body, "From")) == 0 {
				// As sendmail(1) and Postfix's pickup do: RFC 5322 wants
				// a From, and the large providers refuse mail without.
				body = append([]byte("From: <"+from+">\r\n"), body...)
			}
			body = submission.CompleteHeaders(append([]byte(recv), body...), len(recv), host, seed, now)
			return a.run(cmd, func(ctx context.Context, q *queue.Queue) error {
				if !includeSuppressed {
					// As the SMTP listener (550 at RCPT) and the API (422)
					// refuse them: an unsubscribe or a hard bounce holds
					// on every way in.
					sup, err := q.SuppressedAmong(ctx, tenant, to)
					if err != nil {
						return fmt.Errorf("suppression list: %w", err)
					}
					if len(sup) > 0 {
						return fmt.Errorf("not queued: %d recipient(s) on tenant %s's suppression list: %s (lift them with `outflow suppress remove`, or pass --include-suppressed to send to them all the same)",
							len(sup), tenant, strings.Join(sup, ", "))
					}
				}
				sub := &queue.Submission{Tenant: tenant, From: from, Rcpts: to, Body: body,
					ReceivedAt: now, IdempotencyKey: key, Source: queue.SourceNATS, DSN: dsnp, SendAt: sendAt}
				if cmd.Flags().Changed("list-unsubscribe") {
					// Said here, it holds for this message; unsaid, the
					// message goes without links (this command does not
					// read the daemon's tenant settings).
					sub.ListUnsubscribe = &listUnsub
					listUnsubscribe{}.apply(sub)
				}
				if len(to) > 1 {
					// serve gives each recipient of a tenant with a
					// return path an envelope of its own, so that a
					// return path names one recipient (bounce/doc.go);
					// this command cannot read which tenants have one,
					// so it splits whenever the fleet has made the
					// return-path key, and when it cannot tell: a split
					// costs a transaction per recipient, a shared
					// envelope its return path (the workers send one of
					// several recipients with the message's own sender).
					inUse, err := bounce.InUse(ctx, q)
					sub.PerRecipient = inUse || err != nil
				}
				ids, err := q.Enqueue(ctx, sub)
				if err != nil {
					return err
				}
				// No daemon saw it come: the daemons log it from this
				// record, as the SMTP listener logs what it takes.
				recordNATSSubmission(ctx, cmd, q, natsSubmission{Time: now.UTC(), IDs: ids, Tenant: tenant, From: from, To: to,
					Size: len(body), SendAt: sendAt, By: adminBy()})
				if a.json {
					return printJSON(cmd.OutOrStdout(), map[string]any{"ids": ids})
				}
				_, err = fmt.Fprintln(cmd.OutOrStdout(), strings.Join(ids, "\n"))
				return err
			})
		},
	}
	a.bind(cmd)
	cmd.Flags().StringVar(&from, "from", "", "envelope sender (empty for the null sender)")
	cmd.Flags().StringArrayVar(&to, "to", nil, "recipient (repeat for more)")
	cmd.Flags().StringVar(&tenant, "tenant", "nats", "tenant the message is accounted to")
	cmd.Flags().BoolVar(&includeSuppressed, "include-suppressed", false, "send even to recipients on the tenant's suppression list (refused by default, naming them)")
	cmd.Flags().Int64Var(&maxSize, "max-size", submission.DefaultMaxMessageBytes, "largest message accepted, in bytes: the daemon's max-message-size")
	cmd.Flags().StringVar(&key, "idempotency-key", "", "resubmitting with the same key within 24h creates no duplicate")
	cmd.Flags().StringVar(&ret, "ret", "", "DSN RET: FULL or HDRS, what of the message a notification returns (RFC 3461)")
	cmd.Flags().StringVar(&envID, "envid", "", "DSN ENVID: your id of the message, returned in notifications (RFC 3461)")
	cmd.Flags().StringArrayVar(&notify, "notify", nil, "DSN NOTIFY of one recipient, RCPT=NEVER or RCPT=SUCCESS,FAILURE,DELAY (repeat per recipient)")
	cmd.Flags().StringVar(&sendAtArg, "send-at", "", "hold the message until this RFC 3339 time, at most 72 hours ahead (a time past sends at once)")
	cmd.Flags().BoolVar(&listUnsub, "list-unsubscribe", false, "one-click unsubscribe links: one envelope per recipient, each with a List-Unsubscribe naming it (the workers need --unsubscribe-url)")
	cmd.Flags().StringArrayVar(&orcpt, "orcpt", nil, "DSN ORCPT of one recipient, RCPT=TYPE;ADDRESS, e.g. b@x=rfc822;b@old.example (repeat per recipient)")
	rootCmd.AddCommand(cmd)
}

// submitDSN checks the DSN flags with the SMTP listener's rules
// (submission.MessageDSN, submission.RecipientDSN) and returns them as an
// SMTP submission stores them. A --notify or --orcpt value starts with one
// of the --to recipients and "=".
func submitDSN(ret, envID string, notify, orcpt, to []string) (*queue.DSNParams, error) {
	d, serr := submission.MessageDSN(ret, envID)
	if serr != nil {
		return nil, errors.New(serr.Message)
	}
	type given struct {
		notify []string
		orcpt  string
	}
	per := map[string]*given{}
	split := func(flag, v string) (string, string, error) {
		for _, r := range to {
			if rest, ok := strings.CutPrefix(v, r+"="); ok {
				if per[r] == nil {
					per[r] = &given{}
				}
				return r, rest, nil
			}
		}
		return "", "", fmt.Errorf("--%s %q: want RCPT=VALUE with RCPT one of --to", flag, v)
	}
	for _, v := range notify {
		r, list, err := split("notify", v)
		if err != nil {
			return nil, err
		}
		per[r].notify = strings.Split(list, ",")
	}
	for _, v := range orcpt {
		r, o, err := split("orcpt", v)
		if err != nil {
			return nil, err
		}
		per[r].orcpt = o
	}
	for _, r := range to {
		g := per[r]
		if g == nil {
			continue
		}
		var typ, addr string
		if g.orcpt != "" {
			if typ, addr, serr = submission.ParseORcpt(g.orcpt); serr != nil {
				return nil, fmt.Errorf("--orcpt for %s: %s", r, serr.Message)
			}
		}
		p, ok, serr := submission.RecipientDSN(g.notify, typ, addr)
		if serr != nil {
			return nil, fmt.Errorf("--notify/--orcpt for %s: %s", r, serr.Message)
		}
		if !ok {
			continue
		}
		d = submission.AddRcptDSN(d, r, p)
	}
	return d, nil
}

// toCRLF turns bare LF line ends into CRLF, the form SMTP sends and stores
// (RFC 5321 2.3.8); files on disk usually have LF.
func toCRLF(b []byte) []byte {
	var out []byte
	for i := 0; i < len(b); i++ {
		if b[i] == '\n' && (i == 0 || b[i-1] != '\r') {
			out = append(out, '\r')
		}
		out = append(out, b[i])
	}
	return out
}
