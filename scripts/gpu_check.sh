#!/usr/bin/env bash
# The GPU check: on a machine with an NVIDIA GPU, from the repository's folder,
#
#   bash scripts/gpu_check.sh OUTDIR [--deps DIR] [--corpus DIR] [--deadline SECONDS] [--only PATTERNS]
#
# 1. prints the machine (GPU, driver, nvcc, CMake, CPU, PyTorch when present);
# 2. configures a release build for this GPU's architecture only (nvidia-smi's compute
#    capability) in build-gpu/ and builds it; with --deps, the dependencies come from a folder
#    of unpacked Debian packages (scripts/fetch_deps.sh; such a machine has no package registry);
# 3. runs the cuda tests on the GPU with CLUSTR_REQUIRE_GPU=1 (no usable GPU fails, never skips);
# 4. runs compute-sanitizer's memcheck over the cuda tests (racecheck, synccheck and initcheck
#    come after the benchmarks, in step 7);
# 5. trains the main job (the copy task to its target) with --device cuda, then resumes it (in a
#    copy) at a batch past the device's memory: a clear error, exit 1, the folder unchanged;
# 6. runs the GPU benchmarks: cuBLAS GEMM in fp32, TF32 and bf16, the three attention types from
#    N = 512 up (the paper's Figure 4, PNGs), full attention beside PyTorch's
#    scaled_dot_product_attention in bf16 and fp32 at batch 1 and 8
#    (apps/bench_attention_torch.py), the encoder layer's step (bench_encoder) and the
#    copy-task step in fp32 and bf16 (graphs on and off; off once more without cuBLASLt's
#    epilogues, CLUSTR_GEMM_EPILOGUES=off), the copy-task step beside PyTorch 2.x on the same GPU,
#    eager and torch.compile(mode="reduce-overhead"), and a BERT-width model's step beside
#    PyTorch (apps/bench_copy_task_torch.py), and each kernel's GPU time in clustered and
#    improved-clustered attention and in three copy-task steps (ncu: profile_attention.log,
#    profile_copy_step.log);
# 7. runs compute-sanitizer's racecheck, synccheck and initcheck, and, with --corpus (a speech
#    corpus folder made by data/make_speech_corpus.py), 300 speech steps on the device, with
#    CUDA graphs and without.
# Every log, CSV and PNG goes to OUTDIR, with summary.txt: one line per step, PASS / FAIL /
# NOT RUN and why. Each step has a time limit, and the whole check aims at 8 minutes on one H100
# without the compiled PyTorch peers (the H200's run of 1e53358: 334 s); those add 3-5 minutes,
# mostly PyTorch's compilation (30-60 s a compiled run; see the PyTorch peers' steps below), and
# under a --deadline of 8 minutes the steps after them (the profiles, racecheck, synccheck,
# initcheck, speech) are the ones left NOT RUN.
# The exit status is 0 only when every step that ran passed. The steps run in the order of what
# matters most (correctness first, then the figures); --deadline caps the whole check: each step
# gets at most the seconds left, and a step with under 20 seconds left is NOT RUN. --only runs the
# build and the steps whose names (as summary.txt writes them) match one of the space-separated
# patterns, e.g. --only 'cuda_tests sanitizer_*'.
#
# GPU_CHECK_EMULATE=1 rehearses the same steps on a machine without a GPU: an emulated-device
# build (-DCLUSTR_CUDA=EMULATE), no nvidia-smi or compute-sanitizer, tiny sizes; it checks the
# script and the programs' flags, not the GPU.
set -uo pipefail
cd "$(dirname "$0")/.."

