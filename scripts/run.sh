#!/usr/bin/env bash
# Sets everything up and runs the main job: for now the GEMM benchmark (ours vs OpenBLAS), which
# prints a table and writes bench_gemm.csv. Extra arguments go to the benchmark (--help).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j "$(nproc)" --target bench_gemm
./build/apps/bench_gemm "$@"
