package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/outflow/outflow/api"
	"github.com/outflow/outflow/internal/testutil"
	"github.com/outflow/outflow/internal/testutil/testqueue"
	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/throttle"
	"github.com/outflow/outflow/webhook"
)

// runAdmin runs `outflow ARGS --data dir --json=asJSON` in process and
// returns its standard output.
func runAdmin(t *testing.T, ctx context.Context, dir string, asJSON bool, args ...string) string {
	t.Helper()
	var out bytes.Buffer
	if err := execRoot(ctx, &out, append(args, "--data", dir, "--json="+strconv.FormatBool(asJSON))...); err != nil {
		t.Fatalf("outflow %s: %v", strings.Join(args, " "), err)
	}
	return out.String()
}

// execRoot runs `outflow ARGS` in process with ctx, its standard output to
// out (nil: discarded), and then puts rootCmd back as it was: cobra keeps
// every flag's value, and each command's context, from one run to the next,
// and a subcommand run later would inherit a test's context long cancelled.
func execRoot(ctx context.Context, out io.Writer, args ...string) error {
	if out == nil {
		out = io.Discard
	}
	markUsageErrors(rootCmd)
	rootCmd.SetArgs(args)
	rootCmd.SetOut(out)
	rootCmd.SetErr(io.Discard)
	defer func() {
		rootCmd.SetArgs(nil)
		rootCmd.SetIn(nil)
		rootCmd.SetOut(nil)
		rootCmd.SetErr(nil)
		resetCommands(rootCmd)
	}()
	return rootCmd.ExecuteContext(ctx)
}

// resetCommands puts every flag of c and its subcommands back to its
// default, unset, and forgets their contexts.
func resetCommands(c *cobra.Command) {
	reset := func(f *pflag.Flag) {
		if sv, ok := f.Value.(pflag.SliceValue); ok {
			_ = sv.Replace(nil)
		} else {
			_ = f.Value.Set(f.DefValue)
		}
		f.Changed = false
	}
	c.LocalNonPersistentFlags().VisitAll(reset)
	c.PersistentFlags().VisitAll(reset)
	//lint:ignore SA1012 cobra hands the parent's context on only to a command whose own is nil
	c.SetContext(nil)
	for _, s := range c.Commands() {
		resetCommands(s)
	}
}

// oneObject decodes out as exactly one JSON object on one line.
func oneObject(t *testing.T, out string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(out), &m); err != nil || strings.Count(out, "\n") != 1 || !strings.HasSuffix(out, "\n") {
		t.Fatalf("want one JSON object on one line, got %q (%v)", out, err)
	}
	return m
}

// docKeys are the keys docs/configuration.md gives for verb's --json
// object: the quoted names that open the object or follow a comma in the
// row's second cell (not the values, which follow a colon).
func docKeys(t *testing.T, verb string) []string {
	t.Helper()
	row := testutil.DocSection(t, "../../docs/configuration.md", "| `"+verb, "\n")
	cells := strings.Split(row, " | ")
	if len(cells) < 3 {
		t.Fatalf("docs/configuration.md: the row of %s has no --json cell: %q", verb, row)
	}
	var keys []string
	for _, m := range regexp.MustCompile(`(?:\{|, )"([a-z_]+)"`).FindAllStringSubmatch(cells[1], -1) {
		keys = append(keys, m[1])
	}
	sort.Strings(keys)
	return keys
}

