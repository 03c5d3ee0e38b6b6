package unsubscribe

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"testing"

	"golang.org/x/crypto/chacha20poly1305"
)

var testKey = []byte("0123456789abcdef0123456789abcdef")

const testBase = "https://mail.example.com/unsubscribe"

func testLinks(t testing.TB) *Links {
	t.Helper()
	l, err := New(testKey, testBase+"/")
	if err != nil {
		t.Fatal(err)
	}
	return l
}

var testTarget = Target{Tenant: "shop", Rcpt: "Alice.Smith@example.org", ID: "Xk3bQ9zNUID0aBcDeFgHiJ-2"}

// A token opens to the target it was made for, and only under its key.
func TestTokenRoundTrip(t *testing.T) {
	l := testLinks(t)
	targets := []Target{
		testTarget,
		{Tenant: "eu.shop.example", Rcpt: `"john q. public"@example.com`, ID: "kabc"},
		{Tenant: "t", Rcpt: "josé.niño@exämple.de", ID: "id"},
		{Tenant: "t", Rcpt: "用户@例子.广告", ID: "k0123456789abcdef01234567"},
		{Tenant: "t", Rcpt: `"a\"b <c>"@[192.0.2.1]`, ID: ""},
		{},
	}
	for _, tg := range targets {
		tok := l.Token(tg)
		got, err := l.Open(tok)
		if err != nil || got != tg {
			t.Errorf("Open(Token(%+v)) = %+v, %v", tg, got, err)
		}
		if strings.ContainsAny(tok, "+/=") {
			t.Errorf("token %q is not unpadded base64url", tok)
		}
	}
}

// The same target gives the same token, from any Links under the same key,
// so that every attempt of a message sends the same bytes; any difference
// in the target changes it.
func TestTokenDeterministic(t *testing.T) {
	a, b := testLinks(t), testLinks(t)
	tok := a.Token(testTarget)
	for range 3 {
		if b.Token(testTarget) != tok || a.Token(testTarget) != tok {
			t.Fatal("the same target gave two tokens")
		}
	}
	seen := map[string]bool{tok: true}
	for _, tg := range []Target{
		{Tenant: "shop", Rcpt: "alice.smith@example.org", ID: testTarget.ID},
		{Tenant: "shop", Rcpt: testTarget.Rcpt, ID: "Xk3bQ9zNUID0aBcDeFgHiJ-3"},
		{Tenant: "shop2", Rcpt: testTarget.Rcpt, ID: testTarget.ID},
		// The separator keeps the fields apart.
		{Tenant: "sho", Rcpt: "p\x00" + testTarget.Rcpt, ID: testTarget.ID},
	} {
		tk := a.Token(tg)
		if seen[tk] {
			t.Errorf("target %+v shares a token", tg)
		}
		seen[tk] = true
	}
}

// A token is what the format described at version says, built here from
// the primitives, and a link made by this version opens in later ones:
// links in delivered mail stay valid across upgrades. A change of format
// must keep opening this token.
func TestTokenFormat(t *testing.T) {
	const want = "AX3bzbNTaqtsTT5i96NfBHleuDRG4P52FzuyXhmDuT6oHfHypy8Fbjp1vXt12ZZ8HdmSQVieDCrvPhdXf5wrsaAWBbzrYwMhR6MPvWSSXA7eRXUMM0g7wBP2Oqd84Q"
	sub := func(label string) []byte {
		m := hmac.New(sha256.New, testKey)
		m.Write([]byte(label))
		return m.Sum(nil)
	}
	plain := []byte(testTarget.Tenant + "\x00" + testTarget.Rcpt + "\x00" + testTarget.ID)
	m := hmac.New(sha256.New, sub("unsubscribe/nonce"))
	m.Write([]byte{1})
	m.Write(plain)
	nonce := m.Sum(nil)[:24]
	aead, err := chacha20poly1305.NewX(sub("unsubscribe/seal"))
	if err != nil {
		t.Fatal(err)
	}
	built := base64.RawURLEncoding.EncodeToString(aead.Seal(append([]byte{1}, nonce...), nonce, plain, []byte{1}))
	if built != want {
		t.Fatalf("built from the primitives: %q, want %q", built, want)
	}
	l := testLinks(t)
	if got := l.Token(testTarget); got != want {
		t.Errorf("Token = %q, want %q", got, want)
	}
	if got, err := l.Open(want); err != nil || got != testTarget {
		t.Errorf("Open = %+v, %v", got, err)
	}
}