usage() {
  echo "usage: bash scripts/gpu_check.sh OUTDIR [--deps DIR] [--corpus DIR] [--deadline SECONDS] [--only PATTERNS]" >&2
  exit 2
}
[ $# -ge 1 ] || usage
out=$1
shift
deps="" corpus="" deadline="" only=""
while [ $# -gt 0 ]; do
  case "$1" in
    --deps) [ $# -ge 2 ] || usage; deps=$(cd "$2" && pwd) || exit 2; shift 2 ;;
    --corpus) [ $# -ge 2 ] || usage; corpus=$(cd "$2" && pwd) || exit 2; shift 2 ;;
    --deadline)
      [ $# -ge 2 ] || usage
      [[ "$2" =~ ^[0-9]+$ ]] || { echo "gpu_check: --deadline takes whole seconds, not '$2'" >&2; exit 2; }
      deadline=$2; shift 2 ;;
    --only) [ $# -ge 2 ] || usage; only=$2; shift 2 ;;
    *) echo "gpu_check: unknown argument '$1'" >&2; usage ;;
  esac
done
emulate=${GPU_CHECK_EMULATE:-0}
mkdir -p "$out" || exit 2
out=$(cd "$out" && pwd)
summary="$out/summary.txt"
: > "$summary"
failures=0
start=$(date +%s)

note() { echo "$*" | tee -a "$summary"; }

# step NAME LIMIT_SECONDS COMMAND...: runs the command with its output in OUTDIR/NAME.log.
step() {
  local name=$1 limit=$2
  shift 2
  local t0 rc
  t0=$(date +%s)
  if [ -n "$only" ] && [ "$name" != configure ] && [ "$name" != build ]; then
    local -a patterns
    local pattern chosen=0
    read -ra patterns <<< "$only"
    for pattern in "${patterns[@]}"; do
      # shellcheck disable=SC2053  # the pattern is a glob on purpose
      [[ $name == $pattern ]] && chosen=1
    done
    if [ "$chosen" = 0 ]; then
      note "NOT RUN  $name: not among --only '$only'"
      return 1
    fi
  fi
  if [ -n "$deadline" ]; then
    local left=$(( deadline - (t0 - start) ))
    if [ "$left" -lt 20 ]; then
      note "NOT RUN  $name: past the check's ${deadline}s deadline"
      return 1
    fi
    [ "$left" -lt "$limit" ] && limit=$left
  fi
  echo "== $name (limit ${limit}s)"
  timeout --kill-after=10 "$limit" "$@" > "$out/$name.log" 2>&1
  rc=$?
  local took=$(( $(date +%s) - t0 ))
  if [ "$rc" -eq 0 ]; then
    note "PASS     $name (${took}s)"
  elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    note "FAIL     $name: over its ${limit}s limit (log: $name.log)"
    failures=$((failures + 1))
  else
    note "FAIL     $name: exit status $rc (log: $name.log)"
    failures=$((failures + 1))
    tail -5 "$out/$name.log"
  fi
  return "$rc"
}

not_run() { note "NOT RUN  $1: $2"; }

# ---- 1. the machine ----------------------------------------------------------------------------
{
  echo "date: $(date -u)"
  # The commit, and whether the files differ from it (a copied working tree can be newer).
  echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)" \
    "($(git status --porcelain --untracked-files=no 2>/dev/null | wc -l) tracked files differ)"
  echo "cpu: $(lscpu | sed -n 's/^Model name: *//p')"
  if [ "$emulate" = 1 ]; then
    echo "gpu: none (GPU_CHECK_EMULATE=1: the emulated device)"
  else
    nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv
  fi
  command -v nvcc > /dev/null && nvcc --version | tail -2
  [ -x /usr/local/cuda/bin/nvcc ] && /usr/local/cuda/bin/nvcc --version | tail -1
  cmake --version | head -1
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())' \
    2> /dev/null || echo "torch: not importable"
} > "$out/machine.txt" 2>&1
cat "$out/machine.txt"

arch=""
if [ "$emulate" != 1 ]; then
  if ! command -v nvidia-smi > /dev/null; then
    note "FAIL     gpu: nvidia-smi not found: this check needs a machine with an NVIDIA GPU"
    exit 1
  fi
  cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2> /dev/null | head -1 | tr -d ' ')
  if [ -z "$cap" ]; then
    note "FAIL     gpu: nvidia-smi lists no GPU (compute capability unknown)"
    exit 1
  fi
  arch=${cap/./}
  echo "GPU architecture: sm_$arch"
