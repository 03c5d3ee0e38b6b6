package api

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"mime"
	"net"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/emersion/go-smtp"

	"github.com/outflow/outflow/internal/membudget"
	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/submission"
)

// Accepted is the 202 answer of POST /v1/messages: one id per destination
// domain, in the order the domains first appear among the recipients, as
// the SMTP listener's 250 names them.
type Accepted struct {
	IDs []string `json:"ids"`
}

// maxRequest is the largest request body read for a message of at most
// maxMessage bytes: base64 attachments grow by a third, JSON escaping
// adds some more.
func maxRequest(maxMessage int64) int64 { return maxMessage*3/2 + 1<<20 }

// postMessage is POST /v1/messages.
func (s *Server) postMessage(w http.ResponseWriter, r *http.Request, key *KeyInfo) *Problem {
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return problem(http.StatusUnsupportedMediaType, ProblemMediaType, "unsupported media type", "send the message as Content-Type: application/json")
	}
	idemKey := r.Header.Get("Idempotency-Key")
	if len(idemKey) > maxIdemKey || strings.ContainsAny(idemKey, "\r\n\x00") {
		return problem(http.StatusBadRequest, ProblemBadIdemKey, "bad Idempotency-Key", fmt.Sprintf("at most %d octets of text", maxIdemKey))
	}
	limit := maxRequest(s.cfg.MaxMessageBytes)
	if r.ContentLength > limit {
		return tooLarge(s.cfg.MaxMessageBytes)
	}
	// Charged as the body is read, what the request holds; given back
	// once the answer is written (inflight.go). A Content-Length for
	// which there is no room now is refused before a byte of it is read,
	// but charged nothing: a client that declares much and sends little
	// holds only what it sent.
	charge, p := s.chargeBody(r.Context(), key.Tenant, r.ContentLength, http.MaxBytesReader(w, r.Body, limit))
	if p != nil {
		s.refusedInflight(key, r.ContentLength, 0, p)
		return p
	}
	defer charge.release()
	// The decoder reads the body itself: one copy of it in memory, not
	// two. The hash covers every octet read, which is the whole body.
	// An octet that is not UTF-8 (8-bit text sent as is) is found on
	// the way: the decoder would take it as U+FFFD (utf8.go).
	hash := sha256.New()
	u8 := &utf8Reader{r: charge}
	req, p, err := decodeRequestFrom(io.TeeReader(u8, hash))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return tooLarge(s.cfg.MaxMessageBytes)
		}
		var full *membudget.Full
		if errors.As(err, &full) || errors.Is(err, context.Canceled) && r.Context().Err() != nil {
			p := inflightProblem(err)
			s.refusedInflight(key, r.ContentLength, charge.read, p)
			return p
		}
		return problem(http.StatusBadRequest, ProblemBadJSON, "unreadable request", err.Error())
	}
	if u8.bad {
		return u8.problem()
	}
	if p != nil {
		return p
	}
	rcpts, fields, p := s.checkAddresses(req)
	if p != nil {
		return p
	}
	if !s.cfg.SenderDomains.Allows(key.Tenant, req.From) {
		return senderNotAllowed("from", req.From+" is not one of the sender domains of tenant "+key.Tenant)
	}
	dsnp, p := checkDSN(req.DSN, rcpts)
	if p != nil {
		return p
	}
	var sendAt time.Time
	if req.SendAt != nil {
		if req.SendAt.After(time.Now().Add(MaxSendAhead)) {
			return fieldProblem(ProblemBadSendAt, "send_at too far ahead", "send_at",
				fmt.Sprintf("%s is more than %s ahead", req.SendAt.UTC().Format(time.RFC3339), MaxSendAhead))
		}
		sendAt = req.SendAt.UTC()
	}
	if req.ListUnsubscribe != nil && *req.ListUnsubscribe && s.cfg.Unsubscribe == nil {
		return fieldProblem(ProblemNoUnsubscribe, "no unsubscribe links here", "list_unsubscribe",
			"this server makes no one-click unsubscribe links: its operator has not set --unsubscribe-url")
	}

	reqHash := hex.EncodeToString(hash.Sum(nil))
	date := time.Now().UTC().Truncate(time.Second)
	seed := randomSeed()
	var c *claim
	if idemKey != "" {
		ctx, cancel := context.WithTimeout(r.Context(), s.cfg.EnqueueTimeout)
		c, err = s.idem.begin(ctx, key.Tenant, idemKey, reqHash, s.cfg.EnqueueTimeout)
		cancel()
		switch {
		case errors.Is(err, errIdemMismatch):
			return problem(http.StatusUnprocessableEntity, ProblemIdemMismatch, "Idempotency-Key reused",
				"this key was used with a different request; use a new key for a new message")
		case errors.Is(err, errIdemBusy):
			p := problem(http.StatusConflict, ProblemIdemInProgress, "request in progress", "a request with this Idempotency-Key is still being stored")
			p.RetryAfter = 1
			return p
		case err != nil:
			s.log.Error().Err(err).Msg("idempotency record")
			return unavailable("the idempotency store cannot be read")
		}
		if c.done {
			w.Header().Set("Idempotent-Replayed", "true")
			writeJSON(w, http.StatusAccepted, Accepted{IDs: c.rec.IDs})
			return nil
		}
		// Every try of this key builds the same bytes: same Date, same
		// boundaries and Message-ID.
		date, seed = c.rec.First, idemEntry(key.Tenant, idemKey)
	}
	if sendAt.After(date) {
		// A message built here is dated when it is to be sent (send_at is
		// part of the request, so every try of a key dates it alike).
		date = sendAt.Truncate(time.Second)
	}

	// After the idempotency check: a retry of a request already stored
	// gets its ids even if a recipient was suppressed since.
	p = s.checkSuppressed(r.Context(), key.Tenant, rcpts, fields)
	var msg []byte
	raw := req.Raw != ""
	if p == nil {
		msg, p = s.message(req, date, seed, r.RemoteAddr)
		// What the message was made of is garbage from here on, not
		// held through the store's round trips beside the message.
		req.Raw, req.Text, req.HTML, req.Attachments = "", "", "", nil
	}
	if p == nil {
		if why := s.cfg.SenderDomains.CheckFrom(key.Tenant, msg); why != "" {
			field := "headers.From"
			if raw {
				field = "raw"
			}
			p = senderNotAllowed(field, why)
		}
	}
	if p == nil {
		// Last, once the message is known to be good: its recipients
		// count against the tenant's sending limit, all or none.
		p = s.takeQuota(r.Context(), key.Tenant, len(rcpts))
	}
	if p != nil {
		if c != nil {
			s.idem.abandon(context.WithoutCancel(r.Context()), key.Tenant, idemKey, c)
		}
		return p
	}
	sub := &queue.Submission{
		Tenant: key.Tenant, From: req.From, Rcpts: rcpts, Body: msg,
		ReceivedAt: time.Now().UTC(), RemoteAddr: r.RemoteAddr, IdempotencyKey: idemKey, Source: queue.SourceAPI, DSN: dsnp,
		SendAt: sendAt, ListUnsubscribe: req.ListUnsubscribe,
	}
	// The store is not abandoned with the request: a client that hangs up
	// does not cut an enqueue in half (its retry would find it done).
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), s.cfg.EnqueueTimeout)
	defer cancel()
	ids, err := s.enqueue(ctx, sub)
	if err != nil {
		if s.cfg.Quota != nil && !errors.Is(err, queue.ErrMaybeStored) {
			// Not stored: not sent. What may be stored is delivered,
			// and keeps its recipients counted (a keyed retry counts
			// them again: the limit errs on the side of sending less).
			s.cfg.Quota.Return(key.Tenant, len(rcpts))
		}
		s.log.Error().Err(err).Str("tenant", key.Tenant).Str("key_id", key.ID).Int("size", len(msg)).Msg("api submission not queued")
		if c != nil {
			// Not ctx: when the enqueue ran out of time, so has it, and
			// the record left in progress would answer the client's
			// retry 409 until it went stale.
			rctx := context.WithoutCancel(r.Context())
			if errors.Is(err, queue.ErrMaybeStored) {
				// The key stays this request's (idemRecord.MaybeStored):
				// its retry stores the same bytes under the same ids, and
				// another message cannot take them.
				if err := s.idem.maybeStored(rctx, key.Tenant, idemKey, c); err != nil {
					s.log.Warn().Err(err).Msg("idempotency record not marked maybe stored")
				}
			} else {
				s.idem.abandon(rctx, key.Tenant, idemKey, c)
			}
		}
		if errors.Is(err, queue.ErrNoRoom) {
			return storeFull()
		}
		// Not "nothing was stored": a message to several domains is
		// several envelopes, and some may be stored before the failure
		// (or all of them, when it was their fsync that failed); no
		// worker waits for the answer to deliver what is.
		return unavailable("the message was not stored, or only in part: send it again, with the same Idempotency-Key so that no recipient gets it twice")
	}
	if c != nil {
		if err := s.idem.finish(ctx, key.Tenant, idemKey, c, ids); err != nil {
			// Stored all the same: a retry re-enqueues under the same
			// ids, which the work stream's deduplication absorbs.
			s.log.Warn().Err(err).Strs("ids", ids).Msg("idempotency record not finished")
		}
	}
	s.log.Info().Strs("ids", ids).Str("tenant", key.Tenant).Str("key_id", key.ID).Str("from", req.From).
		Int("rcpt_count", len(rcpts)).Int("size", len(msg)).Msg("api submission accepted")
	writeJSON(w, http.StatusAccepted, Accepted{IDs: ids})
	return nil
}

