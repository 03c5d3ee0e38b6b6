package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
)

// runClassifyCmd runs a fresh `outflow classify` in process and returns its
// standard output.
func runClassifyCmd(t *testing.T, args ...string) string {
	t.Helper()
	c := newClassifyCmd()
	var out bytes.Buffer
	c.SetOut(&out)
	c.SetErr(io.Discard)
	c.SetIn(strings.NewReader(""))
	c.SetArgs(args)
	if err := c.Execute(); err != nil {
		t.Fatalf("classify %v: %v", args, err)
	}
	return out.String()
}

// --json keeps its keys; --explain adds an "explain" object saying whether a
// rule or the weighted tokens decided, which tokens, and the runner-up.
func TestClassifyExplainJSON(t *testing.T) {
	out := runClassifyCmd(t, "--json", "--explain", "451 4.7.1 Hourly volume for your IP reached, come back in a while", "550 5.1.1 User unknown")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 {
		t.Fatalf("got %d lines, want 2:\n%s", len(lines), out)
	}
	var tok, rule map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &tok); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(lines[1]), &rule); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"class", "scope", "rule", "code", "enhanced_code"} {
		if _, ok := tok[k]; !ok {
			t.Errorf("key %q missing: %s", k, lines[0])
		}
	}
	ex, _ := tok["explain"].(map[string]any)
	if tok["class"] != "throttled" || ex["decided_by"] != "tokens" || ex["rule"] != "rfc3463-transient" || ex["runner_up"] != "transient" {
		t.Errorf("token decision not explained: %s", lines[0])
	}
	if toks, _ := ex["tokens"].([]any); len(toks) == 0 || ex["margin"].(float64) <= 0 {
		t.Errorf("no tokens or margin: %s", lines[0])
	}
	ex, _ = rule["explain"].(map[string]any)
	if ex["decided_by"] != "rule" || ex["rule"] != "user-unknown" {
		t.Errorf("rule decision not explained: %s", lines[1])
	}
	// Without --explain the object is absent.
	if out := runClassifyCmd(t, "--json", "550 5.1.1 User unknown"); strings.Contains(out, "explain") {
		t.Errorf("explain without --explain: %s", out)
	}
}

// The text form prints the result line, then the decision and runner-up.
func TestClassifyExplainText(t *testing.T) {
	out := runClassifyCmd(t, "--explain", "451 4.7.1 Hourly volume for your IP reached, come back in a while")
	for _, want := range []string{"throttled\tdestination\ttoken-signal", "decided by: weighted tokens (overriding rule rfc3463-transient)", `"volume"(throttled +2.0)`, "runner-up: transient"} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}
}

// TestClassifyStdinJoinsContinuations: on stdin a multi-line reply pasted
// as the server sent it ("421-..." lines, then "421 ...") is one reply;
// other lines are one reply each, and a reply cut short by a line of
// another code, a blank line or the end of the input still classifies.
func TestClassifyStdinJoinsContinuations(t *testing.T) {
	in := "421-4.7.0 [TSS04] Messages from 192.0.2.1 temporarily deferred due to unexpected volume or user complaints - 4.16.55.1;\n" +
		"421 4.7.0 see https://postmaster.yahooinc.com/error-codes\r\n" +
		"550 5.1.1 User unknown\n" +
		"\n" +
		"452-4.2.2 The email account that you tried to reach is over quota.\n" +
		"550 5.7.1 Rejected\n" +
		"250-first\n" +
		"\n" +
		"451-4.3.0 cut short\n"
	c := newClassifyCmd()
	var out bytes.Buffer
	c.SetOut(&out)
	c.SetErr(io.Discard)
	c.SetIn(strings.NewReader(in))
	c.SetArgs([]string{"--json"})
	if err := c.Execute(); err != nil {
		t.Fatal(err)
	}
	var got []classifyOutput
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var r classifyOutput
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("%v: %q", err, line)
		}
		got = append(got, r)
	}
	want := []struct {
		code  int
		class string
		text  string
	}{
		{421, "throttled", "see https://postmaster.yahooinc.com/error-codes"},
		{550, "permanent", "User unknown"},
		{452, "", "over quota"},
		{550, "permanent", "Rejected"},
		{250, "delivered", "first"},
		{451, "", "cut short"},
	}
	if len(got) != len(want) {
		t.Fatalf("%d replies, want %d:\n%s", len(got), len(want), out.String())
	}
	for i, w := range want {
		g := got[i]
		if g.Code != w.code || (w.class != "" && g.Class.String() != w.class) || !strings.Contains(g.Text, w.text) {
			t.Errorf("reply %d: %d %s %q, want %d %s with %q", i, g.Code, g.Class, g.Text, w.code, w.class, w.text)
		}
	}
	if !strings.Contains(got[0].Text, "[TSS04]") || strings.Count(got[0].Reply, "\n") != 1 {
		t.Errorf("the two lines of the TSS04 reply are not one reply: %+v", got[0])
	}
}

// TestClassifyNamesValidValues: an unknown --stage or --event is refused
// with the names it could have been.
func TestClassifyNamesValidValues(t *testing.T) {
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"--stage", "bogus", "250 ok"}, []string{`unknown stage "bogus"`, "greeting", "rcpt", "data-end"}},
		{[]string{"--event", "bogus"}, []string{`unknown event "bogus"`, "conn-refused", "timeout", "local"}},
	} {
		cmd := newClassifyCmd()
		cmd.SetOut(io.Discard)
		cmd.SetErr(io.Discard)
		cmd.SetArgs(c.args)
		err := cmd.Execute()
		var u usageError
		if !errors.As(err, &u) {
			t.Errorf("%q: %v, want a usage error", c.args, err)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%q: %v, want it to say %s", c.args, err, w)
			}
		}
	}
}
