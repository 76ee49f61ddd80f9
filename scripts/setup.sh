#!/usr/bin/env bash
# Installs what clustr needs to build, from Debian's packages, when it is missing. Idempotent:
# runs apt-get only if a package is not installed yet. Needs root (or sudo) for apt-get.
# The CUDA toolkit is optional and is not installed here; CMake finds it in /usr/local/cuda.
#
#   bash scripts/setup.sh          what the build and the tests need
#   bash scripts/setup.sh speech   that, plus what data/make_speech_corpus.py runs: the speech
#                                  synthesizers (espeak-ng, flite), sox, and the sentence sources
#                                  (WordNet's usage examples, the fortune files), festival's
#                                  diphone voices kal and ked (the unseen-family test set), and
#                                  the CMU pronouncing dictionary (festlex-cmu) for `speech import`
#   bash scripts/setup.sh real-speech
#                                  the packages whose real recorded English speech
#                                  data/make_real_speech.py lists (tuxpaint-stamps-default,
#                                  alsa-utils), and the dictionary to import it with
#   bash scripts/setup.sh text     the text that `text pretrain` reads by default: the fortune
#                                  files (fortunes) and the Python documentation (python3-doc)
#   bash scripts/setup.sh fuzz     clang, whose libFuzzer scripts/fuzz.sh builds the fuzz
#                                  targets with
set -euo pipefail

packages=(g++ cmake make doctest-dev libcli11-dev libstb-dev nlohmann-json3-dev libsndfile1-dev
          libsoxr-dev libsentencepiece-dev libicu-dev libopenblas0 python3 python3-venv
          wordnet-base)
speech_packages=(espeak-ng sox flite wordnet-base fortunes festlex-cmu festival festvox-kallpc16k
                 festvox-kdlpc16k)
real_speech_packages=(tuxpaint-stamps-default alsa-utils festlex-cmu)
text_packages=(fortunes python3-doc)
fuzz_packages=(clang)

for group in "$@"; do
  case "$group" in
    speech) packages+=("${speech_packages[@]}") ;;
    real-speech) packages+=("${real_speech_packages[@]}") ;;
    text) packages+=("${text_packages[@]}") ;;
    fuzz) packages+=("${fuzz_packages[@]}") ;;
    *) echo "setup: unknown group '$group' (known: speech, real-speech, text, fuzz)" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all packages present"
fi