// enqueue calls the queue, turning a panic into an error: a bug there
// costs one 503, not the process.
func (s *Server) enqueue(ctx context.Context, sub *queue.Submission) (ids []string, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("api: enqueue panicked: %v", p)
		}
	}()
	return s.cfg.Queue.Enqueue(ctx, sub)
}

func randomSeed() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func tooLarge(limit int64) *Problem {
	return problem(http.StatusRequestEntityTooLarge, ProblemTooLarge, "message too large", fmt.Sprintf("the limit is %d bytes", limit))
}

// decodeRequestFrom parses the JSON body read from r strictly: an unknown
// field is an error, so that a misspelt "subjcet" is not silently dropped.
// A failure to read r is returned as err, for the caller to answer.
func decodeRequestFrom(r io.Reader) (*MessageRequest, *Problem, error) {
	var req MessageRequest
	if p, err := decodeStrictFrom(r, &req, "a message"); p != nil || err != nil {
		return nil, p, err
	}
	return &req, nil, nil
}

// decodeStrict parses body into v, a pointer to a struct, strictly (an
// unknown field or data after the object is an error) and turns a fault
// into its problem: unknown-field naming the field, or bad-json naming the
// field of a wrong type. what names the object in the detail ("a message").
func decodeStrict(body []byte, v any, what string) *Problem {
	p, err := decodeStrictFrom(bytes.NewReader(body), v, what)
	if err != nil { // a bytes.Reader does not fail
		return problem(http.StatusBadRequest, ProblemBadJSON, "unreadable request", err.Error())
	}
	return p
}

