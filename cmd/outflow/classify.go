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
	Reply        string         `json:"reply"`             // the input line, as given
	Explain      *explainOutput `json:"explain,omitempty"` // with --explain only
}

// explainOutput is the "explain" object of `outflow classify --json
// --explain`: what decided, the weighted tokens found, and the runner-up.
type explainOutput struct {
	DecidedBy string             `json:"decided_by"` // "rule" or "tokens"
	Rule      string             `json:"rule"`       // the rule that matched (with tokens: the code rule overridden)
	Tokens    []explainToken     `json:"tokens,omitempty"`
	Scores    map[string]float64 `json:"scores,omitempty"` // token score per class, in nats
	RunnerUp  classify.Class     `json:"runner_up,omitempty"`
	Margin    float64            `json:"margin"` // lead of the result's class over the runner-up, in nats
}

// explainToken is one vocabulary entry found in the reply.
type explainToken struct {
	Token  string         `json:"token"`
	Class  classify.Class `json:"class"`
	Weight float64        `json:"weight"`
}

func init() { rootCmd.AddCommand(newClassifyCmd()) }

// newClassifyCmd builds `outflow classify` with its own flags, so tests can
// run it afresh.
func newClassifyCmd() *cobra.Command {
	var (
		asJSON    bool
		explain   bool
		rulesFile string
		stageName string
		eventName string
	)
	cmd := &cobra.Command{
		Use:   "classify [reply...]",
		Short: "classify SMTP replies: delivered, transient, throttled, permanent or unknown",
		Long: `Classify SMTP replies the way the workers do.

Each argument is one reply. With no arguments, standard input holds one
reply a line, except that a line whose code is followed by '-' ("421-4.7.0
...") continues into the next line with the same code, as a server sends a
multi-line reply: a multi-line reply pasted as it came is one reply. A reply
may also be multi-line within one argument, flattened onto one line, lack
an enhanced code, or be a Postfix log diagnostic. --event classifies a
transport event (timeout, conn-lost, ...) instead; --stage says which SMTP
step the reply or event answered.
docs/classification.md describes the classes and the rules file format.`,
		Example: `  outflow classify --json '421 4.7.28 Gmail has detected an unusual rate of email.'
  outflow classify --stage rcpt '552 Too many recipients'
  outflow classify --explain '451 Hourly volume for your IP reached, come back later'
  outflow classify --event conn-lost --stage data-end
  outflow classify --rules /etc/outflow/rules.toml --json < replies.txt`,
		RunE: func(cmd *cobra.Command, args []string) error {
			stage, err := classify.ParseStage(stageName)
			if err != nil {
				return usageError{fmt.Errorf("--stage: %w; want %s", err, strings.Join(valueNames(classify.StageUnknown, classify.Stage.String), ", "))}
			}
			var event classify.Event
			if eventName != "" {
				if event, err = classify.ParseEvent(eventName); err != nil {
					return usageError{fmt.Errorf("--event: %w; want %s", err, strings.Join(valueNames(classify.EventConnRefused, classify.Event.String), ", "))}
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
				if explain {
					return printExplanation(out, c.Explain(in), reply, asJSON)
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
			var r replyLines
			for sc.Scan() {
				for _, reply := range r.add(strings.TrimRight(sc.Text(), "\r")) {
					if err := one(reply); err != nil {
						return err
					}
				}
			}
			if err := sc.Err(); err != nil {
				return fmt.Errorf("read stdin: %w", err)
			}
			if reply, ok := r.end(); ok {
				return one(reply)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object per reply")
	cmd.Flags().BoolVar(&explain, "explain", false, "also print which rule or which weighted tokens decided, and how close the runner-up class was")
	cmd.Flags().StringVar(&rulesFile, "rules", "", "extra rules file (TOML), tried before the embedded rules")
	cmd.Flags().StringVar(&stageName, "stage", "unknown", "SMTP step the replies answered: greeting, ehlo, tls, auth, mail, rcpt, data, data-end, ...")
	cmd.Flags().StringVar(&eventName, "event", "", "classify a transport event instead: conn-refused, timeout, conn-lost, tls-failure, dns-nxdomain, dns-servfail, null-mx, local")
	return cmd
}

// replyLines gathers the lines of standard input into replies: one a
// line, but a line whose code is followed by '-' ("421-4.7.0 [TSS04] ...")
// goes on into the next lines with the same code, up to the one with a
// space or nothing after it (RFC 5321 4.2.1), so a multi-line reply pasted
// as the server sent it is classified once. A reply cut short (the next
// line has another code, no code, or is blank; the input ends) is
// classified as far as it goes.
type replyLines struct {
	lines []string // the reply being gathered
	code  string   // its code; "" when no reply goes on
}

// add takes the next line and returns the replies it completes: none while
// a reply goes on, the reply it ends, or the reply it cuts short followed
// by the line itself when that is a reply of one line.
func (r *replyLines) add(line string) []string {
	trimmed := strings.TrimSpace(line)
	code, more := replyCode(trimmed)
	var done []string
	if r.code != "" {
		if code == r.code {
			r.lines = append(r.lines, line)
			if more {
				return nil
			}
			return []string{r.flush()}
		}
		done = append(done, r.flush())
	}
	switch {
	case trimmed == "":
	case more:
		r.lines, r.code = []string{line}, code
	default:
		done = append(done, line)
	}
	return done
}

// end returns the reply the input stopped in the middle of, if any.
func (r *replyLines) end() (string, bool) {
	if r.code == "" {
		return "", false
	}
	return r.flush(), true
}

// flush returns the lines gathered as one reply and starts afresh.
func (r *replyLines) flush() string {
	reply := strings.Join(r.lines, "\n")
	r.lines, r.code = nil, ""
	return reply
}

// replyCode returns the three-digit code at the start of line, and whether
// a '-' after it says the reply goes on ("421-4.7.0 ..."); "" for a line
// that starts otherwise.
func replyCode(line string) (string, bool) {
	if len(line) < 3 || strings.Trim(line[:3], "0123456789") != "" {
		return "", false
	}
	if len(line) == 3 {
		return line, false
	}
	switch line[3] {
	case '-':
		return line[:3], true
	case ' ', '\t':
		return line[:3], false
	}
	return "", false
}

// valueNames lists the names of an enumeration's values from first on, up
// to the first value without one, for an error that says what a flag
// takes.
func valueNames[T ~uint8](first T, name func(T) string) []string {
	var names []string
	for v := first; ; v++ {
		n := name(v)
		if strings.HasPrefix(n, "invalid(") {
			return names
		}
		names = append(names, n)
		if v == ^T(0) {
			return names
		}
	}
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

// printExplanation writes one result with its explanation: in JSON, the
// result's object with an "explain" object; as text, the result's line
// followed by indented lines for the decision, the tokens and the runner-up.
func printExplanation(w io.Writer, ex classify.Explanation, reply string, asJSON bool) error {
	r := ex.Result
	if asJSON {
		eo := &explainOutput{DecidedBy: ex.DecidedBy, Rule: ex.Rule, RunnerUp: ex.RunnerUp, Margin: ex.Margin}
		for _, t := range ex.Tokens {
			eo.Tokens = append(eo.Tokens, explainToken{Token: t.Token, Class: t.Class, Weight: t.Weight})
		}
		if len(ex.Scores) > 0 {
			eo.Scores = map[string]float64{}
			for _, s := range ex.Scores {
				eo.Scores[s.Class.String()] = s.Score
			}
		}
		b, err := json.Marshal(classifyOutput{
			Class: r.Class, Scope: r.Scope, Rule: r.Rule, Code: r.Code, EnhancedCode: r.Enhanced,
			RetryAfterMS: r.RetryAfter.Milliseconds(), Text: r.Text, Reply: reply, Explain: eo,
		})
		if err != nil {
			return fmt.Errorf("encode result: %w", err)
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	}
	if err := printResult(w, r, reply, false); err != nil {
		return err
	}
	var b strings.Builder
	if ex.DecidedBy == "tokens" {
		fmt.Fprintf(&b, "  decided by: weighted tokens (overriding rule %s)\n", ex.Rule)
	} else {
		fmt.Fprintf(&b, "  decided by: rule %s\n", ex.Rule)
	}
	if len(ex.Tokens) > 0 {
		b.WriteString("  tokens:")
		for _, t := range ex.Tokens {
			fmt.Fprintf(&b, " %q(%s %+.1f)", t.Token, t.Class, t.Weight)
		}
		b.WriteString("\n")
	}
	if len(ex.Scores) > 0 {
		b.WriteString("  scores:")
		for _, s := range ex.Scores {
			fmt.Fprintf(&b, " %s %.1f", s.Class, s.Score)
		}
		if ex.Margin >= 0 {
			fmt.Fprintf(&b, "\n  runner-up: %s, %.1f nats behind\n", ex.RunnerUp, ex.Margin)
		} else {
			fmt.Fprintf(&b, "\n  runner-up: %s, %.1f nats ahead on the words; the rule decided\n", ex.RunnerUp, -ex.Margin)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}
