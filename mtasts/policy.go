package mtasts

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Mode is a policy's mode (RFC 8461 5).
type Mode string

const (
	// ModeEnforce: deliver only to MX hosts the policy lists, over
	// STARTTLS with a certificate that verifies for the host name.
	ModeEnforce Mode = "enforce"
	// ModeTesting: deliver as without a policy, and report what would
	// have failed (RFC 8460).
	ModeTesting Mode = "testing"
	// ModeNone: the domain has withdrawn its policy.
	ModeNone Mode = "none"
)

// MaxMaxAge is the largest max_age a policy may state, in seconds (RFC
// 8461 3.2: 31557600, about a year).
const MaxMaxAge = 31557600

// Policy is a parsed MTA-STS policy.
type Policy struct {
	Mode   Mode
	MX     []string      // patterns as given, lower case, without a trailing dot
	MaxAge time.Duration // how long the policy may be cached
	// ID is the id of the TXT record that announced this policy.
	ID string
	// Fetched is when the policy was fetched; it expires at Fetched+MaxAge.
	Fetched time.Time
}

// Expires is when the cached policy stops being valid.
func (p *Policy) Expires() time.Time { return p.Fetched.Add(p.MaxAge) }

// Lines returns the policy as the lines RFC 8460 4.4's "policy-string"
// wants (one per field, as fetched minus comments and blanks).
func (p *Policy) Lines() []string {
	out := []string{"version: STSv1", "mode: " + string(p.Mode)}
	for _, mx := range p.MX {
		out = append(out, "mx: "+mx)
	}
	return append(out, "max_age: "+strconv.FormatInt(int64(p.MaxAge/time.Second), 10))
}

// Match says whether host (an MX host name) matches one of the policy's
// patterns (RFC 8461 4.1): names compare case-insensitively, and a
// pattern "*.example.com" matches exactly one more label on the left
// ("mx.example.com", not "a.b.example.com" nor "example.com").
func (p *Policy) Match(host string) bool {
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	for _, pat := range p.MX {
		if matchPattern(pat, host) {
			return true
		}
	}
	return false
}

func matchPattern(pat, host string) bool {
	if rest, ok := strings.CutPrefix(pat, "*."); ok {
		label, parent, found := strings.Cut(host, ".")
		return found && label != "" && parent == rest
	}
	return pat == host
}

// ErrPolicySyntax is wrapped by every Parse error.
var ErrPolicySyntax = errors.New("invalid MTA-STS policy")

// Parse parses a policy body (RFC 8461 3.2): "key: value" lines ending in
// CRLF or LF. version must be "STSv1", mode enforce, testing or none,
// max_age a non-negative integer of at most MaxMaxAge seconds, and enforce
// and testing need at least one mx pattern. Unknown keys are ignored, as
// the RFC asks (extensions); a repeated version, mode or max_age, a line
// without a colon or a malformed mx pattern is an error.
func Parse(body []byte) (*Policy, error) {
	p := &Policy{}
	seen := map[string]bool{}
	fail := func(format string, args ...any) (*Policy, error) {
		return nil, fmt.Errorf("%w: %s", ErrPolicySyntax, fmt.Sprintf(format, args...))
	}
	text := strings.ReplaceAll(string(body), "\r\n", "\n")
	for n, line := range strings.Split(text, "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		key, val, ok := strings.Cut(line, ":")
		if !ok {
			return fail("line %d has no colon", n+1)
		}
		key = strings.TrimSpace(key)
		val = strings.TrimSpace(val)
		if key != "mx" && seen[key] {
			return fail("line %d repeats %q", n+1, key)
		}
		seen[key] = true
		switch key {
		case "version":
			if n != 0 {
				// 3.2: the version field comes first.
				return fail("version is on line %d, not the first", n+1)
			}
			if val != "STSv1" {
				return fail("version %q, want STSv1", val)
			}
		case "mode":
			switch Mode(val) {
			case ModeEnforce, ModeTesting, ModeNone:
				p.Mode = Mode(val)
			default:
				return fail("mode %q, want enforce, testing or none", val)
			}
		case "max_age":
			if val == "" || strings.TrimLeft(val, "0123456789") != "" || len(val) > 10 {
				return fail("max_age %q is not a number of seconds", val)
			}
			secs, _ := strconv.ParseInt(val, 10, 64)
			if secs > MaxMaxAge {
				return fail("max_age %d exceeds %d seconds", secs, MaxMaxAge)
			}
			p.MaxAge = time.Duration(secs) * time.Second
		case "mx":
			pat := strings.ToLower(strings.TrimSuffix(val, "."))
			if !validPattern(pat) {
				return fail("mx pattern %q", val)
			}
			p.MX = append(p.MX, pat)
		}
	}
	switch {
	case !seen["version"]:
		return fail("no version")
	case !seen["mode"]:
		return fail("no mode")
	case !seen["max_age"]:
		return fail("no max_age")
	case p.Mode != ModeNone && len(p.MX) == 0:
		return fail("mode %s without an mx pattern", p.Mode)
	}
	return p, nil
}

// validPattern accepts a host name, optionally with "*." as its whole
// left-most label (RFC 8461 3.2, sts-policy-mx-value).
func validPattern(pat string) bool {
	name := strings.TrimPrefix(pat, "*.")
	if name == "" || len(name) > 253 {
		return false
	}
	for _, label := range strings.Split(name, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, ch := range label {
			if !(ch >= 'a' && ch <= 'z' || ch >= '0' && ch <= '9' || ch == '-' || ch == '_' || ch > 0x7f) {
				return false
			}
		}
	}
	return true
}

// ParseTXT parses the "_mta-sts" TXT record (RFC 8461 3.1): "v=STSv1;
// id=<1-32 letters and digits>;" with optional whitespace around the
// fields; other fields are ignored. It returns the id.
func ParseTXT(rec string) (string, error) {
	fields := strings.Split(rec, ";")
	if strings.TrimSpace(fields[0]) != "v=STSv1" {
		return "", fmt.Errorf("%w: TXT record %q does not start with v=STSv1", ErrPolicySyntax, rec)
	}
	id := ""
	for _, f := range fields[1:] {
		k, v, ok := strings.Cut(strings.TrimSpace(f), "=")
		if !ok {
			if strings.TrimSpace(f) == "" {
				continue
			}
			return "", fmt.Errorf("%w: TXT field %q", ErrPolicySyntax, f)
		}
		if k == "id" {
			if id != "" {
				return "", fmt.Errorf("%w: TXT record repeats id", ErrPolicySyntax)
			}
			if v == "" || len(v) > 32 || strings.TrimLeft(v, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") != "" {
				return "", fmt.Errorf("%w: TXT id %q (want 1 to 32 letters and digits)", ErrPolicySyntax, v)
			}
			id = v
		}
	}
	if id == "" {
		return "", fmt.Errorf("%w: TXT record %q has no id", ErrPolicySyntax, rec)
	}
	return id, nil
}
