package classify

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeRules(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "rules.toml")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// Operator rules are tried before the embedded ones, may replace an
// embedded rule by name, and may disable embedded rules.
func TestExtraRules(t *testing.T) {
	path := writeRules(t, `
disable = ["greylisting"]

[[rule]]
name = "acme-relay-quota"
note = "Our relay's 550 quota reply is a throttle."
class = "throttled"
scope = "tenant"
codes = ["550"]
text = ["acme quota reached"]
retry_after = "10m"

[[rule]]
name = "user-unknown"   # replaces the embedded rule of this name
class = "transient"
codes = ["5xx"]
text = ["user unknown"]

[[rule]]
name = "regex-rule"
class = "permanent"
scope = "message"
regex = '(?i)spam score \d+'
`)
	c, err := New(Options{ExtraRulesFile: path})
	if err != nil {
		t.Fatal(err)
	}
	res := c.Classify(Input{Raw: "550 5.7.1 ACME quota reached for account 42"})
	if res.Class != Throttled || res.Scope != ScopeTenant || res.Rule != "acme-relay-quota" || res.RetryAfter.Minutes() != 10 {
		t.Errorf("operator rule: %+v", res)
	}
	if res := c.Classify(Input{Raw: "550 5.1.1 User unknown"}); res.Class != Transient || res.Rule != "user-unknown" {
		t.Errorf("replaced rule: %+v", res)
	}
	if res := c.Classify(Input{Raw: "451 4.7.1 Greylisted, come back later"}); res.Rule == "greylisting" {
		t.Errorf("disabled rule still matches: %+v", res)
	}
	if res := c.Classify(Input{Raw: "554 5.7.1 Rejected: Spam score 99"}); res.Class != Permanent || res.Rule != "regex-rule" {
		t.Errorf("regex rule: %+v", res)
	}
	// The default classifier is not affected.
	if res := Default().Classify(Input{Raw: "550 5.1.1 User unknown"}); res.Class != Permanent {
		t.Errorf("default changed: %+v", res)
	}
}

