package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestServeLogsDNSServers: serve says at start, in one info line, the DNS
// servers it asks, as it read --dns. A bare IPv6 address takes no port, so
// "::1:5353" is the server [::1:5353]:53, not ::1 on port 5353; nothing
// said so. "[::1]" (brackets, no port) is [::1]:53.
func TestServeLogsDNSServers(t *testing.T) {
	errFile, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	stderr := os.Stderr
	os.Stderr = errFile // newLogger writes to os.Stderr
	defer func() { os.Stderr = stderr }()

	data := filepath.Join(t.TempDir(), "data")
	cfg, err := parseWith(t, emptyConfig(t), serveArgs(data, "--log-level", "info", "--dns", "::1:5353,[::1]")...)
	if err != nil {
		t.Fatal(err)
	}
	serveUntilUp(t, cfg)
	os.Stderr = stderr
	logs, err := os.ReadFile(errFile.Name())
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, line := range strings.Split(string(logs), "\n") {
		var l struct {
			Level      string   `json:"level"`
			DNSServers []string `json:"dns_servers"`
		}
		if json.Unmarshal([]byte(line), &l) == nil && l.DNSServers != nil {
			if l.Level != "info" || !slices.Equal(l.DNSServers, []string{"[::1:5353]:53", "[::1]:53"}) {
				t.Errorf("DNS servers line %s, want info with [::1:5353]:53 and [::1]:53", line)
			}
			found = append(found, line)
		}
	}
	if len(found) != 1 {
		t.Errorf("%d lines name the DNS servers, want 1:\n%s", len(found), logs)
	}
}
