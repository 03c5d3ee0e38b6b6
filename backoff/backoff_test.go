package backoff

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// policies are the parameter sets the properties are checked on: the two
// lane defaults and some awkward ones (float multiplier, min 0, min = cap,
// window not a whole number of seconds, base above cap).
func policies() []Backoff {
	return []Backoff{
		DefaultRetry(),
		DefaultRateLimit(),
		{Lane: "float", Base: 1300 * time.Millisecond, Min: 0, Cap: 7 * time.Minute, Multiplier: 1.5, ContentionWindow: 1234 * time.Millisecond},
		{Lane: "flat", Base: time.Second, Min: 3 * time.Second, Cap: 3 * time.Second, Multiplier: 1, ContentionWindow: 0},
		{Lane: "huge-base", Base: time.Hour, Min: 10 * time.Second, Cap: time.Minute, Multiplier: 3, ContentionWindow: 5 * time.Second},
	}
}

func TestDefaultsValidate(t *testing.T) {
	for _, b := range []Backoff{DefaultRetry(), DefaultRateLimit()} {
		if err := b.Validate(); err != nil {
			t.Errorf("%s: %v", b.Lane, err)
		}
	}
	r, rl := DefaultRetry(), DefaultRateLimit()
	if rl.Base <= r.Base || rl.Min <= r.Min || rl.Cap < r.Cap || rl.ContentionWindow <= r.ContentionWindow {
		t.Errorf("rate-limit lane %+v is not slower and wider than retry lane %+v", rl, r)
	}
	for _, lane := range []string{LaneRetry, LaneRateLimit} {
		b, err := ForLane(lane)
		if err != nil || b.Lane != lane {
			t.Errorf("ForLane(%q) = %+v, %v", lane, b, err)
		}
	}
	if _, err := ForLane("fast"); err == nil {
		t.Error(`ForLane("fast"): no error`)
	}
}

func TestValidateRejects(t *testing.T) {
	for name, mutate := range map[string]func(*Backoff){
		"zero base":      func(b *Backoff) { b.Base = 0 },
		"zero cap":       func(b *Backoff) { b.Cap = 0 },
		"negative min":   func(b *Backoff) { b.Min = -time.Second },
		"min above cap":  func(b *Backoff) { b.Min = b.Cap + time.Millisecond },
		"multiplier < 1": func(b *Backoff) { b.Multiplier = 0.5 },
		"multiplier NaN": func(b *Backoff) { b.Multiplier = math.NaN() },
		"multiplier Inf": func(b *Backoff) { b.Multiplier = math.Inf(1) },
		"negative window": func(b *Backoff) {
			b.ContentionWindow = -time.Second
		},
	} {
		b := DefaultRetry()
		mutate(&b)
		if err := b.Validate(); err == nil {
			t.Errorf("%s: Validate accepted %+v", name, b)
		}
	}
}

// TestDelayWithinBounds: over many seeds, attempts and worker ids, every
// jittered delay lies in [min, cap], every delay in [min, cap] + offset,
// and the offset in [0, window).
func TestDelayWithinBounds(t *testing.T) {
	for _, b := range policies() {
		minMs, capMs := b.Min.Milliseconds(), b.Cap.Milliseconds()
		for seed := uint64(0); seed < 2000; seed++ {
			worker := fmt.Sprintf("host-%d/%d", seed%7, seed%13)
			off := Offset(worker, b.ContentionWindow).Milliseconds()
			if off < 0 || (b.ContentionWindow > 0 && off >= b.ContentionWindow.Milliseconds()) || (b.ContentionWindow == 0 && off != 0) {
				t.Fatalf("%s: offset %d ms outside [0, %v)", b.Lane, off, b.ContentionWindow)
			}
			attempt := 1 + int(seed%40)
			d := b.Decide(attempt, worker, seed, 0)
			if d.JitterMs < minMs || d.JitterMs > capMs {
				t.Fatalf("%s attempt %d seed %d: jitter %d ms outside [%d, %d]", b.Lane, attempt, seed, d.JitterMs, minMs, capMs)
			}
			if d.DelayMs < minMs+off || d.DelayMs > capMs+off {
				t.Fatalf("%s attempt %d seed %d: delay %d ms outside [%d, %d] + %d", b.Lane, attempt, seed, d.DelayMs, minMs, capMs, off)
			}
			if d.OffsetMs != off || d.DelayMs != d.JitterMs+d.OffsetMs || d.Delay != time.Duration(d.DelayMs)*time.Millisecond {
				t.Fatalf("%s: inconsistent decision %+v (offset %d)", b.Lane, d, off)
			}
			if span := min(d.NominalMs, capMs); d.JitterMs > max(span, minMs) {
				t.Fatalf("%s: jitter %d ms above the full-jitter range %d ms", b.Lane, d.JitterMs, span)
			}
		}
	}
}

