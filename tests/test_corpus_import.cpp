// The speech corpus importers and the pronunciation lexicons (data/corpus_import.h,
// data/lexicon.h): Festival's and CMUdict's lexicon layouts, the real-speech builder
// (data/make_real_speech.py) on hand-made folders, and LibriSpeech, Kaldi and NeMo layouts to
// manifests.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "check.h"
#include "data/audio.h"
#include "data/corpus_import.h"
#include "data/lexicon.h"
#include "data/manifest.h"

using namespace clustr;
using clustr::test::TempDir;
using clustr::test::tones;
using clustr::test::write_text;

// ---- pronunciation lexicons and corpus importers (data/lexicon.h, data/corpus_import.h) ------

TEST_CASE("lexicon: Festival's CMU lexicon and CMUdict's text layout give the same phones") {
  TempDir dir;
  write_text(dir.file("festival.out"),
             "MNCL\n"
             "(\"a\" dt (((ax) 0)))\n"
             "(\"a\" n (((ey) 1)))\n"
             "(\"hello\" nil (((hh ax) 0) ((l ow) 1)))\n"
             "(\"record\" n (((r eh) 1) ((k er d) 0)))\n"
             "(\"record\" v (((r ax) 0) ((k ao r d) 1)))\n"
             "(\"don't\" nil (((d ow n t) 1)))\n");
  write_text(dir.file("cmudict.txt"),
             ";;; a comment\n"
             "A  AH0\n"
             "A(2)  EY1\n"
             "HELLO  HH AH0 L OW1\n"
             "RECORD  R EH1 K ER0 D\n"
             "RECORD(2)  R IH0 K AO1 R D\n"
             "DON'T  D OW1 N T\n");
  for (const char* file : {"festival.out", "cmudict.txt"}) {
    CAPTURE(file);
    const Lexicon lex = Lexicon::read(dir.file(file));
    CHECK(lex.size() == 4);
    REQUIRE(lex.find("hello"));
    CHECK(*lex.find("hello") == std::vector<std::string>{"HH", "AH", "L", "OW"});
    CHECK(*lex.find("a") == std::vector<std::string>{"AH"});  // the first entry stays
    CHECK(*lex.find("record") == std::vector<std::string>{"R", "EH", "K", "ER", "D"});
    CHECK(*lex.find("don't") == std::vector<std::string>{"D", "OW", "N", "T"});
    CHECK(lex.find("zebra") == nullptr);
  }
  write_text(dir.file("bad.txt"), "HELLO  HH AH0 L OW1\nWORLD  W ER1 QQ D\n");
  CHECK_ERROR(Lexicon::read(dir.file("bad.txt")), "bad.txt:2", "phone 'QQ' is not one of the 39");
  write_text(dir.file("bad.out"), "MNCL\n(\"x\" nil)\n");
  CHECK_ERROR(Lexicon::read(dir.file("bad.out")), "bad.out:2", "no syllables");
  CHECK_ERROR(Lexicon::read(dir.file("none.txt")), "none.txt", "does not exist");
  CHECK(transcript_words("HELLO, World -- it's 'quoted' well-known!") ==
        std::vector<std::string>{"hello", "world", "it's", "quoted", "well", "known"});
  CHECK(char_labels("It's OK") ==
        std::vector<std::string>{"i", "t", "'", "s", "|", "o", "k"});
}

