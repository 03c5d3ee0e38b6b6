package queue

import (
	"context"
	"fmt"
	"mime"
	"net/mail"
	"strings"
	"testing"
	"time"

	"github.com/outflow/outflow/internal/mailhdr"
)

// editBody is the message the EditHeaders tests edit.
var editBody = []byte("From: a@src.example\r\nTo: r@dst.example\r\nSubject: old\r\n\r\nbody\r\n")

// headerOf returns the header section of msg, each line checked: ASCII
// only (no SMTPUTF8 is sent), no line over 998 octets, CRLF line ends.
func headerOf(t *testing.T, msg []byte) string {
	t.Helper()
	head, _, ok := strings.Cut(string(msg), "\r\n\r\n")
	if !ok {
		t.Fatalf("no header/body separator in %q", msg)
	}
	for _, l := range strings.Split(head, "\r\n") {
		if len(l) > 998 {
			t.Errorf("a header line of %d octets", len(l))
		}
		for i := 0; i < len(l); i++ {
			if c := l[i]; c >= 0x80 || c < 0x20 && c != '\t' {
				t.Errorf("raw octet %#x in header line %q", c, l)
				break
			}
		}
	}
	return head
}

// A replay's edit with non-ASCII text is written as RFC 2047 encoded
// words, as the API writes its subject, and reads back as the operator
// typed it; a long one is folded into short lines.
func TestEditHeadersEncodesNonASCII(t *testing.T) {
	long := strings.Repeat("Réclamation café numéro ", 60) + "fin" // about 1,400 octets
	got, err := EditHeaders(editBody, []byte("Subject: Réclamation café\nComments: "+long+"\nX-Note: plain ascii\n"))
	if err != nil {
		t.Fatal(err)
	}
	headerOf(t, got)
	dec := new(mime.WordDecoder)
	for name, want := range map[string]string{"Subject": "Réclamation café", "Comments": long, "X-Note": "plain ascii"} {
		v := mailhdr.Values(got, name)
		if len(v) != 1 {
			t.Fatalf("%s: %d fields", name, len(v))
		}
		// Unfolded, the encoded words read back to the value (adjacent
		// encoded words join without the space between them).
		s, err := dec.DecodeHeader(v[0])
		if err != nil || s != want {
			t.Errorf("%s reads back as %q (%v), want %q", name, s, err, want)
		}
	}
	if !strings.Contains(string(got), "Subject: =?utf-8?q?R=C3=A9clamation_caf=C3=A9?=\r\n") {
		t.Errorf("Subject not Q-encoded as the API encodes it:\n%s", got)
	}
	// A long ASCII value is folded at spaces, not cut.
	words := strings.TrimSpace(strings.Repeat("word ", 300))
	got, err = EditHeaders(editBody, []byte("X-Long: "+words+"\n"))
	if err != nil {
		t.Fatal(err)
	}
	headerOf(t, got)
	if v := mailhdr.Values(got, "X-Long"); len(v) != 1 || v[0] != words {
		t.Errorf("X-Long unfolds to %q", v)
	}
}

// In an address field only the display names are encoded; an address
// that is not ASCII (it would need SMTPUTF8) is refused.
func TestEditHeadersAddressFields(t *testing.T) {
	got, err := EditHeaders(editBody, []byte("Reply-To: \"Dupont, Zoé\" <zoe@src.example>, Service Clientèle <sc@src.example>\n"))
	if err != nil {
		t.Fatal(err)
	}
	head := headerOf(t, got)
	v := mailhdr.Values(got, "Reply-To")
	if len(v) != 1 {
		t.Fatalf("Reply-To fields: %q", head)
	}
	list, err := mail.ParseAddressList(v[0])
	if err != nil || len(list) != 2 || list[0].Name != "Dupont, Zoé" || list[0].Address != "zoe@src.example" ||
		list[1].Name != "Service Clientèle" || list[1].Address != "sc@src.example" {
		t.Errorf("Reply-To %q reads as %v (%v)", v[0], list, err)
	}
	for _, bad := range []string{"To: Zoé <zoé@dst.example>\n", "Cc: r@bücher.example\n", "From: Zoé without an address\n"} {
		if _, err := EditHeaders(editBody, []byte(bad)); err == nil {
			t.Errorf("edit %q accepted", bad)
		} else {
			t.Logf("%q: %v", bad, err)
		}
	}
	// ASCII addresses are written as given.
	got, err = EditHeaders(editBody, []byte("To: Ann <ann@dst.example>\n"))
	if err != nil || !strings.Contains(string(got), "\r\nTo: Ann <ann@dst.example>\r\n") {
		t.Errorf("an ASCII To: %v\n%s", err, got)
	}
}

