// The corpus importers (data/corpus_import.h) on folders built from arbitrary bytes. The first
// byte picks the layout; the rest, cut at NUL bytes, gives the files:
//   0: LibriSpeech: <speaker>/<chapter>/<speaker>-<chapter>.trans.txt (part 1), with the audio
//      files its first lines name made empty beside it (so that lines get past the audio check);
//   1: Kaldi: wav.scp, text, utt2spk (parts 1-3);
//   2: NeMo: the JSON lines manifest (part 1).
// What imports is then written as a manifest in characters (tokens.txt beside it).
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "data/corpus_import.h"
#include "fuzz_input.h"

namespace {

std::vector<std::string> parts(const std::string& s) {
  std::vector<std::string> out(1);
  for (char c : s) {
    if (c == '\0')
      out.emplace_back();
    else
      out.back() += c;
  }
  return out;
}

std::string part(const std::vector<std::string>& p, size_t i) { return i < p.size() ? p[i] : ""; }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int layout = data[0] % 3;
  const std::vector<std::string> p =
      parts(std::string(reinterpret_cast<const char*>(data) + 1, size - 1));
  const std::string dir = clustr::fuzz::fresh_dir("corpus");
  std::vector<clustr::CorpusUtterance> utterances;
  clustr::fuzz::expect_clear_errors([&] {
    if (layout == 0) {
      const std::string chapter = dir + "/19/198";
      clustr::fuzz::write_file("corpus/19/198/19-198.trans.txt", part(p, 0));
      std::istringstream lines(part(p, 0));
      std::string line;
      for (int i = 0; i < 4 && std::getline(lines, line); ++i) {
        const std::string id = line.substr(0, line.find(' '));
        if (!id.empty() && id.find('/') == std::string::npos && id.size() < 64 && id != "." &&
            id != "..")
          clustr::fuzz::write_file("corpus/19/198/" + id + ".wav", "");
      }
      utterances = clustr::import_librispeech(dir);
    } else if (layout == 1) {
      clustr::fuzz::write_file("corpus/wav.scp", part(p, 0));
      clustr::fuzz::write_file("corpus/text", part(p, 1));
      if (p.size() > 2) clustr::fuzz::write_file("corpus/utt2spk", part(p, 2));
      utterances = clustr::import_kaldi(dir);
    } else {
      utterances =
          clustr::import_nemo(clustr::fuzz::write_file("corpus/manifest.json", part(p, 0)));
    }
    for (clustr::CorpusUtterance& u : utterances)
      if (u.seconds < 0) u.seconds = 1.0;  // the empty audio files have no duration to probe
    clustr::write_manifest(utterances, clustr::LabelUnits::chars, nullptr, dir + "/out/train.tsv");
  });
  return 0;
}

// The seed inputs (--make-seeds=DIR); the ordinary suite runs them through the target too.
void clustr_fuzz_seeds(const std::string& dir) {
  const std::string nul(1, '\0');
  clustr::fuzz::write_seed(dir, "librispeech", std::string(1, '\0') +
                           "19-198-0000 HELLO WORLD\n19-198-0001 A DOG'S LIFE\n");
  clustr::fuzz::write_seed(dir, "kaldi", std::string(1, '\1') + "u1 /tmp/u1.wav\nu2 cat x |\n" +
                           nul + "u1 hello world\nu2 bye\n" + nul + "u1 spk1\nu2 spk2\n");
  clustr::fuzz::write_seed(dir, "nemo", std::string(1, '\2') +
                           "{\"audio_filepath\": \"/tmp/a.wav\", \"duration\": 1.5, \"text\": "
                           "\"hello\"}\n{\"audio_filepath\": \"b.wav\", \"duration\": -1}\n");
}

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  clustr::fuzz::make_seeds_if_asked(*argc, *argv, clustr_fuzz_seeds);
  return 0;
}
