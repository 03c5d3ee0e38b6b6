package submission

import (
	"bytes"
	"net/netip"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"
)

// Mechanisms offered. Both send the password in clear inside the SMTP
// stream, hence plaintextAuthAllowed.
const (
	mechPlain = "PLAIN" // RFC 4616
	mechLogin = "LOGIN" // draft-murchison-sasl-login
)

// plaintextAuthAllowed is the rule for offering AUTH PLAIN/LOGIN: only when
// the password cannot be read on the way, that is over TLS (after
// STARTTLS), or from a loopback client (it never leaves the host). Deciding
// per connection rather than per listener also covers a wildcard listener
// reached over loopback.
func plaintextAuthAllowed(isTLS bool, remote netip.Addr, isLoopback func(netip.Addr) bool) bool {
	return isTLS || (remote.IsValid() && isLoopback(remote))
}

// authenticator checks one set of credentials; it returns nil, or the reply
// to give (bare *smtp.SMTPError, see replies.go).
type authenticator func(identity, user, password string) error

// plainServer is the server side of SASL PLAIN (RFC 4616). go-sasl's own
// server turns a malformed message into a plain error, which go-smtp
// reports as a temporary 454; this one answers 501 and counts a failure.
type plainServer struct {
	auth   authenticator
	failed func() // a malformed exchange, counted like a wrong password
	done   bool
}

// Next implements sasl.Server.
func (p *plainServer) Next(response []byte) (challenge []byte, done bool, err error) {
	if p.done {
		return nil, true, errAuthMalformed
	}
	if response == nil {
		// No initial response: ask for it with an empty challenge
		// (RFC 4954 section 4).
		return []byte{}, false, nil
	}
	p.done = true
	// RFC 4616 section 2: message = [authzid] UTF8NUL authcid UTF8NUL passwd
	parts := bytes.Split(response, []byte{0})
	if len(parts) != 3 {
		p.failed()
		return nil, true, errAuthMalformed
	}
	return nil, true, p.auth(string(parts[0]), string(parts[1]), string(parts[2]))
}

// loginServer is the server side of the LOGIN mechanism, which go-sasl
// only implements as a client: the server prompts "Username:" then
// "Password:", the client answers each.
type loginServer struct {
	auth  authenticator
	step  int
	user  string
	fails func()
}

// Next implements sasl.Server.
func (l *loginServer) Next(response []byte) (challenge []byte, done bool, err error) {
	switch l.step {
	case 0:
		l.step = 1
		if response == nil {
			return []byte("Username:"), false, nil
		}
		// Some clients send the user name as an initial response.
		l.user = string(response)
		l.step = 2
		return []byte("Password:"), false, nil
	case 1:
		l.user = string(response)
		l.step = 2
		return []byte("Password:"), false, nil
	case 2:
		l.step = 3
		return nil, true, l.auth("", l.user, string(response))
	default:
		l.fails()
		return nil, true, errAuthMalformed
	}
}

var (
	_ sasl.Server = (*plainServer)(nil)
	_ sasl.Server = (*loginServer)(nil)
)

// authFailed is the reply for wrong credentials. go-smtp only reports a
// permanent 535 5.7.8 for its own ErrAuthFailed value; any other error
// would become a temporary 454, which clients retry forever.
var authFailed error = smtp.ErrAuthFailed