fi

# ---- 2. configure and build ------------------------------------------------------------------
build=build-gpu
cuda_flags=(-DCLUSTR_CUDA=ON "-DCLUSTR_CUDA_ARCHITECTURES=$arch")
[ "$emulate" = 1 ] && build=build-gpu-emulate && cuda_flags=(-DCLUSTR_CUDA=EMULATE)
config=(-DCMAKE_BUILD_TYPE=Release -DCLUSTR_APPS=ON -DCLUSTR_TESTS=ON "${cuda_flags[@]}")
if [ -n "$deps" ]; then
  config+=("-DCLUSTR_DEPS_ROOT=$deps")
  # The libraries that the fetched libsndfile loads in turn (its programs' RPATH covers only
  # their own direct libraries).
  export LD_LIBRARY_PATH="$deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
step configure 120 cmake -S . -B "$build" "${config[@]}" || { note "stopped: no build"; exit 1; }
step build 600 cmake --build "$build" -j "$(nproc)" || { note "stopped: no build"; exit 1; }

# ---- 3. the cuda tests on the GPU -------------------------------------------------------------
if [ "$emulate" = 1 ]; then
  # The emulated device is refused under CLUSTR_REQUIRE_GPU; the rehearsal runs without it.
  step cuda_tests 600 "$build/tests/test_cuda"
else
  step cuda_tests 240 env CLUSTR_REQUIRE_GPU=1 "$build/tests/test_cuda"
fi

# ---- 4. compute-sanitizer: memcheck now, the other tools after the benchmarks ------------------
# Left out here, run above without it: the app tests (whole training runs, most of the time
# under the sanitizer, launching the same kernels as the op tests) and the suite
# provoked_cuda_errors (a failed CUDA call on purpose, which the sanitizer reports as an error).
# initcheck also leaves out the test cases with bf16 products: on an H100 (CUDA 13.0, driver
# 580) it reports every result of cublasGemmEx with bf16 operands as uninitialised memory, in a
# four-line program too (cudaMalloc, cublasGemmEx, cudaMemcpy), while cublasSgemm's and our own
# kernels' results pass; --check-bulk-copy does not change it (docs/PERFORMANCE.md, "H100").
sanitize() {
  local tool
  for tool in "$@"; do
    if [ "$emulate" = 1 ]; then
      not_run "sanitizer_$tool" "no GPU (GPU_CHECK_EMULATE=1)"
    elif ! command -v compute-sanitizer > /dev/null; then
      not_run "sanitizer_$tool" "compute-sanitizer not found"
      failures=$((failures + 1))
    else
      local exclude='*app*'
      [ "$tool" = initcheck ] && exclude='*app*,*bf16*'
      step "sanitizer_$tool" 120 env CLUSTR_REQUIRE_GPU=1 compute-sanitizer --tool "$tool" \
        --error-exitcode 1 "$build/tests/test_cuda" --test-case-exclude="$exclude" \
        --test-suite-exclude=provoked_cuda_errors
    fi
  done
}
sanitize memcheck

# ---- 5. training on the device ----------------------------------------------------------------
if [ "$emulate" = 1 ]; then
  step main_job 600 "$build/apps/copy_task" --device cuda --out "$out/copy_task" --overwrite --steps 2 \
    --warmup 1 --batch 2 --length 7 --eval-interval 1 --eval-batches 1 --final-eval-batches 1 \
    --log-interval 1
else
  step main_job 240 "$build/apps/copy_task" --device cuda --out "$out/copy_task" --overwrite
