package unsubscribe

import (
	"bytes"
	"context"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"hash"
	"net/netip"
	"net/url"
	"strings"
	"sync"

	"golang.org/x/crypto/chacha20poly1305"

	"github.com/outflow/outflow/internal/fleetkey"
)

// Bucket holds the key of the links (keyName): one random key for the
// whole fleet, made by the first process that needs it, so that a link any
// worker wrote opens at any process that serves the page.
const Bucket = "outflow_unsubscribe"

const keyName = "link-key"

// LoadKey returns the fleet's unsubscribe key, making it on first use. Two
// processes making it at once both end with the one stored first.
func LoadKey(ctx context.Context, b fleetkey.Buckets) ([]byte, error) {
	return fleetkey.Load(ctx, b, Bucket, "outflow one-click unsubscribe: the key of its links", keyName)
}

// ErrInvalid is returned by Open for a token that Token did not make
// under this key: cut short, changed, made under another key, or not a
// token at all.
var ErrInvalid = errors.New("unsubscribe: not a valid link")

// Target is what a link names: who is to be unsubscribed, from whose
// mail, and by which message.
type Target struct {
	Tenant string
	Rcpt   string // the recipient address as given to Token, URL or Header
	ID     string // the envelope id (queue.Envelope.ID) of the message that carried the link
}

// A token is base64url (no padding) of
//
//	version (1 byte) | nonce (24 bytes) | XChaCha20-Poly1305(tenant 0x00 rcpt 0x00 id) with its 16-byte tag
//
// sealed under a key derived from the fleet key, with the version byte as
// additional data. The nonce is synthetic: the first 24 bytes of an
// HMAC-SHA256, under a second derived key, of the version and the
// plaintext. So the same target always gives the same token, and Open,
// which derives the nonce again from what it opened, refuses a token
// whose nonce was changed even though the cipher alone would not notice
// (the check of an SIV construction).
const (
	version  = 1
	nonceLen = chacha20poly1305.NonceSizeX
	tagLen   = chacha20poly1305.Overhead
	// minRaw is the shortest token that can open: an empty tenant, rcpt
	// and id still have their two separators.
	minRaw = 1 + nonceLen + 2 + tagLen
	// maxToken bounds what Open decodes. A tenant name, an address of at
	// most 254 octets (RFC 5321's path limit, less the brackets) and an
	// envelope id make a few hundred characters; anything much longer was
	// not made here, and is refused before any work.
	maxToken = 4096
	// maxPooled is the largest buffer kept for reuse: a freak target does
	// not make every pooled scratch hold its size for good.
	maxPooled = 2048
)

// ad is the additional data of every seal: the version byte, so that a
// later format cannot be opened as this one.
var ad = []byte{version}

// enc is base64url without padding, strict, so that each token has one
// spelling: a changed character in the last, partial group is refused
// instead of decoding to the same bytes.
var enc = base64.RawURLEncoding.Strict()

// Links makes the links that go into messages and opens the tokens they
// carry. It is safe for concurrent use.
type Links struct {
	aead    cipher.AEAD
	base    string    // the URL prefix, without a trailing slash
	scratch sync.Pool // of *scratch
}

// scratch holds the HMAC and the buffers of one Token or Open. Every bulk
// message makes a link per recipient, so they are reused: arguments to an
// interface's methods (the HMAC's Write and Sum, the AEAD's Seal and Open)
// escape, and buffers on the stack would move to the heap on every call.
type scratch struct {
	mac   hash.Hash // HMAC-SHA256 under the nonce key
	sum   [sha256.Size]byte
	plain []byte
	raw   []byte
	text  []byte
}

// New returns the links of key, the fleet's key (LoadKey, at least 16
// bytes), under base, the public URL prefix the page is served at, such
// as "https://mail.example.com/unsubscribe". base must be https; plain
// http is taken only for a loopback host (a test or a lab), since a link
// in a message is followed from anywhere.
func New(key []byte, base string) (*Links, error) {
	b, err := checkBase(base)
	if err != nil {
		return nil, err
	}
	l, err := Opener(key)
	if err != nil {
		return nil, err
	}
	l.base = b
	return l, nil
}

