package e2e

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/outflow/outflow/internal/fakemx"
	"github.com/outflow/outflow/queue"
)

// TestSecretsNeverLeak runs the daemon at debug log level with a smarthost
// that requires AUTH (its password in the config file), submits with the
// right password, a wrong one, a "user name" that is really a password, and
// AUTH LOGIN, and then greps everything
// an operator or a client can read — the daemon's log, every event on the
// events stream, `queue list`, `queue inspect`, `queue history` (text and
// JSON) — for each secret, in clear and in base64.
func TestSecretsNeverLeak(t *testing.T) {
	t.Parallel()
	const (
		relayUser     = "relay-account"
		relayPassword = "relay-secret-Qw7#zz"
		wrongPassword = "wrong-secret-Hx3!pp"
		userAsPass    = "typed-password-in-user-field-9Kd"
	)
	mx := fakemx.Start(t, fakemx.Options{Users: map[string]string{relayUser: relayPassword}, RequireAuth: true})
	dir := t.TempDir()
	data := dir + "/data"
	conf := filepath.Join(dir, "outflow.toml")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf("relay-user = %q\nrelay-password = %q\n", relayUser, relayPassword)), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, data, append([]string{"--config", conf, "--users", writeUsers(t, dir), "--relay", mx.Addr(),
		"--log-level", "debug", "--max-attempts", "2"}, fastRetry...)...)

	// Good submissions, PLAIN and LOGIN.
	cl := dialAuth(t, d.SMTPAddr, testUser, testPassword)
	if err := submit(cl, "app@sender.test", []string{"s@dest.test"}, message("secret-1", "")); err != nil {
		t.Fatal(err)
	}
	_ = cl.Quit()
	rc := dialRawFrom(t, d.SMTPAddr, "127.0.0.4")
	rc.cmd("EHLO client.test")
	rc.expect2("AUTH LOGIN", "334")
	rc.expect2(base64.StdEncoding.EncodeToString([]byte(testUser)), "334")
	rc.expect2(base64.StdEncoding.EncodeToString([]byte(testPassword)), "235")
	rc.expect2("MAIL FROM:<app@sender.test>", "250")
	rc.expect2("RCPT TO:<s@dest.test>", "250")
	rc.expect2("DATA", "354")
	rc.send(string(message("secret-2", "")) + ".\r\n")
	rc.expect("250")
	// Failed AUTH: a wrong password, and a password typed as the user name.
	bad := dialRawFrom(t, d.SMTPAddr, "127.0.0.5")
	bad.cmd("EHLO client.test")
	wantPrefix(t, "wrong password", bad.authAs(testUser, wrongPassword), "535")
	wantPrefix(t, "password as user name", bad.authAs(userAsPass, wrongPassword), "535")

	if err := mx.WaitForMessages(2, 60*time.Second); err != nil {
		t.Fatalf("%v\n%s", err, tail(d.Logs(), 30))
	}
	if ok, _ := mx.AuthAttempts(); ok == 0 {
		t.Fatal("the relay never saw a successful AUTH: the test would prove nothing")
	}

	ci, err := queue.ReadClientInfo(data)
	if err != nil {
		t.Fatal(err)
	}
	secrets := map[string]string{
		"submission password":          testPassword,
		"wrong password":               wrongPassword,
		"password typed as a username": userAsPass,
		"relay password":               relayPassword,
		"NATS client password":         ci.Password,
		"AUTH PLAIN token":             base64.StdEncoding.EncodeToString([]byte("\x00" + testUser + "\x00" + testPassword)),
		"AUTH LOGIN password":          base64.StdEncoding.EncodeToString([]byte(testPassword)),
		"relay AUTH PLAIN token":       base64.StdEncoding.EncodeToString([]byte("\x00" + relayUser + "\x00" + relayPassword)),
		"relay AUTH LOGIN password":    base64.StdEncoding.EncodeToString([]byte(relayPassword)),
	}
	outputs := map[string]string{"daemon log": d.Logs()}

	// Every event on the events stream.
	nc := natsFor(t, data)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	waitFor(t, 30*time.Second, "delivered events", func() bool {
		s, err := js.Stream(ctx, queue.StreamEvents)
		if err != nil {
			return false
		}
		info, err := s.Info(ctx)
		return err == nil && info.State.Msgs >= 4 // 2 queued + 2 delivered
	})
	cons, err := js.OrderedConsumer(ctx, queue.StreamEvents, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var events strings.Builder
	var ids []string
	for {
		m, err := cons.Next(jetstream.FetchMaxWait(2 * time.Second))
		if err != nil {
			break
		}
		events.Write(m.Data())
		events.WriteByte('\n')
		for k, v := range m.Headers() {
			events.WriteString(k + ": " + strings.Join(v, ",") + "\n")
		}
		if strings.HasPrefix(m.Subject(), "outflow.events.queued.") {
			ids = append(ids, m.Headers().Get(queue.HdrEventID))
		}
	}
	outputs["events stream"] = events.String()
	if len(ids) == 0 {
		t.Fatal("no queued events read")
	}

	// The admin CLI, text and JSON.
	for _, args := range [][]string{{"queue", "list"}, {"queue", "list", "--json"}, {"queue", "list", "--state", "dead", "--json"}} {
		out, _ := runCLI(t, append(args, "--data", data)...)
		outputs[strings.Join(args, " ")] = out
	}
	for _, id := range ids {
		for _, verb := range []string{"inspect", "history"} {
			for _, js := range [][]string{nil, {"--json"}} {
				args := append([]string{"queue", verb, id, "--data", data}, js...)
				out, _ := runCLI(t, args...)
				outputs[strings.Join(args[:3], " ")+strings.Join(js, "")] = out
			}
		}
	}
	for where, text := range outputs {
		for what, secret := range secrets {
			if strings.Contains(text, secret) {
				t.Errorf("the %s appears in %s", what, where)
			}
		}
	}
	t.Logf("FIGURES secrets: outputs_checked=%d secrets_checked=%d leaks=0 (log %d bytes, events %d bytes)",
		len(outputs), len(secrets), len(outputs["daemon log"]), events.Len())
	d.Stop()
}

