#!/bin/bash
# bench/idle-tenants.sh — what tenants that have stopped sending cost a daemon.
#
#   bench/idle-tenants.sh TENANTS [BINARY ...]
#
# For each binary (default bin/outflow; give two to compare builds, e.g. one
# built in a git worktree of the commit before): a fresh data dir, serve
# relaying to smtp-sink, one message for each of TENANTS tenants through
# `outflow submit --tenant tN`, a wait until /metrics counts them all
# delivered and 5 s more (for the workers' last pull requests to expire),
# then serve's own CPU over 20 s with nothing to do (utime + stime from
# /proc/PID/stat) and its resident memory at the end. Each tenant keeps its
# consumer on the work stream; only what the workers do about it changes.
# Needs smtp-sink (make deps) and curl.
set -u
[ $# -ge 1 ] || { sed -n 3,14p "$0"; exit 2; }
tenants=$1
shift
cd "$(dirname "$0")/.."
PATH="$PATH:/usr/sbin"
[ $# -ge 1 ] || set -- "$PWD/bin/outflow"
tick=$(getconf CLK_TCK)

metric() { # metric PORT NAME: the value of an unlabelled metric, 0 if absent
	curl -sf "http://127.0.0.1:$1/metrics" | awk -v n="$2" '$1 == n { printf "%d", $2; f = 1 } END { if (!f) print 0 }'
}
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

for bin in "$@"; do
	data=$(mktemp -d)
	http=$(port) sinkp=$(port)
	smtp-sink -u nobody "127.0.0.1:$sinkp" 1024 >/dev/null 2>&1 &
	sink=$!
	"$bin" serve --data "$data" --smtp-addr 127.0.0.1:0 --http-addr "127.0.0.1:$http" \
		--nats-addr 127.0.0.1:0 --api-addr 127.0.0.1:0 --relay "127.0.0.1:$sinkp" --relay-tls none \
		--log-level warn >/dev/null 2>"$data.log" &
	pid=$!
	for _ in $(seq 1 300); do curl -sf "http://127.0.0.1:$http/readyz" >/dev/null && break; sleep 0.1; done
	for i in $(seq 1 "$tenants"); do
		printf 'Subject: idle\r\n\r\nx\r\n' | "$bin" submit --data "$data" --tenant "t$i" --from a@source.test --to b@dest.test >/dev/null ||
			{ echo "idle-tenants.sh: submit for t$i failed" >&2; exit 1; }
	done
	for _ in $(seq 1 3000); do
		[ "$(metric "$http" outflow_delivered_recipients_total)" -ge "$tenants" ] && break
		sleep 0.1
	done
	sleep 5
	c0=$(awk '{ print $14 + $15 }' "/proc/$pid/stat")
	sleep 20
	c1=$(awk '{ print $14 + $15 }' "/proc/$pid/stat")
	rss=$(awk '/^VmRSS/ { print $2 }' "/proc/$pid/status")
	kill "$pid" "$sink"
	wait "$pid" "$sink" 2>/dev/null
	awk -v bin="$bin" -v n="$tenants" -v c=$((c1 - c0)) -v hz="$tick" -v rss="$rss" 'BEGIN {
		printf "%s: %d tenants, idle CPU %.2f %% of a core, RSS %.0f MiB\n", bin, n, 100 * c / hz / 20, rss / 1024
	}'
	rm -rf "$data" "$data.log"
done
