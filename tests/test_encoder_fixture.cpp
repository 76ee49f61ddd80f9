// EncoderLayer (full attention) against PyTorch's nn.TransformerEncoderLayer, and with shared-QK
// full attention (shared-full) against the same layer written out in PyTorch. Each fixture
// (tests/fixtures/encoder/, written by tests/fixtures/make_encoder_fixture.py, one per variant:
// post-norm, pre-norm, shared-full) holds the layer's weights under clustr's parameter names, an input x (B, N,
// D) with lengths, an upstream gradient dout that is 0 at padded positions, and PyTorch's out and
// the gradients of sum(out * dout) w.r.t. x and every parameter, computed in float64 and rounded to
// float32.
//
// out is compared at valid positions only: clustr's attention zeroes padded query rows, PyTorch
// computes them. The gradients do not depend on those rows (dout is 0 there), so all of them
// are compared, grad.x included (0 at padded positions in both).
//
// Tolerance: atol 1e-5, rtol 1e-4, as for the single ops (test_fixtures.cpp). The references are
// exact to half a float32 ulp and PyTorch's own float32 layer stays within 0.16 of this
// tolerance (make_encoder_fixture.py prints the figure); a layer is a few dozen ops deep, each
// with O(1) values and sums of at most F = 768 terms.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "autograd/variable.h"
#include "check.h"
#include "core/random.h"
#include "core/safetensors.h"
#include "layers/encoder.h"

#ifndef CLUSTR_FIXTURE_DIR
#error "CLUSTR_FIXTURE_DIR must name the folder of the reference fixtures (tests/CMakeLists.txt)"
#endif

using namespace clustr;

namespace {

constexpr double kAtol = 1e-5, kRtol = 1e-4;

int64_t meta_int(const SafetensorsFile& f, const std::string& key) {
  const std::string& s = f.meta(key);
  size_t used = 0;
  const long long v = std::stoll(s, &used);
  CLUSTR_CHECK(used == s.size(), f.path, ": metadata ", key, " = '", s, "' is not an integer");
  return v;
}

SafetensorsFile load_fixture(const std::string& variant) {
  const std::string path =
      std::string(CLUSTR_FIXTURE_DIR) + "/encoder/encoder_layer-" + variant + ".safetensors";
  REQUIRE_MESSAGE(std::filesystem::exists(path), "missing fixture ", path,
                  " (run tests/fixtures/make_encoder_fixture.py)");
  return load_safetensors(path);
}

// The layer the fixture describes, with its weights copied in; `swap` exchanges two parameters'
// values (for the check of the check).
std::shared_ptr<EncoderLayer> make_layer(const SafetensorsFile& f,
                                         const std::pair<std::string, std::string>& swap = {}) {
  const int64_t D = meta_int(f, "d_model"), H = meta_int(f, "nhead");
  const int64_t F = meta_int(f, "dim_feedforward");
  REQUIRE(f.meta("activation") == "relu");
  REQUIRE(f.meta("eps") == "1e-05");
  Generator gen(1);
  AttentionConfig attention;
  if (f.meta("variant") == "shared-full") attention.type = AttentionType::shared_full;
  auto layer = std::make_shared<EncoderLayer>(D, H, F, attention, 0.0f, Activation::relu,
                                              f.meta("pre_norm") == "true", gen);
  for (const auto& [name, p] : layer->named_parameters()) {
    std::string source = name;
    if (name == swap.first) source = swap.second;
    if (name == swap.second) source = swap.first;
    Tensor value = p.data();  // shares the parameter's storage
    value.copy_from(f.get(source));
  }
  return layer;
}

// The rows of a (B, N, D) tensor at positions n < lengths[b], flattened.
std::vector<float> valid_rows(const Tensor& t, const std::vector<int32_t>& lengths) {
  const int64_t N = t.size(1), D = t.size(2);
  const std::vector<float> all = t.to_vector();
  std::vector<float> out;
  for (size_t b = 0; b < lengths.size(); ++b)
    for (int64_t n = 0; n < lengths[b]; ++n) {
      const auto first = all.begin() + (static_cast<int64_t>(b) * N + n) * D;
      out.insert(out.end(), first, first + D);
    }
  return out;
}

struct Result {
  Tensor out, grad_x;
  std::vector<std::pair<std::string, Variable>> params;
};

Result run(EncoderLayer& layer, const SafetensorsFile& f) {
  Generator gen(2);
  Variable x(f.get("x").clone(), true);
  Variable out = layer.forward(x, f.get("lengths"), gen);
  out.backward(f.get("dout"));
  return {out.data(), x.grad(), layer.named_parameters()};
}

void check_variant(const std::string& variant) {
  const SafetensorsFile f = load_fixture(variant);
  auto layer = make_layer(f);
  REQUIRE(layer->pre_norm() == (variant == "pre-norm"));

  // Every parameter has its value and its gradient in the file, and the file holds nothing else.
  std::set<std::string> expected = {"x", "lengths", "dout", "out", "grad.x"};
  for (const auto& [name, p] : layer->named_parameters()) {
    expected.insert(name);
    expected.insert("grad." + name);
    CHECK_MESSAGE(f.contains(name), f.path, " has no parameter ", name);
  }
  for (const auto& [name, t] : f.tensors)
    CHECK_MESSAGE(expected.count(name), f.path, ": tensor ", name, " matches no parameter");

  const Result r = run(*layer, f);
  const std::vector<int32_t> lengths = f.get("lengths").to_int_vector();
  {
    INFO(variant, ": out at valid positions");
    CHECK_CLOSE(valid_rows(r.out, lengths), valid_rows(f.get("out"), lengths), kAtol, kRtol);
  }
  {
    INFO(variant, ": grad.x");
    CHECK_CLOSE(r.grad_x.to_vector(), f.get("grad.x").to_vector(), kAtol, kRtol);
  }
  for (const auto& [name, p] : r.params) {
    INFO(variant, ": grad.", name);
    REQUIRE_MESSAGE(p.grad().defined(), "no gradient reached ", name);
    CHECK_CLOSE(p.grad().to_vector(), f.get("grad." + name).to_vector(), kAtol, kRtol);
  }
  // Padded outputs are unspecified but finite.
  for (float v : r.out.to_vector()) REQUIRE(std::isfinite(v));
}

}  // namespace