// readErrs remembers the first error other than io.EOF that its reader
// returned: the decoder's error is then the reader's, not the JSON's.
type readErrs struct {
	r   io.Reader
	err error
}

func (e *readErrs) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil && err != io.EOF && e.err == nil {
		e.err = err
	}
	return n, err
}

// decodeStrictFrom is decodeStrict reading from r, all of it (a body's
// hash covers every octet); a failure to read r is returned as err, not
// as a problem.
func decodeStrictFrom(r io.Reader, v any, what string) (*Problem, error) {
	rd := &readErrs{r: r}
	dec := json.NewDecoder(rd)
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil && !onlySpace(dec.Buffered(), rd) {
		// Not dec.More(), which says false before a "]" or "}": a body
		// of `{...}]` was taken.
		err = errors.New("data after the JSON object")
	}
	if rd.err != nil {
		return nil, rd.err
	}
	if err == nil {
		return nil, nil
	}
	return jsonProblem(err, what), nil
}

// onlySpace reads buffered, then r to its end, and reports whether they
// hold nothing but JSON white space.
func onlySpace(buffered, r io.Reader) bool {
	buf := make([]byte, 4096)
	for _, rd := range []io.Reader{buffered, r} {
		for {
			n, err := rd.Read(buf)
			if len(bytes.TrimLeft(buf[:n], " \t\r\n")) > 0 {
				return false
			}
			if err != nil {
				break
			}
		}
	}
	return true
}

