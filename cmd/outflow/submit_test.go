package main

import (
	"bytes"
	"context"
	"errors"
	"net/mail"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/outflow/outflow/bounce"
	"github.com/outflow/outflow/internal/testutil/testqueue"
	"github.com/outflow/outflow/queue"
)

// TestSubmitDSN: --ret, --envid, --notify and --orcpt become the envelope's
// DSN parameters in the SMTP listener's form, and a bad value is refused
// with the listener's reason.
func TestSubmitDSN(t *testing.T) {
	to := []string{"ann@one.example", "b=x@two.example"}
	d, err := submitDSN("hdrs", "order 42", []string{"ann@one.example=success,failure", "b=x@two.example=NEVER"},
		[]string{"ann@one.example=rfc822;ann@old.example"}, to)
	if err != nil {
		t.Fatal(err)
	}
	want := &queue.DSNParams{Ret: "HDRS", EnvID: "order 42", Rcpts: map[string]queue.RcptDSN{
		"ann@one.example": {Notify: []string{"SUCCESS", "FAILURE"}, ORcpt: "ann@old.example"},
		"b=x@two.example": {Notify: []string{"NEVER"}},
	}}
	if !reflect.DeepEqual(d, want) {
		t.Fatalf("got %+v, want %+v", d, want)
	}
	if d, err := submitDSN("", "", nil, nil, to); d != nil || err != nil {
		t.Fatalf("no flags: %+v, %v", d, err)
	}
	for _, c := range []struct {
		ret, envID    string
		notify, orcpt []string
		wantInMessage string
	}{
		{"ALL", "", nil, nil, "RET must be FULL or HDRS"},
		{"", strings.Repeat("e", 101), nil, nil, "ENVID longer than 100"},
		{"", "", []string{"ann@one.example=NEVER,DELAY"}, nil, "NOTIFY=NEVER cannot be combined"},
		{"", "", []string{"ann@one.example=SOMETIMES"}, nil, "NOTIFY must be NEVER"},
		{"", "", []string{"carl@one.example=NEVER"}, nil, "RCPT one of --to"},
		{"", "", nil, []string{"ann@one.example=ann@old.example"}, "ORCPT must be addr-type;address"},
	} {
		if _, err := submitDSN(c.ret, c.envID, c.notify, c.orcpt, to); err == nil || !strings.Contains(err.Error(), c.wantInMessage) {
			t.Errorf("submitDSN(%q, %q, %v, %v) = %v, want %q", c.ret, c.envID, c.notify, c.orcpt, err, c.wantInMessage)
		}
	}
}

