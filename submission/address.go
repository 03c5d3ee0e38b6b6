package submission

import (
	"strings"

	"github.com/outflow/outflow/internal/ascii"
)

// Address is an envelope mailbox (MAIL FROM or RCPT TO) that passed
// ParseAddress. Its parts are kept as the client spelled them.
type Address struct {
	Local  string // the local part, a Dot-string
	Domain string // the domain, a sequence of LDH labels
}

// String is the mailbox as local@domain.
func (a Address) String() string { return a.Local + "@" + a.Domain }

// AddressError says why ParseAddress refused an address.
type AddressError struct {
	Reason   string // short, for the SMTP reply; never contains the input
	NonASCII bool   // the address is not ASCII (RFC 6531 X.6.7 applies)
}

// Error returns the reason.
func (e *AddressError) Error() string { return "submission: bad address: " + e.Reason }

// RFC 5321 section 4.5.3.1 size limits.
const (
	maxLocalPart = 64  // 4.5.3.1.1
	maxDomain    = 255 // 4.5.3.1.2
	// 4.5.3.1.3: a path is at most 256 octets including the angle
	// brackets, so the mailbox inside is at most 254.
	maxMailbox = 254
	maxLabel   = 63 // RFC 1035 section 2.3.4
)

// ParseAddress validates a mailbox as go-smtp hands it to the session
// (brackets and source route removed, a quoted local part unquoted) and
// splits it. It accepts only what outflow can deliver safely:
//
//   - ASCII only: SMTPUTF8 is not offered, so anything else, including
//     invalid UTF-8, is refused with NonASCII set (553 5.6.7).
//   - The local part is a Dot-string (RFC 5321 section 4.1.2): atext atoms
//     separated by single dots. A quoted local part that needs its quotes
//     (spaces, specials) is refused.
//   - The domain is a hostname: LDH labels of 1 to 63 octets, not starting
//     or ending with a hyphen, and a last label that is not all digits
//     (RFC 1123 section 2.1), so "1.2.3.4" cannot pass as a name.
//   - Address literals ("[192.0.2.1]") are refused: a literal would point
//     delivery at any host, internal ones included, bypassing MX lookup.
//   - The size limits of RFC 5321 section 4.5.3.1.
func ParseAddress(s string) (Address, error) {
	if !ascii.IsString(s) {
		return Address{}, &AddressError{Reason: "non-ASCII address without SMTPUTF8", NonASCII: true}
	}
	if len(s) > maxMailbox {
		return Address{}, &AddressError{Reason: "address longer than 254 octets"}
	}
	at := strings.LastIndexByte(s, '@')
	if at < 0 {
		return Address{}, &AddressError{Reason: "missing @domain"}
	}
	local, domain := s[:at], s[at+1:]
	if err := checkLocalPart(local); err != nil {
		return Address{}, err
	}
	if err := checkDomain(domain); err != nil {
		return Address{}, err
	}
	return Address{Local: local, Domain: domain}, nil
}

// checkLocalPart applies RFC 5321 section 4.1.2 Dot-string.
func checkLocalPart(local string) error {
	if local == "" {
		return &AddressError{Reason: "empty local part"}
	}
	if len(local) > maxLocalPart {
		return &AddressError{Reason: "local part longer than 64 octets"}
	}
	if local[0] == '.' || local[len(local)-1] == '.' || strings.Contains(local, "..") {
		return &AddressError{Reason: "local part has a leading, trailing or doubled dot"}
	}
	for i := 0; i < len(local); i++ {
		if c := local[i]; c != '.' && !isAtext(c) {
			return &AddressError{Reason: "local part contains a character not allowed in a Dot-string"}
		}
	}
	return nil
}

// isAtext is RFC 5322 section 3.2.3 atext, ASCII only.
func isAtext(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-/=?^_`{|}~", c) >= 0
}

// checkDomain applies RFC 5321 section 4.1.2 Domain, without address
// literals.
func checkDomain(d string) error {
	if d == "" {
		return &AddressError{Reason: "empty domain"}
	}
	if d[0] == '[' {
		return &AddressError{Reason: "address literals are not accepted, use a domain name"}
	}
	if len(d) > maxDomain {
		return &AddressError{Reason: "domain longer than 255 octets"}
	}
	for rest := d; ; {
		l, tail, more := strings.Cut(rest, ".")
		if l == "" {
			return &AddressError{Reason: "domain has an empty label"}
		}
		if len(l) > maxLabel {
			return &AddressError{Reason: "domain label longer than 63 octets"}
		}
		if l[0] == '-' || l[len(l)-1] == '-' {
			return &AddressError{Reason: "domain label starts or ends with a hyphen"}
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-') {
				return &AddressError{Reason: "domain contains a character other than letters, digits, hyphen and dot"}
			}
		}
		if !more {
			if strings.Trim(l, "0123456789") == "" {
				return &AddressError{Reason: "domain ends in a numeric label (an IP address is not a domain)"}
			}
			return nil
		}
		rest = tail
	}
}
