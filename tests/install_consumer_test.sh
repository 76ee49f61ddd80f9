#!/usr/bin/env bash
# Installs the build in BUILD_DIR into a fresh prefix, configures and builds the project in
# tests/install_consumer against it (find_package(clustr), clustr::clustr) and runs its program.
#   bash tests/install_consumer_test.sh BUILD_DIR WORK_DIR
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: bash tests/install_consumer_test.sh BUILD_DIR WORK_DIR" >&2; exit 2; }
build=$1 work=$2
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work"
mkdir -p "$work"
cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"
test -f "$work/prefix/include/clustr/core/ops.h"
ls "$work"/prefix/lib*/cmake/clustr/clustrConfig.cmake > /dev/null
cmake -S "$here/install_consumer" -B "$work/consumer" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$work/prefix" > "$work/configure.log"
cmake --build "$work/consumer" > "$work/build.log"
"$work/consumer/consumer"