// Opener returns the links of key for opening tokens only (Open and
// Token), as an operator's tool reads a link a recipient forwarded; its
// URL and Header have no base to start with.
func Opener(key []byte) (*Links, error) {
	if len(key) < 16 {
		return nil, fmt.Errorf("unsubscribe: a key of %d bytes; at least 16 are needed", len(key))
	}
	aead, err := chacha20poly1305.NewX(derive(key, "unsubscribe/seal"))
	if err != nil {
		return nil, fmt.Errorf("unsubscribe: %w", err)
	}
	nonceKey := derive(key, "unsubscribe/nonce")
	l := &Links{aead: aead}
	l.scratch.New = func() any { return &scratch{mac: hmac.New(sha256.New, nonceKey)} }
	return l, nil
}

// TokenOf is the token of a link as a recipient may paste it: the whole
// URL (with or without the angle brackets of the header field), or the
// token alone.
func TokenOf(link string) string {
	link = strings.TrimSuffix(strings.TrimPrefix(strings.TrimSpace(link), "<"), ">")
	if i := strings.IndexAny(link, "?#"); i >= 0 {
		link = link[:i]
	}
	link = strings.TrimRight(link, "/")
	return link[strings.LastIndexByte(link, '/')+1:]
}

// derive is the sub-key of key for one use: sealing, or making nonces.
// Two uses of one key could leak something through each other; keys
// derived under different labels are independent.
func derive(key []byte, label string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(label))
	return m.Sum(nil)
}

// checkBase validates the URL prefix and returns it in the form links
// use: scheme lower-cased, path escaped, no trailing slash.
func checkBase(base string) (string, error) {
	u, err := url.Parse(strings.TrimSpace(base))
	if err != nil {
		return "", fmt.Errorf("unsubscribe: base URL %q: %w", base, err)
	}
	bad := func(why string) error { return fmt.Errorf("unsubscribe: base URL %q: %s", base, why) }
	switch {
	case u.Opaque != "" || u.Host == "" || u.Hostname() == "":
		return "", bad("a host is required, as in https://mail.example.com/unsubscribe")
	case u.User != nil:
		return "", bad("user information does not belong in a public link")
	case u.RawQuery != "" || u.ForceQuery || strings.Contains(base, "?"):
		return "", bad("a query is not allowed: the token is the link's last path segment")
	case u.Fragment != "" || strings.Contains(base, "#"):
		return "", bad("a fragment is not allowed")
	}
	switch u.Scheme {
	case "https":
	case "http":
		if !loopback(u.Hostname()) {
			return "", bad("must be https (plain http only for localhost or a loopback address)")
		}
	default:
		return "", bad("must be https")
	}
	return u.Scheme + "://" + u.Host + strings.TrimSuffix(u.EscapedPath(), "/"), nil
}

// loopback reports whether host is "localhost" or a loopback IP literal.
func loopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.IsLoopback()
}

func (l *Links) get() *scratch { return l.scratch.Get().(*scratch) }

func (l *Links) put(s *scratch) {
	if cap(s.plain) > maxPooled || cap(s.raw) > maxPooled || cap(s.text) > maxPooled {
		return
	}
	l.scratch.Put(s)
}

// nonce is the synthetic nonce of plain, in s.sum.
func (s *scratch) nonce(plain []byte) []byte {
	s.mac.Reset()
	s.mac.Write(ad)
	s.mac.Write(plain)
	return s.mac.Sum(s.sum[:0])[:nonceLen]
}

// seal makes t's token in s.text.
func (l *Links) seal(s *scratch, t Target) []byte {
	p := append(s.plain[:0], t.Tenant...)
	p = append(append(p, 0), t.Rcpt...)
	p = append(append(p, 0), t.ID...)
	s.plain = p
	r := append(s.raw[:0], version)
	r = append(r, s.nonce(p)...)
	r = l.aead.Seal(r, r[1:1+nonceLen], p, ad)
	s.raw = r
	s.text = enc.AppendEncode(s.text[:0], r)
	return s.text
}

// Token seals t. The same target always gives the same token, so that
// every attempt of a message carries the same bytes and a DKIM signature
// made once over them stays valid. The address cannot be read from the
// token, only opened with the key.
func (l *Links) Token(t Target) string {
	s := l.get()
	defer l.put(s)
	return string(l.seal(s, t))
}

