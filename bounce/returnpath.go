package bounce

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base32"
	"errors"
	"hash"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/outflow/outflow/internal/fleetkey"
)

// BucketBounces holds the return path's key (keyName): one random key for
// the whole fleet, made by the first process that needs it, so that a
// bounce to an address any worker wrote is recognised by any listener.
const BucketBounces = "outflow_bounces"

const keyName = "return-path-key"

// Buckets opens key-value buckets (queue.Queue.KeyValue).
type Buckets = fleetkey.Buckets

// LoadKey returns the fleet's return-path key, making it on first use. Two
// processes making it at once both end with the one stored first.
func LoadKey(ctx context.Context, b Buckets) ([]byte, error) {
	return fleetkey.Load(ctx, b, BucketBounces, "outflow return path: the key of its addresses", keyName)
}

// Streams reads the stream that holds a key-value bucket
// (queue.Queue.KVStream), without making the bucket.
type Streams interface {
	KVStream(ctx context.Context, bucket string) (jetstream.Stream, error)
}

// InUse reports whether a process of the fleet has made the return-path
// key (LoadKey), which serve does at start when some tenant's mail goes
// out with a return path. It makes nothing. `outflow submit`, which does
// not read the daemon's tenant settings, asks it to know whether to give
// each recipient an envelope of its own, as serve does for such a tenant
// (queue.Submission.PerRecipient). A key deleted since still counts: the
// processes that loaded it keep using it.
func InUse(ctx context.Context, s Streams) (bool, error) {
	st, err := s.KVStream(ctx, BucketBounces)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if _, err := st.GetLastMsgForSubject(ctx, "$KV."+BucketBounces+"."+keyName); err != nil {
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return false, nil
		}
		return false, err
	}
	return true, nil
}

// ReturnPath makes the envelope senders (MAIL FROM) that bring a
// message's later bounces back to outflow, and recognises them when they
// come back. An address is
//
//	b.<envelope id>.<minute>.<mac>@<return-path domain>
//
// with the attempt's minute since the Unix epoch in base 36 (how far back
// the listener looks for the envelope's events) and the first 10 bytes of
// an HMAC-SHA256 of the two under the fleet's key, in lower-case base 32:
// nobody can make an address that suppresses a recipient of a message
// outflow did not send, or name another envelope. The envelope id is
// written as it is (letters, digits and hyphens); mail systems return
// bounces to the envelope sender byte for byte. About 50 octets, under
// RFC 5321's 64 for a local part; a longer one is not used (Address).
type ReturnPath struct {
	key     []byte
	def     string             // the default domain, "" for none
	tenants map[string]*string // a tenant's own domain; "" turns it off for the tenant
	domains map[string]bool    // every domain, lower-cased
	macs    sync.Pool          // of hash.Hash: HMAC-SHA256 under key
}

// NewReturnPath returns the return path with key (LoadKey): domain is
// every tenant's unless tenants names another (or "", none) for one.
func NewReturnPath(key []byte, domain string, tenants map[string]*string) *ReturnPath {
	rp := &ReturnPath{key: key, def: strings.ToLower(domain), tenants: map[string]*string{}, domains: map[string]bool{}}
	rp.macs.New = func() any { return hmac.New(sha256.New, key) }
	if rp.def != "" {
		rp.domains[rp.def] = true
	}
	for t, d := range tenants {
		if d == nil {
			continue
		}
		v := strings.ToLower(strings.TrimSpace(*d))
		rp.tenants[t] = &v
		if v != "" {
			rp.domains[v] = true
		}
	}
	return rp
}

// Enabled reports whether any tenant's mail gets a return path.
func (rp *ReturnPath) Enabled() bool { return rp != nil && len(rp.domains) > 0 }

// Domains returns the domains bounces come back to, sorted by nothing.
func (rp *ReturnPath) Domains() []string {
	out := make([]string, 0, len(rp.domains))
	for d := range rp.domains {
		out = append(out, d)
	}
	return out
}

// Applies reports whether tenant's mail goes out with a return path.
func (rp *ReturnPath) Applies(tenant string) bool { return rp != nil && rp.domainOf(tenant) != "" }

// domainOf is tenant's return-path domain, "" for none.
func (rp *ReturnPath) domainOf(tenant string) string {
	if d, ok := rp.tenants[tenant]; ok {
		return *d
	}
	return rp.def
}

const maxLocal = 64 // RFC 5321 4.5.3.1.1

var b32 = base32.StdEncoding.WithPadding(base32.NoPadding)

// macLen is the MAC's length in the address: 10 bytes in base 32.
const macLen = 16

// appendMAC appends the MAC of id and minute, in lower-case base 32, to
// dst. Every attempt of a tenant with a return path makes one: the HMAC
// is reused from a pool and the input built on the stack.
func (rp *ReturnPath) appendMAC(dst []byte, id, minute string) []byte {
	h := rp.macs.Get().(hash.Hash)
	defer rp.macs.Put(h)
	h.Reset()
	var in [128]byte
	b := append(in[:0], "outflow-return-path\x00"...)
	b = append(append(append(b, id...), 0), minute...)
	h.Write(b)
	var sum [sha256.Size]byte
	var enc [macLen]byte
	b32.Encode(enc[:], h.Sum(sum[:0])[:10])
	for i, c := range enc {
		if c >= 'A' && c <= 'Z' {
			enc[i] = c + 'a' - 'A'
		}
	}
	return append(dst, enc[:]...)
}