// documented fails unless got has exactly the keys the doc row of verb
// names.
func documented(t *testing.T, verb string, got map[string]any) {
	t.Helper()
	var keys []string
	for k := range got {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	if want := docKeys(t, verb); !reflect.DeepEqual(keys, want) {
		t.Errorf("%s --json has keys %v, docs/configuration.md says %v", verb, keys, want)
	}
}

// TestChangeVerbsHonourJSON: every verb that changes something prints one
// JSON object with --json, with the fields its sentence carries and the
// names the other verbs and the HTTP API use, and without --json the
// sentence scripts already parse, byte for byte.
func TestChangeVerbsHonourJSON(t *testing.T) {
	dir := t.TempDir()
	q := testqueue.Connect(t, testqueue.Listening(t, dir), queue.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	run := func(asJSON bool, args ...string) string { t.Helper(); return runAdmin(t, ctx, dir, asJSON, args...) }
	text := func(want string, args ...string) {
		t.Helper()
		if got := run(false, args...); got != want {
			t.Errorf("outflow %s: printed %q, want %q", strings.Join(args, " "), got, want)
		}
	}
	// fields checks want's fields in got, and got's keys against the
	// doc row of verb.
	fields := func(verb string, got map[string]any, want map[string]any) {
		t.Helper()
		documented(t, verb, got)
		for k, w := range want {
			if g, ok := got[k]; !ok || !reflect.DeepEqual(g, w) {
				t.Errorf("%v: %s = %#v, want %#v", got, k, g, w)
			}
		}
	}

	t.Run("suppress", func(t *testing.T) {
		add := []string{"suppress", "add", "Ann@One.example", "--tenant", "shop", "--reason", "unsubscribed"}
		before := time.Now().UTC().Truncate(time.Second)
		entry := oneObject(t, run(true, append(add, "--for", "720h")...))
		fields("suppress add", entry, map[string]any{"tenant": "shop", "address": "ann@one.example", "reason": "unsubscribed", "source": "admin"})
		created, err := time.Parse(time.RFC3339, entry["created"].(string))
		if err != nil || created.Before(before) {
			t.Errorf("created %v (%v), want a time from %v on", entry["created"], err, before)
		}
		if exp, err := time.Parse(time.RFC3339, entry["expires"].(string)); err != nil || exp.Sub(created) < 720*time.Hour-time.Second {
			t.Errorf("expires %v (%v), want 720h after created", entry["expires"], err)
		}
		// The entry printed is the entry stored: `suppress list` shows it.
		if listed := oneObject(t, run(true, "suppress", "list", "--tenant", "shop")); !reflect.DeepEqual(listed, entry) {
			t.Errorf("suppress list --json: %v, want what add printed, %v", listed, entry)
		}
		text("suppressed ann@one.example for tenant shop\n", append(add, "--for", "0s")...)

		remove := []string{"suppress", "remove", "ANN@one.example", "--tenant", "shop"}
		fields("suppress remove", oneObject(t, run(true, remove...)), map[string]any{"tenant": "shop", "address": "ann@one.example", "removed": true})
		run(false, append(add, "--for", "0s")...)
		text("removed ann@one.example for tenant shop\n", remove...)
	})

	t.Run("webhook", func(t *testing.T) {
		store, err := webhook.Open(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		var eps [2]*webhook.Endpoint
		for i := range eps {
			if eps[i], err = store.Add(ctx, "shop", "http://127.0.0.1:9/hook", nil); err != nil {
				t.Fatal(err)
			}
		}
		id := eps[0].ID
		fields("webhook test", oneObject(t, run(true, "webhook", "test", id)),
			map[string]any{"id": id, "tenant": "shop", "type": webhook.EventTest, "published": true})
		text("test event published for "+id+"\n", "webhook", "test", id)
		fields("webhook replay", oneObject(t, run(true, "webhook", "replay", id)), map[string]any{"id": id, "replayed": 0.0})
		text("replaying 0 dead letter(s) of "+id+"\n", "webhook", "replay", id)
		fields("webhook remove", oneObject(t, run(true, "webhook", "remove", id)), map[string]any{"id": id, "removed": true})
		text("removed "+eps[1].ID+"\n", "webhook", "remove", eps[1].ID)
	})

	t.Run("dest rate", func(t *testing.T) {
		// The destination as it is stored: "Slow.TEST." is slow.test.
		capped := oneObject(t, run(true, "dest", "rate", "Slow.TEST.", "--max", "5", "--for", "1h"))
		fields("dest rate", capped, map[string]any{"dest": "slow.test", "rate": 5.0})
		if until, err := time.Parse(time.RFC3339, capped["until"].(string)); err != nil || time.Until(until) <= 0 {
			t.Errorf("until %v (%v), want a time to come", capped["until"], err)
		}
		// Until changed: no time to print (not the zero time).
		if open := oneObject(t, run(true, "dest", "rate", "slow.test", "--max", "5", "--for", "0s")); len(open) != 2 {
			t.Errorf("dest rate without --for: %v, want dest and rate only", open)
		}
		text("slow.test: at most 5/s until changed\n", "dest", "rate", "slow.test", "--max", "5", "--for", "0s")

		// --clear removes the cap, and says whether there was one.
		if cleared := oneObject(t, run(true, "dest", "rate", "slow.test", "--clear")); !reflect.DeepEqual(cleared, map[string]any{"dest": "slow.test", "rate": 0.0, "cleared": true}) {
			t.Errorf("dest rate --clear: %v, want dest, rate 0 and cleared", cleared)
		}
		kv, err := throttle.OpenState(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		if st, err := throttle.GetState(ctx, kv, "slow.test"); err != nil || st.RateOverride != 0 || !st.RateUntil.IsZero() {
			t.Errorf("after --clear: override %v until %v (%v), want none", st.RateOverride, st.RateUntil, err)
		}
		text("slow.test: had no rate cap; nothing to clear\n", "dest", "rate", "slow.test", "--clear")
		run(false, "dest", "rate", "slow.test", "--max", "5")
		text("slow.test: rate cap cleared (the configured or learned rate applies)\n", "dest", "rate", "slow.test", "--clear")
	})

	t.Run("dest resume", func(t *testing.T) {
		fields("dest resume", oneObject(t, run(true, "dest", "resume", "calm.test")), map[string]any{"dest": "calm.test", "resumed": false})
		text("calm.test: was neither suspended nor held by its breaker; nothing to resume\n", "dest", "resume", "calm.test")
		run(false, "dest", "suspend", "calm.test", "--for", "1h")
		fields("dest resume", oneObject(t, run(true, "dest", "resume", "calm.test")), map[string]any{"dest": "calm.test", "resumed": true})
	})

	t.Run("apikey", func(t *testing.T) {
		keys, err := api.OpenKeys(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		var infos [2]*api.KeyInfo
		for i := range infos {
			if _, infos[i], err = keys.Create(ctx, "shop", false); err != nil {
				t.Fatal(err)
			}
		}
		got := oneObject(t, run(true, "apikey", "revoke", infos[0].ID))
		fields("apikey revoke", got, map[string]any{"id": infos[0].ID, "tenant": "shop", "revoked": true})
		if _, ok := got["hash"]; ok {
			t.Errorf("apikey revoke --json shows the key's hash: %v", got)
		}
		text("revoked "+infos[1].ID+" (tenant shop)\n", "apikey", "revoke", infos[1].ID)
	})
}
