package main

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/outflow/outflow/backoff"
	"github.com/outflow/outflow/webhook"
)

// runScheduleCmd runs a fresh `outflow schedule` in process and returns its
// standard output.
func runScheduleCmd(t *testing.T, args ...string) (string, error) {
	t.Helper()
	c := newScheduleCmd()
	var out bytes.Buffer
	c.SetOut(&out)
	c.SetErr(io.Discard)
	c.SetArgs(args)
	err := c.Execute()
	return out.String(), err
}

func parseLines(t *testing.T, out string) []map[string]any {
	t.Helper()
	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("not a JSON line: %q: %v", l, err)
		}
		lines = append(lines, m)
	}
	return lines
}

// TestScheduleReplaysLoggedDecision: the daemon logs decisions with fresh
// seeds; `outflow schedule` given a line's seed, worker, attempt and
// parameters prints the same figures for that attempt.
func TestScheduleReplaysLoggedDecision(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for i, b := range []backoff.Backoff{backoff.DefaultRetry(), backoff.DefaultRateLimit(),
		{Lane: "custom", Base: 1700 * time.Millisecond, Min: 250 * time.Millisecond, Cap: 11 * time.Minute, Multiplier: 1.7, ContentionWindow: 3500 * time.Millisecond}} {
		for j := range 20 {
			attempt := 1 + rng.IntN(15)
			worker := fmt.Sprintf("mx-%d/%d", i, j)
			seed := rng.Uint64() // as backoff.NewSeed would
			hint := time.Duration(0)
			if j%5 == 0 {
				hint = time.Duration(rng.IntN(600)) * time.Second
			}
			d := b.Decide(attempt, worker, seed, hint)
			var buf bytes.Buffer
			backoff.Record{MsgID: "m", Attempt: attempt + j%3, WorkerID: worker, Lane: b.Lane, Decision: d,
				NextAttemptAt: d.At(time.Now())}.LogOutcome(zerolog.New(&buf), "", nil)
			var logged map[string]any
			if err := json.Unmarshal(buf.Bytes(), &logged); err != nil {
				t.Fatal(err)
			}
			ms := func(k string) string { return fmt.Sprintf("%dms", int64(logged[k].(float64))) }
			args := []string{
				"--seed", logged["jitter_seed"].(string),
				"--worker", logged["worker_id"].(string),
				"--attempts", fmt.Sprint(logged["backoff_attempt"]),
				"--base", ms("base_ms"), "--min", ms("min_ms"), "--cap", ms("cap_ms"),
				"--window", ms("window_ms"), "--hint", ms("hint_ms"),
				"--multiplier", strconv.FormatFloat(logged["multiplier"].(float64), 'g', -1, 64),
				"--json",
			}
			out, err := runScheduleCmd(t, args...)
			if err != nil {
				t.Fatalf("schedule %v: %v", args, err)
			}
			lines := parseLines(t, out)
			last := lines[len(lines)-1]
			if last["attempt"] != logged["backoff_attempt"] {
				t.Errorf("schedule's last attempt %v, logged backoff_attempt %v", last["attempt"], logged["backoff_attempt"])
			}
			for _, k := range []string{"nominal_ms", "cap_ms", "jitter_seed", "jitter_ms", "offset_ms", "delay_ms"} {
				if last[k] != logged[k] {
					t.Errorf("%s: schedule printed %v, daemon logged %v\nargs %v\nlog %s", k, last[k], logged[k], args, buf.Bytes())
				}
			}
		}
	}
}

// TestScheduleRuns: --runs R prints R timelines with seeds S, S+1, ...,
// cumulative at_ms, and the design's JSON fields only.
func TestScheduleRuns(t *testing.T) {
	out, err := runScheduleCmd(t, "--seed", "0xfffffffffffffffe", "--runs", "3", "--attempts", "4", "--worker", "w", "--json")
	if err != nil {
		t.Fatal(err)
	}
	lines := parseLines(t, out)
	if len(lines) != 12 {
		t.Fatalf("%d lines, want 12", len(lines))
	}
	wantSeeds := []string{"18446744073709551614", "18446744073709551615", "0"} // wraps
	var at float64
	for i, l := range lines {
		run, attempt := i/4, i%4+1
		if l["run"] != float64(run) || l["attempt"] != float64(attempt) || l["jitter_seed"] != wantSeeds[run] {
			t.Errorf("line %d: %v", i, l)
		}
		if attempt == 1 {
			at = 0
		}
		at += l["delay_ms"].(float64)
		if l["at_ms"] != at {
			t.Errorf("line %d: at_ms %v, want %v", i, l["at_ms"], at)
		}
		if len(l) != 9 {
			t.Errorf("line %d has %d fields, want 9: %v", i, len(l), l)
		}
	}
}

