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

// String returns the class name used in rules files and JSON ("throttled").
func (c Class) String() string { return name(classNames[:], c) }

// MarshalText encodes the class by its name, so JSON and logs show
// "throttled" rather than 3.
func (c Class) MarshalText() ([]byte, error) {
	if c == 0 || int(c) >= len(classNames) {
		return nil, fmt.Errorf("classify: invalid class %d", uint8(c))
	}
	return []byte(classNames[c]), nil
}

// UnmarshalText decodes a class name as written by MarshalText.
func (c *Class) UnmarshalText(b []byte) error {
	v, err := ParseClass(string(b))
	if err != nil {
		return err
	}
	*c = v
	return nil
}

// ParseClass returns the Class with the given name ("transient").
func ParseClass(s string) (Class, error) { return lookup[Class](classNames[:], s, "class") }

// String returns the scope name used in rules files and JSON ("destination").
func (s Scope) String() string { return name(scopeNames[:], s) }

// MarshalText encodes the scope by its name.
func (s Scope) MarshalText() ([]byte, error) {
	if s == 0 || int(s) >= len(scopeNames) {
		return nil, fmt.Errorf("classify: invalid scope %d", uint8(s))
	}
	return []byte(scopeNames[s]), nil
}

// UnmarshalText decodes a scope name as written by MarshalText.
func (s *Scope) UnmarshalText(b []byte) error {
	v, err := ParseScope(string(b))
	if err != nil {
		return err
	}
	*s = v
	return nil
}

// ParseScope returns the Scope with the given name ("recipient").
func ParseScope(s string) (Scope, error) { return lookup[Scope](scopeNames[:], s, "scope") }

// String returns the stage name used in rules files ("data-end").
func (s Stage) String() string { return name(stageNames[:], s) }

// MarshalText encodes the stage by its name.
func (s Stage) MarshalText() ([]byte, error) {
	if int(s) >= len(stageNames) {
		return nil, fmt.Errorf("classify: invalid stage %d", uint8(s))
	}
	return []byte(stageNames[s]), nil
}

// UnmarshalText decodes a stage name as written by MarshalText.
func (s *Stage) UnmarshalText(b []byte) error {
	v, err := ParseStage(string(b))
	if err != nil {
		return err
	}
	*s = v
	return nil
}

// ParseStage returns the Stage with the given name ("rcpt", "data-end").
func ParseStage(s string) (Stage, error) { return lookup[Stage](stageNames[:], s, "stage") }

// String returns the event name used in rules files ("conn-lost").
func (e Event) String() string { return name(eventNames[:], e) }

// MarshalText encodes the event by its name.
func (e Event) MarshalText() ([]byte, error) {
	if int(e) >= len(eventNames) {
		return nil, fmt.Errorf("classify: invalid event %d", uint8(e))
	}
	return []byte(eventNames[e]), nil
}

// UnmarshalText decodes an event name as written by MarshalText.
func (e *Event) UnmarshalText(b []byte) error {
	v, err := ParseEvent(string(b))
	if err != nil {
		return err
	}
	*e = v
	return nil
}

// ParseEvent returns the Event with the given name ("timeout").
func ParseEvent(s string) (Event, error) { return lookup[Event](eventNames[:], s, "event") }