// TestWebhookURLTokenNeverLogged: a webhook URL may carry the endpoint's
// credential in its query (?token=, Azure's sig=) or path (Slack's), which
// `webhook add` accepts. A POST that fails (here: nothing listens) must
// leave it neither in the daemon's log (the http client's error is
// `Post "<the whole URL>": dial tcp …`) nor in the dead letter's reason.
func TestWebhookURLTokenNeverLogged(t *testing.T) {
	t.Parallel()
	const querySecret, pathSecret = "QueryTok-Secret2", "PathSecret-7Hq"
	dir := t.TempDir()
	d := startDaemon(t, dir+"/data", "--users", writeUsers(t, dir), "--webhook-allow-private", "--webhook-max-attempts", "2")
	url := "http://" + freeAddr(t) + "/services/T0/" + pathSecret + "?token=" + querySecret
	adminCLI(t, d.Data, "webhook", "add", "--tenant", testUser, "--url", url)
	list := adminCLI(t, d.Data, "webhook", "list")
	epID := strings.Fields(strings.Split(list, "\n")[1])[0]
	// The test event is published once the consumer exists, which the
	// daemon makes as it sees the endpoint: repeat until one is spent.
	waitFor(t, 90*time.Second, "the test event's budget spent", func() bool {
		adminCLI(t, d.Data, "webhook", "test", epID)
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			if strings.Contains(d.Logs(), `"webhook budget spent"`) {
				return true
			}
			time.Sleep(100 * time.Millisecond) // polling the log with a deadline
		}
		return false
	})
	logs := d.Logs()
	if !strings.Contains(logs, `"webhook deferred"`) || !strings.Contains(logs, "connection refused") {
		t.Fatalf("no failed POST in the log:\n%s", logs)
	}
	js, err := jetstream.New(natsFor(t, d.Data))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, "outflow_webhook_dead")
	if err != nil {
		t.Fatal(err)
	}
	var dead strings.Builder
	waitFor(t, 30*time.Second, "the dead letter", func() bool {
		keys, err := kv.Keys(ctx)
		if err != nil || len(keys) == 0 {
			return false
		}
		dead.Reset()
		for _, k := range keys {
			if e, err := kv.Get(ctx, k); err == nil {
				dead.Write(e.Value())
			}
		}
		return strings.Contains(dead.String(), "connection refused")
	})
	for where, text := range map[string]string{"daemon log": logs, "dead letters": dead.String()} {
		for _, secret := range []string{querySecret, pathSecret} {
			if strings.Contains(text, secret) {
				t.Errorf("the URL's secret %s appears in the %s", secret, where)
			}
		}
	}
	d.Stop()
}
