package main

import (
	"bytes"
	"encoding/json"
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
