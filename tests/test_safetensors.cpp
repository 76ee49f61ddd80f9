// safetensors I/O: bit-exact round trips, one hand-made corrupt file per validation rule (each
// must be rejected with a message naming the file and the problem), and the atomic write.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "check.h"
#include "core/error.h"
#include "core/safetensors.h"

namespace fs = std::filesystem;
using namespace clustr;
using clustr::test::TempDir;

namespace {


void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(f.good());
}

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

// A file with the given header text (unpadded, as another writer might produce) and data bytes.
std::string make_file(const std::string& header, const std::string& data) {
  return le64(header.size()) + header + data;
}

std::string floats(std::initializer_list<float> v) {
  std::string s(v.size() * 4, '\0');
  std::memcpy(s.data(), v.begin(), s.size());
  return s;
}

// Loading `path` must throw clustr::Error whose message names the file and contains `what`.
void expect_rejected(const std::string& path, const std::string& what) {
  CAPTURE(what);
  bool threw = false;
  try {
    load_safetensors(path);
  } catch (const Error& e) {
    threw = true;
    std::string msg = e.what();
    CAPTURE(msg);
    CHECK(msg.find(path) != std::string::npos);
    CHECK(msg.find(what) != std::string::npos);
  }
  CHECK_MESSAGE(threw, "no clustr::Error for a file that should be rejected");
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && a.nbytes() == b.nbytes() &&
         (a.nbytes() == 0 || std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0);
}

const std::string kOneF32 = R"("x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]})";

}  // namespace