// The recipient's address cannot be read from a link.
func TestTokenHidesAddress(t *testing.T) {
	l := testLinks(t)
	for _, tg := range []Target{testTarget, {Tenant: "shop", Rcpt: "averyrecognisablename@example.org", ID: "x"}} {
		u := l.URL(tg)
		local := strings.ToLower(tg.Rcpt[:strings.IndexByte(tg.Rcpt, '@')])
		raw, err := base64.RawURLEncoding.DecodeString(l.Token(tg))
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range []string{strings.ToLower(u), strings.ToLower(string(raw))} {
			if strings.Contains(s, local) || strings.Contains(s, "example.org") || strings.Contains(s, tg.Tenant) {
				t.Errorf("%q shows the target %+v", s, tg)
			}
		}
	}
}

// Anything Token did not make under this key is ErrInvalid: another key,
// any changed byte or character, a cut, nothing, not base64.
func TestOpenRefuses(t *testing.T) {
	l := testLinks(t)
	tok := l.Token(testTarget)
	other, err := New([]byte("another key, another fleet......"), testBase)
	if err != nil {
		t.Fatal(err)
	}
	invalid := func(what, s string) {
		t.Helper()
		if got, err := l.Open(s); !errors.Is(err, ErrInvalid) || got != (Target{}) {
			t.Errorf("%s: Open(%q) = %+v, %v", what, s, got, err)
		}
	}
	invalid("another key", other.Token(testTarget))
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	for i := range tok {
		for _, c := range alphabet + "+/=.%\r\n " {
			if byte(c) != tok[i] {
				invalid("character changed", tok[:i]+string(c)+tok[i+1:])
			}
		}
		invalid("character removed", tok[:i]+tok[i+1:])
	}
	raw, _ := base64.RawURLEncoding.DecodeString(tok)
	for i := range raw {
		for bit := range 8 {
			b := append([]byte(nil), raw...)
			b[i] ^= 1 << bit
			invalid("byte changed", base64.RawURLEncoding.EncodeToString(b))
		}
	}
	for n := range len(tok) {
		invalid("cut", tok[:n])
	}
	invalid("padded", tok+"==")
	invalid("wrapped", tok[:40]+"\r\n"+tok[40:])
	invalid("longer", tok+"AAAA")
	invalid("empty", "")
	invalid("not base64", "not a token at all, is it?")
	invalid("huge", strings.Repeat("A", 100000))
	// The nonce of another target with this one's ciphertext: the
	// cipher would open it only with its own nonce, and the synthetic
	// nonce check refuses what it opens to.
	raw2, _ := base64.RawURLEncoding.DecodeString(l.Token(Target{Tenant: "x", Rcpt: "y@z", ID: "1"}))
	mix := append(append([]byte{}, raw2[:1+nonceLen]...), raw[1+nonceLen:]...)
	invalid("another nonce", base64.RawURLEncoding.EncodeToString(mix))
}

// Open refuses a token that opens but does not split into three fields,
// which Token makes only from fields that hold a NUL.
func TestOpenNeedsThreeFields(t *testing.T) {
	l := testLinks(t)
	for _, tg := range []Target{{Tenant: "a\x00b", Rcpt: "c@d", ID: "e"}, {Tenant: "a", Rcpt: "c@d", ID: "e\x00"}} {
		if _, err := l.Open(l.Token(tg)); !errors.Is(err, ErrInvalid) {
			t.Errorf("Open(Token(%q)) = %v", tg, err)
		}
	}
	s := l.get()
	defer l.put(s)
	for _, p := range []string{"", "one", "one\x00two", "a\x00b\x00c\x00d"} {
		r := append([]byte{version}, s.nonce([]byte(p))...)
		r = l.aead.Seal(r, r[1:1+nonceLen], []byte(p), ad)
		if _, err := l.Open(base64.RawURLEncoding.EncodeToString(r)); !errors.Is(err, ErrInvalid) {
			t.Errorf("plaintext %q opened: %v", p, err)
		}
	}
	// A good plaintext sealed under a nonce that is not its own: the
	// cipher opens it, the synthetic nonce check does not.
	p := []byte("shop\x00a@b.example\x00id1")
	r := append([]byte{version}, make([]byte, nonceLen)...)
	r = l.aead.Seal(r, r[1:1+nonceLen], p, ad)
	if _, err := l.Open(base64.RawURLEncoding.EncodeToString(r)); !errors.Is(err, ErrInvalid) {
		t.Errorf("a token under a nonce not its own opened: %v", err)
	}
}

