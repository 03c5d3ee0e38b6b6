package throttle

import (
	"encoding/json"
	"regexp"
	"testing"
	"time"
)

func TestStateKeyRoundTrip(t *testing.T) {
	valid := regexp.MustCompile(`^[-/_=.a-zA-Z0-9]+$`)
	for _, d := range []string{"gmail.com", "google", "a=b", "ex ample", ".lead", "trail.", "a..b", "ünï.com", "x_y-z/w", "=3D"} {
		k := StateKey(d)
		if !valid.MatchString(k) || k[0] == '.' || k[len(k)-1] == '.' || regexp.MustCompile(`\.\.`).MatchString(k) {
			t.Errorf("StateKey(%q) = %q: not a valid KV key", d, k)
		}
		if back := DestFromKey(k); back != d {
			t.Errorf("DestFromKey(StateKey(%q)) = %q", d, back)
		}
	}
	if k := StateKey("mail.example.com"); k != "mail.example.com" {
		t.Errorf("plain domain escaped: %q", k)
	}
}

func TestDestStateReadDefaults(t *testing.T) {
	now := time.Now()
	var s DestState
	if s.RateFactor() != 1 || s.BreakerAt(now) != BreakerClosed || s.Suspended(now) {
		t.Fatalf("zero state: factor %v breaker %s", s.RateFactor(), s.BreakerAt(now))
	}
	s = DestState{Breaker: BreakerOpen, BreakerUntil: now.Add(time.Second), Factor: 0.3, SuspendedUntil: now.Add(time.Minute)}
	if s.BreakerAt(now) != BreakerOpen || s.BreakerAt(now.Add(time.Second)) != BreakerHalfOpen || !s.Suspended(now) || s.RateFactor() != 0.3 {
		t.Fatalf("state %+v read wrong", s)
	}
	if _, ok := (DestState{RateOverride: 5, RateUntil: now.Add(-time.Second)}).rateOverride(now); ok {
		t.Fatal("expired rate override still applies")
	}
	if r, ok := (DestState{RateOverride: 5}).rateOverride(now); !ok || r != 5 {
		t.Fatal("override without an end does not apply")
	}
	b, _ := json.Marshal(DestState{Dest: "x"})
	if string(b) != `{"dest":"x"}` {
		t.Fatalf("zero fields stored: %s", b)
	}
}