// jsonProblem is the problem of a JSON decoding error of what.
func jsonProblem(err error, what string) *Problem {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	var tpe *time.ParseError
	switch {
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		// encoding/json has no error type for this one.
		name := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		p := problem(http.StatusBadRequest, ProblemUnknownField, "unknown field", fmt.Sprintf("%q is not a field of %s", name, what))
		p.Errors = []FieldError{{Field: name, Reason: "unknown field"}}
		return p
	case errors.As(err, &syn):
		return problem(http.StatusBadRequest, ProblemBadJSON, "malformed JSON", fmt.Sprintf("%v (at byte %d)", syn, syn.Offset))
	case errors.As(err, &typ) && typ.Field == "":
		return problem(http.StatusBadRequest, ProblemBadJSON, "malformed JSON", fmt.Sprintf("the body must be a JSON object (%s), not %s", what, typ.Value))
	case errors.As(err, &typ):
		want := jsonType(typ.Type)
		p := problem(http.StatusBadRequest, ProblemBadJSON, "malformed JSON", fmt.Sprintf("%s: want %s, got %s", typ.Field, want, typ.Value))
		p.Errors = []FieldError{{Field: typ.Field, Reason: "want " + want}}
		return p
	case errors.As(err, &tpe):
		// The API's only times are RFC 3339 (a suppression's "expires").
		return problem(http.StatusBadRequest, ProblemBadJSON, "malformed JSON",
			fmt.Sprintf("a time must be RFC 3339, e.g. 2030-01-02T15:04:05Z; %q is not", tpe.Value))
	default:
		return problem(http.StatusBadRequest, ProblemBadJSON, "malformed JSON", err.Error())
	}
}

// jsonType names the JSON type a Go type decodes from, for a client who
// never saw the Go code: "array of string", not "[]string".
func jsonType(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Float32, reflect.Float64:
		return "number"
	case reflect.Slice, reflect.Array:
		return "array of " + jsonType(t.Elem())
	case reflect.Pointer:
		return jsonType(t.Elem())
	default:
		return "object"
	}
}