// Whatever a stranger puts in the URL, Open never panics, and accepts only
// a token Token makes: the one its target seals to.
func FuzzOpen(f *testing.F) {
	l := testLinks(f)
	f.Add(l.Token(testTarget))
	f.Add(l.Token(Target{}))
	f.Add("")
	f.Add("AQ")
	f.Add(strings.Repeat("A", 60))
	f.Add("not/a?token")
	f.Fuzz(func(t *testing.T, s string) {
		tg, err := l.Open(s)
		if err != nil {
			if !errors.Is(err, ErrInvalid) || tg != (Target{}) {
				t.Fatalf("Open(%q) = %+v, %v", s, tg, err)
			}
			return
		}
		if tok := l.Token(tg); tok != s {
			t.Fatalf("Open(%q) = %+v, which seals to %q", s, tg, tok)
		}
	})
}

func TestNewBase(t *testing.T) {
	for _, c := range []struct{ base, want string }{
		{"https://mail.example.com/unsubscribe/", "https://mail.example.com/unsubscribe"},
		{"https://mail.example.com/unsubscribe", "https://mail.example.com/unsubscribe"},
		{"HTTPS://Mail.Example.com:8443/u", "https://Mail.Example.com:8443/u"},
		{"https://mail.example.com", "https://mail.example.com"},
		{"https://mail.example.com/", "https://mail.example.com"},
		{"https://mail.example.com/a b", "https://mail.example.com/a%20b"},
		{"http://127.0.0.1:8025/unsubscribe", "http://127.0.0.1:8025/unsubscribe"},
		{"http://[::1]:8025/u", "http://[::1]:8025/u"},
		{"http://localhost/u", "http://localhost/u"},
		{"http://LOCALHOST:80/u/", "http://LOCALHOST:80/u"},
	} {
		l, err := New(testKey, c.base)
		if err != nil {
			t.Errorf("New(%q): %v", c.base, err)
			continue
		}
		if u := l.URL(testTarget); u != c.want+"/"+l.Token(testTarget) {
			t.Errorf("New(%q): URL %q, want under %q", c.base, u, c.want)
		}
	}
	for _, base := range []string{
		"ftp://x", "http://example.com/u", "http://10.0.0.1/u", "http://localhost.example.com/u",
		"https:///x", "https://", "https:x", "mail.example.com/unsubscribe", "/unsubscribe", "",
		"https://mail.example.com/u?tenant=a", "https://mail.example.com/u?", "https://mail.example.com/u#top",
		"https://mail.example.com/u#", "https://user:pw@mail.example.com/u", "https://mail.example.com:port/u",
		"::garbage::", "https://exa mple.com/u", "https://mail.example.com/\x7f",
	} {
		_, err := New(testKey, base)
		if err == nil {
			t.Errorf("New(%q) accepted", base)
			continue
		}
		if !strings.Contains(err.Error(), fmt.Sprintf("%q", base)) {
			t.Errorf("New(%q): %q does not name the value", base, err)
		}
	}
	if _, err := New(testKey[:15], testBase); err == nil {
		t.Error("a 15-byte key was accepted")
	}
}

func TestHeader(t *testing.T) {
	l := testLinks(t)
	h := l.Header(testTarget)
	want := "List-Unsubscribe: <https://mail.example.com/unsubscribe/" + l.Token(testTarget) + ">\r\n" +
		"List-Unsubscribe-Post: List-Unsubscribe=One-Click\r\n"
	if string(h) != want {
		t.Fatalf("Header = %q, want %q", h, want)
	}
	if !Has(append(h, "Subject: x\r\n\r\nbody\r\n"...)) {
		t.Error("Has does not see the fields Header makes")
	}
}

