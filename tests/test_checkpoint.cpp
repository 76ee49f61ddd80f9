// Checkpoints: bit-exact round trips of parameters, extras, step, config and generator state;
// one error naming every mismatch, with the model left untouched; damaged and foreign files
// rejected; and the bytes on disk read back by a reader that shares no code with ours.
//
// The models here are small Module subclasses defined in this file, so these tests depend on
// Module alone, not on the layers.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "check.h"
#include "core/error.h"
#include "core/random.h"
#include "core/safetensors.h"
#include "layers/checkpoint.h"
#include "layers/module.h"

namespace fs = std::filesystem;
using namespace clustr;
using clustr::test::TempDir;

namespace {


std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(f.good());
}

// The raw bytes of a tensor's elements: equal bytes means bit-exact (NaN payloads, -0.0).
std::string bytes_of(const Tensor& t) {
  if (t.dtype() == DType::i32) {
    std::vector<int32_t> v = t.to_int_vector();
    return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int32_t));
  }
  std::vector<float> v = t.to_vector();
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// A layer with a weight (out, in) and a bias (out), drawn from `gen`.
class Affine : public Module {
 public:
  Affine(int64_t in, int64_t out, Generator& gen) {
    Tensor w = Tensor::empty({out, in});
    normal_(w, gen);
    weight = register_parameter("weight", w);
    Tensor b = Tensor::empty({out});
    uniform_(b, gen, -1.0f, 1.0f);
    bias = register_parameter("bias", b);
  }
  Variable weight, bias;
};

// Parameters: "scale" (1), "proj.weight" (hidden, in), "proj.bias" (hidden),
// "head.weight" (1, hidden), "head.bias" (1).
class Net : public Module {
 public:
  explicit Net(Generator& gen, int64_t in = 3, int64_t hidden = 4) {
    Tensor s = Tensor::empty({1});
    uniform_(s, gen);
    scale = register_parameter("scale", s);
    proj = register_module("proj", std::make_shared<Affine>(in, hidden, gen));
    head = register_module("head", std::make_shared<Affine>(hidden, 1, gen));
  }
  Variable scale;
  std::shared_ptr<Affine> proj, head;
};

// Every parameter's bytes by name: compared before and after a load.
std::map<std::string, std::string> snapshot(const Module& m) {
  std::map<std::string, std::string> out;
  for (const auto& [name, p] : m.named_parameters()) out[name] = bytes_of(p.data());
  return out;
}

// The metadata that makes a hand-made safetensors file a clustr checkpoint.
std::map<std::string, std::string> checkpoint_metadata() {
  return {{"format", "clustr-checkpoint"}, {"format_version", "1"}, {"step", "0"}};
}

// The model's parameters as (name, tensor) pairs, for hand-made files.
std::vector<std::pair<std::string, Tensor>> tensors_of(const Module& m) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& [name, p] : m.named_parameters()) out.emplace_back(name, p.data());
  return out;
}

}  // namespace