// A bad rules file is refused at start with the line and the reason.
func TestBadRulesFile(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		line       int
		reason     string
	}{
		{"syntax", "[[rule]]\nname = \"x\"\nclass = \"transient\n", 3, ""},
		{"unknown class", "[[rule]]\nname = \"x\"\nclass = \"throtled\"\n", 3, `unknown class "throtled"`},
		{"missing class", "\n\n[[rule]]\nname = \"x\"\n", 3, "class is missing"},
		{"missing name", "[[rule]]\nclass = \"transient\"\n", 1, "name is missing"},
		{"unknown key", "[[rule]]\nname = \"x\"\nclass = \"transient\"\n\n  clas = \"permanent\"\n", 5, `unknown key "clas"`},
		{"second rule", "[[rule]]\nname = \"a\"\nclass = \"transient\"\n\n[[rule]]\nname = \"b\"\nclass = \"transient\"\ncodes = [\"4x\"]\n", 8, `bad code "4x"`},
		{"bad enhanced", "[[rule]]\nname = \"x\"\nclass = \"transient\"\nenhanced = [\"7.1.1\"]\n", 4, `bad enhanced code "7.1.1"`},
		{"bad scope", "[[rule]]\nname = \"x\"\nclass = \"transient\"\nscope = \"planet\"\n", 4, `unknown scope "planet"`},
		{"bad stage", "[[rule]]\nname = \"x\"\nclass = \"transient\"\nstages = [\"quit\"]\n", 4, `unknown stage "quit"`},
		{"bad event", "[[rule]]\nname = \"x\"\nclass = \"transient\"\nevents = [\"boom\"]\n", 4, `unknown event "boom"`},
		{"event and codes", "[[rule]]\nname = \"x\"\nclass = \"transient\"\nevents = [\"timeout\"]\ncodes = [\"4xx\"]\n", 4, "either events or replies"},
		{"unknown for a reply", "[[rule]]\nname = \"x\"\nclass = \"unknown\"\ncodes = [\"451\"]\n", 3, "class unknown is only for"},
		{"unknown before the dot", "[[rule]]\nname = \"x\"\nclass = \"unknown\"\nevents = [\"timeout\"]\nstages = [\"data\", \"data-end\"]\n", 3, "class unknown is only for"},
		{"bad regex", "[[rule]]\nname = \"x\"\nclass = \"transient\"\nregex = \"(\"\n", 4, "bad regex"},
		{"bad duration", "[[rule]]\nname = \"x\"\nclass = \"transient\"\nretry_after = \"soon\"\n", 4, `bad retry_after "soon"`},
		{"empty phrase", "[[rule]]\nname = \"x\"\nclass = \"transient\"\ntext = [\"  \"]\n", 4, "empty phrase"},
		{"wrong type", "[[rule]]\nname = \"x\"\nclass = \"transient\"\ncodes = \"4xx\"\n", 4, "codes must be a list of strings"},
		{"duplicate", "[[rule]]\nname = \"x\"\nclass = \"transient\"\n[[rule]]\nname = \"x\"\nclass = \"transient\"\n", 4, "duplicate rule name"},
		{"disable unknown", "disable = [\"no-such-rule\"]\n", 1, `disable names unknown rule "no-such-rule"`},
		{"unknown top key", "\nrules = []\n", 2, `unknown key "rules"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := writeRules(t, tc.body)
			_, err := New(Options{ExtraRulesFile: path})
			var re *RulesError
			if !errors.As(err, &re) {
				t.Fatalf("New: %v, want a *RulesError", err)
			}
			if re.File != path || re.Line != tc.line || !strings.Contains(re.Reason, tc.reason) {
				t.Errorf("got file %s line %d reason %q, want line %d reason containing %q", re.File, re.Line, re.Reason, tc.line, tc.reason)
			}
			if !strings.Contains(err.Error(), path) {
				t.Errorf("error %q does not name the file", err)
			}
		})
	}
	if _, err := New(Options{ExtraRulesFile: filepath.Join(t.TempDir(), "missing.toml")}); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v, want ErrNotExist", err)
	}
}

// Every embedded rule says why it exists, and each one is reached by at
// least one reply of the corpus, the extra examples or the events below, so
// no rule is dead weight (or shadowed by an earlier one).
func TestEmbeddedRulesAreUsed(t *testing.T) {
	c := Default()
	used := map[string]bool{}
	for _, file := range everyReplyFile {
		for _, row := range readReplies(t, file) {
			res := c.Classify(Input{Raw: row.text})
			used[c.Classify(Input{Raw: row.text, Stage: row.stage}).Rule] = true
			if file == "testdata/extra-replies.tsv" && (res.Class != row.class || res.Scope != row.scope) {
				t.Errorf("%s:%d: %s/%s (rule %s), want %s/%s", file, row.line, res.Class, res.Scope, res.Rule, row.class, row.scope)
			}
			used[res.Rule] = true
			used[c.Classify(Input{Raw: row.text, Stage: StageRcpt}).Rule] = true
			used[c.Classify(Input{Raw: row.text, Stage: StageAuth}).Rule] = true
			used[c.Classify(Input{Raw: row.text, Stage: StageGreeting}).Rule] = true
		}
	}
	for ev := EventConnRefused; ev <= EventLocal; ev++ {
		for st := StageUnknown; st <= StageDataEnd; st++ {
			used[c.Classify(Input{Event: ev, Stage: st}).Rule] = true
		}
	}
	for _, name := range embeddedFiles {
		data, err := embeddedRules.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		rf, err := parseRules(name, data)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rf.rules {
			if r.Note == "" {
				t.Errorf("%s:%d: rule %s has no note", name, r.line, r.Name)
			}
			if strings.HasSuffix(name, "providers.toml") && r.Provider == "" {
				t.Errorf("%s:%d: rule %s names no provider", name, r.line, r.Name)
			}
			if !used[r.Name] {
				t.Errorf("%s:%d: rule %s is never reached", name, r.line, r.Name)
			}
		}
	}
}