// Address is the envelope sender for an attempt of envelope id at at: the
// return path of tenant's domain, or from itself when the tenant has none,
// when from is the null sender (a bounce is never answered with another),
// or when the address would be too long.
func (rp *ReturnPath) Address(tenant, id, from string, at time.Time) string {
	if rp == nil || from == "" {
		return from
	}
	domain := rp.domainOf(tenant)
	if domain == "" || id == "" || strings.ContainsAny(id, ".@") {
		return from
	}
	var mb [16]byte
	minute := strconv.AppendInt(mb[:0], at.Unix()/60, 36)
	n := len("b...") + len(id) + len(minute) + macLen
	if n > maxLocal {
		return from
	}
	b := make([]byte, 0, n+1+len(domain))
	b = append(append(append(append(b, "b."...), id...), '.'), minute...)
	b = rp.appendMAC(append(b, '.'), id, string(minute))
	return string(append(append(b, '@'), domain...))
}

// Check returns the envelope id and the attempt's minute of addr, or ok
// false when addr is not one of this fleet's return-path addresses (a
// domain not configured, a malformed local part, a MAC that does not
// match). Domains match case-insensitively, as do the MAC's letters; the
// id is compared as written.
func (rp *ReturnPath) Check(addr string) (id string, at time.Time, ok bool) {
	if rp == nil {
		return "", time.Time{}, false
	}
	addr = strings.TrimSuffix(strings.TrimPrefix(strings.TrimSpace(addr), "<"), ">")
	at_ := strings.LastIndexByte(addr, '@')
	if at_ < 0 || !rp.domains[strings.ToLower(addr[at_+1:])] {
		return "", time.Time{}, false
	}
	parts := strings.Split(addr[:at_], ".")
	if len(parts) != 4 || !strings.EqualFold(parts[0], "b") || parts[1] == "" {
		return "", time.Time{}, false
	}
	id, minute, mac := parts[1], strings.ToLower(parts[2]), strings.ToLower(parts[3])
	n, err := strconv.ParseInt(minute, 36, 64)
	if err != nil || n < 0 {
		return "", time.Time{}, false
	}
	if !hmac.Equal([]byte(mac), rp.appendMAC(nil, id, minute)) {
		return "", time.Time{}, false
	}
	return id, time.Unix(n*60, 0).UTC(), true
}

// FeedbackLocal is the local part of the address at each return-path
// domain that takes feedback reports (ARF) from providers' feedback loops,
// which send them to one registered address rather than to the message's
// envelope sender: fbl@<domain>. Such a report names its envelope by the
// return path it was sent from: its Original-Mail-From, else one in the
// original's header (Return-Path, else Authentication-Results'
// smtp.mailfrom= and the like); see Server.withOriginal. Microsoft's JMRP
// in its older format sends no report, only the original attached.
const FeedbackLocal = "fbl"

// IsFeedbackAddress reports whether addr is FeedbackLocal at one of the
// return-path domains.
func (rp *ReturnPath) IsFeedbackAddress(addr string) bool {
	if rp == nil {
		return false
	}
	addr = strings.TrimSuffix(strings.TrimPrefix(strings.TrimSpace(addr), "<"), ">")
	local, domain, ok := strings.Cut(addr, "@")
	return ok && strings.EqualFold(local, FeedbackLocal) && rp.domains[strings.ToLower(domain)]
}

// HasDomain reports whether domain is one of the return-path domains.
func (rp *ReturnPath) HasDomain(domain string) bool {
	return rp != nil && rp.domains[strings.ToLower(strings.TrimSuffix(domain, "."))]
}

// RoleLocals are the local parts at each return-path domain that people
// write to: postmaster (RFC 5321 4.5.1 has every mail domain take it) and
// abuse (RFC 2142; where providers' abuse desks write about a sending
// domain). The listener forwards them to an operator (Config.Postmaster).
var RoleLocals = []string{"postmaster", "abuse"}

// IsRoleAddress reports whether addr is one of RoleLocals at one of the
// return-path domains.
func (rp *ReturnPath) IsRoleAddress(addr string) bool {
	if rp == nil {
		return false
	}
	addr = strings.TrimSuffix(strings.TrimPrefix(strings.TrimSpace(addr), "<"), ">")
	local, domain, ok := strings.Cut(addr, "@")
	if !ok || !rp.HasDomain(domain) {
		return false
	}
	for _, l := range RoleLocals {
		if strings.EqualFold(local, l) {
			return true
		}
	}
	return false
}

// Find returns the return paths of this fleet that appear in text (an
// original's header: its Return-Path, a Received field's "for", the
// smtp.mailfrom= of an Authentication-Results field or the envelope-from=
// of a Received-SPF field), each once, at most max. A word is a return
// path as it stands, or its value after its first '=' (key=value, as
// RFC 8601 and RFC 7208 §9.1 write the envelope sender).
func (rp *ReturnPath) Find(text []byte, max int) []string {
	var out []string
	seen := map[string]bool{}
	fields := strings.FieldsFunc(string(text), func(r rune) bool {
		return r == ' ' || r == '\t' || r == '\r' || r == '\n' || r == '<' || r == '>' || r == ';' || r == ',' || r == '"' || r == '(' || r == ')'
	})
	for _, f := range fields {
		if len(out) >= max {
			break
		}
		if _, v, ok := strings.Cut(f, "="); ok && !strings.HasPrefix(f, "b.") && !strings.HasPrefix(f, "B.") {
			f = v
		}
		if !strings.HasPrefix(f, "b.") && !strings.HasPrefix(f, "B.") || seen[f] {
			continue
		}
		seen[f] = true
		if _, _, ok := rp.Check(f); ok {
			out = append(out, f)
		}
	}
	return out
}