TEST_CASE("checkpoint: parameters, step, config and extras round trip bit-exactly") {
  TempDir dir;
  Generator gen(1);
  Net saved(gen);
  // Values a lossy writer would change: -0.0, a NaN with a payload, a denormal, infinities.
  const uint32_t nan_bits = 0x7fc01234u;
  float nan_payload;
  std::memcpy(&nan_payload, &nan_bits, 4);
  Tensor w = saved.proj->weight.data();
  w.copy_from(Tensor::from_vector(
      {-0.0f, nan_payload, 1e-45f, std::numeric_limits<float>::infinity(),
       -std::numeric_limits<float>::infinity(), 1.0f / 3, -2.5f, 7e30f, 1.0f, 2.0f, 3.0f, 4.0f},
      {4, 3}));

  CheckpointState state;
  state.step = 1234567890123;
  state.config = {{"attention", "improved-clustered"},
                  {"lr", "0.0001"},
                  {"empty", ""},
                  {"text", "quotes \" and \\ and\nnewline, ünïcode"}};
  state.extras = {{"optimizer.proj.weight.m", test::random_tensor({4, 3}, 5)},
                  {"optimizer.step_count", Tensor::from_int_vector({7, -8}, {2})},
                  {"optimizer.empty", Tensor::zeros({0, 3})}};
  const std::string path = dir.file("model.safetensors");
  save_checkpoint(path, saved, state);
  CHECK(dir.list() == std::vector<std::string>{"model.safetensors"});  // no temporary left over

  Generator other(99);
  Net loaded(other);
  REQUIRE(snapshot(loaded) != snapshot(saved));
  const Tensor storage_before = loaded.proj->weight.data();
  LoadedCheckpoint ck = load_checkpoint(path, loaded);
  CHECK(snapshot(loaded) == snapshot(saved));
  CHECK(ck.path == path);
  CHECK(ck.step == state.step);
  CHECK(ck.config == state.config);
  CHECK(read_checkpoint_config(path) == state.config);  // the same, without a model
  CHECK(config_number(ck.config, "lr", path) == 0.0001);
  CHECK_ERROR(config_number(ck.config, "text", path), path.c_str(), ": config entry 'text' is ",
              "not a number");
  CHECK_ERROR(config_number(ck.config, "empty", path),
              "config entry 'empty' is \"\", not a number");
  CHECK_ERROR(config_number(ck.config, "steps", path), path.c_str(), " lacks config entry 'steps'");
  CHECK(ck.metadata.at("format") == "clustr-checkpoint");
  CHECK(ck.metadata.at("format_version") == "1");
  CHECK(ck.metadata.at("step") == "1234567890123");
  CHECK(ck.metadata.at("config.lr") == "0.0001");
  CHECK_FALSE(ck.rng.has_value());
  CHECK(ck.missing.empty());
  CHECK(ck.unexpected.empty());
  REQUIRE(ck.extras.size() == state.extras.size());
  for (const auto& [name, t] : state.extras) {
    CAPTURE(name);
    REQUIRE(ck.extras.count(name) == 1);
    const Tensor& got = ck.extras.at(name);
    CHECK(got.shape() == t.shape());
    CHECK(got.dtype() == t.dtype());
    CHECK(got.device() == Device::cpu);
    CHECK(bytes_of(got) == bytes_of(t));
  }
  // Loading copies into the parameters' own storage (which an optimizer may already hold).
  CHECK(loaded.proj->weight.data().shares_storage(storage_before));
  CHECK_FALSE(loaded.proj->weight.data().shares_storage(saved.proj->weight.data()));

  // Saving again over the file replaces it whole.
  state.step = 5;
  state.extras.clear();
  save_checkpoint(path, saved, state);
  CHECK(dir.list() == std::vector<std::string>{"model.safetensors"});
  ck = load_checkpoint(path, loaded);
  CHECK(ck.step == 5);
  CHECK(ck.extras.empty());
}

TEST_CASE("checkpoint: the generator state is restored and draws the same numbers") {
  TempDir dir;
  Generator gen(0xFFFFFFFFFFFFFFFFull);  // the whole uint64 range survives the decimal strings
  Net model(gen);
  Tensor drawn = Tensor::empty({37});
  normal_(drawn, gen);  // the run has used some of the stream
  CheckpointState state;
  state.rng = GeneratorState::of(gen);
  const std::string path = dir.file("rng.safetensors");
  save_checkpoint(path, model, state);

  // What the uninterrupted run draws next.
  Tensor expected = Tensor::empty({50});
  uniform_(expected, gen);
  const uint32_t expected_word = gen.next_u32();

  Generator resumed(3);
  Net model2(resumed);
  LoadedCheckpoint ck = load_checkpoint(path, model2);
  REQUIRE(ck.rng.has_value());
  CHECK(ck.rng->seed == 0xFFFFFFFFFFFFFFFFull);
  CHECK(ck.rng->offset == state.rng->offset);
  CHECK(ck.metadata.at("rng.seed") == "18446744073709551615");
  ck.restore_generator(resumed);
  CHECK(resumed.seed() == state.rng->seed);
  CHECK(resumed.offset() == state.rng->offset);
  Tensor got = Tensor::empty({50});
  uniform_(got, resumed);
  CHECK(bytes_of(got) == bytes_of(expected));
  CHECK(resumed.next_u32() == expected_word);

  // A checkpoint saved without a generator state says so when asked for one.
  save_checkpoint(path, model, CheckpointState{});
  ck = load_checkpoint(path, model2);
  CHECK_FALSE(ck.rng.has_value());
  CHECK_ERROR(ck.restore_generator(resumed), "checkpoint: ", path.c_str(), "no generator state");
}

