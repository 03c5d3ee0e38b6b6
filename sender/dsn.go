package sender

import (
	"strings"

	"github.com/outflow/outflow/dsn"
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
		s += " ENVID=" + dsn.XText(d.EnvID)
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
		s += " ORCPT=" + dsn.ORCPT(p.ORcptType, p.ORcpt)
	}
	return s
}
