package worker

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/emersion/go-msgauth/dkim"
	"github.com/emersion/go-smtp"

	"github.com/outflow/outflow/internal/fakemx"
	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/sender"
)

// TestDKIMSignedOnceRetriedIdentically: the body is signed before the
// first attempt and kept, inside the envelope for a small body and as a
// signed copy in the Object Store for a large one, so the retry sends the
// very bytes the first attempt sent, and the signature verifies at the
// receiver.
func TestDKIMSignedOnceRetriedIdentically(t *testing.T) {
	t.Run("inline", func(t *testing.T) { testDKIMSignedOnce(t, "hello\r\n", true) })
	large := strings.Repeat(strings.Repeat("x", 98)+"\r\n", (queue.InlineBodyMax/100)+10)
	t.Run("object store", func(t *testing.T) { testDKIMSignedOnce(t, large, false) })
}

// testSigner is a DKIM signer for src.test (selector s1) with a fresh
// Ed25519 key, and the key's public half.
func testSigner(t *testing.T) (ed25519.PublicKey, *sender.DKIMSigner) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := sender.NewDKIMSigner([]sender.DKIMKey{{Domain: "src.test", Selector: "s1", Signer: priv}})
	if err != nil {
		t.Fatal(err)
	}
	return pub, signer
}

// deferFirstDot is a fake MX's hook that answers the first message's
// final dot with 451, and takes every later one.
func deferFirstDot() fakemx.Hook {
	var dots atomic.Int32
	return func(stage fakemx.Stage, arg string) *smtp.SMTPError {
		if stage == fakemx.StageDot && dots.Add(1) == 1 {
			return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "try again"}
		}
		return nil
	}
}

func testDKIMSignedOnce(t *testing.T, text string, inline bool) {
	pub, signer := testSigner(t)
	e := newEnv(t, deferFirstDot())
	e.startPool(func(c *Config) { c.Signer = signer })
	ids, err := e.q.Enqueue(context.Background(), &queue.Submission{Tenant: "t1", From: "app@src.test", Rcpts: []string{"r@dest.test"},
		Body: []byte("From: app@src.test\r\nTo: r@dest.test\r\nSubject: signed\r\nMessage-ID: <s@src.test>\r\n\r\n" + text)})
	if err != nil {
		t.Fatal(err)
	}
	e.waitEvent(ids[0], queue.EventDeferred)
	it, err := e.q.Find(context.Background(), ids[0])
	if err != nil {
		t.Fatal(err)
	}
	if !it.Env.Signed {
		t.Fatalf("deferred envelope does not name a signed body: %+v", it.Env)
	}
	if inline && (!it.Env.Inline() || it.Env.SigLen == 0) {
		t.Fatalf("a small body of one destination should stay inline, with the signature's length: %+v", it.Env)
	}
	if !inline && (it.Env.Inline() || !strings.Contains(it.Env.BodyRef, ".dkim.")) {
		t.Fatalf("a large body should name its signed copy in the Object Store: %+v", it.Env)
	}
	stored, err := e.q.EnvelopeBody(context.Background(), it.Env)
	if err != nil {
		t.Fatal(err)
	}
	e.waitEvent(ids[0], queue.EventDelivered)
	got := e.mx.Messages()[0].Data
	if !bytes.Equal(got, stored) {
		t.Fatalf("retry sent different bytes than were signed before the first attempt")
	}
	vs, err := dkim.VerifyWithOptions(bytes.NewReader(got), &dkim.VerifyOptions{LookupTXT: func(name string) ([]string, error) {
		if name == "s1._domainkey.src.test" {
			return []string{"v=DKIM1; k=ed25519; p=" + base64.StdEncoding.EncodeToString(pub)}, nil
		}
		return nil, errors.New("no record")
	}})
	if err != nil || len(vs) != 1 || vs[0].Err != nil {
		t.Fatalf("verification: %v %+v", err, vs)
	}
}

// TestNoticeFromAligns: a notice's From is MAILER-DAEMON at the original
// sender's domain when a DKIM key signs that domain's mail (DMARC passes
// on the signature), and at this host otherwise (DMARC of a domain nothing
// here signs would fail, and a p=reject domain's own mail system would
// drop the notice, which has a null sender to tell).
func TestNoticeFromAligns(t *testing.T) {
	for _, c := range []struct {
		name, host string
		signed     bool
		want       string
	}{
		{"signed", "outflow.test", true, "MAILER-DAEMON@src.test"},
		{"unsigned", "outflow.test", false, "MAILER-DAEMON@outflow.test"},
		// A host name that is no domain (a container's id): the sender's.
		{"unsigned, bare host name", "3f2a9c", false, "MAILER-DAEMON@src.test"},
		{"unsigned, localhost", "localhost.localdomain", false, "MAILER-DAEMON@src.test"},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, bounceGone)
			_, signer := testSigner(t)
			e.startPool(func(cfg *Config) {
				cfg.DSN = dsnConfig(nil)
				cfg.DSN.ReportingMTA = c.host
				if c.signed {
					cfg.Signer = signer
				}
			})
			e.submitSMTP("app@src.test", nil, "gone@dest.test")
			waitUntil(t, "the report at the MX", func() bool { return len(reports(e.mx)) == 1 })
			r := reports(e.mx)[0].Data
			if !bytes.Contains(r, []byte("From: Mail Delivery System <"+c.want+">\r\n")) {
				t.Errorf("notice not from %s:\n%s", c.want, r)
			}
		})
	}
}