// TestDeterministic: the same inputs give the same decision, and the PRNG
// and hash are pinned to published or recorded values, so a seed logged
// today replays the same delay with any future build.
func TestDeterministic(t *testing.T) {
	for _, b := range policies() {
		for seed := uint64(0); seed < 500; seed++ {
			s := seed * 0x9e3779b97f4a7c15
			a := b.Decide(int(seed%20)+1, "w", s, 0)
			if c := b.Decide(int(seed%20)+1, "w", s, 0); a != c {
				t.Fatalf("%s seed %d: %+v then %+v", b.Lane, s, a, c)
			}
		}
	}
	// SplitMix64's reference output for seed 0 (first value) is
	// 0xe220a8397b1dcdaf (Vigna's splitmix64.c).
	if got, want := Draw(0, 1), float64(uint64(0xe220a8397b1dcdaf)>>11)*0x1p-53; got != want {
		t.Errorf("Draw(0, 1) = %v, want %v", got, want)
	}
	// Recorded values: changing any of these breaks the replay of logged
	// decisions.
	d := DefaultRetry().Decide(3, "host-a/3", 42, 0)
	if d.NominalMs != 40000 || d.CapMs != 900000 || d.JitterMs != 11144 || d.OffsetMs != 1211 || d.DelayMs != 12355 {
		t.Errorf("DefaultRetry().Decide(3, host-a/3, 42) = %+v, want nominal 40000 jitter 11144 offset 1211 delay 12355", d)
	}
}

// TestFloatMultiplier: a fractional multiplier is applied in float seconds,
// never to a truncated time.Duration (maddy's bug).
func TestFloatMultiplier(t *testing.T) {
	b := Backoff{Base: time.Second, Cap: time.Hour, Multiplier: 1.5}
	for attempt, want := range map[int]int64{1: 1500, 2: 2250, 3: 3375, 4: 5062} {
		if got := b.Decide(attempt, "", 1, 0).NominalMs; got != want {
			t.Errorf("attempt %d: nominal %d ms, want %d", attempt, got, want)
		}
	}
}

// TestOverflow: late attempts saturate rather than wrap.
func TestOverflow(t *testing.T) {
	b := DefaultRetry()
	for _, attempt := range []int{62, 64, 1000, math.MaxInt32, math.MaxInt} {
		d := b.Decide(attempt, "w", 7, 0)
		if d.NominalMs != math.MaxInt64 && attempt > 100 {
			t.Errorf("attempt %d: nominal %d, want saturated", attempt, d.NominalMs)
		}
		if d.DelayMs < b.Min.Milliseconds() || d.DelayMs > b.Cap.Milliseconds()+b.ContentionWindow.Milliseconds() {
			t.Errorf("attempt %d: delay %d ms out of bounds", attempt, d.DelayMs)
		}
	}
	if d := b.Decide(0, "w", 7, 0); d.Attempt != 1 {
		t.Errorf("attempt 0 decided as %d, want 1", d.Attempt)
	}
}

// TestNormalized: Decide makes do with out-of-range parameters.
func TestNormalized(t *testing.T) {
	b := Backoff{Base: -time.Second, Min: time.Hour, Cap: time.Minute, Multiplier: math.NaN(), ContentionWindow: -time.Second}
	for seed := uint64(0); seed < 100; seed++ {
		if d := b.Decide(5, "w", seed, 0); d.DelayMs != time.Minute.Milliseconds() || d.Multiplier != 1 {
			t.Fatalf("seed %d: %+v, want delay = cap", seed, d)
		}
	}
}

func TestHint(t *testing.T) {
	b := DefaultRetry()
	short := b.Decide(1, "w", 9, time.Millisecond)
	plain := b.Decide(1, "w", 9, 0)
	hinted := func(d Decision) bool { return d.HintMs > 0 && d.HintMs > d.JitterMs+d.OffsetMs }
	if short.DelayMs != plain.DelayMs || hinted(short) {
		t.Errorf("a shorter hint changed the delay: %+v vs %+v", short, plain)
	}
	long := b.Decide(1, "w", 9, 92*time.Second+time.Microsecond)
	if long.DelayMs != 92001 || long.Delay != 92001*time.Millisecond || !hinted(long) || long.JitterMs != plain.JitterMs {
		t.Errorf("a longer hint did not win (rounded up to ms): %+v", long)
	}
	// A hint beyond the cap still wins: the server knows better.
	if d := b.Decide(1, "w", 9, time.Hour); d.Delay != time.Hour {
		t.Errorf("hint of 1h gave %v", d.Delay)
	}
}