// data/make_real_speech.py on hand-made folders laid out as tuxpaint-stamps-default and
// alsa-utils lay out theirs, then through the NeMo importer: the English descriptions and the
// channel names, the translations, Noise.wav and a recording without its text left out.
TEST_CASE("import: the real-speech builder lists Tux Paint's and ALSA's recordings" *
          doctest::skip(!audio_compiled())) {
  if (std::system("test -x /usr/bin/python3") != 0) return;  // the builder needs it
  TempDir dir;
  const std::string tux = dir.file("stamps"), alsa = dir.file("alsa");
  std::filesystem::create_directories(tux + "/animals/mammals");
  std::filesystem::create_directories(alsa);
  // libsndfile reads by content, not by name: WAV bytes stand in for the Ogg files.
  const std::vector<float> sound = tones(44100, 30000);
  for (const char* name : {"dog_desc.ogg", "dog_desc_fr.ogg", "cat_desc.ogg"})
    write_audio(tux + "/animals/mammals/" + name, sound, 1, 44100, "wav16");
  write_text(tux + "/animals/mammals/dog.txt", "A dog.\nfr.utf8=Un chien.\n");
  write_audio(alsa + "/Front_Left.wav", sound, 1, 44100, "wav16");
  write_audio(alsa + "/Noise.wav", sound, 1, 44100, "wav16");
  const std::string root = std::string(CLUSTR_FIXTURE_DIR) + "/../..";
  const std::string cmd = "/usr/bin/python3 " + root + "/data/make_real_speech.py --out " +
                          dir.file("real") + " --tuxpaint " + tux + " --alsa " + alsa +
                          " 2>/dev/null";
  REQUIRE(std::system(cmd.c_str()) == 0);
  std::vector<CorpusUtterance> u = import_nemo(dir.file("real/real.json"));
  REQUIRE(u.size() == 2);
  CHECK(u[0].id == "tuxpaint-animals-mammals-dog");
  CHECK(u[0].transcript == "A dog.");
  CHECK(u[1].id == "alsa-Front_Left");
  CHECK(u[1].transcript == "Front Left");
  std::ifstream sources(dir.file("real/sources.txt"));
  const std::string report((std::istreambuf_iterator<char>(sources)),
                           std::istreambuf_iterator<char>());
  CHECK(test::contains_all(report, {"1 recordings with text", "1 left out",
                                    "cat_desc.ogg: no text"}));
  write_text(dir.file("lex.txt"), "A  AH0\nDOG  D AO1 G\nFRONT  F R AH1 N T\nLEFT  L EH1 F T\n");
  const Lexicon lex = Lexicon::read(dir.file("lex.txt"));
  probe_durations(u);
  CHECK(u[0].seconds == doctest::Approx(30000.0 / 44100));
  CHECK(write_manifest(u, LabelUnits::phones, &lex, dir.file("real/real.tsv")).written == 2);
  const TokenTable t = read_tokens(dir.file("real/tokens.txt"));
  const Manifest m = read_manifest(dir.file("real/real.tsv"), t);
  REQUIRE(m.utterances.size() == 2);
  std::string phones;
  for (int32_t k : m.utterances[1].labels) phones += t.tokens[size_t(k)] + " ";
  CHECK(phones == "F R AH N T L EH F T ");
  // Nothing found: an error naming what is missing, and no manifest.
  const std::string none = "/usr/bin/python3 " + root + "/data/make_real_speech.py --out " +
                           dir.file("none") + " --tuxpaint " + dir.file("x") + " --alsa " +
                           dir.file("y") + " 2>/dev/null";
  CHECK(std::system(none.c_str()) != 0);
  CHECK_FALSE(std::filesystem::exists(dir.file("none/real.json")));
}