TEST_CASE("safetensors: round trip is bit-exact for every kind of tensor") {
  TempDir dir;
  const float inf = std::numeric_limits<float>::infinity();
  const float qnan = std::numeric_limits<float>::quiet_NaN();
  float payload_nan;
  uint32_t payload_bits = 0x7fc12345u;  // a NaN with a payload, which must survive untouched
  std::memcpy(&payload_nan, &payload_bits, 4);
  Tensor special = Tensor::from_vector(
      {1.5f, -0.0f, 0.0f, inf, -inf, qnan, payload_nan, std::numeric_limits<float>::denorm_min(),
       std::numeric_limits<float>::max(), -3.25e-20f, 1e30f, 7.0f},
      {3, 4});
  Tensor ints = Tensor::from_int_vector(
      {0, -1, std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max(), 42, -7},
      {2, 1, 3});
  Tensor rank0 = Tensor::scalar(-2.5f);
  Tensor empty_rows = Tensor::empty({0, 3});
  Tensor empty_cols = Tensor::from_int_vector({}, {2, 0});
  Tensor one = Tensor::from_vector({9.0f}, {1});
  std::map<std::string, std::string> meta = {
      {"epoch", "3"}, {"empty", ""}, {"unicode", "\xce\xbb = 0.5, \"quoted\"\n"}};

  std::string path = dir.file("model.safetensors");
  save_safetensors(path,
                   {{"special", special},
                    {"layer.0.ints", ints},
                    {"rank0", rank0},
                    {"empty_rows", empty_rows},
                    {"empty_cols", empty_cols},
                    {"one", one}},
                   meta);
  SafetensorsFile f = load_safetensors(path);
  CHECK(f.path == path);
  CHECK(f.tensors.size() == 6);
  CHECK(same_bits(f.get("special"), special));
  CHECK(same_bits(f.get("layer.0.ints"), ints));
  CHECK(same_bits(f.get("rank0"), rank0));
  CHECK(f.get("rank0").rank() == 0);
  CHECK(same_bits(f.get("empty_rows"), empty_rows));
  CHECK(f.get("empty_rows").shape() == Shape{0, 3});
  CHECK(same_bits(f.get("empty_cols"), empty_cols));
  CHECK(f.get("empty_cols").dtype() == DType::i32);
  CHECK(same_bits(f.get("one"), one));
  CHECK(f.metadata == meta);
  CHECK(f.meta("epoch") == "3");
  for (const auto& kv : f.tensors) CHECK(kv.second.device() == Device::cpu);

  // The layout the format prescribes: header length a multiple of 8 (space padding), then the
  // data section holding exactly the tensors' bytes.
  std::string bytes = read_bytes(path);
  REQUIRE(bytes.size() >= 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  CHECK(n % 8 == 0);
  CHECK(bytes[8] == '{');
  uint64_t data = special.nbytes() + ints.nbytes() + rank0.nbytes() + one.nbytes();
  CHECK(bytes.size() == 8 + n + data);
}

TEST_CASE("safetensors: no tensors and no metadata") {
  TempDir dir;
  std::string path = dir.file("empty.safetensors");
  save_safetensors(path, {});
  SafetensorsFile f = load_safetensors(path);
  CHECK(f.tensors.empty());
  CHECK(f.metadata.empty());
}

TEST_CASE("safetensors: files written by other tools (unpadded header, any key order) load") {
  TempDir dir;
  std::string path = dir.file("other.safetensors");
  // Keys in the order a Python writer might use; data order differs from the header order.
  std::string header = R"({"__metadata__": {"format": "pt"},)"
                       R"( "b": {"data_offsets": [8, 12], "shape": [], "dtype": "I32"},)"
                       R"( "a": {"shape": [2], "dtype": "F32", "data_offsets": [0, 8]}})";
  int32_t seven = 7;
  std::string data = floats({1.0f, -2.0f}) + std::string(reinterpret_cast<char*>(&seven), 4);
  write_bytes(path, make_file(header, data));
  SafetensorsFile f = load_safetensors(path);
  CHECK(f.get("a").to_vector() == std::vector<float>{1.0f, -2.0f});
  CHECK(f.get("b").to_int_vector() == std::vector<int32_t>{7});
  CHECK(f.get("b").rank() == 0);
  CHECK(f.meta("format") == "pt");
}

TEST_CASE("safetensors: lookups of absent names say what the file has") {
  TempDir dir;
  std::string path = dir.file("m.safetensors");
  save_safetensors(path, {{"w", Tensor::zeros({2})}}, {{"k", "v"}});
  SafetensorsFile f = load_safetensors(path);
  CHECK_THROWS_WITH_AS(f.get("nope"), doctest::Contains("no tensor named 'nope' (the file has: w)"),
                       Error);
  CHECK_THROWS_WITH_AS(f.meta("nope"),
                       doctest::Contains("no metadata key 'nope' (the file has: k)"), Error);
  CHECK(f.contains("w"));
  CHECK_FALSE(f.contains("nope"));
}

TEST_CASE("safetensors: corrupt files are rejected with a message naming the problem") {
  TempDir dir;
  int count = 0;
  // Writes `bytes` to a fresh file and expects load to fail mentioning `what`.
  auto check = [&](const std::string& bytes, const std::string& what) {
    std::string path = dir.file("bad" + std::to_string(count++) + ".safetensors");
    write_bytes(path, bytes);
    expect_rejected(path, what);
  };
  auto entries = [](const std::string& body) { return "{" + body + "}"; };

  SUBCASE("missing or unreadable file") {
    expect_rejected(dir.file("does_not_exist.safetensors"), "cannot open");
    fs::create_directory(dir.file("a_directory"));
    expect_rejected(dir.file("a_directory"), "not a regular file");
  }
  SUBCASE("shorter than the 8-byte length") {
    check("", "0 bytes, fewer than the 8-byte header length");
    check(std::string("\x10\x00\x00", 3), "3 bytes, fewer than the 8-byte header length");
  }
  SUBCASE("header length past the end of the file, absurd, or zero") {
    check(le64(100) + "{}", "header length 100 runs past the end of the file (10 bytes)");
    check(le64(uint64_t(1) << 62) + "{}", "larger than the 100000000-byte limit");
    check(le64(100'000'001) + "{}", "larger than the 100000000-byte limit");
    check(le64(0), "header length is 0");
  }
  SUBCASE("header that is not JSON, or not an object") {
    check(make_file(R"({"x": {"dtype": "F32",, }})", ""),
          "header is not valid JSON (at header byte 22, file offset 30)");
    check(make_file("{\"x\": \xff}", ""), "header is not valid JSON");
    check(make_file(std::string("{}\0\0", 4), ""), "a NUL byte at header byte 2");
    check(make_file("[1, 2]", ""), "header is not a JSON object but a array");
    check(make_file(R"({"x": [1, 2]})", ""), "header entry 'x' is not a JSON object");
  }
  SUBCASE("entry without dtype, shape or data_offsets") {
    check(make_file(entries(R"("x": {"shape": [2], "data_offsets": [0, 8]})"), floats({1, 2})),
          "tensor 'x' has no \"dtype\" field");
    check(make_file(entries(R"("x": {"dtype": "F32", "data_offsets": [0, 8]})"), floats({1, 2})),
          "tensor 'x' has no \"shape\" field");
    check(make_file(entries(R"("x": {"dtype": "F32", "shape": [2]})"), floats({1, 2})),
          "tensor 'x' has no \"data_offsets\" field");
  }
  SUBCASE("malformed fields") {
    check(make_file(entries(R"("x": {"dtype": 7, "shape": [2], "data_offsets": [0, 8]})"),
                    floats({1, 2})),
          "tensor 'x' has a dtype that is not a string");
    check(make_file(entries(R"("x": {"dtype": "F32", "shape": 2, "data_offsets": [0, 8]})"),
                    floats({1, 2})),
          "tensor 'x' has a shape that is not an array");
    check(make_file(entries(R"("x": {"dtype": "F32", "shape": [2.0], "data_offsets": [0, 8]})"),
                    floats({1, 2})),
          "not a non-negative integer");
    check(make_file(entries(R"("x": {"dtype": "F32", "shape": [2], "data_offsets": [0]})"),
                    floats({1, 2})),
          "tensor 'x' has data_offsets [0]; expected [begin, end]");
    check(make_file(entries(R"("x": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]})"),
                    floats({1, 2})),
          "end before they begin");
    check(make_file(entries(R"("x": {"dtype": "F32", "shape": [2], "data_offsets": [-8, 0]})"),
                    floats({1, 2})),
          "negative value -8 in data_offsets");
  }
  SUBCASE("unsupported or unknown dtype") {
    check(make_file(entries(R"("h": {"dtype": "F16", "shape": [4], "data_offsets": [0, 8]})"),
                    floats({1, 2})),
          "tensor 'h' has dtype F16, which clustr does not support (only F32, BF16 and I32)");
    check(make_file(entries(R"("h": {"dtype": "float32", "shape": [2], "data_offsets": [0, 8]})"),
                    floats({1, 2})),
          "tensor 'h' has an unknown dtype \"float32\"");
  }
  SUBCASE("negative or overflowing dimensions") {
    check(make_file(entries(R"("x": {"dtype": "F32", "shape": [2, -1], "data_offsets": [0, 8]})"),
                    floats({1, 2})),
          "tensor 'x' has a negative dimension -1 in shape [2,-1]");
    check(
        make_file(
            entries(
                R"("x": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 8]})"),
            floats({1, 2})),
        "too large for any file");
  }
  SUBCASE("offsets that do not match shape * dtype size") {
    check(make_file(entries(R"("x": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]})"),
                    floats({1, 2})),
          "tensor 'x' has data_offsets [0, 8] spanning 8 bytes, but F32 shape (3,) needs 12");
    check(make_file(entries(R"("x": {"dtype": "I32", "shape": [], "data_offsets": [0, 8]})"),
                    floats({1, 2})),
          "I32 shape () needs 4");
  }
  SUBCASE("offsets outside the data section") {
    check(make_file(entries(kOneF32), floats({1})),
          "tensor 'x' has data_offsets [0, 8] past the end of the data section (4 bytes)");
  }
  SUBCASE("overlapping tensors") {
    check(make_file(
              entries(kOneF32 + R"(, "y": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]})"),
              floats({1, 2})),
          "tensors 'x' and 'y' overlap in the data section (bytes [4, 8))");
    // An empty tensor placed inside another one's bytes overlaps it as well.
    check(make_file(
              entries(kOneF32 + R"(, "e": {"dtype": "F32", "shape": [0], "data_offsets": [4, 4]})"),
              floats({1, 2})),
          "tensors 'x' and 'e' overlap");
  }
  SUBCASE("gaps and trailing bytes") {
    check(make_file(entries(R"("x": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]})"),
                    floats({1, 2})),
          "bytes [0, 4) of the data section belong to no tensor (the next tensor is 'x')");
    check(make_file(entries(R"("x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},)"
                            R"( "y": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]})"),
                    floats({1, 2, 3})),
          "bytes [4, 8) of the data section belong to no tensor (the next tensor is 'y')");
    check(make_file(entries(kOneF32), floats({1, 2, 3})),
          "the data section has 12 bytes but the tensors cover only 8");
  }
  SUBCASE("duplicate names and keys") {
    check(make_file(entries(kOneF32 + ", " + kOneF32), floats({1, 2})),
          "header has the key 'x' more than once");
    check(make_file(
              entries(
                  R"("x": {"dtype": "F32", "dtype": "I32", "shape": [2], "data_offsets": [0, 8]})"),
              floats({1, 2})),
          "header has the key 'dtype' inside 'x' more than once");
  }
  SUBCASE("malformed metadata") {
    check(make_file(entries(kOneF32 + R"(, "__metadata__": {"epoch": 3})"), floats({1, 2})),
          "metadata value of 'epoch' is not a string: 3");
    check(make_file(entries(kOneF32 + R"(, "__metadata__": ["a"])"), floats({1, 2})),
          "\"__metadata__\" is not a JSON object of strings");
  }
}

