package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Scenario 7: the application's side. 7.1 submits the same messages over
// the HTTP API and over SMTP to the same daemon configuration; 7.2 counts
// the webhook events a local receiver gets while that mail is delivered;
// 7.3 is scenario 1's mail path with a webhook endpoint receiving every
// delivered event against none.

// apiSessions is how many HTTP clients submit at once, as smtp-source's 20
// sessions do.
const apiSessions = 20

// hookReceiver is a local webhook endpoint: it answers 204 and counts the
// distinct webhook-ids, with the times of the first and the last.
type hookReceiver struct {
	srv         *http.Server
	URL         string
	mu          sync.Mutex
	ids         map[string]bool
	first, last time.Time
	posts       atomic.Int64
}

func startHookReceiver() (*hookReceiver, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	h := &hookReceiver{URL: "http://" + ln.Addr().String() + "/hook", ids: map[string]bool{}}
	h.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		h.posts.Add(1)
		now := time.Now()
		h.mu.Lock()
		if id := r.Header.Get("webhook-id"); !h.ids[id] {
			h.ids[id] = true
			if h.first.IsZero() {
				h.first = now
			}
			h.last = now
		}
		h.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	})}
	go func() { _ = h.srv.Serve(ln) }()
	return h, nil
}

// reset forgets what was received (the setup's test event).
func (h *hookReceiver) reset() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ids, h.first, h.last = map[string]bool{}, time.Time{}, time.Time{}
	h.posts.Store(0)
}

func (h *hookReceiver) count() (int, time.Time, time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.ids), h.first, h.last
}

func (h *hookReceiver) Close() { _ = h.srv.Close() }

// admin runs an outflow admin verb against p and returns its stdout.
func (s *suite) admin(p *outflowProc, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out, errb bytes.Buffer
	cmd := exec.CommandContext(ctx, s.c.outflow, append(args, "--data", p.Data)...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("outflow %s: %w: %s", strings.Join(args, " "), err, errb.String())
	}
	return strings.TrimSpace(out.String()), nil
}

// addHook registers recv for tenant's events on p and waits until the
// daemon delivers to it (its consumer takes events from its creation on).
func (s *suite) addHook(p *outflowProc, tenant string, recv *hookReceiver) error {
	line, err := s.admin(p, "webhook", "add", "--tenant", tenant, "--url", recv.URL, "--json")
	if err != nil {
		return err
	}
	var ep struct{ ID string }
	if err := json.Unmarshal([]byte(line), &ep); err != nil {
		return fmt.Errorf("webhook add: %w", err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err := s.admin(p, "webhook", "test", ep.ID); err != nil {
			return err
		}
		for wait := time.Now().Add(2 * time.Second); time.Now().Before(wait); time.Sleep(20 * time.Millisecond) {
			if n, _, _ := recv.count(); n > 0 {
				recv.reset()
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("webhook %s: no test delivery within a minute", ep.ID)
		}
	}
}

// apiSubmit POSTs msgs messages of about size bytes (a text body the API
// builds into MIME) from apiSessions clients with key, and returns when
// the last 202 arrived.
func apiSubmit(addr, key string, msgs, size int) (time.Duration, error) {
	text := strings.Repeat(strings.Repeat("x", 75)+"\n", max(size/76, 1))
	tr := &http.Transport{MaxIdleConnsPerHost: apiSessions}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: time.Minute}
	var next atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	start := time.Now()
	for range apiSessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(msgs) || firstErr.Load() != nil {
					return
				}
				b, _ := json.Marshal(map[string]any{"from": "bench@source.test", "to": []string{"rcpt@example.com"},
					"subject": fmt.Sprintf("bench %d", i), "text": text})
				req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/messages", bytes.NewReader(b))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Authorization", "Bearer "+key)
				res, err := c.Do(req)
				if err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
				body, _ := io.ReadAll(res.Body)
				res.Body.Close()
				if res.StatusCode != http.StatusAccepted {
					firstErr.CompareAndSwap(nil, fmt.Errorf("POST /v1/messages: %d %s", res.StatusCode, body))
					return
				}
			}
		}()
	}
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// appRun is one run of 7.1/7.2: submission and delivery rates, and the
// webhook events' when a receiver is registered.
type appRun struct {
	submit, deliver float64 // msg/s: to the last acceptance, to the sink's last message
	events          float64 // delivered events per second, submission start to the last event
	eventsLag       float64 // s from the sink's last message to the last event
}

