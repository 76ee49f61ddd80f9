#!/usr/bin/env bash
# Coverage-guided fuzzing of every reader of outside input (tests/fuzz/): builds the fuzz
# targets with clang's libFuzzer, AddressSanitizer and UndefinedBehaviorSanitizer in build-fuzz/,
# makes each target's seed inputs (its --make-seeds, plus the test fixtures that are such
# files), then runs each target for the time given, one after another. Any crash, sanitizer
# report, leak, uncaught exception, timeout (10 s for one input) or memory blow-up (2 GB) fails
# the run; the input that caused it is in build-fuzz/findings/, and its fix goes with a copy of
# it in tests/fuzz/regressions/<target>/ (which the ordinary suite replays).
#
#   bash scripts/fuzz.sh --seconds 20          every target 20 s (the test command's stage)
#   bash scripts/fuzz.sh --minutes 60          every target an hour
#   bash scripts/fuzz.sh --minutes 5 --targets "safetensors manifest"
#   bash scripts/fuzz.sh --runs 1000000        every target a million inputs
#   bash scripts/fuzz.sh --seconds 8 --parallel 2
#                                              two targets at a time, one core each (the test
#                                              command's stage)
#   bash scripts/fuzz.sh --merge               the inputs that add coverage kept in
#                                              tests/fuzz/corpora/<target>/ (minimised)
#
# The inputs each run grows stay in build-fuzz/corpus/<target>/ and are reused by the next run.
# The table at the end (also build-fuzz/fuzz-report.md) gives each target's executions, inputs
# per second, coverage (libFuzzer's "cov": edges reached) and corpus size.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=20
runs=0
targets=""
merge=0
parallel=1
jobs=$(nproc)
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    --minutes) seconds=$(( $2 * 60 )); shift 2 ;;
    --runs) runs=$2; seconds=0; shift 2 ;;
    --targets) targets=$2; shift 2 ;;
    --merge) merge=1; shift ;;
    --parallel) parallel=$2; shift 2 ;;
    *) echo "fuzz: unknown argument '$1' (see the header of $0)" >&2; exit 2 ;;
  esac
done

command -v clang++ > /dev/null ||
  { echo "fuzz: clang++ is needed (bash scripts/setup.sh fuzz installs Debian's clang)" >&2; exit 2; }
echo "== fuzz build (clang, libFuzzer, ASan + UBSan) =="
# The readers need neither OpenMP nor CUDA; without them the build is smaller and every input
# runs on one thread, as libFuzzer expects.
configure_log=$(mktemp)
CC=clang CXX=clang++ cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1" -DCLUSTR_FUZZ=ON -DCLUSTR_OPENMP=OFF \
  -DCLUSTR_CUDA=OFF -DCLUSTR_TESTS=OFF -DCLUSTR_APPS=ON -DCLUSTR_AUDIO=ON \
  -DCLUSTR_SENTENCEPIECE=ON -DCLUSTR_ICU=ON > "$configure_log" ||
  { cat "$configure_log"; rm -f "$configure_log"; exit 1; }
rm -f "$configure_log"
cmake --build build-fuzz -j "$jobs" --target fuzz_targets

if [ -z "$targets" ]; then
  targets=$(cd build-fuzz/tests/fuzz && ls fuzz_* | grep -v '\.' | sed 's/^fuzz_//' | sort | tr '\n' ' ')
fi
mkdir -p build-fuzz/findings build-fuzz/rows
for t in $targets; do
  [ -x "build-fuzz/tests/fuzz/fuzz_$t" ] ||
    { echo "fuzz: no target $t (built: $(ls build-fuzz/tests/fuzz | grep '^fuzz_' | tr '\n' ' '))" >&2; exit 2; }
done