// ksD returns the Kolmogorov-Smirnov statistic of xs against the uniform
// distribution on [0, 1).
func ksD(xs []float64) float64 {
	xs = slices.Clone(xs)
	slices.Sort(xs)
	n := float64(len(xs))
	var d float64
	for i, x := range xs {
		d = max(d, float64(i+1)/n-x, x-float64(i)/n)
	}
	return d
}

// ksCrit01 is the KS critical value at the 1% level for n samples (the
// asymptotic 1.628/sqrt(n), accurate for n in the thousands). The samples
// are fixed, so this is a pinned property, not a flaky test.
func ksCrit01(n int) float64 { return 1.628 / math.Sqrt(float64(n)) }

// TestDrawUniform: the draw is uniform on [0, 1) for consecutive seeds (as
// `schedule --runs` uses them), for random seeds, and across attempts of
// one seed; and the jitter Decide derives from it is uniform on
// [0, min(nominal, cap)).
func TestDrawUniform(t *testing.T) {
	const n = 20000
	rng := rand.New(rand.NewPCG(1, 2))
	samples := map[string][]float64{}
	for i := range n {
		samples["consecutive seeds, attempt 1"] = append(samples["consecutive seeds, attempt 1"], Draw(uint64(i), 1))
		samples["random seeds, attempt 7"] = append(samples["random seeds, attempt 7"], Draw(rng.Uint64(), 7))
		samples["one seed, attempts 1..n"] = append(samples["one seed, attempts 1..n"], Draw(12345, i+1))
	}
	// min 0 so the clamp never bites; a cap of hours makes the ms
	// rounding negligible against the KS tolerance.
	b := Backoff{Base: time.Hour, Cap: 4 * time.Hour, Multiplier: 2}
	for i := range n {
		d := b.Decide(2, "w", uint64(i)+1e6, 0) // nominal 4h = cap
		samples["Decide jitter / span"] = append(samples["Decide jitter / span"], float64(d.JitterMs)/float64(d.CapMs))
	}
	for name, xs := range samples {
		if d, crit := ksD(xs), ksCrit01(len(xs)); d > crit {
			t.Errorf("%s: KS D = %.4f > %.4f: not uniform", name, d, crit)
		} else {
			t.Logf("%s: KS D = %.4f (critical %.4f)", name, d, crit)
		}
	}
}

// TestOffsetSpread: the offsets of 1,000 worker ids, named as operators
// name them, cover the window evenly (chi-square over 10 bins and KS), and
// a worker's offset depends on its id only.
func TestOffsetSpread(t *testing.T) {
	const window = 2 * time.Second
	namings := map[string]func(i int) string{
		"worker-N":   func(i int) string { return fmt.Sprintf("worker-%d", i) },
		"host/N":     func(i int) string { return fmt.Sprintf("mx-out-%02d.example.net/%d", i/16, i%16) },
		"hex suffix": func(i int) string { return fmt.Sprintf("outflow-%04x", i) },
	}
	for name, id := range namings {
		var bins [10]int
		xs := make([]float64, 1000)
		for i := range 1000 {
			off := Offset(id(i), window)
			if off != Offset(id(i), window) {
				t.Fatalf("%s: offset of %q not stable", name, id(i))
			}
			xs[i] = float64(off) / float64(window)
			bins[int(xs[i]*10)]++
		}
		var chi2 float64
		for _, c := range bins {
			chi2 += float64((c-100)*(c-100)) / 100
		}
		// 21.67 is the 1% critical value of chi-square with 9 degrees of
		// freedom.
		if chi2 > 21.67 {
			t.Errorf("%s: chi-square %.1f > 21.67 over bins %v: offsets not even", name, chi2, bins)
		}
		if d, crit := ksD(xs), ksCrit01(len(xs)); d > crit {
			t.Errorf("%s: KS D = %.4f > %.4f", name, d, crit)
		}
	}
	// Pinned: a worker keeps its offset across restarts and builds.
	if got := Offset("host-a/3", window); got != 1211*time.Millisecond {
		t.Errorf(`Offset("host-a/3", 2s) = %v, want 1.211s`, got)
	}
	if Offset("w", 0) != 0 || Offset("w", time.Microsecond) != 0 {
		t.Error("a window below 1 ms must give offset 0")
	}
}

