#!/usr/bin/env bash
# The long runs recorded in docs/testing.md ("Fuzzing"): each target in turn (or those named) for
# RUNS executions (default 10,000,000), niced, one at a time, each from its corpus and seeds.
# Prints per target the executions, wall time, executions per second, corpus size and outcome;
# libFuzzer's whole output is in target/long-<target>.log. Stops at the first crash, whose
# input libFuzzer writes to artifacts/<target>/.
#
#   fuzz/run-long.sh                      # every target, 10 M executions each
#   RUNS=50000000 fuzz/run-long.sh cursor # one target, longer
set -euo pipefail
cd "$(dirname "$0")"
source ./max-len.sh
runs="${RUNS:-10000000}"

cargo fuzz build -s none
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(cargo fuzz list)
fi
for target in "${targets[@]}"; do
  mkdir -p "corpus/$target"
  corpora=("corpus/$target")
  if [ -d "seeds/$target" ]; then
    corpora+=("seeds/$target")
  fi
  log="target/long-$target.log"
  started=$(date +%s)
  status=0
  nice -n 10 cargo fuzz run -s none "$target" "${corpora[@]}" -- \
    -runs="$runs" -max_len="$(max_len "$target")" -print_final_stats=1 >"$log" 2>&1 || status=$?
  seconds=$(($(date +%s) - started))
  executions=$(grep -oP '^stat::number_of_executed_units: \K[0-9]+' "$log" || echo 0)
  corpus_files=$(find "corpus/$target" -type f | wc -l)
  corpus_bytes=$(du -sb "corpus/$target" | cut -f1)
  rate=$((executions / (seconds > 0 ? seconds : 1)))
  echo "$target: $executions executions in ${seconds}s ($rate exec/s)," \
    "corpus $corpus_files inputs / $corpus_bytes bytes, max_len $(max_len "$target"), exit $status"
  if [ "$status" -ne 0 ]; then
    grep -E 'panicked|SUMMARY|Test unit written' "$log" || true
    exit "$status"
  fi
done