# One target: its seeds, then the run (or the merge); its report row goes to
# build-fuzz/rows/<target>, and "FAILED" to build-fuzz/rows/<target>.failed on a finding.
fuzz_one() {
  local t=$1 exe=build-fuzz/tests/fuzz/fuzz_$1
  local seeds=build-fuzz/seeds/$t corpus=build-fuzz/corpus/$t kept=tests/fuzz/corpora/$t
  rm -f "build-fuzz/rows/$t" "build-fuzz/rows/$t.failed"
  rm -rf "$seeds" && mkdir -p "$seeds"
  "$exe" --make-seeds="$(pwd)/$seeds" > /dev/null
  case "$t" in
    safetensors|checkpoint)
      find tests/fixtures -name '*.safetensors' -size -64k -exec cp {} "$seeds/" \; ;;
    audio)
      find tests/fixtures/audio -type f \( -name '*.wav' -o -name '*.flac' -o -name '*.ogg' \) \
        -size -256k -exec cp {} "$seeds/" \; 2> /dev/null || true ;;
  esac
  mkdir -p "$corpus"
  local dirs=("$corpus" "$seeds")
  [ -d "$kept" ] && dirs+=("$kept")
  [ -d "tests/fuzz/regressions/$t" ] && dirs+=("tests/fuzz/regressions/$t")
  if [ "$merge" = 1 ]; then
    rm -rf "$kept.new" && mkdir -p "$kept.new"
    "$exe" -merge=1 "$kept.new" "${dirs[@]}" 2>&1 | tail -2
    rm -rf "$kept" && mv "$kept.new" "$kept"
    echo "$t: $(ls "$kept" | wc -l) inputs kept in $kept"
    return
  fi
  local limits=(-timeout=10 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1
                "-artifact_prefix=build-fuzz/findings/$t-")
  if [ "$runs" -gt 0 ]; then limits+=("-runs=$runs"); else limits+=("-max_total_time=$seconds"); fi
  # A target's dictionary of tokens its format is made of (tests/fuzz/dicts/), where it has one.
  [ -f "tests/fuzz/dicts/$t.dict" ] && limits+=("-dict=tests/fuzz/dicts/$t.dict")
  echo "== $t =="
  local log=build-fuzz/fuzz-$t.log status start took execs cov inputs rate
  start=$(date +%s)
  if ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
       "$exe" "${limits[@]}" "${dirs[@]}" > "$log" 2>&1; then
    status=ok
  else
    status=FAILED
    echo FAILED > "build-fuzz/rows/$t.failed"
    grep -E "ERROR|runtime error|deadly signal|Test unit written|==[0-9]+==" "$log" | head -20
  fi
  took=$(( $(date +%s) - start ))
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | grep -oE '[0-9]+' || echo 0)
  inputs=$(ls "$corpus" | wc -l)
  rate=$(( execs / (took > 0 ? took : 1) ))
  echo "$t: $status, $execs executions in $took s ($rate/s), coverage $cov, $inputs inputs"
  echo "| $t | $took | $execs | $rate | $cov | $inputs |" > "build-fuzz/rows/$t"
}

# Up to `parallel` targets at a time (merging runs one at a time).
[ "$merge" = 1 ] && parallel=1
running=0
for t in $targets; do
  if [ "$running" -ge "$parallel" ]; then
    wait -n || true
    running=$(( running - 1 ))
  fi
  fuzz_one "$t" &
  running=$(( running + 1 ))
done
while [ "$running" -gt 0 ]; do
  wait -n || true
  running=$(( running - 1 ))
done
[ "$merge" = 1 ] && exit 0

report=build-fuzz/fuzz-report.md
{
  echo "| target | seconds | executions | per second | coverage (edges) | corpus inputs |"
  echo "|---|--:|--:|--:|--:|--:|"
} > "$report"
failed=""
for t in $targets; do
  if [ -f "build-fuzz/rows/$t" ]; then cat "build-fuzz/rows/$t" >> "$report"; else failed="$failed $t"; fi
  [ -f "build-fuzz/rows/$t.failed" ] && failed="$failed $t"
done
echo
cat "$report"
if [ -n "$failed" ]; then
  echo "fuzz: findings in:$failed (inputs in build-fuzz/findings/, logs in build-fuzz/fuzz-*.log)" >&2
  exit 1
fi
