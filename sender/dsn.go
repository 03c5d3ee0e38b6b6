package sender

import (
	"strings"
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
		s += " ORCPT=" + xtext(typ) + ";" + xtext(p.ORcpt)
	}
	return s
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
