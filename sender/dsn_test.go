package sender

import (
	"testing"

	"github.com/emersion/go-smtp"

	"github.com/outflow/outflow/internal/fakemx"
)

func dsnMessage() *Message {
	m := msg("example.test", "bob@example.test", "carol@example.test")
	m.DSN = &DSNParams{Ret: "HDRS", EnvID: "env 1+2", Rcpts: []RcptDSN{
		{Notify: []string{"SUCCESS", "FAILURE"}, ORcpt: "Bob+X@example.test"},
		{Notify: []string{"NEVER\r\nRSET"}}, // not a keyword: not sent
	}}
	return m
}

// TestDSNPassedOn: a server that offers DSN gets RET, ENVID, NOTIFY and
// ORCPT, and the accepted recipients are marked DSNRelayed.
func TestDSNPassedOn(t *testing.T) {
	w, fake := oneMX(t, fakemx.Options{DSN: true})
	r := w.sender(w.config()).Send(ctxT(t), dsnMessage())
	checkDelivered(t, r)
	got := fake.Messages()
	if len(got) != 1 {
		t.Fatalf("%d messages", len(got))
	}
	g := got[0]
	if g.Ret != smtp.DSNReturnHeaders || g.EnvID != "env 1+2" {
		t.Errorf("RET %q ENVID %q", g.Ret, g.EnvID)
	}
	if len(g.RcptOpts) != 2 {
		t.Fatalf("rcpt options %+v", g.RcptOpts)
	}
	o := g.RcptOpts[0]
	if len(o.Notify) != 2 || o.Notify[0] != smtp.DSNNotifySuccess || o.Notify[1] != smtp.DSNNotifyFailure ||
		o.OriginalRecipient != "Bob+X@example.test" || o.OriginalRecipientType != smtp.DSNAddressTypeRFC822 {
		t.Errorf("first recipient's options %+v", o)
	}
	if len(g.RcptOpts[1].Notify) != 0 {
		t.Errorf("a non-keyword NOTIFY was sent: %+v", g.RcptOpts[1])
	}
	for _, rr := range r.Rcpts {
		if !rr.DSNRelayed {
			t.Errorf("%s not marked DSNRelayed", rr.Rcpt)
		}
	}
}

// TestDSNNotOffered: without DSN in EHLO no parameter is sent (the server
// would refuse them) and nothing is marked DSNRelayed.
func TestDSNNotOffered(t *testing.T) {
	w, fake := oneMX(t, fakemx.Options{})
	r := w.sender(w.config()).Send(ctxT(t), dsnMessage())
	checkDelivered(t, r)
	if g := fake.Messages(); len(g) != 1 || g[0].EnvID != "" || len(g[0].RcptOpts[0].Notify) != 0 {
		t.Fatalf("parameters sent to a server without DSN: %+v", g)
	}
	for _, rr := range r.Rcpts {
		if rr.DSNRelayed {
			t.Errorf("%s marked DSNRelayed", rr.Rcpt)
		}
	}
}

// TestDSNUTF8ORCPT: an ORCPT of type utf-8 goes out as RFC 6533
// utf-8-addr-xtext, which the next hop decodes to the address given (plain
// xtext there was refused with 501 and bounced the recipient); an ASCII one
// goes out as rfc822.
func TestDSNUTF8ORCPT(t *testing.T) {
	w, fake := oneMX(t, fakemx.Options{DSN: true})
	m := msg("example.test", "bob@example.test", "carol@example.test")
	m.DSN = &DSNParams{Rcpts: []RcptDSN{
		{ORcpt: "café+x=y@example.test", ORcptType: "UTF-8"},
		{ORcpt: "carol+tag@example.test", ORcptType: "utf-8"},
	}}
	r := w.sender(w.config()).Send(ctxT(t), m)
	checkDelivered(t, r)
	g := fake.Messages()[0]
	if o := g.RcptOpts[0]; o.OriginalRecipient != "café+x=y@example.test" || o.OriginalRecipientType != smtp.DSNAddressTypeUTF8 {
		t.Errorf("utf-8 ORCPT arrived as %q (%s)", o.OriginalRecipient, o.OriginalRecipientType)
	}
	if o := g.RcptOpts[1]; o.OriginalRecipient != "carol+tag@example.test" || o.OriginalRecipientType != smtp.DSNAddressTypeRFC822 {
		t.Errorf("ASCII utf-8 ORCPT arrived as %q (%s)", o.OriginalRecipient, o.OriginalRecipientType)
	}
}