func TestNewSeed(t *testing.T) {
	seen := map[uint64]bool{}
	for range 1000 {
		seen[NewSeed()] = true
	}
	if len(seen) < 1000 {
		t.Errorf("1000 seeds, %d distinct", len(seen))
	}
}

func TestParseSeed(t *testing.T) {
	for in, want := range map[string]uint64{
		"42":                   42,
		"0x2a":                 42,
		"0X2A":                 42,
		"0755":                 755, // not octal
		"18446744073709551615": math.MaxUint64,
		"0xffffffffffffffff":   math.MaxUint64,
	} {
		if got, err := ParseSeed(in); err != nil || got != want {
			t.Errorf("ParseSeed(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "-1", "0x", "1e3", "18446744073709551616", "0xg"} {
		if _, err := ParseSeed(in); err == nil {
			t.Errorf("ParseSeed(%q): no error", in)
		}
	}
}

func TestBudget(t *testing.T) {
	b := DefaultBudget()
	first := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		attempts int
		age      time.Duration
		why      string
	}{
		{1, 0, ""},
		{b.MaxAttempts - 1, b.MaxAge - time.Second, ""},
		{b.MaxAttempts, time.Minute, "max-attempts"},
		{3, b.MaxAge, "max-age"},
	} {
		done, why := b.Exhausted(c.attempts, first, first.Add(c.age))
		if done != (c.why != "") || why != c.why {
			t.Errorf("Exhausted(%d, age %v) = %v, %q; want %q", c.attempts, c.age, done, why, c.why)
		}
	}
	if done, _ := (Budget{}).Exhausted(1e6, first, first.Add(1e6*time.Hour)); done {
		t.Error("a zero budget must not limit")
	}
}

// ---- the decision record ----

// sampleRecord is a record as the worker builds it: a throttled reply with
// a server hint shorter than the computed delay, on the message's fourth
// attempt and its second throttle (the rate-limit lane's backoff attempt).
func sampleRecord(now time.Time) Record {
	b := DefaultRateLimit()
	d := b.Decide(2, "mx-out-03/7", 0xfedcba9876543210, 30*time.Second) // above 2^53: string in JSON
	return Record{
		MsgID:         "01JABCDEF",
		Tenant:        "billing",
		Dest:          "gmail.com",
		Attempt:       4,
		WorkerID:      "mx-out-03/7",
		Class:         "throttled",
		Rule:          "gmail-rate-4.7.28",
		Code:          421,
		EnhancedCode:  "4.7.28",
		Reply:         `421-4.7.28 Our system has detected an unusual rate of "mail"`,
		Lane:          b.Lane,
		Decision:      d,
		NextAttemptAt: d.At(now),
	}
}

// designFields are the fields design.md requires on every decision line.
var designFields = []string{
	"msg_id", "tenant", "dest", "attempt", "backoff_attempt", "worker_id", "class", "rule", "code",
	"enhanced_code", "reply", "lane", "nominal_ms", "cap_ms", "jitter_seed",
	"jitter_ms", "offset_ms", "delay_ms", "next_attempt_at",
}

// TestRecordLogReplay logs a record, parses the line, and recomputes the
// delay from the logged seed, worker, backoff attempt and parameters alone.
func TestRecordLogReplay(t *testing.T) {
	now := time.Date(2025, 3, 4, 5, 6, 7, 891_000_000, time.UTC)
	rec := sampleRecord(now)

	var buf bytes.Buffer
	// A logger at error level with a sampler that drops everything: the
	// decision line must still come out, exactly once.
	l := zerolog.New(&buf).Level(zerolog.ErrorLevel).Sample(&zerolog.BasicSampler{N: 1 << 30}).With().Timestamp().Logger()
	l.Error().Msg("burn the sampler's first slot")
	if buf.Len() == 0 {
		t.Fatal("the sampler did not let its first line through")
	}
	buf.Reset()
	rec.LogOutcome(l, "", nil)

	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	if len(lines) != 1 {
		t.Fatalf("%d lines logged, want 1: %q", len(lines), buf.String())
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &m); err != nil {
		t.Fatalf("log line is not JSON: %v: %s", err, lines[0])
	}
	for _, f := range designFields {
		if _, ok := m[f]; !ok {
			t.Errorf("log line lacks %q: %s", f, lines[0])
		}
	}
	if m["level"] != "info" || m["message"] != DecisionMessage {
		t.Errorf("level %v message %v", m["level"], m["message"])
	}
	if m["jitter_seed"] != "18364758544493064720" {
		t.Errorf("jitter_seed logged as %#v, want the decimal string", m["jitter_seed"])
	}

	// Replay from the line only.
	seed, err := ParseSeed(m["jitter_seed"].(string))
	if err != nil {
		t.Fatal(err)
	}
	ms := func(k string) time.Duration { return time.Duration(m[k].(float64)) * time.Millisecond }
	b := Backoff{Base: ms("base_ms"), Min: ms("min_ms"), Cap: ms("cap_ms"), Multiplier: m["multiplier"].(float64), ContentionWindow: ms("window_ms")}
	if m["attempt"] != 4.0 || m["backoff_attempt"] != 2.0 {
		t.Errorf("attempt %v backoff_attempt %v, want 4 and 2", m["attempt"], m["backoff_attempt"])
	}
	d := b.Decide(int(m["backoff_attempt"].(float64)), m["worker_id"].(string), seed, ms("hint_ms"))
	if d.DelayMs != int64(m["delay_ms"].(float64)) || d != rec.Decision {
		t.Errorf("replayed %+v, logged %s", d, lines[0])
	}
	next, err := time.Parse(time.RFC3339Nano, m["next_attempt_at"].(string))
	if err != nil || !next.Equal(now.Add(d.Delay)) {
		t.Errorf("next_attempt_at %v (%v), want %v", m["next_attempt_at"], err, now.Add(d.Delay))
	}

	// The line decodes back into the record (as `queue history` reads it).
	var back Record
	if err := json.Unmarshal([]byte(lines[0]), &back); err != nil {
		t.Fatal(err)
	}
	if !back.NextAttemptAt.Equal(rec.NextAttemptAt) {
		t.Errorf("next attempt %v, want %v", back.NextAttemptAt, rec.NextAttemptAt)
	}
	back.NextAttemptAt = rec.NextAttemptAt
	if back != rec {
		t.Errorf("decoded\n%+v\nwant\n%+v", back, rec)
	}
}

// TestRecordJSONMatchesLog: the event-stream form and the log line carry
// the same fields with the same values.
func TestRecordJSONMatchesLog(t *testing.T) {
	rec := sampleRecord(time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC))
	js, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	rec.LogOutcome(zerolog.New(&buf), "deferred", []string{"a@x.example", "b@x.example"})
	var fromJSON, fromLog map[string]any
	if err := json.Unmarshal(js, &fromJSON); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(buf.Bytes(), &fromLog); err != nil {
		t.Fatal(err)
	}
	if fromLog["outcome"] != "deferred" {
		t.Errorf("outcome %v in %s", fromLog["outcome"], buf.Bytes())
	}
	if r, _ := fromLog["rcpts"].([]any); len(r) != 2 || r[0] != "a@x.example" || r[1] != "b@x.example" {
		t.Errorf("rcpts %v in %s", fromLog["rcpts"], buf.Bytes())
	}
	delete(fromLog, "level")
	delete(fromLog, "message")
	delete(fromLog, "outcome")
	delete(fromLog, "rcpts")
	if len(fromJSON) != len(fromLog) {
		t.Errorf("JSON has %d fields, log %d:\n%s\n%s", len(fromJSON), len(fromLog), js, buf.Bytes())
	}
	for k, v := range fromJSON {
		if fromLog[k] != v {
			t.Errorf("%s: JSON %#v, log %#v", k, v, fromLog[k])
		}
	}
	// A record left with Attempt 0 logs the decision's attempt.
	rec.Attempt = 0
	js, _ = json.Marshal(rec)
	if !bytes.Contains(js, []byte(`"attempt":2,`)) {
		t.Errorf("attempt not taken from the decision: %s", js)
	}
}

func TestRecordUnmarshalErrors(t *testing.T) {
	var r Record
	for _, in := range []string{
		`{"jitter_seed":"nope"}`,
		`{"jitter_seed":"1","next_attempt_at":"yesterday"}`,
		`[]`,
	} {
		if err := json.Unmarshal([]byte(in), &r); err == nil {
			t.Errorf("%s: no error", in)
		}
	}
}
