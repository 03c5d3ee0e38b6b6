package dsn

import (
	"strings"
	"testing"
)

// TestOriginalRecipientRoundTrip: a notice's Original-Recipient carries the
// ORCPT decoded (RFC 3461 §4.2), not in the parameter's xtext, and
// ParseDSN reads back the address and type that were given: "+" and "="
// in an rfc822 or x400 address stay as they are, a utf-8 address goes as
// utf-8-addr-xtext (RFC 6533 §3), an ASCII one of type utf-8 as rfc822,
// and a type that is an atom not starting with a letter ("0", which
// intake takes) is still a type. An address that is not printable ASCII
// falls back to xtext, which XTextDecode undoes.
func TestOriginalRecipientRoundTrip(t *testing.T) {
	for _, c := range []struct {
		typ, addr          string
		field              string // the Original-Recipient line's value
		wantType, wantAddr string // as ParseDSN reads them
	}{
		{"rfc822", "ann+news@dst.example", "rfc822;ann+news@dst.example", "rfc822", "ann+news@dst.example"},
		{"", "a=b+c@dst.example", "rfc822;a=b+c@dst.example", "rfc822", "a=b+c@dst.example"},
		{"x400", "a=b@x", "x400;a=b@x", "x400", "a=b@x"},
		{"utf-8", "zoé@dst.example", `utf-8;zo\x{E9}@dst.example`, "utf-8", "zoé@dst.example"},
		{"UTF-8", "ann+news@dst.example", "rfc822;ann+news@dst.example", "rfc822", "ann+news@dst.example"},
		{"0", "0", "0;0", "0", "0"},
		{"x-local", "a b", "x-local;a b", "x-local", "a b"},
		// Not printable US-ASCII, or a space a reader would trim: xtext.
		{"rfc822", "zoé@dst.example", "rfc822;zo+C3+A9@dst.example", "rfc822", "zo+C3+A9@dst.example"},
		{"rfc822", "tab\there@dst.example", "rfc822;tab+09here@dst.example", "rfc822", "tab+09here@dst.example"},
		{"rfc822", " lead@dst.example", "rfc822;+20lead@dst.example", "rfc822", "+20lead@dst.example"},
	} {
		r := failedReport()
		r.Recipients = r.Recipients[:1]
		r.Recipients[0].OriginalType, r.Recipients[0].Original = c.typ, c.addr
		msg, err := Build(r)
		if err != nil {
			t.Fatal(err)
		}
		if line := "\r\nOriginal-Recipient: " + c.field + "\r\n"; !strings.Contains(string(msg), line) {
			t.Errorf("%s;%q: no line %q in\n%s", c.typ, c.addr, line, msg)
		}
		got, err := ParseDSN(msg)
		if err != nil {
			t.Fatal(err)
		}
		rc := got.Recipients[0]
		if rc.OriginalType != c.wantType || rc.Original != c.wantAddr {
			t.Errorf("%s;%q read back as %q;%q, want %q;%q", c.typ, c.addr, rc.OriginalType, rc.Original, c.wantType, c.wantAddr)
		}
		if c.wantAddr != c.addr && XTextDecode(rc.Original) != c.addr {
			t.Errorf("%s;%q: xtext fallback %q decodes to %q", c.typ, c.addr, rc.Original, XTextDecode(rc.Original))
		}
	}
}

// TestORCPTParameterStaysXText: the SMTP parameter is still xtext, where
// the field is not.
func TestORCPTParameterStaysXText(t *testing.T) {
	if got := ORCPT("rfc822", "ann+news@dst.example"); got != "rfc822;ann+2Bnews@dst.example" {
		t.Errorf("ORCPT = %q", got)
	}
	if got := originalRecipient("rfc822", "ann+news@dst.example"); got != "rfc822;ann+news@dst.example" {
		t.Errorf("originalRecipient = %q", got)
	}
}

// TestParseAddressTypes: an address-type is any atom (RFC 3464 §2.1.2),
// digits first included, in Original-Recipient and Final-Recipient; a
// diagnostic's text before a semicolon is still no type.
func TestParseAddressTypes(t *testing.T) {
	status := "Reporting-MTA: dns; mx.example.net\r\n\r\n" +
		"Original-Recipient: 0;0\r\n" +
		"Final-Recipient: 822; a@example.org\r\n" +
		"Action: failed\r\n" +
		"Diagnostic-Code: 550; no such user\r\n" +
		"\r\n" +
		"Original-Recipient: x-#1;b@example.org\r\n" +
		"Final-Recipient: <b;c@example.org>\r\n" +
		"Action: failed\r\n"
	r, err := ParseDSN(mkReport("delivery-status", "Content-Type: message/delivery-status\r\n", status))
	if err != nil {
		t.Fatal(err)
	}
	checkRecipients(t, r.Recipients, []Recipient{
		{Final: "a@example.org", Original: "0", OriginalType: "0", Action: Failed, Diagnostic: "550; no such user"},
		{Final: "b;c@example.org", Original: "b@example.org", OriginalType: "x-#1", Action: Failed},
	})
}
