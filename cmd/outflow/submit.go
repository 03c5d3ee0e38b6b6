package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/submission"
)

func init() {
	a := &adminFlags{}
	var from, tenant, key string
	var to []string
	cmd := &cobra.Command{
		Use:   "submit --from A --to B [--to C] [--idempotency-key K] < message.eml",
		Short: "submit a message through NATS (the second submission path) and print its id",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(to) == 0 {
				return usageError{errors.New("at least one --to is required")}
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
			body, err := io.ReadAll(io.LimitReader(cmd.InOrStdin(), 64<<20+1))
			if err != nil {
				return fmt.Errorf("read message: %w", err)
			}
			if len(body) > 64<<20 {
				return usageError{errors.New("message larger than 64 MiB")}
			}
			if len(body) == 0 {
				return usageError{errors.New("empty message on stdin")}
			}
			body = toCRLF(body)
			return a.run(cmd, func(ctx context.Context, q *queue.Queue) error {
				ids, err := q.Enqueue(ctx, &queue.Submission{Tenant: tenant, From: from, Rcpts: to, Body: body,
					ReceivedAt: time.Now(), IdempotencyKey: key, Source: queue.SourceNATS})
				if err != nil {
					return err
				}
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
	cmd.Flags().StringVar(&key, "idempotency-key", "", "resubmitting with the same key within 24h creates no duplicate")
	rootCmd.AddCommand(cmd)
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
