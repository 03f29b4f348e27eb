#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ (clang, ASan, UBSan: --config=fuzz, in
# a Bazel output base of its own so the main build's cache stays warm) and
# runs each over a copy of its seed corpus (job_spec_fuzzer's with
# examples/*.pbtxt copied in); the repository's corpus is never grown. Prints
# one line per target (executions, exec/s, corpus size, crashes: 0 or the
# crash input) and exits non-zero on any crash, leak, timeout or
# out-of-memory, or a target that did not run.
#
# usage: scripts/fuzz.sh [--junit FILE] [--parallel N] [SECONDS | -runs=N] [TARGET...]
#   SECONDS      per target (default 600; 0 skips fuzzing, reported as
#                skipped); -runs=N stops after N inputs instead
#   TARGET       e.g. job_spec_fuzzer (default: every target in fuzz/)
#   --parallel N targets run N at a time (default 1); all run under nice
#   --junit FILE one test case per target, for scripts/count_tests.py
# FUZZ_OUT names the directory for logs, crash inputs and the grown corpora
# (default: a new temp dir, kept and printed); FUZZ_OUTPUT_BASE the output base
# (default ~/.cache/downpour-fuzz). Scratch files go to /dev/shm when it is
# writable. Reproduce a crash with the printed binary and the crash file.
set -uo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
"$ROOT/scripts/install-deps.sh" --test

junit="" parallel=1 budget="-max_total_time=600" targets=()
while (($#)); do
  case $1 in
    --junit) junit=$2; shift 2 ;;
    --parallel) parallel=$2; shift 2 ;;
    -runs=*) budget=$1; shift ;;
    [0-9]*) budget="-max_total_time=$1"; shift ;;
    -h | --help) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) targets+=("$1"); shift ;;
  esac
done
if ((${#targets[@]} == 0)); then
  for f in "$ROOT"/fuzz/*_fuzzer.cc; do targets+=("$(basename "$f" .cc)"); done
fi

# write_junit TSV: the cases of TSV (target, passed|failed|skipped, message).
write_junit() {
  [[ -n $junit ]] || return 0
  python3 - "$1" "$junit" "$ROOT/tests" <<'EOF'
import sys
sys.path.insert(0, sys.argv[3])
from junit import write_junit
cases = [line.rstrip("\n").split("\t", 2) for line in open(sys.argv[1]) if line.strip()]
write_junit(sys.argv[2], "fuzz", [(name, result, "" if result == "passed" else message)
                                  for name, result, message in cases])
EOF
}

if [[ $budget == -max_total_time=0 ]]; then
  skipped=$(mktemp -t downpour-fuzz-skipped.XXXXXX)
  for t in "${targets[@]}"; do printf '%s\tskipped\t%s\n' "$t" "0 seconds asked" >>"$skipped"; done
  write_junit "$skipped"
  rm -f "$skipped"
  echo "fuzz: skipped (0 seconds per target)"
  exit 0
fi

output_base=${FUZZ_OUTPUT_BASE:-$HOME/.cache/downpour-fuzz}
bazel_fuzz() { bazel --output_base="$output_base" "$@"; }
labels=()
for t in "${targets[@]}"; do labels+=("//fuzz:$t"); done
build_start=$SECONDS
bazel_fuzz build --config=fuzz "${labels[@]}" 2>&1 | grep -vE '^(INFO|Loading|Analyzing)'
build_ok=$((PIPESTATUS[0] == 0))
bin=$(bazel_fuzz info --config=fuzz bazel-bin 2>/dev/null)
echo "fuzz: built in $((SECONDS - build_start)) s"

out=${FUZZ_OUT:-$(mktemp -d -t downpour-fuzz.XXXXXX)}
mkdir -p "$out"
scratch=$(mktemp -d -p "$([[ -w /dev/shm ]] && echo /dev/shm || echo "${TMPDIR:-/tmp}")" \
  downpour-fuzz-scratch.XXXXXX)
trap 'rm -rf "$scratch"' EXIT

# run_target NAME: fuzzes one target; writes $out/NAME.result (status, summary).
run_target() {
  local name=$1 seeds corpus dict=() log
  seeds=$ROOT/fuzz/corpus/${name%_fuzzer}
  corpus=$out/$name.corpus
  log=$out/$name.log
  mkdir -p "$corpus" "$out/$name.crashes" "$scratch/$name"
  cp -r "$seeds"/. "$corpus"/
  # The job spec fuzzer's seeds also hold the example specs in text format,
  # taken from examples/ rather than kept twice in the repository.
  local examples=()
  [[ $name == job_spec_fuzzer ]] && examples=("$ROOT"/examples/*.pbtxt)
  ((${#examples[@]} == 0)) || cp "${examples[@]}" "$corpus"/
  [[ -f $ROOT/fuzz/${name%_fuzzer}.dict ]] && dict=("-dict=$ROOT/fuzz/${name%_fuzzer}.dict")
  local seed_count
  seed_count=$(($(find "$seeds" -type f | wc -l) + ${#examples[@]}))
  (cd "$scratch/$name" && TMPDIR="$scratch/$name" nice -n 10 "$bin/fuzz/$name" "$budget" \
    -timeout=30 -print_final_stats=1 "${dict[@]}" -artifact_prefix="$out/$name.crashes/" \
    "$corpus" >"$log" 2>&1)
  local rc=$? runs rate crash files
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  crash=$(find "$out/$name.crashes" -type f | head -1)
  files=$(find "$corpus" -type f | wc -l)
  local summary="$name: ${runs:-?} executions, ${rate:-?} exec/s, corpus $seed_count -> $files files,"
  if [[ -n $crash ]]; then
    echo "failed	$summary crashes: $(find "$out/$name.crashes" -type f | wc -l) ($crash)" >"$out/$name.result"
  elif ((rc != 0)); then
    echo "failed	$summary exit status $rc, no crash input (see $log)" >"$out/$name.result"
  else
    echo "passed	$summary crashes: 0" >"$out/$name.result"
  fi
}

status=0
if ((build_ok)); then
  running=0
  for t in "${targets[@]}"; do
    run_target "$t" &
    ((++running >= parallel)) && { wait -n; ((running--)); }
  done
  wait
fi
cases=$out/junit.tsv
: >"$cases"
for t in "${targets[@]}"; do
  if ((!build_ok)); then
    echo "$t: not run, the fuzz build failed"
    printf '%s\tfailed\t%s\n' "$t" "the fuzz build failed" >>"$cases"
    status=1
  elif [[ ! -f $out/$t.result ]]; then
    printf '%s\tfailed\t%s\n' "$t" "did not run (see $out/$t.log)" >>"$cases"
    status=1
  else
    IFS=$'\t' read -r result summary <"$out/$t.result"
    echo "$summary"
    [[ $result == passed ]] || { status=1; tail -n 30 "$out/$t.log" >&2; }
    printf '%s\t%s\t%s\n' "$t" "$result" "$summary" >>"$cases"
  fi
done
echo "fuzz: logs, crash inputs and grown corpora in $out; binaries in $bin/fuzz"
write_junit "$cases"
exit $status
