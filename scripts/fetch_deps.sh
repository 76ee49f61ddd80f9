#!/usr/bin/env bash
# Fetches the packages that clustr's build needs beside a compiler, CMake and (for the GPU) the
# CUDA toolkit, as Debian .deb files, and unpacks them into one folder, for a machine that has
# no package registry (such as the GPU machine of scripts/gpu_check.sh):
#
#   bash scripts/fetch_deps.sh deps        # here, where apt-get can download
#   (copy deps/ to the other machine, beside the repository)
#   cmake -S . -B build -DCLUSTR_DEPS_ROOT=$PWD/deps/root ...
#
# deps/debs holds the .deb files (apt-get download: the versions this machine's Debian has);
# deps/root the packages unpacked with dpkg -x (nothing is installed, no root needed to unpack).
# The packages are headers and CMake files, and shared libraries (libstb, libsndfile, libsoxr and
# what libsndfile loads), which the build links with their full paths (the programs find them
# through their RPATH; libsndfile's own libraries through LD_LIBRARY_PATH). Safe to run again.
set -euo pipefail

if [ $# -ne 1 ]; then
  echo "usage: bash scripts/fetch_deps.sh DIR" >&2
  exit 2
fi
dir=$1
# libsndfile and libsoxr (audio files, for the speech app) with the libraries libsndfile needs,
# SentencePiece (word-piece labels) and ICU (Unicode for the WordPiece tokenizer);
# gpu_check.sh puts deps/root's library folder on LD_LIBRARY_PATH for those.
packages=(doctest-dev libcli11-dev nlohmann-json3-dev libstb-dev libstb0
          libsndfile1-dev libsndfile1 libsoxr-dev libsoxr0 libsentencepiece-dev libsentencepiece0
          libicu-dev libicu72 libflac12 libmp3lame0 libmpg123-0 libogg0 libopus0 libvorbis0a libvorbisenc2)

mkdir -p "$dir/debs" "$dir/root"
dir=$(cd "$dir" && pwd)
for p in "${packages[@]}"; do
  if ! ls "$dir/debs/${p}_"*.deb > /dev/null 2>&1; then
    (cd "$dir/debs" && apt-get download -q "$p") || {
      echo "fetch_deps: apt-get download $p failed (is a package registry reachable?)" >&2
      exit 1
    }
  fi
done
for deb in "$dir"/debs/*.deb; do
  dpkg -x "$deb" "$dir/root"
done
echo "fetch_deps: ${#packages[@]} packages unpacked into $dir/root; configure with"
echo "  -DCLUSTR_DEPS_ROOT=$dir/root"
