package sender

import (
	"fmt"
	"strings"

	"github.com/outflow/outflow/internal/ascii"
)

// DSNParams are the RFC 3461 parameters of one message, given to a next
// hop that offers DSN: RET and ENVID on MAIL FROM, NOTIFY and ORCPT on
// each RCPT TO. Values are plain (decoded); they are written as xtext
// where RFC 3461 says so.
type DSNParams struct {
	Ret   string    // "FULL" or "HDRS"; "" sends no RET
	EnvID string    // "" sends no ENVID
	Rcpts []RcptDSN // by index of Message.Rcpts; missing entries send nothing
}

// RcptDSN is one recipient's NOTIFY and ORCPT.
type RcptDSN struct {
	Notify    []string // "NEVER", or some of "SUCCESS", "FAILURE", "DELAY"
	ORcpt     string   // original recipient address, "" for none
	ORcptType string   // its address type; "" means rfc822
}

func (d *DSNParams) mailParams() string {
	if d == nil {
		return ""
	}
	s := ""
	if d.Ret == "FULL" || d.Ret == "HDRS" {
		s += " RET=" + d.Ret
	}
	if d.EnvID != "" {
		s += " ENVID=" + xtext(d.EnvID)
	}
	return s
}

func (d *DSNParams) rcptParams(i int) string {
	if d == nil || i >= len(d.Rcpts) {
		return ""
	}
	p := d.Rcpts[i]
	s := ""
	var notify []string
	for _, n := range p.Notify {
		// Only the four keywords: anything else would be written into
		// the command line as it is.
		if n = strings.ToUpper(n); n == "NEVER" || n == "SUCCESS" || n == "FAILURE" || n == "DELAY" {
			notify = append(notify, n)
		}
	}
	if len(notify) > 0 {
		s += " NOTIFY=" + strings.Join(notify, ",")
	}
	if p.ORcpt != "" {
		typ := p.ORcptType
		if typ == "" {
			typ = "rfc822"
		}
		switch {
		case !strings.EqualFold(typ, "utf-8"):
			s += " ORCPT=" + xtext(typ) + ";" + xtext(p.ORcpt)
		case ascii.IsString(p.ORcpt):
			// An ASCII address is an rfc822 one, which every
			// DSN-capable server reads.
			s += " ORCPT=rfc822;" + xtext(p.ORcpt)
		default:
			s += " ORCPT=utf-8;" + utf8AddrXtext(p.ORcpt)
		}
	}
	return s
}

// utf8AddrXtext encodes s as RFC 6533 utf-8-addr-xtext, the form of an
// ORCPT of type utf-8: "+", "=", "\", controls, space and every non-ASCII
// character become "\x{HEX}" of its code point. (Plain xtext's "+HH" is
// not valid there: a next hop refused it with 501, and the recipient
// bounced.)
func utf8AddrXtext(s string) string {
	var b strings.Builder
	for _, r := range s {
		if r > ' ' && r < 0x7f && r != '+' && r != '=' && r != '\\' {
			b.WriteRune(r)
			continue
		}
		fmt.Fprintf(&b, "\\x{%02X}", r)
	}
	return b.String()
}

// xtext encodes s as RFC 3461 §4 xtext: "+", "=", controls, space and
// non-ASCII octets become "+HH".
func xtext(s string) string {
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '!' || c > '~' || c == '+' || c == '=' {
			b.WriteByte('+')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&0xf])
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}
