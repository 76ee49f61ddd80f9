#!/usr/bin/env bash
# A training app under the signals and the folder lock that a user meets:
#   app_signal_test.sh OUT TRAIN_COMMAND... -- RESUME_COMMAND...
# 1. starts TRAIN_COMMAND (which writes into OUT) and waits for its first log line "step ";
# 2. a second run into OUT while the first lives must fail, naming the lock's holder;
# 3. SIGINT: the first run must end with status 130, saying so, and leave a checkpoint;
# 4. RESUME_COMMAND (which continues from OUT) must run to its end with status 0.
set -u
out=$1
shift
train=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do train+=("$1"); shift; done
[ $# -gt 0 ] || { echo "usage: app_signal_test.sh OUT TRAIN... -- RESUME..."; exit 2; }
shift
resume=("$@")
fail() { echo "FAIL: $*"; exit 1; }

rm -rf "$out"
log=$(mktemp)
trap 'rm -f "$log" "$log.2"' EXIT
"${train[@]}" > "$log" 2>&1 &
pid=$!
for _ in $(seq 600); do
  grep -q "^\(epoch [0-9]*  \)\?step " "$log" && break
  kill -0 "$pid" 2> /dev/null || { cat "$log"; fail "the run ended before its first step line"; }
  sleep 0.1
done
grep -q "step " "$log" || { kill -KILL "$pid"; fail "no step line within 60 s"; }

"${train[@]}" > "$log.2" 2>&1
rc=$?
[ "$rc" -ne 0 ] || fail "a second run into $out while the first lives exited 0"
grep -q "is in use by another run (process $pid)" "$log.2" || { cat "$log.2"; fail "the second run did not name the lock's holder"; }
echo "second run refused: $(tail -1 "$log.2")"

kill -INT "$pid"
wait "$pid"
rc=$?
tail -2 "$log"
[ "$rc" -eq 130 ] || fail "the interrupted run exited $rc, expected 130"
grep -q "interrupted by SIGINT" "$log" || fail "the run did not say it was interrupted"
ls "$out"/*.safetensors > /dev/null 2>&1 || fail "no checkpoint in $out"
ls "$out" | grep -q '\.tmp\.' && fail "temporary files left in $out"

"${resume[@]}" > "$log" 2>&1
rc=$?
tail -2 "$log"
[ "$rc" -eq 0 ] || fail "the resumed run exited $rc"
grep -q "resumed from" "$log" || fail "the resumed run did not resume"
echo "PASS"