fi
# The device's memory running out (scripts/device_oom_check.sh): the main job's run resumed,
# in a copy, at a batch past the device's memory must stop with the error that names the tensor,
# the bytes and --batch, exit 1 and leave its folder as it was. On the GPU: 780,000 sequences of
# N = 128, 1e8 tokens (the most the held-out sets allow); the first layer's Q, K and V alone
# would take 150 GB. Emulated: a 6 MiB device and a batch of 64.
if [ ! -f "$out/copy_task/checkpoint.safetensors" ]; then
  not_run device_oom "the main job left no checkpoint to resume"
elif [ "$emulate" = 1 ]; then
  step device_oom 120 env CLUSTR_EMULATION_MEMORY=6M bash scripts/device_oom_check.sh \
    "$build/apps/copy_task" "$out/copy_task" "$out/device_oom_run" 64 --warmup 1 --length 7
else
  step device_oom 180 bash scripts/device_oom_check.sh "$build/apps/copy_task" \
    "$out/copy_task" "$out/device_oom_run" 780000
fi

# ---- 6. benchmarks -----------------------------------------------------------------------------
# Whether python3 has a PyTorch that sees the GPU (the PyTorch peers' steps need one).
torch_sees_gpu() {
  python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' > /dev/null 2>&1
}
if [ "$emulate" = 1 ]; then
  step bench_gemm 300 "$build/apps/bench_gemm" --device cuda --shapes transformer --reps 1 \
    --overwrite --csv "$out/bench_gemm_fp32.csv"
  step bench_encoder 300 "$build/apps/bench_encoder" --device cuda --shapes 2x8 --reps 1 \
    --overwrite --csv "$out/bench_encoder.csv"
  step bench_attention 600 "$build/apps/bench_attention" --device cuda --n 64 128 --reps 1 \
    --heads 1 --dim 8 --clusters 4 --bits 15 --iterations 2 --topk 8 \
    --attention full clustered improved-clustered --overwrite --csv "$out/bench_attention.csv" \
    --png "$out/attention_time.png" --png-memory "$out/attention_memory.png"
  not_run bench_attention_sdpa "PyTorch's side needs a real GPU"
  not_run bench_attention_sdpa_b8 "PyTorch's side needs a real GPU"
  step bench_attention_lsh 300 "$build/apps/bench_attention" --device cuda --n 64 128 --reps 1 \
    --heads 1 --dim 8 --buckets 4 --chunk 8 --attention lsh-1 lsh-4 \
    --overwrite --csv "$out/bench_attention_lsh.csv"
