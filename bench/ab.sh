#!/bin/bash
# bench/ab.sh — A/B of `outflow serve` settings on scenario 1's path.
#
#   bench/ab.sh ROUNDS MSGS SIZE 'ARM' 'ARM' ...
#
# Each ARM is extra `serve` flags, optionally led by environment settings
# (NAME=value words, e.g. 'GOMAXPROCS=1' or 'GOGC=200 --sync-window 2ms';
# '' is the defaults). Per round, every arm in turn: a fresh data dir, serve
# relaying to smtp-sink, a 500-message warm-up, then `smtp-source -s 20 -m
# MSGS -l SIZE` timed until /metrics counts every recipient delivered. One
# line per run: messages per second, serve's own CPU per message (utime +
# stime from /proc/PID/stat), the machine's busy cores (/proc/stat) and
# the group commit's fsyncs per message over the measured part. Arms
# alternate within a round, so compare medians over the rounds: the
# machines are shared. Needs bin/outflow (make build), smtp-source and
# smtp-sink (make deps) and curl.
set -u
[ $# -ge 4 ] || { sed -n 3,16p "$0"; exit 2; }
rounds=$1 msgs=$2 size=$3
shift 3
cd "$(dirname "$0")/.."
PATH="$PATH:/usr/sbin"
bin=$PWD/bin/outflow
tick=$(getconf CLK_TCK)
cores=$(nproc)

metric() { # metric PORT NAME: the value of an unlabelled metric, 0 if absent
	curl -sf "http://127.0.0.1:$1/metrics" | awk -v n="$2" '$1 == n { printf "%d", $2; f = 1 } END { if (!f) print 0 }'
}
delivered_wait() { # delivered_wait PORT COUNT: until COUNT recipients are delivered (10 min at most)
	local i
	for i in $(seq 1 30000); do
		[ "$(metric "$1" outflow_delivered_recipients_total)" -ge "$2" ] && return 0
		sleep 0.02
	done
	echo "ab.sh: only $(metric "$1" outflow_delivered_recipients_total) of $2 delivered" >&2
	return 1
}
machine() { # machine: busy and total jiffies of all cores
	awk '$1 == "cpu" { print $2+$3+$4+$7+$8+$9, $2+$3+$4+$5+$6+$7+$8+$9 }' /proc/stat
}
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

for r in $(seq 1 "$rounds"); do
	for arm in "$@"; do
		envs=() flags=()
		for w in $arm; do
			case $w in
			[A-Z]*=*) envs+=("$w") ;;
			*) flags+=("$w") ;;
			esac
		done
		data=$(mktemp -d)
		smtp=$(port) http=$(port) sinkp=$(port)
		smtp-sink -u nobody "127.0.0.1:$sinkp" 1024 >/dev/null 2>&1 &
		sink=$!
		env "${envs[@]}" "$bin" serve --data "$data" --smtp-addr "127.0.0.1:$smtp" --http-addr "127.0.0.1:$http" \
			--nats-addr 127.0.0.1:0 --api-addr 127.0.0.1:0 --relay "127.0.0.1:$sinkp" --relay-tls none \
			--trusted-networks 127.0.0.0/8 --log-level warn "${flags[@]}" >/dev/null 2>"$data.log" &
		pid=$!
		for _ in $(seq 1 300); do curl -sf "http://127.0.0.1:$http/metrics" >/dev/null && break; sleep 0.1; done
		smtp-source -s 20 -m 500 -l "$size" -f bench@source.test -t rcpt@example.com "127.0.0.1:$smtp"
		delivered_wait "$http" 500
		f0=$(metric "$http" outflow_store_fsyncs_total)
		c0=$(awk '{ print $14 + $15 }' "/proc/$pid/stat")
		read -r b0 t0 < <(machine)
		s0=$(date +%s.%N)
		smtp-source -s 20 -m "$msgs" -l "$size" -f bench@source.test -t rcpt@example.com "127.0.0.1:$smtp"
		delivered_wait "$http" $((msgs + 500))
		s1=$(date +%s.%N)
		read -r b1 t1 < <(machine)
		c1=$(awk '{ print $14 + $15 }' "/proc/$pid/stat")
		f1=$(metric "$http" outflow_store_fsyncs_total)
		kill "$pid" "$sink"
		wait "$pid" "$sink" 2>/dev/null
		awk -v r="$r" -v arm="$arm" -v n="$msgs" -v s="$s1-$s0" -v c=$((c1 - c0)) -v hz="$tick" \
			-v b=$((b1 - b0)) -v t=$((t1 - t0)) -v k="$cores" -v f=$((f1 - f0)) 'BEGIN {
				split(s, p, "-"); secs = p[1] - p[2]
				printf "round %d [%s] %.0f msg/s, serve %.0f µs/msg, busy %.2f cores, %.3f fsyncs/msg\n",
					r, arm, n / secs, c * 1e6 / hz / n, k * b / t, f / n
			}'
		rm -rf "$data" "$data.log"
	done
done