TEST_CASE("safetensors: truncated or mutated files load or throw clustr::Error, nothing else") {
  TempDir dir;
  std::string good_path = dir.file("good.safetensors");
  save_safetensors(good_path,
                   {{"a", Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3})},
                    {"b", Tensor::from_int_vector({7, 8}, {2})}},
                   {{"k", "v"}});
  const std::string good = read_bytes(good_path);
  int loaded = 0, rejected = 0, other = 0, count = 0;
  auto attempt = [&](const std::string& bytes) {
    // A fresh name each time: truncating and rewriting one file makes ext4 flush it to disk.
    std::string path = dir.file("mutant" + std::to_string(count++));
    write_bytes(path, bytes);
    struct Remove {
      std::string p;
      ~Remove() { std::remove(p.c_str()); }
    } remove_it{path};
    try {
      load_safetensors(path);
      ++loaded;
    } catch (const Error&) {
      ++rejected;
    } catch (const std::exception& e) {
      ++other;
      FAIL_CHECK((std::string("not a clustr::Error: ") + e.what()));
    }
  };
  for (size_t n = 0; n < good.size(); ++n) attempt(good.substr(0, n));  // every truncation
  CHECK(loaded == 0);
  // Single-byte changes everywhere, from a fixed-seed LCG so any failure reproduces.
  uint64_t state = 12345;
  for (int i = 0; i < 2000; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    std::string bytes = good;
    size_t at = static_cast<size_t>(state >> 33) % bytes.size();
    bytes[at] = static_cast<char>(state >> 13);
    attempt(bytes);
  }
  CHECK(other == 0);
  CHECK(rejected > 0);
}

