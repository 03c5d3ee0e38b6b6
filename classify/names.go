package classify

import "fmt"

// The names below are the spelling used in the rules file, in JSON output
// and in log lines. They are part of the contract: changing one breaks
// operators' rule files and dashboards.

var classNames = [...]string{
	Delivered: "delivered",
	Transient: "transient",
	Throttled: "throttled",
	Permanent: "permanent",
	Unknown:   "unknown",
}

var scopeNames = [...]string{
	ScopeRecipient:   "recipient",
	ScopeMessage:     "message",
	ScopeTenant:      "tenant",
	ScopeDestination: "destination",
	ScopeConnection:  "connection",
	ScopeSource:      "source",
}

var stageNames = [...]string{
	StageUnknown:  "unknown",
	StageDNS:      "dns",
	StageConnect:  "connect",
	StageGreeting: "greeting",
	StageEHLO:     "ehlo",
	StageTLS:      "tls",
	StageAuth:     "auth",
	StageMail:     "mail",
	StageRcpt:     "rcpt",
	StageData:     "data",
	StageDataEnd:  "data-end",
}

var eventNames = [...]string{
	EventNone:        "none",
	EventConnRefused: "conn-refused",
	EventTimeout:     "timeout",
	EventConnLost:    "conn-lost",
	EventTLSFailure:  "tls-failure",
	EventDNSNXDomain: "dns-nxdomain",
	EventDNSServFail: "dns-servfail",
	EventNullMX:      "null-mx",
	EventLocal:       "local",
}

func name[T ~uint8](names []string, v T) string {
	if int(v) < len(names) && names[v] != "" {
		return names[v]
	}
	return fmt.Sprintf("invalid(%d)", uint8(v))
}

func lookup[T ~uint8](names []string, s, what string) (T, error) {
	for i, n := range names {
		if n != "" && n == s {
			return T(i), nil
		}
	}
	return 0, fmt.Errorf("unknown %s %q", what, s)
}

// marshalName is v's name, an error for a value without one (out of
// range, or the unset zero of Class and Scope).
func marshalName[T ~uint8](names []string, v T, what string) ([]byte, error) {
	if int(v) >= len(names) || names[v] == "" {
		return nil, fmt.Errorf("classify: invalid %s %d", what, uint8(v))
	}
	return []byte(names[v]), nil
}

// unmarshalName sets *v to the value named b.
func unmarshalName[T ~uint8](names []string, b []byte, what string, v *T) error {
	x, err := lookup[T](names, string(b), what)
	if err != nil {
		return err
	}
	*v = x
	return nil
}

// String returns the class name used in rules files and JSON ("throttled").
func (c Class) String() string { return name(classNames[:], c) }

// MarshalText encodes the class by its name, so JSON and logs show
// "throttled" rather than 3.
func (c Class) MarshalText() ([]byte, error) { return marshalName(classNames[:], c, "class") }

// UnmarshalText decodes a class name as written by MarshalText.
func (c *Class) UnmarshalText(b []byte) error { return unmarshalName(classNames[:], b, "class", c) }

// ParseClass returns the Class with the given name ("transient").
func ParseClass(s string) (Class, error) { return lookup[Class](classNames[:], s, "class") }

// String returns the scope name used in rules files and JSON ("destination").
func (s Scope) String() string { return name(scopeNames[:], s) }

// MarshalText encodes the scope by its name.
func (s Scope) MarshalText() ([]byte, error) { return marshalName(scopeNames[:], s, "scope") }

// UnmarshalText decodes a scope name as written by MarshalText.
func (s *Scope) UnmarshalText(b []byte) error { return unmarshalName(scopeNames[:], b, "scope", s) }

// ParseScope returns the Scope with the given name ("recipient").
func ParseScope(s string) (Scope, error) { return lookup[Scope](scopeNames[:], s, "scope") }

// String returns the stage name used in rules files ("data-end").
func (s Stage) String() string { return name(stageNames[:], s) }

// MarshalText encodes the stage by its name.
func (s Stage) MarshalText() ([]byte, error) { return marshalName(stageNames[:], s, "stage") }

// UnmarshalText decodes a stage name as written by MarshalText.
func (s *Stage) UnmarshalText(b []byte) error { return unmarshalName(stageNames[:], b, "stage", s) }

// ParseStage returns the Stage with the given name ("rcpt", "data-end").
func ParseStage(s string) (Stage, error) { return lookup[Stage](stageNames[:], s, "stage") }

// String returns the event name used in rules files ("conn-lost").
func (e Event) String() string { return name(eventNames[:], e) }

// MarshalText encodes the event by its name.
func (e Event) MarshalText() ([]byte, error) { return marshalName(eventNames[:], e, "event") }

// UnmarshalText decodes an event name as written by MarshalText.
func (e *Event) UnmarshalText(b []byte) error { return unmarshalName(eventNames[:], b, "event", e) }

// ParseEvent returns the Event with the given name ("timeout").
func ParseEvent(s string) (Event, error) { return lookup[Event](eventNames[:], s, "event") }