TEST_CASE("import: LibriSpeech, Kaldi and NeMo layouts round-trip to manifests" *
          doctest::skip(!audio_compiled())) {
  TempDir dir;
  write_text(dir.file("lex.txt"), "HELLO  HH AH0 L OW1\nWORLD  W ER1 L D\nA  AH0\n");
  const Lexicon lex = Lexicon::read(dir.file("lex.txt"));
  // Audio: 0.25 s and 0.5 s of tones, FLAC at 16 kHz and WAV at 22.05 kHz.
  auto audio = [&](const std::string& path, int rate, double seconds, const char* format) {
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    write_audio(path, tones(rate, int64_t(rate * seconds)), 1, rate, format);
  };
  // LibriSpeech: speaker 19, chapter 198.
  const std::string ls = dir.file("ls");
  audio(ls + "/19/198/19-198-0000.flac", 16000, 0.25, "flac16");
  audio(ls + "/19/198/19-198-0001.flac", 16000, 0.5, "flac16");
  audio(ls + "/19/198/19-198-0002.flac", 16000, 0.5, "flac16");
  write_text(ls + "/19/198/19-198.trans.txt",
             "19-198-0000 HELLO WORLD\n19-198-0001 A WORLD\n19-198-0002 HELLO ZEBRA\n");
  std::vector<CorpusUtterance> u = import_librispeech(ls);
  REQUIRE(u.size() == 3);
  probe_durations(u);
  CHECK(u[0].seconds == doctest::Approx(0.25));
  const ImportReport r = write_manifest(u, LabelUnits::phones, &lex, dir.file("out/ls.tsv"));
  CHECK(r.written == 2);
  REQUIRE(r.problems.size() == 1);  // ZEBRA: named with the file and line
  CHECK(test::contains_all(r.problems[0], {"19-198.trans.txt:3", "19-198-0002",
                                           "word 'zebra' is not in the lexicon"}));
  const TokenTable t = read_tokens(dir.file("out/tokens.txt"));
  CHECK(t.size() == 40);
  const Manifest m = read_manifest(dir.file("out/ls.tsv"), t);
  REQUIRE(m.utterances.size() == 2);
  CHECK(m.utterances[0].id == "19-198-0000");
  std::vector<std::string> phones;
  for (int32_t k : m.utterances[0].labels) phones.push_back(t.tokens[size_t(k)]);
  CHECK(phones == std::vector<std::string>{"HH", "AH", "L", "OW", "W", "ER", "L", "D"});
  CHECK(read_audio(m.utterances[1].wav_path, 16000).size() == 8000);

  // Kaldi: wav.scp with a relative path and an absolute one, text, characters as labels.
  const std::string kd = dir.file("kaldi");
  audio(kd + "/audio/u1.wav", 22050, 0.5, "wav16");
  audio(kd + "/audio/u2.wav", 22050, 0.25, "wav16");
  write_text(kd + "/wav.scp", "u1 audio/u1.wav\nu2 " + kd + "/audio/u2.wav\n");
  write_text(kd + "/text", "u1 hello world\nu2 it's ok\n");
  u = import_kaldi(kd);
  probe_durations(u);
  REQUIRE(u.size() == 2);
  CHECK(u[0].seconds == doctest::Approx(0.5));
  CHECK(write_manifest(u, LabelUnits::chars, nullptr, dir.file("kout/train.tsv")).written == 2);
  const TokenTable ct = read_tokens(dir.file("kout/tokens.txt"));
  const Manifest km = read_manifest(dir.file("kout/train.tsv"), ct);
  std::string spelled;
  for (int32_t k : km.utterances[1].labels) spelled += ct.tokens[size_t(k)];
  CHECK(spelled == "it's|ok");
  write_text(kd + "/wav.scp", "u1 sox audio/u1.flac -t wav - |\n");
  CHECK_ERROR(import_kaldi(kd), "wav.scp:1", "is a command", "ends in '|'");
  write_text(kd + "/wav.scp", "u1 audio/u1.wav\n");
  CHECK_ERROR(import_kaldi(kd), "text:2", "utterance 'u2' has no line in", "wav.scp");

  // NeMo: JSON lines; the duration given is taken, a missing one is read from the file.
  const std::string nm = dir.file("nemo.jsonl");
  write_text(nm, "{\"audio_filepath\": \"kaldi/audio/u1.wav\", \"duration\": 0.5, \"text\": "
                 "\"hello world\"}\n\n{\"audio_filepath\": \"" + kd + "/audio/u2.wav\", \"text\": "
                 "\"a world\"}\n");
  u = import_nemo(nm);
  REQUIRE(u.size() == 2);
  CHECK(u[0].id == "u1");
  CHECK(u[1].seconds < 0);
  probe_durations(u);
  CHECK(u[1].seconds == doctest::Approx(0.25).epsilon(1e-3));  // 5,512 samples at 22.05 kHz
  CHECK(write_manifest(u, LabelUnits::phones, &lex, dir.file("nout/n.tsv")).written == 2);
  write_text(nm, "{\"audio_filepath\": \"x.wav\", \"text\": \"a\"}\n{not json}\n");
  CHECK_ERROR(import_nemo(nm), "nemo.jsonl:2", "not a JSON object");
  write_text(nm, "{\"audio_filepath\": \"x.wav\"}\n");
  CHECK_ERROR(import_nemo(nm), "nemo.jsonl:1", "expected {\"audio_filepath\"");
  CHECK_ERROR(write_manifest(u, LabelUnits::phones, nullptr, dir.file("x.tsv")),
              "phone labels need a pronunciation dictionary");
}