// checkAddresses validates from, to, cc and bcc as the SMTP listener
// validates MAIL FROM and RCPT TO, and returns the recipients without
// duplicates, with the request field that names each (for later problems).
func (s *Server) checkAddresses(req *MessageRequest) ([]string, map[string]string, *Problem) {
	if req.From == "" {
		return nil, nil, fieldProblem(ProblemMissingField, "missing field", "from", "the sender address is required")
	}
	if len(req.To) == 0 {
		return nil, nil, fieldProblem(ProblemMissingField, "missing field", "to", "at least one recipient is required")
	}
	n := len(req.To) + len(req.Cc) + len(req.Bcc)
	if n > s.cfg.MaxRecipients {
		p := problem(http.StatusUnprocessableEntity, ProblemBadAddress, "too many recipients", fmt.Sprintf("at most %d recipients per message (to, cc and bcc together)", s.cfg.MaxRecipients))
		p.Errors = []FieldError{{Field: "to", Reason: "too many recipients"}}
		return nil, nil, p
	}
	var bad []FieldError
	check := func(field, a string) {
		if _, err := submission.ParseAddress(a); err != nil {
			var ae *submission.AddressError
			reason := err.Error()
			if errors.As(err, &ae) {
				reason = ae.Reason
			}
			fe := FieldError{Field: field, Reason: reason}
			if len(a) <= 254 && !strings.ContainsAny(a, "\r\n\x00") {
				fe.Value = a
			}
			bad = append(bad, fe)
		}
	}
	check("from", req.From)
	fields := make(map[string]string, n)
	rcpts := make([]string, 0, n)
	for _, l := range []struct {
		name  string
		addrs []string
	}{{"to", req.To}, {"cc", req.Cc}, {"bcc", req.Bcc}} {
		for i, a := range l.addrs {
			field := fmt.Sprintf("%s[%d]", l.name, i)
			check(field, a)
			if k := strings.ToLower(a); fields[k] == "" {
				fields[k] = field
				rcpts = append(rcpts, a)
			}
		}
	}
	if len(bad) > 0 {
		p := problem(http.StatusUnprocessableEntity, ProblemBadAddress, "bad address",
			fmt.Sprintf("%d address(es) cannot be used: %s: %s", len(bad), bad[0].Field, bad[0].Reason))
		p.Errors = bad
		return nil, nil, p
	}
	return rcpts, fields, nil
}

// checkDSN checks the request's DSN parameters with the SMTP listener's
// rules (submission.MessageDSN, submission.RecipientDSN) and returns them
// as stored, keyed by the recipients' spelling in rcpts.
func checkDSN(d *DSNRequest, rcpts []string) (*queue.DSNParams, *Problem) {
	if d == nil {
		return nil, nil
	}
	bad := func(field, value string, err *smtp.SMTPError) *Problem {
		p := problem(http.StatusBadRequest, ProblemBadDSN, "bad DSN parameter", field+": "+err.Message)
		fe := FieldError{Field: field, Reason: err.Message}
		if len(value) <= 254 && !strings.ContainsAny(value, "\r\n\x00") {
			fe.Value = value
		}
		p.Errors = []FieldError{fe}
		return p
	}
	out, err := submission.MessageDSN(d.Ret, d.EnvID)
	if err != nil {
		// Each of the listener's replies begins with the parameter's name.
		field, value := "dsn.ret", d.Ret
		if !strings.HasPrefix(err.Message, "RET") {
			field, value = "dsn.envid", d.EnvID
		}
		return nil, bad(field, value, err)
	}
	byLower := make(map[string]string, len(rcpts))
	for _, r := range rcpts {
		byLower[strings.ToLower(r)] = r
	}
	for _, addr := range slices.Sorted(maps.Keys(d.Recipients)) {
		rd := d.Recipients[addr]
		field := "dsn.recipients[" + addr + "]"
		rcpt, ok := byLower[strings.ToLower(addr)]
		if !ok {
			p := problem(http.StatusBadRequest, ProblemBadDSN, "bad DSN parameter", field+": not a recipient in \"to\", \"cc\" or \"bcc\"")
			p.Errors = []FieldError{{Field: field, Reason: "not a recipient in \"to\", \"cc\" or \"bcc\""}}
			return nil, p
		}
		var typ, orcpt string
		if rd.ORcpt != "" {
			if typ, orcpt, err = submission.ParseORcpt(rd.ORcpt); err != nil {
				return nil, bad(field+".orcpt", rd.ORcpt, err)
			}
		}
		rp, given, err := submission.RecipientDSN(rd.Notify, typ, orcpt)
		if err != nil {
			if strings.HasPrefix(err.Message, "NOTIFY") {
				return nil, bad(field+".notify", strings.Join(rd.Notify, ","), err)
			}
			return nil, bad(field+".orcpt", rd.ORcpt, err)
		}
		if !given {
			continue
		}
		out = submission.AddRcptDSN(out, rcpt, rp)
	}
	return out, nil
}

