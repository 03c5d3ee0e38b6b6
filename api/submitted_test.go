package api

import (
	"net/http"
	"testing"
)

// TestSubmissionsCounted: every answer to POST /v1/messages is counted by
// result, as the SMTP listener's transactions are
// (outflow_api_submissions_total): mail submitted over the API was in no
// metric, so a spam run through a leaked key and the store failing under
// API traffic went unseen. Other routes are not submissions.
func TestSubmissionsCounted(t *testing.T) {
	f := newFixture(t, nil)
	if got := f.srv.Submissions(); got != [numResults]uint64{} {
		t.Fatalf("counted %v before any request", got)
	}
	msg := map[string]any{"from": "a@src.example", "to": []string{"b@one.example"}, "text": "hi"}
	hdr := map[string]string{"Idempotency-Key": "k-1"}
	steps := []struct {
		name   string
		key    string
		body   any
		hdr    map[string]string
		status int
		want   [numResults]uint64 // accepted, rejected, tempfail, after the step
	}{
		{"stored", f.key, msg, nil, http.StatusAccepted, [3]uint64{1, 0, 0}},
		{"malformed", f.key, `{"from":`, nil, http.StatusBadRequest, [3]uint64{1, 1, 0}},
		{"not UTF-8", f.key, []byte("{\"from\":\"a@src.example\",\"to\":[\"b@one.example\"],\"text\":\"caf\xe9\"}"), nil, http.StatusBadRequest, [3]uint64{1, 2, 0}},
		{"no key", "", msg, nil, http.StatusUnauthorized, [3]uint64{1, 3, 0}},
		{"store down", f.key, msg, hdr, http.StatusServiceUnavailable, [3]uint64{1, 3, 1}},
		{"stored on retry", f.key, msg, hdr, http.StatusAccepted, [3]uint64{2, 3, 1}},
	}
	for _, s := range steps {
		f.fq.fail.Store(s.name == "store down")
		if res := f.do(t, "POST", "/v1/messages", s.key, s.body, s.hdr); res.status != s.status {
			t.Fatalf("%s: %d %s, want %d", s.name, res.status, res.raw, s.status)
		}
		if got := f.srv.Submissions(); got != s.want {
			t.Fatalf("%s: counted %v (%v), want %v", s.name, got, Results, s.want)
		}
	}
	f.do(t, "GET", "/v1/messages/nosuchid", f.key, nil, nil)
	f.do(t, "DELETE", "/v1/messages", f.key, nil, nil)
	if got := f.srv.Submissions(); got != steps[len(steps)-1].want {
		t.Fatalf("other routes and methods counted: %v", got)
	}
	for p, want := range map[*Problem]string{
		nil: ResultAccepted,
		problem(http.StatusTooManyRequests, ProblemInflight, "", ""):      ResultTempfail,
		problem(http.StatusServiceUnavailable, ProblemInflight, "", ""):   ResultTempfail,
		problem(http.StatusInternalServerError, ProblemInternal, "", ""):  ResultTempfail,
		problem(http.StatusTooManyRequests, ProblemRateLimited, "", ""):   ResultRejected,
		problem(http.StatusTooManyRequests, ProblemQuotaExceeded, "", ""): ResultRejected,
	} {
		if got := Results[submissionResult(p)]; got != want {
			t.Errorf("%+v counted %s, want %s", p, got, want)
		}
	}
}
