#!/usr/bin/env bash
# The device's memory running out, as a user meets it: a run resumed with a batch that cannot
# fit must stop with a clear error (the tensor's shape, the bytes asked for and free, the flag
# that sizes the run), exit with status 1, and leave the run folder as it was (no partial
# checkpoint, the earlier one untouched). scripts/gpu_check.sh runs it on the GPU; the test
# suite checks the same on the emulated device under a memory cap (copy_task_cuda_out_of_memory).
#
#   bash scripts/device_oom_check.sh COPY_TASK RUN_FOLDER WORK_FOLDER BATCH [FLAG...]
#
# COPY_TASK: the copy_task program; RUN_FOLDER: a finished copy-task run on the device (its
# checkpoint is resumed); WORK_FOLDER: where a copy of it is made and resumed (replaced if it
# exists); BATCH: a --batch past the device's memory; FLAGs: the run's own settings that differ
# from the defaults (a resume must repeat them). Prints what it checked; exits 0 only when every
# check held.
set -uo pipefail
[ $# -ge 4 ] || { echo "usage: bash scripts/device_oom_check.sh COPY_TASK RUN_FOLDER WORK_FOLDER BATCH [FLAG...]" >&2; exit 2; }
program=$1 run=$2 work=$3 batch=$4
shift 4
[ -f "$run/checkpoint.safetensors" ] || { echo "device_oom_check: no checkpoint in $run" >&2; exit 2; }
rm -rf "$work" && cp -r "$run" "$work" || exit 2
# Every file's checksum (the run's lock file aside), before and after.
sums() { (cd "$work" && find . -type f ! -name .lock -print0 | sort -z | xargs -0 sha256sum); }
before=$(sums)
"$program" --device cuda --resume "$work" --steps 999999999 --target-accuracy 0 --batch "$batch" \
  --eval-batches 1 --final-eval-batches 1 "$@" > "$work.log" 2>&1
status=$?
after=$(sums)
failed=0
absent() { ! grep -q -- "$1" "$2"; }  # absent TEXT FILE
check() {  # check WHAT CONDITION...
  local what=$1
  shift
  if "$@"; then echo "ok      $what"; else echo "FAILED  $what"; failed=1; fi
}
check "exit status 1 (got $status)" test "$status" -eq 1
check "the error names the tensor and the bytes free" \
  grep -Eq "tensor of shape \([0-9, ]*\) does not fit on the device: .*out of device memory allocating [0-9]+ bytes.*has [0-9]+ of [0-9]+ bytes free" "$work.log"
check "the error names the flag that sizes the run" grep -q -- "grows with --batch $batch" "$work.log"
check "the resume was accepted (the checkpoint's settings)" absent "--resume:" "$work.log"
check "the run folder unchanged (no partial checkpoint)" test "$before" = "$after"
echo "the run's output: $work.log"
tail -4 "$work.log"
exit "$failed"