// message returns the bytes to queue: the raw message (with a Date and a
// Message-ID if it had none), or the built one, under a Received line (RFC
// 5321 section 4.4), within the size limit. The Received line is written
// into the buffer the message is made in, not copied in front of it
// afterwards: a large message is in memory once here, not twice.
func (s *Server) message(req *MessageRequest, date time.Time, seed, remote string) ([]byte, *Problem) {
	host, _, _ := net.SplitHostPort(remote)
	lit := "unknown"
	if ip := net.ParseIP(host); ip != nil {
		if ip.To4() != nil {
			lit = "[" + ip.String() + "]"
		} else {
			lit = "[IPv6:" + ip.String() + "]"
		}
	}
	recv := "Received: from " + lit + "\r\n\tby " + s.cfg.Hostname + " (outflow) with HTTP;\r\n\t" + date.Format(time.RFC1123Z) + "\r\n"
	var msg []byte
	var err error
	if req.Raw != "" {
		if req.Subject != "" || req.Text != "" || req.HTML != "" || len(req.Headers) > 0 || len(req.Attachments) > 0 {
			return nil, problem(http.StatusBadRequest, ProblemBadMessage, "raw and parts together",
				"give either raw or subject/text/html/headers/attachments, not both")
		}
		msg, err = s.rawMessage(req.Raw, recv, date, seed)
	} else {
		msg, err = buildAfter([]byte(recv), req, date, s.cfg.Hostname, seed)
	}
	if err != nil {
		var p *Problem
		if errors.As(err, &p) {
			return nil, p
		}
		s.log.Error().Err(err).Msg("build message")
		return nil, problem(http.StatusInternalServerError, ProblemInternal, "internal error", "the message could not be built")
	}
	if int64(len(msg)-len(recv)) > s.cfg.MaxMessageBytes {
		return nil, tooLarge(s.cfg.MaxMessageBytes)
	}
	return msg, nil
}

// rawMessage is raw with CRLF line ends, and a Date and a Message-ID when
// it has none (submission.CompleteHeaders), under recv: normalized into
// one buffer with room in front for recv and the added fields.
func (s *Server) rawMessage(raw, recv string, date time.Time, seed string) ([]byte, error) {
	// Date (39 octets) and Message-ID (49 and the host name).
	room := len(recv) + 96 + len(s.cfg.Hostname)
	buf, err := normalizeRaw(raw, room)
	if err != nil {
		return nil, err
	}
	msg := buf[room:]
	hdr := msg
	if i := bytes.Index(msg, []byte("\r\n\r\n")); i >= 0 {
		hdr = msg[:i+4]
	}
	// The fields missing from the header section go on top of it; the
	// header alone is copied for that, not the whole message.
	done := submission.CompleteHeaders(hdr, 0, s.cfg.Hostname, seed, date)
	add := done[:len(done)-len(hdr)]
	at := room - len(add) - len(recv)
	if at < 0 { // more fields than room was left for: never today
		out := make([]byte, 0, len(recv)+len(add)+len(msg))
		return append(append(append(out, recv...), add...), msg...), nil
	}
	copy(buf[at:], recv)
	copy(buf[at+len(recv):], add)
	return buf[at:], nil
}