else
  step bench_gemm 120 "$build/apps/bench_gemm" --device cuda --shapes all \
    --overwrite --csv "$out/bench_gemm_fp32.csv"
  step bench_gemm_tf32 120 "$build/apps/bench_gemm" --device cuda --shapes all --tf32 \
    --overwrite --csv "$out/bench_gemm_tf32.csv"
  step bench_gemm_bf16 120 "$build/apps/bench_gemm" --device cuda --shapes all --precision bf16 \
    --overwrite --csv "$out/bench_gemm_bf16.csv"
  step bench_attention 300 "$build/apps/bench_attention" --device cuda \
    --attention full clustered improved-clustered \
    --n 512 1024 2048 4096 8192 16384 32768 65536 131072 --max-full-n 65536 --reps 3 \
    --overwrite --csv "$out/bench_attention.csv" --png "$out/attention_time.png" \
    --png-memory "$out/attention_memory.png"
  # Full attention beside PyTorch's scaled_dot_product_attention on the same GPU (a
  # FlashAttention-class kernel), bf16 and fp32: time, TFLOP/s and GB/s of both sides.
  if ! torch_sees_gpu; then
    not_run bench_attention_sdpa "python3 has no PyTorch that sees the GPU"
    not_run bench_attention_sdpa_b8 "python3 has no PyTorch that sees the GPU"
  else
    step bench_attention_sdpa 240 python3 apps/bench_attention_torch.py --device cuda \
      --binary "$build/apps/bench_attention" --n 2048 4096 8192 16384 32768 65536 --batch 1 \
      --heads 6 --dim 64 --precision bf16 fp32 --reps 5 --rounds 2 --overwrite \
      --csv "$out/bench_attention_sdpa.csv"
    step bench_attention_sdpa_b8 180 python3 apps/bench_attention_torch.py --device cuda \
      --binary "$build/apps/bench_attention" --n 2048 4096 8192 16384 --batch 8 \
      --heads 6 --dim 64 --precision bf16 fp32 --reps 5 --rounds 2 --overwrite \
      --csv "$out/bench_attention_sdpa_b8.csv"
  fi
  # The Reformer baseline's first device kernels (cuda/reformer.cu), against the clustered
  # types above.
  step bench_attention_lsh 240 "$build/apps/bench_attention" --device cuda \
    --attention lsh-1 lsh-4 --n 512 2048 8192 32768 65536 --reps 3 \
    --overwrite --csv "$out/bench_attention_lsh.csv"
  for precision in fp32 bf16; do
    step "bench_encoder_$precision" 120 "$build/apps/bench_encoder" --device cuda \
      --precision "$precision" --overwrite --csv "$out/bench_encoder_$precision.csv"
  done
  # The paper's copy-task model with full attention, its step replayed as a CUDA graph (windows
  # of 10 steps, read back once each) and launched op by op (--cuda-graphs off): the log lines'
  # ms/step and launches/step.
  copy_step=(--device cuda --overwrite --attention full --length 63 --layers 4 --heads 6
             --head-dim 32 --feedforward 768 --dropout 0 --batch 32 --optimizer radam --lr 2e-4
             --steps 40 --log-interval 10 --eval-interval 100000 --target-accuracy 0
             --eval-batches 1 --final-eval-batches 1)
  for precision in fp32 bf16; do
    for graphs in on off; do
      step "copy_task_step_${precision}_graphs_$graphs" 120 "$build/apps/copy_task" \
        "${copy_step[@]}" --out "$out/copy_task_step_${precision}_$graphs" \
        --precision "$precision" --cuda-graphs "$graphs"
    done
  done
  # Launched op by op once more without cuBLASLt's epilogues (the linear layers' bias, ReLU and
  # bias gradients as kernels of their own): what the epilogues save.
  step copy_task_step_fp32_graphs_off_no_epilogues 120 env CLUSTR_GEMM_EPILOGUES=off \
    "$build/apps/copy_task" "${copy_step[@]}" --out "$out/copy_task_step_fp32_no_epilogues" \
    --precision fp32 --cuda-graphs off
fi
# The copy-task step beside PyTorch 2.x on the same GPU (same model, full attention; PyTorch's
# attention is scaled_dot_product_attention), fp32 and bf16 (autocast), N = 64 and 128, each
# timed as one loop of 20 steps. PyTorch runs eager and as torch.compile(step,
# mode="reduce-overhead") (the whole training step compiled, replayed as CUDA graphs: the mode
# for launch-bound steps like these), each in its own process. --compile default is left out:
# each compiled run takes 30-60 s of compilation, and a third mode (four more compiled runs,
# 2-4 minutes) does not fit the check's 8 minutes; run it by hand with `--compile none default
# reduce-overhead`. One round per length (two before the compiled runs): a compiled run
# compiles again in each round. Estimate per precision: 2 x (about 15 s ours + eager, 40-70 s
# compiled), 110-170 s; the limit leaves room for a slow compilation.
# pytorch_peer_bert: the same task and loss at BERT-base's width (D 768, 12 heads, feed-forward
# 3072, 4 layers, batch 16, N = 512; our app takes these through its flags), bf16 (the
# precision such a model is trained in), eager and reduce-overhead: 60-100 s.
if [ "$emulate" = 1 ]; then
  for name in pytorch_peer_fp32 pytorch_peer_bf16 pytorch_peer_bert; do
    not_run "$name" "PyTorch's side needs a real GPU"
  done
elif ! torch_sees_gpu; then
  for name in pytorch_peer_fp32 pytorch_peer_bf16 pytorch_peer_bert; do
    not_run "$name" "python3 has no PyTorch that sees the GPU"
  done
