#!/bin/sh
# bench/run.sh — outflow's benchmark suite against Postfix on this machine.
# `make bench` runs it after building bin/outflow and installing postfix
# (smtp-source, smtp-sink); the Postfix daemon of the system is never
# started, the suite runs private instances from temporary directories.
#
#   BENCH_QUICK=1        a few minutes instead of ~30: fewer messages, 1 run
#   BENCH_RUNS=N         alternating runs per scenario (default 3, quick 1)
#   BENCH_SCENARIOS=1,2  which scenarios (default all seven)
#   BENCH_RESULTS=FILE   also write the tables (markdown) to FILE
#   BENCH_NO_ANCHOR=1    scenario 6 without its 30-minute Postfix anchor
#   BENCH_PROFILE=DIR    instead: CPU, allocation and heap profiles of scenario 1
#                        (in-process pipeline) into DIR, kept out of the repo
set -eu
cd "$(dirname "$0")/.."
PATH="$PATH:/usr/sbin"
export PATH
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
go build -o "$bin/outflow-bench" ./bench/cmd/outflow-bench
if [ -n "${BENCH_PROFILE:-}" ]; then
  exec "$bin/outflow-bench" -profile "$BENCH_PROFILE"
fi
set -- -outflow bin/outflow
[ "${BENCH_QUICK:-}" = 1 ] && set -- "$@" -quick
[ -n "${BENCH_RUNS:-}" ] && set -- "$@" -runs "$BENCH_RUNS"
[ -n "${BENCH_SCENARIOS:-}" ] && set -- "$@" -scenarios "$BENCH_SCENARIOS"
[ -n "${BENCH_RESULTS:-}" ] && set -- "$@" -results "$BENCH_RESULTS"
"$bin/outflow-bench" "$@"