// MessageStatus is the answer of GET /v1/messages/{id}: where the message
// is now, and every event recorded for it (what `outflow queue history`
// shows).
type MessageStatus struct {
	ID     string `json:"id"`
	Tenant string `json:"tenant"`
	Dest   string `json:"dest,omitempty"`
	// State is queued, deferred, throttled, unknown or dead while the
	// message is stored; afterwards the last outcome: delivered, bounced,
	// dropped, or dead and expired once a dead letter is purged.
	State  string     `json:"state"`
	NextAt *time.Time `json:"next_attempt_at,omitempty"`
	// LastClass and LastReply say why a stored message waits: its last
	// attempt's class and reply, or for one not tried yet the
	// coordinator's reason ("local", "suspended: a.test@192.0.2.10:
	// source blocked (…): 550 …"), which a deferred event records too.
	LastClass  string   `json:"last_class,omitempty"`
	LastReply  string   `json:"last_reply,omitempty"`
	Recipients []string `json:"recipients,omitempty"`
	// Outcomes is what became of each recipient the history names: one
	// attempt can deliver some of a part's recipients and bounce others,
	// and State, the part's last outcome, says one of them.
	Outcomes []RecipientOutcome `json:"outcomes,omitempty"`
	History  []queue.Event      `json:"history"`
}

// RecipientOutcome is one recipient's state, the `outcomes` of a
// message's status (queue.RecipientOutcomes).
type RecipientOutcome = queue.RecipientOutcome

// history reads message id's events for key. Only the tenant's events are
// read when it is known, a sixty-fourth of the stream's with many tenants
// (queue.TenantHistory): a tenant's key's, or for an admin key that of a
// message still in a lane (it, nil when none).
func (s *Server) history(ctx context.Context, key *KeyInfo, it *queue.Item, id string) ([]queue.Event, error) {
	tenant := key.Tenant
	if key.Admin {
		tenant = ""
		if it != nil {
			tenant = it.Env.Tenant
		}
	}
	if tenant != "" {
		evs, err := s.cfg.Queue.TenantHistory(ctx, tenant, id, time.Time{})
		if !key.Admin {
			evs = queue.EventsForTenant(evs)
		}
		return evs, err
	}
	return s.cfg.Queue.History(ctx, id, time.Time{})
}

// getMessage is GET /v1/messages/{id}. A key sees its tenant's messages
// only (an admin key every tenant's); another tenant's id is a 404, as if
// it did not exist.
func (s *Server) getMessage(w http.ResponseWriter, r *http.Request, key *KeyInfo) *Problem {
	id := r.PathValue("id")
	notFound := problem(http.StatusNotFound, ProblemNotFound, "no such message", "no message "+id+" for this key's tenant")
	ctx := r.Context()
	it, err := s.cfg.Queue.Find(ctx, id)
	if err != nil && !errors.Is(err, queue.ErrNotFound) {
		s.log.Error().Err(err).Str("msg_id", id).Msg("api find")
		return unavailable("the queue cannot be read")
	}
	hist, herr := s.history(ctx, key, it, id)
	if herr != nil && !errors.Is(herr, queue.ErrNotFound) {
		s.log.Error().Err(herr).Str("msg_id", id).Msg("api history")
		return unavailable("the events cannot be read")
	}
	st := MessageStatus{ID: id, History: hist}
	if st.History == nil {
		st.History = []queue.Event{}
	}
	switch {
	case it != nil:
		st.Tenant, st.Dest, st.State, st.Recipients = it.Env.Tenant, it.Env.Dest, string(it.State), it.Env.Rcpts
		st.LastClass, st.LastReply = it.Env.LastClass, it.Env.LastReply
		// A delivered envelope's acknowledgement is not waited for (the
		// SENT marker makes a lost one harmless), so for a moment it is
		// still on the work lane behind its outcome: the outcome is the
		// state.
		if out := queue.LastOutcome(hist); it.State == queue.StateQueued && (out == queue.EventDelivered || out == queue.EventBounced) {
			st.State = out
		}
		if !it.NextAt.IsZero() {
			t := it.NextAt.UTC()
			st.NextAt = &t
		}
	case len(hist) > 0:
		st.Tenant, st.Dest, st.State = hist[0].Tenant, hist[0].Dest, queue.LastOutcome(hist)
	default:
		return notFound
	}
	if !key.Admin && st.Tenant != key.Tenant {
		return notFound
	}
	st.Outcomes = queue.RecipientOutcomes(hist, nil)
	writeJSON(w, http.StatusOK, st)
	return nil
}

