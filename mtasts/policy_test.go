package mtasts

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	good := "version: STSv1\r\nmode: enforce\r\nmx: mx1.Example.com.\r\nmx: *.example.net\r\nmax_age: 86400\r\n"
	p, err := Parse([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if p.Mode != ModeEnforce || p.MaxAge != 24*time.Hour || len(p.MX) != 2 || p.MX[0] != "mx1.example.com" {
		t.Fatalf("parsed %+v", p)
	}
	// LF line ends, extension keys and blank lines are accepted.
	if _, err := Parse([]byte("version: STSv1\nmode: testing\nmx: a.example\nfoo_ext: bar\n\nmax_age: 31557600\n")); err != nil {
		t.Errorf("LF policy: %v", err)
	}
	if p, err := Parse([]byte("version: STSv1\nmode: none\nmax_age: 0\n")); err != nil || p.Mode != ModeNone {
		t.Errorf("mode none without mx: %v %+v", err, p)
	}
	bad := map[string]string{
		"no version":          "mode: enforce\nmx: a.example\nmax_age: 1\n",
		"version not first":   "mode: enforce\nversion: STSv1\nmx: a.example\nmax_age: 1\n",
		"wrong version":       "version: STSv2\nmode: enforce\nmx: a.example\nmax_age: 1\n",
		"unknown mode":        "version: STSv1\nmode: strict\nmx: a.example\nmax_age: 1\n",
		"no mode":             "version: STSv1\nmx: a.example\nmax_age: 1\n",
		"no max_age":          "version: STSv1\nmode: enforce\nmx: a.example\n",
		"max_age too large":   "version: STSv1\nmode: enforce\nmx: a.example\nmax_age: 31557601\n",
		"negative max_age":    "version: STSv1\nmode: enforce\nmx: a.example\nmax_age: -1\n",
		"max_age not integer": "version: STSv1\nmode: enforce\nmx: a.example\nmax_age: 1d\n",
		"enforce without mx":  "version: STSv1\nmode: enforce\nmax_age: 1\n",
		"wildcard mid-name":   "version: STSv1\nmode: enforce\nmx: a.*.example\nmax_age: 1\n",
		"repeated mode":       "version: STSv1\nmode: enforce\nmode: none\nmx: a.example\nmax_age: 1\n",
		"line without colon":  "version: STSv1\nmode enforce\nmx: a.example\nmax_age: 1\n",
		"html error page":     "<html><body>not found</body></html>",
	}
	for name, body := range bad {
		if _, err := Parse([]byte(body)); !errors.Is(err, ErrPolicySyntax) {
			t.Errorf("%s: err %v, want ErrPolicySyntax", name, err)
		}
	}
}

func TestMatch(t *testing.T) {
	p := &Policy{MX: []string{"mail.example.com", "*.example.net"}}
	for host, want := range map[string]bool{
		"mail.example.com":  true,
		"MAIL.Example.COM.": true,
		"mx.example.com":    false,
		"mx1.example.net":   true,
		"a.b.example.net":   false, // the wildcard is one label
		"example.net":       false,
		".example.net":      false,
	} {
		if got := p.Match(host); got != want {
			t.Errorf("Match(%q) = %v, want %v", host, got, want)
		}
	}
}

func TestParseTXT(t *testing.T) {
	for rec, want := range map[string]string{
		"v=STSv1; id=20160831085700Z;": "20160831085700Z",
		"v=STSv1;id=abc":               "abc",
		"v=STSv1; id=x1; ext=foo":      "x1",
	} {
		if id, err := ParseTXT(rec); err != nil || id != want {
			t.Errorf("ParseTXT(%q) = %q, %v; want %q", rec, id, err, want)
		}
	}
	for _, rec := range []string{"v=STSv1;", "v=STSv1; id=", "v=STSv1; id=has-dash", "v=STSv1; id=" + strings.Repeat("a", 33), "id=a; v=STSv1", "v=STSv1; id=a; id=b"} {
		if _, err := ParseTXT(rec); err == nil {
			t.Errorf("ParseTXT(%q) accepted", rec)
		}
	}
}
