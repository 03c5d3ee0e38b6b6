package main

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

type ipResolver map[string][]net.IPAddr

func (r ipResolver) LookupTXT(context.Context, string) ([]string, error) { return nil, nil }
func (r ipResolver) LookupTLSA(context.Context, int, string, string) ([]*dns.TLSA, bool, error) {
	return nil, false, nil
}
func (r ipResolver) LookupIPAddr(_ context.Context, host string) ([]net.IPAddr, error) {
	if ips, ok := r[host]; ok {
		return ips, nil
	}
	if ip := net.ParseIP(host); ip != nil {
		return []net.IPAddr{{IP: ip}}, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// TestDialVia: policy hosts resolve through the delivery resolver, trying
// each address in turn.
func TestDialVia(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	// 127.0.0.9 refuses; 127.0.0.1 answers.
	res := ipResolver{"mta-sts.example.test": {{IP: net.ParseIP("127.0.0.9")}, {IP: net.ParseIP("127.0.0.1")}}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := dialVia(res)(ctx, "tcp", net.JoinHostPort("mta-sts.example.test", port))
	if err != nil {
		t.Fatalf("dial through the resolver: %v", err)
	}
	_ = c.Close()
	if _, err := dialVia(res)(ctx, "tcp", "mta-sts.unknown.test:443"); err == nil {
		t.Fatal("a name the resolver does not know was dialled")
	}
}

// TestMTASTSRefreshRuns: with MTA-STS on, serve gets a function to run
// even without TLS reports, the one that refreshes the cached policies
// (mtasts.Client.Refresh), and it returns when its context ends.
func TestMTASTSRefreshRuns(t *testing.T) {
	c := &serveConfig{}
	c.MTASTS = true
	sts, _, _, run, err := tlsPolicies(c, ipResolver{}, nil, "outflow.test", "w1", prometheus.NewRegistry(), zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	if sts == nil || run == nil {
		t.Fatalf("MTA-STS on: lookup %v, run %v; want both", sts, run != nil)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); run(ctx) }()
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return after its context ended")
	}
}
