package throttle

import "testing"

// TestNormalizeDestSource: the SOURCE of DEST@SOURCE is written as the
// workers name the pair (the [[egress]] address as netip writes it,
// unmapped), however the operator typed it. Each IPv6 spelling of ::1, and
// ::ffff:127.0.0.1 for 127.0.0.1, was stored as a pair of its own, and a
// suspension of it held no mail.
func TestNormalizeDestSource(t *testing.T) {
	for in, want := range map[string]string{
		"both.h6.test@::1":                     "both.h6.test@::1",
		"both.h6.test@0:0:0:0:0:0:0:1":         "both.h6.test@::1",
		"both.h6.test@[::1]":                   "both.h6.test@::1",
		"both.h6.test@0000:0000::0001":         "both.h6.test@::1",
		"Both.H6.test.@2001:DB8::A":            "both.h6.test@2001:db8::a",
		"v4only.h6.test@::ffff:127.0.0.1":      "v4only.h6.test@127.0.0.1",
		"v4only.h6.test@[::ffff:127.0.0.1]":    "v4only.h6.test@127.0.0.1",
		"v4only.h6.test@[127.0.0.1]":           "v4only.h6.test@127.0.0.1",
		"gmail.com@192.0.2.10":                 "gmail.com@192.0.2.10",
		"gmail.com@fe80::1%lo":                 "gmail.com@fe80::1%lo",
		"gmail.com@[FE80:0::1%eth0]":           "gmail.com@fe80::1%eth0",
		"gmail.com@[fe80::1%Eth0]":             "gmail.com@fe80::1%Eth0",
		"gmail.com@Mta1.Example.":              "gmail.com@mta1.example",
		"gmail.com@[not-an-ip]":                "gmail.com@[not-an-ip]",
		"gmail.com@[]":                         "gmail.com@[]",
		"gmail.com":                            "gmail.com",
		"  gmail.com@0:0:0:0:0:ffff:c000:20a ": "gmail.com@192.0.2.10",
	} {
		if got := NormalizeDest(in); got != want {
			t.Errorf("NormalizeDest(%q) = %q, want %q", in, got, want)
		}
	}
}
