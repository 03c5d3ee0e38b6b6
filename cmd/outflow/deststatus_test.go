package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/outflow/outflow/internal/testutil/testqueue"
	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/throttle"
)

// TestDestStatusGroupConnsAndWholeLines: `dest status` names the provider
// group a domain is in, a connection override, a pin and connection limit
// on the whole destination when the workers send from egress addresses
// ("all sources:"), and for DEST@SOURCE what is set on the destination
// and its group ("whole dest:"). The state is written as the admin
// commands and rules write it, and the worker's view comes from a fake
// worker answering the status request as `outflow serve` does
// (serveDestStatus): gmail.com is in the group google and the worker
// sends from one egress address; solo.example is its own destination and
// the worker has no egress addresses.
func TestDestStatusGroupConnsAndWholeLines(t *testing.T) {
	dir := t.TempDir()
	q := testqueue.Connect(t, testqueue.Listening(t, dir), queue.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	const src = "192.0.2.10"
	stop, err := q.ServeDestStatus(func(dest string) []byte {
		name, source := throttle.SplitPair(strings.TrimSpace(dest))
		ws := throttle.WorkerStatus{Worker: "w/0"}
		switch name {
		case "gmail.com":
			ws.Dest = throttle.PairName("google", source)
			if source == "" {
				ws.Sources = []throttle.DestStatus{{Dest: throttle.PairName("google", src), Breaker: "closed"}}
			}
		default:
			ws.Dest = throttle.PairName(name, source)
		}
		ws.Breaker = "closed"
		b, _ := json.Marshal(ws)
		return b
	})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()

	run := func(args ...string) string { t.Helper(); return runAdmin(t, ctx, dir, false, args...) }
	run("dest", "rate", "gmail.com", "--max", "5")
	run("dest", "rate", "google", "--max", "20", "--for", "1h")
	run("dest", "rate", "solo.example", "--max", "7")
	kv, err := throttle.OpenState(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	// No admin command sets a connection override; a rule does, with
	// the state API.
	if err := throttle.SetConns(ctx, kv, "gmail.com", 3, time.Time{}, "test"); err != nil {
		t.Fatal(err)
	}
	if err := throttle.SetConns(ctx, kv, "solo.example", 2, time.Now().Add(time.Hour), "test"); err != nil {
		t.Fatal(err)
	}

	has := func(out string, want ...string) {
		t.Helper()
		for _, w := range want {
			if !strings.Contains(out, w) {
				t.Errorf("dest status lacks %q:\n%s", w, out)
			}
		}
	}
	lacks := func(out string, prefixes ...string) {
		t.Helper()
		for _, p := range prefixes {
			if strings.Contains(out, "\n"+p) {
				t.Errorf("dest status has a %q line it should not:\n%s", p, out)
			}
		}
	}

	t.Run("domain in a group, workers with sources", func(t *testing.T) {
		out := run("dest", "status", "gmail.com")
		has(out,
			"destination:   gmail.com\n",
			"\ngroup:         google (gmail.com's mail is also held to what is set on gmail.com itself)\n",
			"\nrate override: 5/s until changed\n",
			"\nconns:         3 (override) until changed\n",
			"\nall sources:   at most 5/s and 3 connections on the total from every source address, on top of each address's own limits\n",
			"\nper source address (dest status DEST@SOURCE for one):\n")
		// Without a source the destination's own lines are its own: no
		// whole dest lines.
		lacks(out, "whole dest:")
	})

	t.Run("one source", func(t *testing.T) {
		out := run("dest", "status", "gmail.com@"+src)
		has(out,
			"destination:   gmail.com@"+src+"\n",
			"\ngroup:         google (gmail.com's mail is also held to what is set on gmail.com itself)\n",
			"\nwhole dest:    gmail.com: at most 5/s and 3 connections on the total from every source, on top of this address's own\n",
			"\nwhole dest:    google: at most 20/s on the total from every source, on top of this address's own\n",
			" (all of gmail.com's mail, from any source: an envelope takes its source at each attempt)\n")
		// The pair has no override of its own, and "all sources" is for
		// the destination without a source.
		lacks(out, "rate override:", "conns:", "all sources:")
	})

	t.Run("own destination, workers without sources", func(t *testing.T) {
		out := run("dest", "status", "solo.example")
		until := "\nconns:         2 (override) until "
		has(out, "\nrate override: 7/s until changed\n", until)
		if i := strings.Index(out, until); i >= 0 {
			line := out[i+len(until):]
			line = line[:strings.IndexByte(line, '\n')]
			if at, err := time.Parse(time.RFC3339, line); err != nil || time.Until(at) <= 0 {
				t.Errorf("conns override until %q (%v), want a time to come", line, err)
			}
		}
		lacks(out, "group:", "all sources:", "whole dest:", "per source address")
	})

	t.Run("nothing set", func(t *testing.T) {
		out := run("dest", "status", "calm.example@"+src)
		lacks(out, "group:", "conns:", "all sources:", "whole dest:")
		has(out, "\nsuspended:     no\n")
	})
}

// TestDestStatusHelpers: groupOf and ownLimitsText, with hand-made views
// and limits.
func TestDestStatusHelpers(t *testing.T) {
	view := func(dest string) throttle.WorkerStatus {
		return throttle.WorkerStatus{Worker: "w", DestStatus: throttle.DestStatus{Dest: dest}}
	}
	for _, c := range []struct {
		views  []throttle.WorkerStatus
		domain string
		want   string
	}{
		{nil, "gmail.com", ""},
		{[]throttle.WorkerStatus{view("gmail.com")}, "gmail.com", ""},
		{[]throttle.WorkerStatus{view("gmail.com@192.0.2.10")}, "gmail.com", ""},
		{[]throttle.WorkerStatus{view("google")}, "gmail.com", "google"},
		{[]throttle.WorkerStatus{view("google@192.0.2.10")}, "gmail.com", "google"},
		// A worker that has not (yet) the group counts for nothing; one
		// that has it names it.
		{[]throttle.WorkerStatus{view("gmail.com"), view("google")}, "gmail.com", "google"},
		// Asked for a group, the group is no group of its own.
		{[]throttle.WorkerStatus{view("google")}, "google", ""},
	} {
		var names []string
		for _, v := range c.views {
			names = append(names, v.Dest)
		}
		if got := groupOf(c.views, c.domain); got != c.want {
			t.Errorf("groupOf(%v, %q) = %q, want %q", names, c.domain, got, c.want)
		}
	}

	for _, c := range []struct {
		r    float64
		c    int
		want string
	}{
		{5, 0, "at most 5/s"},
		{0, 2, "at most 2 connections"},
		{5, 2, "at most 5/s and 2 connections"},
		{4.134160073737176, 4, "at most 4.13/s and 4 connections"},
		{0, 1, "at most 1 connection"},
		{0.5, 0, "at most 0.5/s"},
	} {
		if got := ownLimitsText(c.r, c.c); got != c.want {
			t.Errorf("ownLimitsText(%v, %d) = %q, want %q", c.r, c.c, got, c.want)
		}
	}
}

// TestDestRateClearSaysWhetherThereWasACap: `dest rate --clear` of a
// destination with no cap (a name mistyped, a cap cleared already) says
// so, as `dest resume` and `dest forget` do, instead of "cleared".
func TestDestRateClearSaysWhetherThereWasACap(t *testing.T) {
	dir := t.TempDir()
	testqueue.Connect(t, testqueue.Listening(t, dir), queue.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	run := func(args ...string) string { t.Helper(); return runAdmin(t, ctx, dir, false, args...) }
	run("dest", "rate", "capped.example", "--max", "5")
	if out := run("dest", "rate", "capped.example", "--clear"); !strings.Contains(out, "rate cap cleared") {
		t.Errorf("clearing a cap: %q", out)
	}
	for _, dest := range []string{"capped.example", "never.example"} {
		if out := run("dest", "rate", dest, "--clear"); !strings.Contains(out, "had no rate cap; nothing to clear") {
			t.Errorf("clearing %s without a cap: %q", dest, out)
		}
	}
}