// Edits that would break the message or inject a field are refused with
// the reason, and nothing is written.
func TestEditHeadersRefuses(t *testing.T) {
	for _, c := range []struct{ edit, why string }{
		{"Subject: a\rBcc: x@evil.example\n", "CR"},
		{"Subject: a\x00b\n", "NUL"},
		{"Subject: a\x1bb\n", "control"},
		{"Subject: a\x7fb\n", "control"},
		{"Subject: a\u0085b\n", "control"},
		{"Subject: caf\xe9\n", "not UTF-8"},
		{"Subj\x01ect: a\n", "field name"},
		{"Sübject: a\n", "field name"},
		{"Message-ID: <café@src.example>\n", "structured"},
		{"Content-Type: text/plain; name=café\n", "structured"},
		{"X-Token: " + strings.Repeat("x", 1200) + "\n", "too long to fold"},
	} {
		_, err := EditHeaders(editBody, []byte(c.edit))
		if err == nil || !strings.Contains(err.Error(), c.why) {
			t.Errorf("edit %q: %v, want an error saying %q", c.edit, err, c.why)
		}
	}
}

// TestReplayEditGrowsInlineBody: an edit that takes an inline body past
// what an envelope carries stores the edited body as the envelope's own
// copy. Kept inline, the work stream took it, the worker refused the
// envelope as malformed and parked it cut short, and the message was
// lost: the dead letter it came from was already deleted. (A 30 KiB
// value of words, folded into lines: one 30 KiB word is refused.)
func TestReplayEditGrowsInlineBody(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	body := "Subject: x\r\n\r\n" + strings.Repeat("a", 120<<10) + "\r\n"
	if _, err := q.Enqueue(ctx, &Submission{Tenant: "t", From: "a@b.example", Rcpts: []string{"r@d.example"}, Body: []byte(body)}); err != nil {
		t.Fatal(err)
	}
	work, _ := q.Messages(ctx, LaneWork, 1)
	d := next(t, work)
	if !d.Env.Inline() {
		t.Fatal("the 120 KiB body is not inline")
	}
	if err := d.Dead(ctx, d.Env.Clone(), "max-attempts"); err != nil {
		t.Fatal(err)
	}
	note := strings.TrimSpace(strings.Repeat("bbbbbbbbbb ", 3<<10))
	if _, err := q.Replay(ctx, d.Env.ID, []byte("X-Note: "+note+"\n")); err != nil {
		t.Fatalf("replay: %v", err)
	}
	re := next(t, work)
	if re.Env.Inline() || re.Env.BodyRef != EditedBodyRef(re.Env) || re.Env.Replays != 1 {
		t.Fatalf("replayed envelope: inline %v, body %q; want the edited copy stored", re.Env.Inline(), re.Env.BodyRef)
	}
	got, err := q.EnvelopeBody(ctx, re.Env)
	if err != nil {
		t.Fatal(err)
	}
	headerOf(t, got)
	if v := mailhdr.Values(got, "X-Note"); len(v) != 1 || v[0] != note || !strings.HasSuffix(string(got), strings.Repeat("a", 100)+"\r\n") {
		t.Fatalf("edited body: %d bytes, X-Note of %d octets", len(got), len(strings.Join(v, "")))
	}
}

// Many edits at once: the fields they name go, the others keep their
// order, and the edits' values follow in the order of the edits, a name
// given twice keeping both values.
func TestEditHeadersManyEdits(t *testing.T) {
	body := []byte("From: a@src.example\r\nX-1: old\r\nTo: r@dst.example\r\nx-3: old\r\n folded\r\nSubject: old\r\n\r\nbody\r\n")
	var edits strings.Builder
	const n = 2000
	for i := n; i > 0; i-- {
		fmt.Fprintf(&edits, "X-%d: v%d\n", i, i)
	}
	edits.WriteString("X-7: again\nSubject:\n")
	out, err := EditHeaders(body, []byte(edits.String()))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"From: a@src.example", "To: r@dst.example"}
	for i := n; i > 0; i-- {
		want = append(want, fmt.Sprintf("X-%d: v%d", i, i))
		if i == 7 {
			want = append(want, "X-7: again")
		}
	}
	if got := headerOf(t, out); got != strings.Join(want, "\r\n") {
		t.Errorf("edited header:\n%.300s\n…\n%s\nwant\n%.300s\n…\n%s", got, got[max(0, len(got)-200):],
			strings.Join(want, "\r\n"), strings.Join(want[len(want)-10:], "\r\n"))
	}
}

// BenchmarkEditHeadersManyEdits: 4,000 edit lines of distinct names, as a
// replay file or the console's form may carry. Each edit rescanning every
// field made this quadratic (0.58 s; 16,000 lines 11 s).
func BenchmarkEditHeadersManyEdits(b *testing.B) {
	var edits strings.Builder
	for i := range 4000 {
		fmt.Fprintf(&edits, "X-%d: v\n", i)
	}
	e := []byte(edits.String())
	b.ReportAllocs()
	for b.Loop() {
		if _, err := EditHeaders(editBody, e); err != nil {
			b.Fatal(err)
		}
	}
}