TEST_CASE("checkpoint: a mismatched file throws one error naming every problem") {
  TempDir dir;
  Generator gen(2);
  Net model(gen);
  const auto before = snapshot(model);
  const std::string path = dir.file("bad.safetensors");

  // proj.weight transposed, head.bias stored as i32, scale absent, one stray tensor, and an
  // extra (allowed) beside them.
  save_safetensors(path,
                   {{"proj.weight", Tensor::zeros({3, 4})},
                    {"proj.bias", Tensor::zeros({4})},
                    {"head.weight", Tensor::zeros({1, 4})},
                    {"head.bias", Tensor::from_int_vector({1}, {1})},
                    {"bogus.weight", Tensor::zeros({2, 2})},
                    {"optimizer.proj.bias.m", Tensor::zeros({4})}},
                   checkpoint_metadata());
  const std::string msg = test::error_of([&] { load_checkpoint(path, model); });
  INFO("error message: " << msg);
  CHECK(test::contains_all(
      msg, {"checkpoint: ", path.c_str(), "cannot be loaded into this model (4 problems):",
            "missing tensor 'scale' (the model has f32 (1,))",
            "tensor 'proj.weight' has the wrong shape: expected (4, 3), found (3, 4)",
            "tensor 'head.bias' has the wrong dtype: expected f32, found i32",
            "unexpected tensor 'bogus.weight' (f32 (2, 2);"}));
  CHECK(msg.find("proj.bias'") == std::string::npos);  // the matching ones are not listed
  CHECK(msg.find("optimizer.proj.bias.m") == std::string::npos);  // extras are not unexpected
  // Nothing was copied, not even the parameters that matched.
  CHECK(snapshot(model) == before);

  // Wrong shape and dtype at once: both reported.
  save_safetensors(path,
                   {{"scale", Tensor::from_int_vector({1, 2}, {2})},
                    {"proj.weight", Tensor::zeros({4, 3})},
                    {"proj.bias", Tensor::zeros({4})},
                    {"head.weight", Tensor::zeros({1, 4})},
                    {"head.bias", Tensor::zeros({1})}},
                   checkpoint_metadata());
  CHECK_ERROR(load_checkpoint(path, model), "(2 problems)",
              "tensor 'scale' has the wrong shape: expected (1,), found (2,)",
              "tensor 'scale' has the wrong dtype: expected f32, found i32");
  CHECK(snapshot(model) == before);

  // A checkpoint of a bigger model of the same design: shape errors only.
  Net bigger(gen, 5, 6);
  save_checkpoint(path, bigger, {});
  CHECK_ERROR(load_checkpoint(path, model), "(3 problems)",
              "'proj.weight' has the wrong shape: expected (4, 3), found (6, 5)",
              "'proj.bias' has the wrong shape: expected (4,), found (6,)",
              "'head.weight' has the wrong shape: expected (1, 4), found (1, 6)");
  CHECK(snapshot(model) == before);
}

TEST_CASE("checkpoint: not strict, missing and unexpected tensors are listed, not errors") {
  TempDir dir;
  Generator gen(3);
  Net model(gen);
  const auto before = snapshot(model);
  const std::string path = dir.file("partial.safetensors");
  const Tensor new_bias = Tensor::from_vector({1, 2, 3, 4}, {4});
  save_safetensors(path, {{"proj.bias", new_bias}, {"other.weight", Tensor::zeros({2})}},
                   checkpoint_metadata());
  CHECK_ERROR(load_checkpoint(path, model), "missing tensor 'scale'",
              "unexpected tensor 'other.weight'");
  CHECK(snapshot(model) == before);

  CheckpointLoadOptions loose;
  loose.strict = false;
  LoadedCheckpoint ck = load_checkpoint(path, model, loose);
  CHECK(ck.missing == std::vector<std::string>{"scale", "proj.weight", "head.weight", "head.bias"});
  CHECK(ck.unexpected == std::vector<std::string>{"other.weight"});
  auto after = snapshot(model);
  CHECK(after.at("proj.bias") == bytes_of(new_bias));
  after.erase("proj.bias");
  auto expected = before;
  expected.erase("proj.bias");
  CHECK(after == expected);

  // A shape mismatch is an error even when not strict.
  save_safetensors(path, {{"proj.bias", Tensor::zeros({5})}}, checkpoint_metadata());
  CHECK_ERROR(load_checkpoint(path, model, loose),
              "(1 problem):", "'proj.bias' has the wrong shape: expected (4,), found (5,)");
}

