#!/usr/bin/env bash
# Builds every fuzz target and runs each for SECONDS (default 12) from its corpus and seeds,
# one after another; exits non-zero at the first crash or failed assertion (libFuzzer writes the
# input to fuzz/artifacts/<target>/). .ci/run calls this; docs/testing.md ("Fuzzing") explains it.
#
# Stable Rust is enough: without a sanitizer (`-s none`) cargo-fuzz passes only flags stable
# rustc accepts, while its default, AddressSanitizer, needs `-Zsanitizer` (nightly). What catches
# bugs here is the targets' assertions, overflow checks and debug assertions (cargo-fuzz turns
# both on), not a sanitizer: the decoders are safe Rust.
set -euo pipefail
cd "$(dirname "$0")"
seconds="${1:-10}"
source ./max-len.sh

cargo fuzz build -s none
targets=$(cargo fuzz list)
passed=0
for target in $targets; do
  mkdir -p "corpus/$target"
  corpora=("corpus/$target")
  if [ -d "seeds/$target" ]; then
    corpora+=("seeds/$target")
  fi
  log="target/fuzz-$target.log"
  echo "fuzz: $target for ${seconds}s"
  if ! cargo fuzz run -s none "$target" "${corpora[@]}" -- \
    -max_total_time="$seconds" -max_len="$(max_len "$target")" -print_final_stats=1 \
    >"$log" 2>&1; then
    tail -n 80 "$log"
    echo "fuzz: $passed passed, 1 failed"
    exit 1
  fi
  grep -E '^#[0-9]+ +DONE|^stat::number_of_executed_units' "$log"
  passed=$((passed + 1))
done
# A closing line in the form CI's summary reader knows.
echo "fuzz: $passed passed, 0 failed"
