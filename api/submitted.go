package api

import "net/http"

// The results POST /v1/messages is counted under, as the SMTP listener
// counts its transactions (outflow_submissions_total): what the client
// was told, so that mail submitted over the API is seen in the metrics
// (cmd/outflow exports these as outflow_api_submissions_total{result}).
const (
	// ResultAccepted: 202, the message stored (or an Idempotency-Key's
	// repeat answered with the ids of the one stored).
	ResultAccepted = "accepted"
	// ResultRejected: any other 4xx: the request is refused as it is
	// (malformed, a bad address, unauthorized, over the key's rate or the
	// tenant's sending limit, a key reused); sent again unchanged it is
	// refused again, as a 5xx over SMTP.
	ResultRejected = "rejected"
	// ResultTempfail: 5xx (the store did not take it: 503, or a 500),
	// or the 429 of a tenant's share of the bytes in flight: nothing may
	// be taken as accepted and the client sends it again, as a 4xx after
	// DATA over SMTP (whose refusals for want of memory are 452s).
	ResultTempfail = "tempfail"
)

// Results lists the results in the order Submissions returns them.
var Results = [numResults]string{ResultAccepted, ResultRejected, ResultTempfail}

const numResults = 3

// countSubmission counts how one POST /v1/messages ended: p, or nil for
// its 202.
func (s *Server) countSubmission(p *Problem) {
	s.submitted[submissionResult(p)].Add(1)
}

// submissionResult is the index in Results of a request that ended in p.
func submissionResult(p *Problem) int {
	switch {
	case p == nil:
		return 0
	case p.Status >= http.StatusInternalServerError || p.Type == ProblemInflight:
		return 2
	}
	return 1
}

// Submissions returns how many POST /v1/messages requests this process
// answered, by result, in the order of Results; for the metrics.
func (s *Server) Submissions() [numResults]uint64 {
	var n [numResults]uint64
	for i := range n {
		n[i] = s.submitted[i].Load()
	}
	return n
}