TEST_CASE("encoder fixture: post-norm layer matches PyTorch") { check_variant("post-norm"); }

TEST_CASE("encoder fixture: pre-norm layer matches PyTorch") { check_variant("pre-norm"); }

// One projection for queries and keys (no attention.key.* tensors), unit-length keys, no
// attention to oneself, and a sequence of one position whose query takes its own value.
TEST_CASE("encoder fixture: shared-QK full attention (shared-full) matches PyTorch") {
  check_variant("shared-full");
  // The check of the check: the query and value projections exchanged.
  const SafetensorsFile f = load_fixture("shared-full");
  auto layer = make_layer(f, {"attention.query.weight", "attention.value.weight"});
  const Result r = run(*layer, f);
  const std::vector<int32_t> lengths = f.get("lengths").to_int_vector();
  CHECK_FALSE(test::compare_close(valid_rows(r.out, lengths), valid_rows(f.get("out"), lengths),
                                  kAtol, kRtol)
                  .ok);
}

TEST_CASE("encoder fixture: a wrong weight mapping is caught") {
  // The check of the check: with the query and key projections exchanged (the mistake a wrong
  // split of PyTorch's in_proj_weight makes), the outputs must fall outside the tolerance.
  const SafetensorsFile f = load_fixture("post-norm");
  auto layer = make_layer(f, {"attention.query.weight", "attention.key.weight"});
  const Result r = run(*layer, f);
  const std::vector<int32_t> lengths = f.get("lengths").to_int_vector();
  const auto report = test::compare_close(valid_rows(r.out, lengths),
                                          valid_rows(f.get("out"), lengths), kAtol, kRtol);
  CHECK_FALSE(report.ok);
}