func TestScheduleHuman(t *testing.T) {
	out, err := runScheduleCmd(t, "--seed", "42", "--worker", "host-a/3", "--attempts", "3", "--runs", "2")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"lane retry  base 5s  min 1s  cap 15m0s  multiplier 2  window 2s",
		"run 0  seed 42 (0x2a)", "run 1  seed 43 (0x2b)",
		"attempt  nominal    cap   jitter  offset    delay       at", "12.355s", "25.39s", // attempt 3 of seed 42, see coordinator's pinned values
		"total window 25.39s over 3 attempts", "total window over 2 runs",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// TestScheduleLaneDefaults: --lane ratelimit fills unset parameters from
// the rate-limit lane; flags given still win.
func TestScheduleLaneDefaults(t *testing.T) {
	out, err := runScheduleCmd(t, "--lane", "ratelimit", "--cap", "20m", "--seed", "1", "--attempts", "1", "--json")
	if err != nil {
		t.Fatal(err)
	}
	l := parseLines(t, out)[0]
	rl := backoff.DefaultRateLimit()
	if l["nominal_ms"] != float64(2*rl.Base.Milliseconds()) || l["cap_ms"] != float64(20*time.Minute/time.Millisecond) {
		t.Errorf("ratelimit line %v", l)
	}
}

func TestScheduleUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"--seed", "-1"},
		{"--seed", "0xzz"},
		{"--lane", "fast"},
		{"--attempts", "0"},
		{"--runs", "0"},
		{"--min", "1h", "--cap", "1m"},
		{"--multiplier", "0.5"},
		{"--hint", "-1s"},
		{"--runs", "1000000", "--attempts", "6"},
	} {
		_, err := runScheduleCmd(t, args...)
		var u usageError
		if !errors.As(err, &u) {
			t.Errorf("%v: error %v, want a usage error", args, err)
		}
	}
}

// TestSchedulePlot: --plot writes a well-formed SVG with one strip per
// attempt, the same for the same seed, and prints the spread table.
func TestSchedulePlot(t *testing.T) {
	dir := t.TempDir()
	svg := func(name string) []byte {
		t.Helper()
		path := filepath.Join(dir, name)
		out, err := runScheduleCmd(t, "--runs", "500", "--attempts", "6", "--seed", "9", "--worker", "a<b&c", "--plot", path)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out, "p50") || !strings.Contains(out, "wrote "+path) {
			t.Errorf("output:\n%s", out)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	one, two := svg("one.svg"), svg("two.svg")
	if !bytes.Equal(one, two) {
		t.Error("same seed, different plots")
	}
	dec := xml.NewDecoder(bytes.NewReader(one))
	strips := 0
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("SVG is not well-formed XML: %v", err)
		}
		if cd, ok := tok.(xml.CharData); ok && strings.HasPrefix(string(cd), "attempt ") {
			strips++
		}
	}
	if strips != 6 {
		t.Errorf("%d attempt strips, want 6", strips)
	}
	if _, err := runScheduleCmd(t, "--plot", filepath.Join(dir, "missing", "x.svg")); err == nil {
		t.Error("plot into a missing directory: no error")
	}
}

// TestScheduleReplaysWebhookDeferral: a "webhook deferred" line (the
// dispatcher's, with its default schedule) replays with --lane webhook and
// only the line's jitter_seed, worker_id, backoff_attempt and hint_ms:
// the last line printed has the logged delay_ms. The line here is made
// with webhook.DefaultBackoff, which the dispatcher uses
// (webhook.TestWebhookDeferralReplays checks a real line against it).
func TestScheduleReplaysWebhookDeferral(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 3))
	b := webhook.DefaultBackoff()
	for j := range 20 {
		attempt := 1 + rng.IntN(webhook.DefaultMaxAttempts-1)
		worker := fmt.Sprintf("mx-%d", j)
		seed := rng.Uint64()
		hint := time.Duration(0)
		if j%4 == 0 {
			hint = time.Duration(1+rng.IntN(600)) * time.Second // Retry-After
		}
		d := b.Decide(attempt, worker, seed, hint)
		args := []string{"--lane", "webhook", "--seed", strconv.FormatUint(d.JitterSeed, 10), "--worker", worker,
			"--attempts", strconv.Itoa(d.Attempt), "--hint", fmt.Sprintf("%dms", d.HintMs), "--json"}
		out, err := runScheduleCmd(t, args...)
		if err != nil {
			t.Fatalf("schedule %v: %v", args, err)
		}
		lines := parseLines(t, out)
		last := lines[len(lines)-1]
		if last["delay_ms"] != float64(d.DelayMs) || last["cap_ms"] != float64(d.CapMs) || last["nominal_ms"] != float64(d.NominalMs) {
			t.Errorf("schedule %v: %v, the dispatcher decided %+v", args, last, d)
		}
	}
	out, err := runScheduleCmd(t, "--lane", "webhook", "--seed", "1", "--attempts", "1")
	if err != nil || !strings.Contains(out, "lane webhook  base 2s  min 1s  cap 5m0s  multiplier 2  window 2s") {
		t.Errorf("--lane webhook: %v\n%s", err, out)
	}
}