TEST_CASE("safetensors: save rejects bad names and leaves nothing behind") {
  TempDir dir;
  std::string path = dir.file("out.safetensors");
  Tensor t = Tensor::zeros({2});
  CHECK_THROWS_WITH_AS(save_safetensors(path, {{"a", t}, {"a", t}}),
                       doctest::Contains("cannot save two tensors named 'a'"), Error);
  CHECK_THROWS_WITH_AS(save_safetensors(path, {{"", t}}), doctest::Contains("empty name"), Error);
  CHECK_THROWS_WITH_AS(save_safetensors(path, {{"__metadata__", t}}), doctest::Contains("reserved"),
                       Error);
  CHECK_THROWS_WITH_AS(save_safetensors(path, {{"u", Tensor()}}), doctest::Contains("undefined"),
                       Error);
  CHECK_THROWS_WITH_AS(save_safetensors(path, {{"bad\xff", t}}),
                       doctest::Contains("not valid UTF-8"), Error);
  CHECK(dir.list().empty());
  CHECK_THROWS_WITH_AS(save_safetensors(dir.file("no_such_dir/out.safetensors"), {{"a", t}}),
                       doctest::Contains("cannot create the temporary file"), Error);
}

TEST_CASE("safetensors: the write is atomic (temporary file, then rename)") {
  TempDir dir;
  std::string path = dir.file("ckpt.safetensors");
  save_safetensors(path, {{"w", Tensor::from_vector({1, 2, 3}, {3})}}, {{"step", "1"}});
  CHECK(dir.list() == std::vector<std::string>{"ckpt.safetensors"});  // no temporary left over

  // Saving over an existing file replaces it whole.
  save_safetensors(path, {{"v", Tensor::from_int_vector({5}, {1})}}, {{"step", "2"}});
  CHECK(dir.list() == std::vector<std::string>{"ckpt.safetensors"});
  SafetensorsFile f = load_safetensors(path);
  CHECK(f.tensors.size() == 1);
  CHECK(f.get("v").to_int_vector() == std::vector<int32_t>{5});
  CHECK(f.meta("step") == "2");

  // A failed save (validation) leaves the old file as it was.
  std::string before = read_bytes(path);
  CHECK_THROWS_AS(save_safetensors(path, {{"a", Tensor()}}), Error);
  CHECK(read_bytes(path) == before);

  // A save that fails after writing (the rename onto a non-empty directory is refused) removes
  // its temporary file and reports the failure.
  std::string blocked = dir.file("blocked");
  fs::create_directory(blocked);
  write_bytes(blocked + "/inside", "x");
  CHECK_THROWS_WITH_AS(save_safetensors(blocked, {{"w", Tensor::zeros({4})}}),
                       doctest::Contains("renaming"), Error);
  CHECK(dir.list() == std::vector<std::string>{"blocked", "ckpt.safetensors"});
}