// TestSubmitStoresDSN: `outflow submit` against a running queue stores
// its DSN flags on the envelope.
func TestSubmitStoresDSN(t *testing.T) {
	dir := t.TempDir()
	q := testqueue.Connect(t, testqueue.Listening(t, dir), queue.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	rootCmd.SetIn(strings.NewReader("Subject: hi\n\nhello\n"))
	if err := execRoot(ctx, nil, "submit", "--data", dir, "--from", "app@src.example", "--to", "ann@one.example",
		"--ret", "full", "--envid", "e-1", "--notify", "ann@one.example=SUCCESS", "--orcpt", "ann@one.example=rfc822;ann@old.example"); err != nil {
		t.Fatal(err)
	}
	items, err := q.List(ctx, queue.Filter{State: queue.StateQueued})
	if err != nil || len(items) != 1 {
		t.Fatalf("queued %d, %v", len(items), err)
	}
	want := &queue.DSNParams{Ret: "FULL", EnvID: "e-1", Rcpts: map[string]queue.RcptDSN{
		"ann@one.example": {Notify: []string{"SUCCESS"}, ORcpt: "ann@old.example"}}}
	if got := items[0].Env.DSN; !reflect.DeepEqual(got, want) {
		t.Fatalf("stored DSN %+v, want %+v", got, want)
	}
	// The bare message is stored under a trace field, with the From,
	// Date and Message-ID it lacked.
	it, err := q.Find(ctx, items[0].Env.ID)
	if err != nil {
		t.Fatal(err)
	}
	b, err := q.EnvelopeBody(ctx, it.Env)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(b, []byte("Received: by ")) || !bytes.Contains(b, []byte("(outflow submit, from userid ")) {
		t.Fatalf("no Received field on top: %q", b)
	}
	m, err := mail.ReadMessage(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("%v: %q", err, b)
	}
	if _, err := m.Header.Date(); err != nil || m.Header.Get("Message-ID") == "" || m.Header.Get("Subject") != "hi" ||
		m.Header.Get("From") != "<app@src.example>" {
		t.Fatalf("stored header %v (date: %v)", m.Header, err)
	}
}

// TestSubmitSplitsForReturnPaths: once the fleet has made its return-path
// key (serve does, at start, when some tenant's mail goes out with a
// return path), `outflow submit` gives each recipient an envelope of its
// own, as serve does for such a tenant, so that no return path is shared
// by two recipients. Before, it keeps one envelope per domain.
func TestSubmitSplitsForReturnPaths(t *testing.T) {
	dir := t.TempDir()
	q := testqueue.Connect(t, testqueue.Listening(t, dir), queue.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	submit := func() []string {
		t.Helper()
		var out bytes.Buffer
		rootCmd.SetIn(strings.NewReader("Subject: hi\n\nhello\n"))
		if err := execRoot(ctx, &out, "submit", "--data", dir, "--from", "app@src.example",
			"--to", "ann@one.example", "--to", "bob@one.example"); err != nil {
			t.Fatal(err)
		}
		return strings.Fields(out.String())
	}
	rcptsOf := func(ids []string) [][]string {
		t.Helper()
		var out [][]string
		for _, id := range ids {
			it, err := q.Find(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, it.Env.Rcpts)
		}
		return out
	}

	if got := rcptsOf(submit()); !reflect.DeepEqual(got, [][]string{{"ann@one.example", "bob@one.example"}}) {
		t.Fatalf("without return paths: envelopes of %v, want one of both", got)
	}
	if _, err := bounce.LoadKey(ctx, q); err != nil {
		t.Fatal(err)
	}
	if got := rcptsOf(submit()); !reflect.DeepEqual(got, [][]string{{"ann@one.example"}, {"bob@one.example"}}) {
		t.Fatalf("with return paths: envelopes of %v, want one per recipient", got)
	}
}

// TestSubmitRefusesWhatSMTPRefuses: `outflow submit` queues only what the
// SMTP listener would take, with its reason, and queues nothing else: a
// NUL, a bare CR, a line over 1,000 octets, a message over --max-size.
// Lines ending in LF alone are made CRLF, as sendmail(1) does, not refused.
func TestSubmitRefusesWhatSMTPRefuses(t *testing.T) {
	dir := t.TempDir()
	q := testqueue.Connect(t, testqueue.Listening(t, dir), queue.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, c := range []struct {
		name, body string
		extra      []string
		want       string // in the error; "" for queued
	}{
		{"LF line ends", "Subject: hi\n\nhello\n", nil, ""},
		{"NUL", "Subject: hi\r\n\r\nnul\x00here\r\n", nil, "NUL"},
		{"bare CR", "Subject: hi\r\n\r\nbare\rcr\r\n", nil, "bare CR"},
		{"trailing CR", "Subject: hi\r\n\r\nend\r", nil, "bare CR"},
		{"line of 999 octets and CRLF", "Subject: hi\r\n\r\n" + strings.Repeat("y", 999) + "\r\n", nil, "Line too long"},
		{"line of 998 octets and CRLF", "Subject: hi\r\n\r\n" + strings.Repeat("y", 998) + "\r\n", nil, ""},
		{"over --max-size", "Subject: hi\r\n\r\n" + strings.Repeat("z", 200) + "\r\n", []string{"--max-size", "100"}, "larger than --max-size 100"},
		{"over --max-size once made CRLF", "Subject: hi\n\n" + strings.Repeat("z\n", 48), []string{"--max-size", "100"}, "larger than --max-size 100"},
	} {
		t.Run(c.name, func(t *testing.T) {
			before, err := q.List(ctx, queue.Filter{State: queue.StateQueued})
			if err != nil {
				t.Fatal(err)
			}
			rootCmd.SetIn(strings.NewReader(c.body))
			args := append([]string{"submit", "--data", dir, "--from", "app@src.example", "--to", "ann@one.example"}, c.extra...)
			err = execRoot(ctx, nil, args...)
			after, lerr := q.List(ctx, queue.Filter{State: queue.StateQueued})
			if lerr != nil {
				t.Fatal(lerr)
			}
			if c.want == "" {
				if err != nil || len(after) != len(before)+1 {
					t.Fatalf("error %v, queued %d → %d; want it queued", err, len(before), len(after))
				}
				return
			}
			var ue usageError
			if err == nil || !strings.Contains(err.Error(), c.want) || !errors.As(err, &ue) {
				t.Fatalf("error %v, want a usage error naming %q", err, c.want)
			}
			if len(after) != len(before) {
				t.Fatalf("queued %d → %d, want nothing queued", len(before), len(after))
			}
		})
	}
}

// TestSubmitHonoursSuppressions: `outflow submit` refuses recipients on the
// tenant's suppression list, naming them, and queues nothing, as the SMTP
// listener (550) and the API (422) do: an unsubscribe or a hard bounce
// held on every way in but this one. Another tenant's entry does not
// count, --include-suppressed sends all the same, and the reserved tenant
// names are refused.
func TestSubmitHonoursSuppressions(t *testing.T) {
	dir := t.TempDir()
	q := testqueue.Connect(t, testqueue.Listening(t, dir), queue.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	list, err := q.Suppressions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := list.Add(ctx, queue.Suppression{Tenant: "shop", Address: "gone@one.example", Source: queue.SuppressUnsubscribe}); err != nil {
		t.Fatal(err)
	}
	submit := func(args ...string) (string, error) {
		t.Helper()
		var out bytes.Buffer
		rootCmd.SetIn(strings.NewReader("Subject: hi\n\nhello\n"))
		err := execRoot(ctx, &out, append([]string{"submit", "--data", dir, "--from", "app@src.example",
			"--to", "ann@one.example", "--to", "Gone@one.example"}, args...)...)
		return out.String(), err
	}
	depth := func() uint64 {
		t.Helper()
		n, err := q.Depth(ctx, queue.LaneWork)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if _, err := submit("--tenant", "shop"); err == nil || !strings.Contains(err.Error(), "Gone@one.example") || !strings.Contains(err.Error(), "suppression list") {
		t.Fatalf("a suppressed recipient: %v, want a refusal naming it", err)
	}
	if n := depth(); n != 0 {
		t.Fatalf("%d envelopes queued after the refusal", n)
	}
	if out, err := submit("--tenant", "other"); err != nil || len(strings.Fields(out)) != 1 {
		t.Fatalf("another tenant's entry: %q, %v, want it queued", out, err)
	}
	if out, err := submit("--tenant", "shop", "--include-suppressed"); err != nil || len(strings.Fields(out)) != 1 {
		t.Fatalf("--include-suppressed: %q, %v, want it queued", out, err)
	}
	for _, reserved := range []string{"*", "postmaster", ""} {
		var u usageError
		if _, err := submit("--tenant", reserved); !errors.As(err, &u) {
			t.Errorf("--tenant %q: %v, want a usage error", reserved, err)
		}
	}
}
