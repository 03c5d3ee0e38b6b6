package bounce

import (
	"strings"
	"testing"
	"time"
)

func ptr(s string) *string { return &s }

func testReturnPath() *ReturnPath {
	return NewReturnPath([]byte("0123456789abcdef0123456789abcdef"), "rp.example.org",
		map[string]*string{"shop": ptr("Bounces.Shop.Example"), "own": ptr("")})
}

// An address made for an attempt names its envelope and minute, under the
// tenant's domain; the listener's check gives them back.
func TestReturnPathRoundTrip(t *testing.T) {
	rp := testReturnPath()
	at := time.Date(2026, 12, 6, 13, 7, 42, 0, time.UTC)
	for _, tc := range []struct{ tenant, domain string }{{"billing", "@rp.example.org"}, {"shop", "@bounces.shop.example"}} {
		a := rp.Address(tc.tenant, "Xk3bQ9zNUID0aB-2", "app@shop.example", at)
		if !strings.HasPrefix(a, "b.Xk3bQ9zNUID0aB-2.") || !strings.HasSuffix(a, tc.domain) {
			t.Fatalf("tenant %s: address %q", tc.tenant, a)
		}
		if local := a[:strings.IndexByte(a, '@')]; len(local) > 64 {
			t.Fatalf("local part of %d octets", len(local))
		}
		id, when, ok := rp.Check("<" + strings.ToUpper(a[:2]) + a[2:len(a)-len(tc.domain)] + strings.ToUpper(tc.domain) + ">")
		if !ok || id != "Xk3bQ9zNUID0aB-2" || !when.Equal(at.Truncate(time.Minute)) {
			t.Fatalf("Check(%q) = %q, %v, %v", a, id, when, ok)
		}
	}
}

// What the return path leaves alone, and what its check refuses.
func TestReturnPathRefuses(t *testing.T) {
	rp := testReturnPath()
	now := time.Now()
	if a := rp.Address("billing", "id1", "", now); a != "" {
		t.Errorf("null sender became %q: a bounce must never be answered", a)
	}
	if a := rp.Address("own", "id1", "app@own.example", now); a != "app@own.example" {
		t.Errorf("a tenant that turned its return path off got %q", a)
	}
	if a := rp.Address("billing", strings.Repeat("x", 60), "app@b.example", now); a != "app@b.example" {
		t.Errorf("a local part over 64 octets was written: %q", a)
	}
	if (*ReturnPath)(nil).Address("t", "id1", "a@b.example", now) != "a@b.example" {
		t.Error("no return path changed the sender")
	}
	good := rp.Address("billing", "id1", "app@b.example", now)
	other := NewReturnPath([]byte("another key, another fleet......"), "rp.example.org", nil)
	local, domain, _ := strings.Cut(good, "@")
	parts := strings.Split(local, ".")
	for name, addr := range map[string]string{
		"other domain":    local + "@elsewhere.example",
		"other id":        "b.id2." + parts[2] + "." + parts[3] + "@" + domain,
		"other minute":    "b.id1.zzz." + parts[3] + "@" + domain,
		"mac cut short":   local[:len(local)-1] + "@" + domain,
		"no mac":          "b.id1." + parts[2] + "@" + domain,
		"not a return":    "postmaster@" + domain,
		"no domain":       local,
		"empty id":        "b.." + parts[2] + "." + parts[3] + "@" + domain,
		"other fleet key": other.Address("billing", "id1", "app@b.example", now),
	} {
		if _, _, ok := rp.Check(addr); ok {
			t.Errorf("%s: %q accepted", name, addr)
		}
	}
}

// Whatever a stranger sends to RCPT, Check accepts only an address the
// return path itself wrote: the one Address gives for the id and minute
// it reads (the domain and the MAC's letters in any case).
func FuzzReturnPathCheck(f *testing.F) {
	rp := testReturnPath()
	at := time.Date(2026, 12, 6, 13, 0, 0, 0, time.UTC)
	f.Add(rp.Address("billing", "Xk3bQ9-2", "a@b.example", at))
	f.Add("b.x.1.aaaaaaaaaaaaaaaa@rp.example.org")
	f.Add("<B.id.zz.AAAA@BOUNCES.SHOP.EXAMPLE>")
	f.Fuzz(func(t *testing.T, addr string) {
		id, when, ok := rp.Check(addr)
		_ = rp.Find([]byte(addr), 4)
		if !ok {
			return
		}
		trimmed := strings.TrimSuffix(strings.TrimPrefix(strings.TrimSpace(addr), "<"), ">")
		want := rp.Address("billing", id, "a@b.example", when)
		wantLocal, _, _ := strings.Cut(want, "@")
		gotLocal := trimmed[:strings.LastIndexByte(trimmed, '@')]
		if !strings.EqualFold(gotLocal, wantLocal) || !strings.HasPrefix(gotLocal[2:], id) {
			t.Fatalf("Check accepted %q (id %q, %v), which Address writes as %q", addr, id, when, want)
		}
	})
}

// BenchmarkReturnPathAddress is what a return path adds to each attempt
// of a tenant that has one.
func BenchmarkReturnPathAddress(b *testing.B) {
	rp := testReturnPath()
	at := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		_ = rp.Address("shop", "Xk3bQ9zNUID0aBcDeFgHiJ-1", "app@shop.example", at)
	}
}
