#!/usr/bin/env bash
# CLUSTR_DEPS_ROOT (CMakeLists.txt): the build finds doctest, CLI11, nlohmann-json, stb,
# libsndfile, libsoxr, SentencePiece and ICU in a folder of unpacked Debian packages before the
# system's. The folder is made here from the installed packages' own files (dpkg -L), laid out
# as dpkg -x lays out a .deb
# (scripts/fetch_deps.sh, which downloads them, is for machines without the packages), and the
# project is configured against it: every dependency must come from the folder.
set -euo pipefail
src=$1
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
for p in doctest-dev libcli11-dev nlohmann-json3-dev libstb-dev libstb0 libsndfile1-dev \
         libsndfile1 libsoxr-dev libsoxr0 libsentencepiece-dev libsentencepiece0 libicu-dev \
         libicu72; do
  dpkg -L "$p" | while read -r f; do
    if [ -f "$f" ] || [ -L "$f" ]; then cp -P --parents "$f" "$root"; fi
  done
done
cmake -S "$src" -B "$root/build" -DCLUSTR_CUDA=OFF -DCLUSTR_APPS=ON -DCLUSTR_TESTS=ON \
  -DCLUSTR_DEPS_ROOT="$root" > "$root/configure.log" 2>&1 || {
  cat "$root/configure.log"
  echo "configure against CLUSTR_DEPS_ROOT failed"
  exit 1
}
status=0
for var in CLI11_DIR doctest_DIR nlohmann_json_DIR CLUSTR_STB_INCLUDE_DIR CLUSTR_STB_LIBRARY \
           CLUSTR_SNDFILE_INCLUDE_DIR CLUSTR_SNDFILE_LIBRARY CLUSTR_SOXR_INCLUDE_DIR \
           CLUSTR_SOXR_LIBRARY CLUSTR_SENTENCEPIECE_INCLUDE_DIR CLUSTR_SENTENCEPIECE_LIBRARY \
           CLUSTR_SENTENCEPIECE_TRAIN_LIBRARY CLUSTR_ICU_INCLUDE_DIR CLUSTR_ICU_LIBRARY; do
  value=$(grep "^$var:" "$root/build/CMakeCache.txt" | cut -d= -f2-)
  case "$value" in
    "$root"/*) echo "$var from the folder: ${value#"$root"}" ;;
    *) echo "$var NOT from the folder: '$value'"; status=1 ;;
  esac
done
# A folder that is not an unpacked package tree is refused with the reason.
if cmake -S "$src" -B "$root/bad" -DCLUSTR_CUDA=OFF -DCLUSTR_DEPS_ROOT="$root/nothing" \
     > "$root/bad.log" 2>&1; then
  echo "a CLUSTR_DEPS_ROOT without usr/ was accepted"; status=1
elif grep -q "has no usr/ folder" "$root/bad.log"; then
  echo "a CLUSTR_DEPS_ROOT without usr/ is refused"
else
  cat "$root/bad.log"; echo "refused without the expected reason"; status=1
fi
[ "$status" -eq 0 ] && echo "deps root: OK"
exit "$status"