TEST_CASE("checkpoint: damaged files are rejected with load_safetensors' message") {
  TempDir dir;
  Generator gen(4);
  Net model(gen);
  const std::string good_path = dir.file("good.safetensors");
  CheckpointState state;
  state.step = 3;
  state.rng = GeneratorState::of(gen);
  save_checkpoint(good_path, model, state);
  const std::string good = read_bytes(good_path);
  const auto before = snapshot(model);

  SUBCASE("truncated") {
    const std::string path = dir.file("truncated.safetensors");
    write_bytes(path, good.substr(0, good.size() - 5));
    CHECK_ERROR(load_checkpoint(path, model), "safetensors: ", path.c_str(),
                "past the end of the data section");
    write_bytes(path, good.substr(0, 5));
    CHECK_ERROR(load_checkpoint(path, model), "safetensors: ", path.c_str(),
                "fewer than the 8-byte header length");
  }
  SUBCASE("corrupted header") {
    const std::string path = dir.file("corrupt.safetensors");
    std::string bytes = good;
    bytes[8] = '[';  // the header's opening brace
    write_bytes(path, bytes);
    CHECK_ERROR(load_checkpoint(path, model), "safetensors: ", path.c_str(),
                "header is not valid JSON");
  }
  SUBCASE("absent") {
    CHECK_ERROR(load_checkpoint(dir.file("nope.safetensors"), model), "cannot open");
  }
  CHECK(snapshot(model) == before);
}

TEST_CASE("checkpoint: foreign files and malformed metadata are rejected") {
  TempDir dir;
  Generator gen(5);
  Net model(gen);
  const auto before = snapshot(model);
  const std::string path = dir.file("x.safetensors");
  auto meta = checkpoint_metadata();

  SUBCASE("plain safetensors, no format") {
    save_safetensors(path, tensors_of(model));
    CHECK_ERROR(load_checkpoint(path, model), "checkpoint: ", path.c_str(),
                "not a clustr checkpoint (metadata \"format\" is absent, expected "
                "\"clustr-checkpoint\")");
    CHECK_ERROR(read_checkpoint_config(path), "not a clustr checkpoint");
  }
  SUBCASE("another format") {
    meta["format"] = "pt";
    save_safetensors(path, tensors_of(model), meta);
    CHECK_ERROR(load_checkpoint(path, model),
                "not a clustr checkpoint (metadata \"format\" is \"pt\"");
  }
  SUBCASE("a newer version") {
    meta["format_version"] = "2";
    save_safetensors(path, tensors_of(model), meta);
    CHECK_ERROR(load_checkpoint(path, model),
                "unsupported checkpoint format_version \"2\"; this build reads version 1");
  }
  SUBCASE("no version") {
    meta.erase("format_version");
    save_safetensors(path, tensors_of(model), meta);
    CHECK_ERROR(load_checkpoint(path, model), "unsupported checkpoint format_version (absent)");
  }
  SUBCASE("malformed step and rng, reported together with tensor problems") {
    meta["step"] = "-3";
    meta["rng.seed"] = "12x";
    auto tensors = tensors_of(model);
    tensors.erase(tensors.begin());  // scale
    save_safetensors(path, tensors, meta);
    CHECK_ERROR(load_checkpoint(path, model), "(4 problems)",
                "metadata 'step' is \"-3\", not a non-negative integer",
                "metadata 'rng.seed' is \"12x\", not an unsigned 64-bit integer",
                "metadata 'rng.seed' is present without 'rng.offset'", "missing tensor 'scale'");
  }
  SUBCASE("rng offset out of range, step absent") {
    meta.erase("step");
    meta["rng.seed"] = "1";
    meta["rng.offset"] = "18446744073709551616";  // 2^64
    save_safetensors(path, tensors_of(model), meta);
    CHECK_ERROR(load_checkpoint(path, model), "(2 problems)", "metadata 'step' is absent",
                "metadata 'rng.offset' is \"18446744073709551616\", not an unsigned 64-bit");
  }
  CHECK(snapshot(model) == before);
}

