# outflow — `make run` starts it on embedded defaults, `make test` runs every test.
GO        ?= go
BIN       := bin/outflow
VERSION   ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -X main.version=$(VERSION)
PKGS      := ./...
# Fuzzing budgets are execution counts (about 10 s each on 2 cores), not
# durations: a duration races Go's fuzz coordinator at its deadline and fails
# with a bare "context deadline exceeded" and no crasher (golang/go#75804,
# unfixed in Go 1.26). FUZZTIME=30s still works for a longer local run.
FUZZTIME  ?=
# Debian packages the end-to-end tests and benchmarks drive as real peers.
DEB_DEPS  := postfix swaks libnet-ssleay-perl strace fuse3 chromium

.PHONY: all build run test test-short test-long fuzz bench lint deps clean

all: build

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/outflow

# One process: submission on 127.0.0.1:2525, embedded NATS under ./data,
# metrics on 127.0.0.1:9090. The first start prints a generated login.
# Extra serve flags go in ARGS, e.g. make run ARGS="--relay 127.0.0.1:2526 --relay-tls none".
run: build
	$(BIN) serve --data ./data $(ARGS)

# deps installs the Debian packages tests and benchmarks use (postfix for
# smtp-sink/smtp-source, swaks with Net::SSLeay for its STARTTLS, strace for the durability test's fsync
# trace, fuse3 for the fault-injecting filesystem, chromium for the
# console's browser test, dnsmasq-base for the DNS server of the MX delivery
# test), without starting the Postfix daemon.
deps:
	@missing=""; \
	command -v smtp-sink >/dev/null 2>&1 || missing="$$missing postfix"; \
	command -v swaks >/dev/null 2>&1 || missing="$$missing swaks"; \
	perl -MNet::SSLeay -e1 >/dev/null 2>&1 || missing="$$missing libnet-ssleay-perl"; \
	command -v strace >/dev/null 2>&1 || missing="$$missing strace"; \
	command -v fusermount3 >/dev/null 2>&1 || missing="$$missing fuse3"; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	[ -x /usr/sbin/dnsmasq ] || command -v dnsmasq >/dev/null 2>&1 || missing="$$missing dnsmasq-base"; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  echo "postfix postfix/main_mailer_type select No configuration" | debconf-set-selections 2>/dev/null || true; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  (apt-get update -qq && apt-get install -y -qq --no-install-recommends $$missing) >/dev/null || \
	    { echo "apt-get install$$missing failed"; exit 1; }; \
	  service postfix stop >/dev/null 2>&1 || true; \
	fi; \
	PATH="$$PATH:/usr/sbin"; command -v smtp-sink >/dev/null && command -v swaks >/dev/null && perl -MNet::SSLeay -e1 && command -v strace >/dev/null && command -v fusermount3 >/dev/null && command -v chromium >/dev/null && command -v dnsmasq >/dev/null

test: deps build
	PATH="$$PATH:/usr/sbin" $(GO) test -race -shuffle=on -timeout 20m $(PKGS)
	# Built without -race (nats-server races with itself when JetStream
	# restarts in process): throttle/restart_test.go.
	$(GO) test -count=1 -run 'TestFollowsBucketsAfterJetStreamRestart' ./throttle
	$(MAKE) fuzz

test-short: build
	$(GO) test -race -short $(PKGS)

# Long variants of the reliability tests (more kills, more messages), and
# the 30-minute soak with faults (OUTFLOW_SOAK=5m shortens it).
test-long: deps build
	PATH="$$PATH:/usr/sbin" OUTFLOW_LONG=1 $(GO) test -race -timeout 90m $(PKGS)

# Brief fuzzing of every parser that reads untrusted input (must never
# panic) and of the body scans' fast paths against their octet loops.
fuzz:
	$(GO) test -run='^$$' -fuzz=FuzzParseReply -fuzztime=$(or $(FUZZTIME),300000x) ./classify
	$(GO) test -run='^$$' -fuzz=FuzzParseAddress -fuzztime=$(or $(FUZZTIME),150000x) ./submission
	$(GO) test -run='^$$' -fuzz=FuzzBodyValidator -fuzztime=$(or $(FUZZTIME),150000x) ./submission
	$(GO) test -run='^$$' -fuzz=FuzzDotReader -fuzztime=$(or $(FUZZTIME),100000x) ./submission
	$(GO) test -run='^$$' -fuzz=FuzzDotStuff -fuzztime=$(or $(FUZZTIME),150000x) ./sender
	$(GO) test -run='^$$' -fuzz=FuzzDecodeEnvelope -fuzztime=$(or $(FUZZTIME),75000x) ./queue
	$(GO) test -run='^$$' -fuzz=FuzzEnvelopeJSON -fuzztime=$(or $(FUZZTIME),20000x) ./queue
	$(GO) test -run='^$$' -fuzz=FuzzParseDSN -fuzztime=$(or $(FUZZTIME),100000x) ./dsn
	$(GO) test -run='^$$' -fuzz=FuzzReturnPathCheck -fuzztime=$(or $(FUZZTIME),40000x) ./bounce
	$(GO) test -run='^$$' -fuzz=FuzzOpen -fuzztime=$(or $(FUZZTIME),40000x) ./unsubscribe

# bench: micro-benchmarks, then the end-to-end suite against Postfix
# (docs/benchmarks.md). BENCH_QUICK=1 for a few-minute version.
bench: deps build
	$(GO) test -run='^$$' -bench=. -benchmem ./classify ./throttle ./sender ./submission ./queue ./worker ./webhook ./internal/gcpolicy
	PATH="$$PATH:/usr/sbin" BENCH_QUICK="$(BENCH_QUICK)" ./bench/run.sh

lint:
	test -z "$$(gofmt -l .)" || { gofmt -l .; exit 1; }
	$(GO) vet $(PKGS)
	@if $(GO) run honnef.co/go/tools/cmd/staticcheck@v0.7.0 -version >/dev/null 2>&1; then \
	  $(GO) run honnef.co/go/tools/cmd/staticcheck@v0.7.0 $(PKGS); \
	else echo "staticcheck not installable here; skipped"; fi

clean:
	rm -rf bin
