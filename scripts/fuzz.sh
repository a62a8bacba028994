#!/usr/bin/env bash
# Runs every fuzz target (fuzz/fuzz_targets) for a fixed time with libFuzzer, on the
# stable toolchain: coverage comes from rustc's own SanitizerCoverage pass, enabled with
# stable -C flags; the build is for an explicit --target so the flags stay off build
# scripts. Seeds: fuzz/corpus/<target> (read only); what a run finds goes to
# target/fuzz/corpus/<target>. Every file in fuzz/regressions/<target> (a crash found
# once, kept as a test) is replayed first. Prints one line per target: executions,
# coverage, corpus size, and whether it crashed; exits non-zero if any target crashed.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]     (default 60 s, every target)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true
triple=$(rustc -vV | sed -n 's/^host: //p')
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target/fuzz}
export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
 -Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
 -Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks"
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(ls fuzz/fuzz_targets | sed 's/\.rs$//')
fi
echo "fuzz: building ${#targets[@]} targets (release, coverage-instrumented, $triple)"
cargo build --manifest-path fuzz/Cargo.toml --release --target "$triple" --locked -q
bin="$CARGO_TARGET_DIR/$triple/release"
logs="$CARGO_TARGET_DIR/logs"
mkdir -p "$logs"
failed=0
passed=0
printf '%-22s %12s %8s %8s %8s  %s\n' target executions exec/s cov corpus result
for t in "${targets[@]}"; do
  work="$CARGO_TARGET_DIR/corpus/$t"
  mkdir -p "$work" "fuzz/corpus/$t"
  log="$logs/$t.log"
  result=ok
  # Crashes found before: each must now pass.
  if compgen -G "fuzz/regressions/$t/*" >/dev/null; then
    if ! "$bin/$t" fuzz/regressions/"$t"/* >"$log.regressions" 2>&1; then
      result="REGRESSION (see $log.regressions)"
    fi
  fi
  if ! "$bin/$t" "$work" "fuzz/corpus/$t" -max_total_time="$seconds" -max_len=65536 -rss_limit_mb=2048 \
    -timeout=10 -artifact_prefix="$CARGO_TARGET_DIR/crash-$t-" -print_final_stats=1 >"$log" 2>&1; then
    result="CRASH (see $log; input in $CARGO_TARGET_DIR/crash-$t-*)"
  fi
  if [ "$result" = ok ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | grep -oE '[0-9]+' || true)
  corpus=$(find "$work" "fuzz/corpus/$t" -type f | wc -l)
  printf '%-22s %12s %8s %8s %8s  %s\n' "$t" "${runs:-?}" "${speed:-?}" "${cov:-?}" "$corpus" "$result"
done
echo "fuzz: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