func TestHas(t *testing.T) {
	for _, c := range []struct {
		name string
		msg  string
		want bool
	}{
		{"present", "From: a@b\r\nList-Unsubscribe: <mailto:u@b>\r\nSubject: s\r\n\r\nbody\r\n", true},
		{"first field", "List-Unsubscribe: <https://b/u>\r\n\r\n", true},
		{"name case", "From: a@b\r\nlist-UNSUBSCRIBE: <https://b/u>\r\n\r\n", true},
		{"space before colon", "From: a@b\r\nList-Unsubscribe : <https://b/u>\r\n\r\n", true},
		{"empty value", "List-Unsubscribe:\r\n\r\n", true},
		{"folded value", "From: a@b\r\nList-Unsubscribe:\r\n <https://b/u>,\r\n\t<mailto:u@b>\r\nSubject: s\r\n\r\n", true},
		{"LF only", "From: a@b\nList-Unsubscribe: <https://b/u>\n\nbody\n", true},
		{"no separator", "From: a@b\r\nList-Unsubscribe: <https://b/u>", true},
		{"absent", "From: a@b\r\nSubject: s\r\n\r\nbody\r\n", false},
		{"only Post", "From: a@b\r\nList-Unsubscribe-Post: List-Unsubscribe=One-Click\r\n\r\n", false},
		{"other List field", "List-Id: <x.b>\r\nList-Unsubscribed: x\r\nList-Unsubscribe-X: y\r\n\r\n", false},
		{"in a folded line", "Subject: hello\r\n List-Unsubscribe: <https://b/u>\r\n\r\n", false},
		{"in a value", "Subject: List-Unsubscribe: <https://b/u>\r\n\r\n", false},
		{"in the body", "From: a@b\r\n\r\nList-Unsubscribe: <https://b/u>\r\n", false},
		{"in the body, LF", "From: a@b\n\nList-Unsubscribe: <https://b/u>\n", false},
		{"no header", "\r\nList-Unsubscribe: <https://b/u>\r\n", false},
		{"name alone", "List-Unsubscribe", false},
		{"no separator, absent", "From: a@b\r\nSubject: s", false},
		{"empty", "", false},
	} {
		if got := Has([]byte(c.msg)); got != c.want {
			t.Errorf("%s: Has(%q) = %v", c.name, c.msg, got)
		}
	}
}

// Has stops at the header section's end, and allocates nothing.
func TestHasStopsAtBody(t *testing.T) {
	msg := []byte("From: a@b\r\nSubject: s\r\n\r\nList-Unsubscribe: <x>\r\n")
	if Has(msg) {
		t.Fatal("Has read the body")
	}
	msg = []byte("From: a@b\r\nSubject: s\r\nList-Unsubscribe: <x>\r\n\r\nbody\r\n")
	if n := testing.AllocsPerRun(100, func() { Has(msg) }); n != 0 {
		t.Errorf("Has allocates %v times", n)
	}
}

func TestMsgIDOf(t *testing.T) {
	for id, want := range map[string]string{
		"Xk3bQ9zNUID0aB":    "Xk3bQ9zNUID0aB",
		"Xk3bQ9zNUID0aB-2":  "Xk3bQ9zNUID0aB",
		"Xk3bQ9zNUID0aB-12": "Xk3bQ9zNUID0aB",
		"k0a1b2-x":          "k0a1b2-x",
		"a-1-2":             "a-1",
		"abc-":              "abc-",
		"-2":                "-2",
		"a-2b":              "a-2b",
		"":                  "",
	} {
		if got := msgIDOf(id); got != want {
			t.Errorf("msgIDOf(%q) = %q, want %q", id, got, want)
		}
	}
}

func BenchmarkToken(b *testing.B) {
	l := testLinks(b)
	b.ReportAllocs()
	for b.Loop() {
		_ = l.Token(testTarget)
	}
}

func BenchmarkOpen(b *testing.B) {
	l := testLinks(b)
	tok := l.Token(testTarget)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := l.Open(tok); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkHeader(b *testing.B) {
	l := testLinks(b)
	b.ReportAllocs()
	for b.Loop() {
		_ = l.Header(testTarget)
	}
}

// An operator's tool opens a link pasted whole, or its token, with the
// key alone.
func TestOpenerAndTokenOf(t *testing.T) {
	key := bytes.Repeat([]byte{9}, 32)
	l, err := New(key, "https://mail.example.com/unsubscribe")
	if err != nil {
		t.Fatal(err)
	}
	want := Target{Tenant: "news", Rcpt: "ann@example.org", ID: "m1-2"}
	o, err := Opener(key)
	if err != nil {
		t.Fatal(err)
	}
	for _, pasted := range []string{l.URL(want), "<" + l.URL(want) + ">", " " + l.URL(want) + "/ ", l.URL(want) + "?utm=x", l.Token(want)} {
		if got, err := o.Open(TokenOf(pasted)); err != nil || got != want {
			t.Errorf("%q: %+v, %v", pasted, got, err)
		}
	}
	if _, err := Opener(key[:8]); err == nil {
		t.Error("a short key was taken")
	}
}