TEST_CASE("checkpoint: save rejects bad extras and settings, leaving the old file") {
  TempDir dir;
  Generator gen(6);
  Net model(gen);
  const std::string path = dir.file("ckpt.safetensors");
  save_checkpoint(path, model, {});
  const std::string before = read_bytes(path);

  CheckpointState state;
  state.extras = {{"adam.m", Tensor::zeros({2})},
                  {"optimizer.ok", Tensor::zeros({2})},
                  {"proj.weight", Tensor::zeros({4, 3})}};
  CHECK_ERROR(save_checkpoint(path, model, state), "checkpoint: ", path.c_str(),
              "cannot save these extra tensors (2 problems):",
              "extra tensor 'adam.m' does not start with \"optimizer.\"",
              "extra tensor 'proj.weight' does not start with \"optimizer.\"");

  state = {};
  state.step = -1;
  CHECK_ERROR(save_checkpoint(path, model, state), "cannot save a negative step (-1)");
  state = {};
  state.config = {{"", "x"}};
  CHECK_ERROR(save_checkpoint(path, model, state), "empty key");
  state = {};
  state.extras = {{"optimizer.u", Tensor()}};
  CHECK_ERROR(save_checkpoint(path, model, state), "undefined");  // from save_safetensors

  CHECK(read_bytes(path) == before);
  CHECK(dir.list() == std::vector<std::string>{"ckpt.safetensors"});
}

// Reads the file with nothing but byte arithmetic and string search: the 8-byte little-endian
// header length, the JSON text, and each tensor's bytes at its data_offsets. Any writer whose
// output this accepts is readable by other safetensors implementations.
TEST_CASE("checkpoint: the bytes on disk are standard safetensors") {
  TempDir dir;
  Generator gen(7);
  Net model(gen);
  CheckpointState state;
  state.step = 42;
  state.config = {{"lr", "0.001"}};
  state.rng = GeneratorState{11, 22};
  const Tensor m = Tensor::from_vector({0.5f, -0.25f, 8.0f, 1e-3f}, {4});
  state.extras = {{"optimizer.proj.bias.m", m}};
  const std::string path = dir.file("std.safetensors");
  save_checkpoint(path, model, state);

  const std::string bytes = read_bytes(path);
  REQUIRE(bytes.size() >= 8);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(static_cast<unsigned char>(bytes[i])) << (8 * i);
  REQUIRE(8 + n <= bytes.size());
  CHECK(n % 8 == 0);
  const std::string header = bytes.substr(8, n);
  const size_t data_start = 8 + n;
  CHECK(header.front() == '{');
  INFO("header: " << header);

  // The {...} entry of `name` in the header.
  auto entry = [&](const std::string& name) -> std::string {
    size_t at = header.find("\"" + name + "\":{");
    if (at == std::string::npos) return "";
    size_t end = header.find('}', at);
    return end == std::string::npos ? "" : header.substr(at, end - at + 1);
  };
  uint64_t covered = 0;
  auto check_tensor = [&](const std::string& name, const Tensor& expected, const char* shape) {
    CAPTURE(name);
    const std::string e = entry(name);
    REQUIRE(!e.empty());
    CHECK(e.find("\"dtype\":\"F32\"") != std::string::npos);
    CHECK(e.find(std::string("\"shape\":") + shape) != std::string::npos);
    size_t off = e.find("\"data_offsets\":[");
    REQUIRE(off != std::string::npos);
    char* rest = nullptr;
    const uint64_t begin = std::strtoull(e.c_str() + off + 16, &rest, 10);
    REQUIRE(*rest == ',');
    const uint64_t end = std::strtoull(rest + 1, &rest, 10);
    REQUIRE(*rest == ']');
    REQUIRE(end - begin == expected.nbytes());
    REQUIRE(data_start + end <= bytes.size());
    CHECK(bytes.substr(data_start + begin, end - begin) == bytes_of(expected));
    covered += end - begin;
  };
  check_tensor("scale", model.scale.data(), "[1]");
  check_tensor("proj.weight", model.proj->weight.data(), "[4,3]");
  check_tensor("proj.bias", model.proj->bias.data(), "[4]");
  check_tensor("head.weight", model.head->weight.data(), "[1,4]");
  check_tensor("head.bias", model.head->bias.data(), "[1]");
  check_tensor("optimizer.proj.bias.m", m, "[4]");
  CHECK(data_start + covered == bytes.size());  // nothing else in the data section

  const std::string meta = entry("__metadata__");
  REQUIRE(!meta.empty());
  for (const char* kv :
       {"\"format\":\"clustr-checkpoint\"", "\"format_version\":\"1\"", "\"step\":\"42\"",
        "\"config.lr\":\"0.001\"", "\"rng.seed\":\"11\"", "\"rng.offset\":\"22\""}) {
    CAPTURE(kv);
    CHECK(meta.find(kv) != std::string::npos);
  }
}