// runApp starts a sink, a daemon and (with hooks) a receiver registered
// for the API tenant, submits msgs over the API (api) or SMTP, and waits
// for every message at the sink and, with hooks, every delivered event.
func (s *suite) runApp(api, hooks bool, msgs, size int) (appRun, error) {
	var r appRun
	sk := newSink(freePort())
	if err := sk.Start(); err != nil {
		return r, err
	}
	defer sk.Stop()
	data, err := os.MkdirTemp("", "outflow-bench-data-")
	if err != nil {
		return r, err
	}
	defer os.RemoveAll(data)
	apiAddr := freePort()
	p, err := startOutflow(s.c.outflow, data, sk.addr, "--api-addr", apiAddr, "--api-rate", "-1", "--webhook-allow-private")
	if err != nil {
		return r, err
	}
	defer p.Stop()
	s.last = p
	tenant := "bench"
	if !api {
		tenant = "trusted" // smtp-source submits from a trusted network, without AUTH
	}
	var recv *hookReceiver
	if hooks {
		if recv, err = startHookReceiver(); err != nil {
			return r, err
		}
		defer recv.Close()
		if err := s.addHook(p, tenant, recv); err != nil {
			return r, err
		}
		for i := range s.c.hookOthers {
			if err := s.addHook(p, "other"+strconv.Itoa(i), recv); err != nil {
				return r, err
			}
		}
	}
	var key string
	if api {
		if key, err = s.admin(p, "apikey", "create", "--tenant", tenant); err != nil {
			return r, err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	start := time.Now()
	var sub time.Duration
	if api {
		sub, err = apiSubmit(apiAddr, key, msgs, size)
	} else {
		_, err = smtpSource(ctx, p.SMTPAddr, 20, msgs, size)
		sub = time.Since(start)
	}
	if err != nil {
		return r, err
	}
	end, err := sk.WaitCount(int64(msgs), 15*time.Minute)
	if err != nil {
		return r, err
	}
	r.submit, r.deliver = float64(msgs)/sub.Seconds(), float64(msgs)/end.Sub(start).Seconds()
	if hooks {
		deadline := time.Now().Add(15 * time.Minute)
		for {
			n, _, last := recv.count()
			if n >= msgs {
				// The sink's count is read from its status line, which
				// trails a little: a last event "before" it is no lag.
				r.events, r.eventsLag = float64(n)/last.Sub(start).Seconds(), max(last.Sub(end).Seconds(), 0)
				break
			}
			if time.Now().After(deadline) {
				return r, fmt.Errorf("webhook receiver: %d of %d delivered events", n, msgs)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	return r, nil
}

func (s *suite) scenario7() error {
	n := s.e2eMsgs()
	othersNote := ""
	if s.c.hookOthers > 0 {
		othersNote = fmt.Sprintf(" (with webhooks on, %d endpoints of other tenants beside it, which get none of this mail's events: `-hook-others %d`)", s.c.hookOthers, s.c.hookOthers)
	}
	const size = 2048
	t1 := &table{
		title: "Scenario 7.1: HTTP API against SMTP submission",
		notes: []string{fmt.Sprintf("The same daemon configuration (`serve --api-rate -1`, relay to `smtp-sink`), %d messages of about 2 KiB to one recipient: over SMTP by `smtp-source -s 20` (trusted network, no AUTH), over the API by %d Go HTTP clients with kept-alive connections POSTing `{from, to, subject, text}` (the API builds the MIME). Submission: messages over the time to the last 250 / 202; delivery: to the sink's last message. Fresh data dir per run; runs alternate; medians of %d.", n, apiSessions, s.c.runs)},
		head:  []string{"way in", "submitted msg/s (runs)", "delivered msg/s (runs)", "API/SMTP submitted"},
	}
	t2 := &table{
		title: "Scenario 7.2: webhook events delivered per second",
		notes: []string{fmt.Sprintf("7.1's API runs again with a webhook endpoint (a local Go receiver answering 204) registered for the tenant's default events: one signed POST per delivered message, one in flight per endpoint%s. Events per second from the first submission to the last event; lag: from the sink's last message to the last event.", othersNote)},
		head:  []string{"events", "events/s (runs)", "mail delivered msg/s (runs)", "lag s (runs)"},
	}
	t3 := &table{
		title: "Scenario 7.3: the mail path with webhooks on against off",
		notes: []string{fmt.Sprintf("Scenario 1's path (`smtp-source -s 20 -m %d -l 2048`, trusted network) with one webhook endpoint receiving every delivered event of the tenant against none%s. Mail delivered per second; the target is at most 10%% slower (ratio at least 0.90).", n, othersNote)},
		head:  []string{"webhooks", "delivered msg/s (runs)", "on/off", "on/off per run", "events/s with on (runs)"},
	}
	var apiRuns, smtpRuns, hookRuns, offRuns, onRuns []appRun
	for i := 0; i < s.c.runs; i++ {
		order := []bool{true, false}
		if i%2 == 1 {
			order = []bool{false, true}
		}
		for _, api := range order {
			r, err := s.runApp(api, false, n, size)
			if err != nil {
				return err
			}
			name := map[bool]string{true: "API", false: "SMTP"}[api]
			fmt.Printf("  run %d 7.1 %-4s %d x %d B: submitted %.0f msg/s, delivered %.0f msg/s\n", i+1, name, n, size, r.submit, r.deliver)
			if api {
				apiRuns = append(apiRuns, r)
			} else {
				smtpRuns = append(smtpRuns, r)
			}
		}
		r, err := s.runApp(true, true, n, size)
		if err != nil {
			return err
		}
		fmt.Printf("  run %d 7.2 API + webhook: %.0f events/s, mail %.0f msg/s, lag %.1f s\n", i+1, r.events, r.deliver, r.eventsLag)
		hookRuns = append(hookRuns, r)
		for _, on := range []bool{i%2 == 1, i%2 == 0} {
			r, err := s.runApp(false, on, n, size)
			if err != nil {
				return err
			}
			fmt.Printf("  run %d 7.3 webhooks %-3v: mail %.0f msg/s, events %.0f/s\n", i+1, on, r.deliver, r.events)
			if on {
				onRuns = append(onRuns, r)
			} else {
				offRuns = append(offRuns, r)
			}
		}
	}
	field := func(rs []appRun, f func(appRun) float64) []float64 {
		xs := make([]float64, len(rs))
		for i, r := range rs {
			xs[i] = f(r)
		}
		return xs
	}
	sub := func(r appRun) float64 { return r.submit }
	del := func(r appRun) float64 { return r.deliver }
	ev := func(r appRun) float64 { return r.events }
	lag := func(r appRun) float64 { return r.eventsLag }
	ma, ms := median(field(apiRuns, sub)), median(field(smtpRuns, sub))
	t1.rows = append(t1.rows,
		[]string{"HTTP API", fmt.Sprintf("**%.0f** (%s)", ma, fmtRuns(field(apiRuns, sub), "")), fmt.Sprintf("%.0f (%s)", median(field(apiRuns, del)), fmtRuns(field(apiRuns, del), "")), fmt.Sprintf("**%.2f**", ma/ms)},
		[]string{"SMTP", fmt.Sprintf("**%.0f** (%s)", ms, fmtRuns(field(smtpRuns, sub), "")), fmt.Sprintf("%.0f (%s)", median(field(smtpRuns, del)), fmtRuns(field(smtpRuns, del), "")), "1"})
	t2.rows = append(t2.rows, []string{fmt.Sprint(n), fmt.Sprintf("**%.0f** (%s)", median(field(hookRuns, ev)), fmtRuns(field(hookRuns, ev), "")),
		fmt.Sprintf("%.0f (%s)", median(field(hookRuns, del)), fmtRuns(field(hookRuns, del), "")), fmt.Sprintf("%.1f (%s)", median(field(hookRuns, lag)), fmtRuns1(field(hookRuns, lag)))})
	mon, moff := median(field(onRuns, del)), median(field(offRuns, del))
	t3.rows = append(t3.rows,
		[]string{"off", fmt.Sprintf("**%.0f** (%s)", moff, fmtRuns(field(offRuns, del), "")), "1", "—", "—"},
		[]string{"on", fmt.Sprintf("**%.0f** (%s)", mon, fmtRuns(field(onRuns, del), "")), fmt.Sprintf("**%.2f**", mon/moff), pairRatios(onRuns, offRuns, del), fmtRuns(field(onRuns, ev), "")})
	s.tables = append(s.tables, t1, t2, t3)
	return nil
}

// pairRatios is f(a[i])/f(b[i]) for each run: on a shared machine the two
// halves of one run (back to back) see the most similar load.
func pairRatios(a, b []appRun, f func(appRun) float64) string {
	var parts []string
	for i := range min(len(a), len(b)) {
		parts = append(parts, fmt.Sprintf("%.2f", f(a[i])/f(b[i])))
	}
	return strings.Join(parts, ", ")
}