// URL is t's link: the base URL, "/", and Token(t).
func (l *Links) URL(t Target) string {
	s := l.get()
	defer l.put(s)
	return l.base + "/" + string(l.seal(s, t))
}

const (
	hdrStart = "List-Unsubscribe: <"
	hdrEnd   = ">\r\nList-Unsubscribe-Post: List-Unsubscribe=One-Click\r\n"
)

// Header returns the List-Unsubscribe (RFC 2369) and List-Unsubscribe-Post
// (RFC 8058) fields for t, each ending in CRLF, to go in front of a
// message. The URL is never folded: a line longer than 78 characters is
// allowed (RFC 5322 sets the limit at 998), and a fold inside the angle
// brackets would be read as part of the URL by some receivers.
func (l *Links) Header(t Target) []byte {
	s := l.get()
	defer l.put(s)
	tok := l.seal(s, t)
	b := make([]byte, 0, len(hdrStart)+len(l.base)+1+len(tok)+len(hdrEnd))
	b = append(append(b, hdrStart...), l.base...)
	b = append(append(b, '/'), tok...)
	return append(b, hdrEnd...)
}

// Open returns the target token names, or ErrInvalid when Token did not
// make token under this key.
func (l *Links) Open(token string) (Target, error) {
	if len(token) < enc.EncodedLen(minRaw) || len(token) > maxToken {
		return Target{}, ErrInvalid
	}
	s := l.get()
	defer l.put(s)
	s.text = append(s.text[:0], token...)
	r, err := enc.AppendDecode(s.raw[:0], s.text)
	s.raw = r
	// The decoder skips CR and LF: a length that does not match means
	// the token had some, and another spelling is not the same token.
	if err != nil || enc.EncodedLen(len(r)) != len(token) || len(r) < minRaw || r[0] != version {
		return Target{}, ErrInvalid
	}
	nonce := r[1 : 1+nonceLen]
	p, err := l.aead.Open(s.plain[:0], nonce, r[1+nonceLen:], ad)
	if err != nil {
		return Target{}, ErrInvalid
	}
	s.plain = p
	if !hmac.Equal(s.nonce(p), nonce) {
		return Target{}, ErrInvalid
	}
	i := bytes.IndexByte(p, 0)
	j := bytes.LastIndexByte(p, 0)
	if i < 0 || i == j || bytes.IndexByte(p[i+1:j], 0) >= 0 {
		return Target{}, ErrInvalid
	}
	// One string for the three fields.
	str := string(p)
	return Target{Tenant: str[:i], Rcpt: str[i+1 : j], ID: str[j+1:]}, nil
}

const fieldName = "list-unsubscribe"

// Has reports whether the header section of msg (up to its first empty
// line, or all of msg when it has none) has a List-Unsubscribe field, the
// field name in any case. It reads nothing past the header section and
// allocates nothing: it runs for every bulk message.
func Has(msg []byte) bool {
	for len(msg) > 0 {
		line := msg
		if n := bytes.IndexByte(msg, '\n'); n >= 0 {
			line, msg = msg[:n], msg[n+1:]
		} else {
			msg = nil
		}
		if len(line) > 0 && line[len(line)-1] == '\r' {
			line = line[:len(line)-1]
		}
		if len(line) == 0 {
			return false // the end of the header section
		}
		if isUnsubscribeField(line) {
			return true
		}
	}
	return false
}

// isUnsubscribeField reports whether line starts a List-Unsubscribe
// field: the name in any case, optional white space (RFC 5322's obsolete
// syntax allows it before the colon), then a colon. A continuation line
// starts with white space and never matches; List-Unsubscribe-Post does
// not either.
func isUnsubscribeField(line []byte) bool {
	if len(line) <= len(fieldName) {
		return false
	}
	for i := 0; i < len(fieldName); i++ {
		c := line[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != fieldName[i] {
			return false
		}
	}
	for _, c := range line[len(fieldName):] {
		switch c {
		case ':':
			return true
		case ' ', '\t':
		default:
			return false
		}
	}
	return false
}