// senderNotAllowed is the problem of a sender outside the tenant's
// sender domains (Config.SenderDomains).
func senderNotAllowed(field, why string) *Problem {
	p := problem(http.StatusUnprocessableEntity, ProblemSenderNotAllowed, "sender not allowed", field+": "+why)
	p.Errors = []FieldError{{Field: field, Reason: why}}
	return p
}

// Canceled is the answer to DELETE /v1/messages/{id}.
type Canceled struct {
	ID    string `json:"id"`
	State string `json:"state"` // dropped
	Was   string `json:"was"`   // where it waited: queued, deferred, throttled, unknown, dead
}

// cancelMessage is DELETE /v1/messages/{id}: the tenant's message (an
// admin key: any) is taken out of the queue wherever it waits, with a
// dropped event, as `outflow queue drop` does: 200. A message that has
// left the queue is a 409 already-sent naming its outcome; another
// tenant's, or none, a 404. One id is one destination's part of a
// message. A part a worker is delivering at this moment may still be
// delivered: its history then shows both.
func (s *Server) cancelMessage(w http.ResponseWriter, r *http.Request, key *KeyInfo) *Problem {
	id := r.PathValue("id")
	notFound := problem(http.StatusNotFound, ProblemNotFound, "no such message", "no message "+id+" for this key's tenant")
	ctx := r.Context()
	it, err := s.cfg.Queue.Find(ctx, id)
	switch {
	case errors.Is(err, queue.ErrNotFound):
		hist, herr := s.history(ctx, key, nil, id)
		if herr != nil && !errors.Is(herr, queue.ErrNotFound) {
			s.log.Error().Err(herr).Str("msg_id", id).Msg("api history")
			return unavailable("the events cannot be read")
		}
		if len(hist) == 0 || !key.Admin && hist[0].Tenant != key.Tenant {
			return notFound
		}
		return problem(http.StatusConflict, ProblemAlreadySent, "already sent",
			"message "+id+" has left the queue: "+queue.LastOutcome(hist))
	case err != nil:
		s.log.Error().Err(err).Str("msg_id", id).Msg("api find")
		return unavailable("the queue cannot be read")
	}
	if !key.Admin && it.Env.Tenant != key.Tenant {
		return notFound
	}
	// A tenant's own cancellation is the API's; an admin key's of
	// another tenant's message is the operator's, which that tenant sees
	// as "admin" (queue.ForTenant), and the operator's views by key.
	by := "api"
	if key.Admin && it.Env.Tenant != key.Tenant {
		by = queue.OperatorAdmin + ":apikey " + key.ID
	}
	dropped, err := s.cfg.Queue.DropBy(ctx, id, by)
	if errors.Is(err, queue.ErrNotFound) {
		// Delivered or moved between the look and the drop: ask again.
		return problem(http.StatusConflict, ProblemAlreadySent, "already sent", "message "+id+" left its lane meanwhile; read its state")
	}
	if err != nil {
		s.log.Error().Err(err).Str("msg_id", id).Msg("api cancel")
		return unavailable("the queue cannot be written")
	}
	s.log.Info().Str("msg_id", id).Str("tenant", dropped.Env.Tenant).Str("key_id", key.ID).Str("was", string(dropped.State)).Msg("message canceled")
	writeJSON(w, http.StatusOK, Canceled{ID: id, State: queue.EventDropped, Was: string(dropped.State)})
	return nil
}
