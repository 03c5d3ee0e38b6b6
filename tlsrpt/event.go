package tlsrpt

// Policy types (RFC 8460 4.4, "policy-type").
const (
	PolicySTS      = "sts"
	PolicyTLSA     = "tlsa"
	PolicyNoPolicy = "no-policy-found"
)

// Result types (RFC 8460 4.3).
const (
	ResultSTARTTLSNotSupported = "starttls-not-supported"
	ResultHostMismatch         = "certificate-host-mismatch"
	ResultExpired              = "certificate-expired"
	ResultNotTrusted           = "certificate-not-trusted"
	ResultValidationFailure    = "validation-failure"
	ResultTLSAInvalid          = "tlsa-invalid"
	ResultDNSSECInvalid        = "dnssec-invalid"
	ResultDANERequired         = "dane-required"
	ResultSTSPolicyFetch       = "sts-policy-fetch-error"
	ResultSTSPolicyInvalid     = "sts-policy-invalid"
	ResultSTSWebPKIInvalid     = "sts-webpki-invalid"
)

// Event is the TLS outcome of one connection attempt (or one policy
// fetch) for a policy domain.
type Event struct {
	// Domain is the policy domain: the recipient domain for MTA-STS,
	// the MX host for DANE (RFC 8460 3, 4.4).
	Domain string
	// PolicyType is PolicySTS or PolicyTLSA.
	PolicyType string
	// Policy is the policy as RFC 8460's "policy-string" wants it: the
	// MTA-STS policy's lines, or the TLSA records in presentation form.
	Policy []string
	// MXHosts are the MTA-STS policy's MX patterns ("mx-host"); none
	// for DANE.
	MXHosts []string
	// Success is true when the session was established as the policy
	// asks; otherwise Result says why not.
	Success bool
	Result  string
	// ReceivingMX is the MX host name, ReceivingIP its address, and
	// SendingIP ours, when known (RFC 8460 4.4 failure details).
	ReceivingMX string
	ReceivingIP string
	SendingIP   string
	// Detail is a short human-readable explanation
	// ("additional-information"); it never carries message data.
	Detail string
}
