package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/outflow/outflow/classify"
)

// classifyOutput is one line of `outflow classify --json`. Field names are
// part of the command's contract (design.md, Interfaces).
type classifyOutput struct {
	Class        classify.Class `json:"class"`
	Scope        classify.Scope `json:"scope"`
	Rule         string         `json:"rule"`
	Code         int            `json:"code"`
	EnhancedCode string         `json:"enhanced_code"`
	RetryAfterMS int64          `json:"retry_after_ms,omitempty"` // server hint or rule default, in milliseconds; absent when none
	Text         string         `json:"text"`
	Reply        string         `json:"reply"` // the input line, as given
}

func init() {
	var (
		asJSON    bool
		rulesFile string
		stageName string
		eventName string
	)
	cmd := &cobra.Command{
		Use:   "classify [reply...]",
		Short: "classify SMTP replies: delivered, transient, throttled, permanent or unknown",
		Long: `Classify SMTP replies the way the workers do.

Each argument is one reply; with no arguments, each line of standard input
is one. A reply may be multi-line (with 250-/421- continuation prefixes),
flattened onto one line, lack an enhanced code, or be a Postfix log
diagnostic. --event classifies a transport event (timeout, conn-lost, ...)
instead; --stage says which SMTP step the reply or event answered.
docs/classification.md describes the classes and the rules file format.`,
		Example: `  outflow classify --json '421 4.7.28 Gmail has detected an unusual rate of email.'
  outflow classify --stage rcpt '552 Too many recipients'
  outflow classify --event conn-lost --stage data-end
  outflow classify --rules /etc/outflow/rules.toml --json < replies.txt`,
		RunE: func(cmd *cobra.Command, args []string) error {
			stage, err := classify.ParseStage(stageName)
			if err != nil {
				return usageError{fmt.Errorf("--stage: %w", err)}
			}
			var event classify.Event
			if eventName != "" {
				if event, err = classify.ParseEvent(eventName); err != nil {
					return usageError{fmt.Errorf("--event: %w", err)}
				}
			}
			c, err := classify.New(classify.Options{ExtraRulesFile: rulesFile})
			if err != nil {
				return err
			}
			out := bufio.NewWriter(cmd.OutOrStdout())
			defer out.Flush()
			one := func(reply string) error {
				in := classify.Input{Raw: reply, Stage: stage}
				if event != classify.EventNone {
					in = classify.Input{Event: event, Stage: stage, Text: reply}
				}
				return printResult(out, c.Classify(in), reply, asJSON)
			}
			if event != classify.EventNone && len(args) == 0 {
				return one("")
			}
			if len(args) > 0 {
				for _, a := range args {
					if err := one(a); err != nil {
						return err
					}
				}
				return nil
			}
			sc := bufio.NewScanner(cmd.InOrStdin())
			sc.Buffer(make([]byte, 64*1024), 1<<20) // replies are short; 1 MiB bounds a runaway line
			for sc.Scan() {
				line := strings.TrimRight(sc.Text(), "\r")
				if strings.TrimSpace(line) == "" {
					continue
				}
				if err := one(line); err != nil {
					return err
				}
			}
			if err := sc.Err(); err != nil {
				return fmt.Errorf("read stdin: %w", err)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object per reply")
	cmd.Flags().StringVar(&rulesFile, "rules", "", "extra rules file (TOML), tried before the embedded rules")
	cmd.Flags().StringVar(&stageName, "stage", "unknown", "SMTP step the replies answered: greeting, ehlo, tls, auth, mail, rcpt, data, data-end, ...")
	cmd.Flags().StringVar(&eventName, "event", "", "classify a transport event instead: conn-refused, timeout, conn-lost, tls-failure, dns-nxdomain, dns-servfail, null-mx, local")
	rootCmd.AddCommand(cmd)
}

// printResult writes one result, as JSON or as a tab-separated line
// (class, scope, rule, code, enhanced code, retry hint, text).
func printResult(w io.Writer, r classify.Result, reply string, asJSON bool) error {
	if asJSON {
		b, err := json.Marshal(classifyOutput{
			Class: r.Class, Scope: r.Scope, Rule: r.Rule, Code: r.Code, EnhancedCode: r.Enhanced,
			RetryAfterMS: r.RetryAfter.Milliseconds(), Text: r.Text, Reply: reply,
		})
		if err != nil {
			return fmt.Errorf("encode result: %w", err)
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	}
	hint := "-"
	if r.RetryAfter > 0 {
		hint = r.RetryAfter.String()
	}
	enh := r.Enhanced
	if enh == "" {
		enh = "-"
	}
	_, err := fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\t%s\t%s\n", r.Class, r.Scope, r.Rule, r.Code, enh, hint, r.Text)
	return err
}
