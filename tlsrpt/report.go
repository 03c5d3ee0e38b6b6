package tlsrpt

import "time"

// Report is the JSON report of RFC 8460 4.4.
type Report struct {
	OrganizationName string         `json:"organization-name"`
	DateRange        DateRange      `json:"date-range"`
	ContactInfo      string         `json:"contact-info"`
	ReportID         string         `json:"report-id"`
	Policies         []PolicyResult `json:"policies"`
}

// DateRange is the UTC day a report covers.
type DateRange struct {
	Start time.Time `json:"start-datetime"`
	End   time.Time `json:"end-datetime"`
}

// PolicyResult is one policy's counts.
type PolicyResult struct {
	Policy         PolicyDesc      `json:"policy"`
	Summary        Summary         `json:"summary"`
	FailureDetails []FailureDetail `json:"failure-details,omitempty"`
}

// PolicyDesc names the policy. mx-host is a list: the RFC's example had
// it as one string, corrected by erratum 6241.
type PolicyDesc struct {
	Type   string   `json:"policy-type"`
	String []string `json:"policy-string"`
	Domain string   `json:"policy-domain"`
	MXHost []string `json:"mx-host,omitempty"`
}

// Summary counts sessions.
type Summary struct {
	Successful int64 `json:"total-successful-session-count"`
	Failed     int64 `json:"total-failure-session-count"`
}

// FailureDetail counts the failures of one kind with one receiving host.
type FailureDetail struct {
	ResultType          string `json:"result-type"`
	SendingMTAIP        string `json:"sending-mta-ip,omitempty"`
	ReceivingMXHostname string `json:"receiving-mx-hostname,omitempty"`
	ReceivingIP         string `json:"receiving-ip,omitempty"`
	FailedSessionCount  int64  `json:"failed-session-count"`
	AdditionalInfo      string `json:"additional-information,omitempty"`
}