else
  for precision in fp32 bf16; do
    step "pytorch_peer_$precision" 300 python3 apps/bench_copy_task_torch.py --device cuda \
      --binary "$build/apps/copy_task" --precision "$precision" --steps 20 --warmup 5 \
      --compile none reduce-overhead --rounds 1 --overwrite \
      --csv "$out/bench_copy_task_torch_$precision.csv"
  done
  step pytorch_peer_bert 240 python3 apps/bench_copy_task_torch.py --device cuda \
    --binary "$build/apps/copy_task" --model bert --precision bf16 --steps 20 --warmup 5 \
    --compile none reduce-overhead --rounds 1 --overwrite \
    --csv "$out/bench_copy_task_torch_bert.csv"
fi
# The CTC loss's device kernel (layers/cuda/ctc.cu) beside PyTorch's ctc_loss on the same GPU, at
# the CPU benchmark's shape (T 800, B 8, V 50, 90..110 labels), forward + backward with the
# log-softmax, each step synchronised: 20-40 s.
if [ "$emulate" = 1 ]; then
  not_run bench_ctc_cuda "PyTorch's side needs a real GPU"
elif ! torch_sees_gpu; then
  not_run bench_ctc_cuda "python3 has no PyTorch that sees the GPU"
else
  step bench_ctc_cuda 90 python3 apps/bench_ctc_torch.py --device cuda \
    --binary "$build/apps/bench_ctc" --reps 20 --rounds 2 --overwrite \
    --csv "$out/bench_ctc_cuda.csv"
fi

# Where the attention types' time goes: each kernel's GPU time (Nsight Compute), one forward +
# backward of clustered and improved-clustered attention at N = 16384 (after the untimed one).
if [ "$emulate" = 1 ]; then
  not_run profile_attention "no GPU (GPU_CHECK_EMULATE=1)"
elif ! command -v ncu > /dev/null; then
  not_run profile_attention "ncu not found"
else
  step profile_attention 180 ncu --clock-control none --metrics gpu__time_duration.sum --print-summary per-kernel \
    "$build/apps/bench_attention" --device cuda --attention clustered improved-clustered \
    --n 16384 --reps 1 --overwrite --csv "$out/profile_attention.csv"
  # The copy-task step: its kernels' GPU time against the step's wall time (the rest is the
  # host's: launches, autograd, copies).
  step profile_copy_step 150 ncu --clock-control none --metrics gpu__time_duration.sum --print-summary per-kernel \
    "$build/apps/copy_task" --device cuda --out "$out/profile_copy_step" --overwrite \
    --attention full --length 63 --layers 4 --heads 6 --head-dim 32 --feedforward 768 \
    --dropout 0 --batch 32 --steps 3 --log-interval 1 --eval-interval 100000 \
    --target-accuracy 0 --eval-batches 1 --final-eval-batches 1
fi

# ---- 7. the other sanitizer tools, and speech training on the device -------------------------
sanitize racecheck synccheck initcheck
if [ -z "$corpus" ]; then
  not_run speech "no --corpus given (make one with data/make_speech_corpus.py where its Debian packages are)"
elif [ "$emulate" = 1 ]; then
  step speech 600 "$build/apps/speech" train --device cuda --corpus "$corpus" --out "$out/speech" --overwrite \
    --max-steps 2 --log-interval 1
else
  step speech 180 "$build/apps/speech" train --device cuda --corpus "$corpus" --out "$out/speech" --overwrite \
    --max-steps 300 --log-interval 20
  # The same steps launched op by op: the log lines' ms/step against the graphs' above.
  step speech_graphs_off 180 "$build/apps/speech" train --device cuda --corpus "$corpus" \
    --out "$out/speech_graphs_off" --overwrite --max-steps 300 --log-interval 20 --cuda-graphs off
fi

note "total: $(( $(date +%s) - start ))s, $failures failed step(s); logs in $out"
[ "$failures" -eq 0 ]
