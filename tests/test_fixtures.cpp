// The autograd ops against PyTorch. Each fixture file (written by tests/fixtures/make_fixtures.py)
// holds one op's inputs, a random upstream gradient dout, and PyTorch's out and input gradients
// of sum(out * dout), computed in float64 and rounded to float32. Here the same inputs go
// through our op as Variables that require grad, out.backward(dout) runs, and out and every
// gradient are compared with CHECK_CLOSE.
//
// The table below lists every fixture file the suite expects: a listed file that is missing
// fails its op's test, and a file in the directory that no entry lists fails the completeness
// test, so a fixture can neither vanish nor be silently ignored.
//
// Tolerance: atol 1e-5, rtol 1e-4 for every op. The references are exact to half a float32
// ulp, inputs are O(1) and reductions are a few dozen terms long, so a float32 implementation
// errs by a few ulps (PyTorch's own float32 results stay within 0.6 of this tolerance, and all
// but layer_norm-offset within 0.02; make_fixtures.py prints these figures). Ours were within
// 0.3 when this was written, the most on cross_entropy-large, whose logits near +-1000 carry
// float32 rounding of 3e-5 each.
#include <doctest/doctest.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "autograd/variable.h"
#include "check.h"
#include "core/error.h"
#include "core/random.h"
#include "core/safetensors.h"

#ifndef CLUSTR_FIXTURE_DIR
#error "CLUSTR_FIXTURE_DIR must name the folder of the reference fixtures (tests/CMakeLists.txt)"
#endif

using namespace clustr;

namespace {

// One loaded fixture: its tensors and its metadata, read with errors that name the file.
struct Fixture {
  std::string name;  // "<op>-<case>"
  SafetensorsFile file;

  const Tensor& tensor(const std::string& n) const { return file.get(n); }
  bool has(const std::string& n) const { return file.contains(n); }
  const std::string& meta(const std::string& key) const { return file.meta(key); }

  int64_t meta_int(const std::string& key) const {
    const std::string& s = meta(key);
    char* end = nullptr;
    errno = 0;
    long long v = std::strtoll(s.c_str(), &end, 10);
    CLUSTR_CHECK(!s.empty() && *end == '\0' && errno == 0, file.path, ": metadata ", key, " = '", s,
                 "' is not an integer");
    return v;
  }
  int meta_axis(const std::string& key) const { return static_cast<int>(meta_int(key)); }
  float meta_float(const std::string& key) const {
    const std::string& s = meta(key);
    char* end = nullptr;
    float v = std::strtof(s.c_str(), &end);
    CLUSTR_CHECK(!s.empty() && *end == '\0', file.path, ": metadata ", key, " = '", s,
                 "' is not a number");
    return v;
  }
  bool meta_bool(const std::string& key) const {
    const std::string& s = meta(key);
    CLUSTR_CHECK(s == "true" || s == "false", file.path, ": metadata ", key, " = '", s,
                 "' is not true or false");
    return s == "true";
  }
  std::vector<int64_t> meta_ints(const std::string& key) const {
    std::vector<int64_t> out;
    const std::string& s = meta(key);
    size_t begin = 0;
    while (begin <= s.size()) {
      size_t comma = std::min(s.find(',', begin), s.size());
      std::string item = s.substr(begin, comma - begin);
      char* end = nullptr;
      long long v = std::strtoll(item.c_str(), &end, 10);
      CLUSTR_CHECK(!item.empty() && *end == '\0', file.path, ": metadata ", key, " = '", s,
                   "' is not a comma-separated list of integers");
      out.push_back(v);
      begin = comma + 1;
    }
    return out;
  }
};

// Runs our op on the fixture's f32 inputs (input0, input1, ...), which require grad; other
// inputs (index, target, weight) and parameters come from the fixture itself.
using OpRunner = std::function<Variable(const Fixture&, const std::vector<Variable>&)>;

struct Tolerance {
  double atol = 1e-5, rtol = 1e-4;
};

struct OpFixtures {
  std::string op;
  std::vector<std::string> cases;  // files "<op>-<case>.safetensors"
  OpRunner run;
  Tolerance tol;
};

Variable binary_op(const Fixture& f, const std::vector<Variable>& x) {
  const std::string& op = f.meta("op");
  if (op == "add") return x.at(0) + x.at(1);
  if (op == "sub") return x.at(0) - x.at(1);
  if (op == "mul") return x.at(0) * x.at(1);
  if (op == "div") return x.at(0) / x.at(1);
  throw Error("unknown binary op " + op);
}

Variable unary_op(const Fixture& f, const std::vector<Variable>& x) {
  const std::string& op = f.meta("op");
  if (op == "neg") return -x.at(0);
  if (op == "exp") return exp(x.at(0));
  if (op == "log") return log(x.at(0));
  if (op == "sqrt") return sqrt(x.at(0));
  if (op == "relu") return relu(x.at(0));
  if (op == "gelu") return gelu(x.at(0));
  if (op == "tanh") return tanh(x.at(0));
  if (op == "sigmoid") return sigmoid(x.at(0));
  if (op == "softmax") return softmax(x.at(0));
  if (op == "log_softmax") return log_softmax(x.at(0));
  throw Error("unknown unary op " + op);
}

Variable reduce_op(const Fixture& f, const std::vector<Variable>& x) {
  const std::string& op = f.meta("op");
  if (op == "sum") return sum(x.at(0), f.meta_axis("axis"), f.meta_bool("keepdim"));
  if (op == "mean") return mean(x.at(0), f.meta_axis("axis"), f.meta_bool("keepdim"));
  if (op == "sum_all") return sum_all(x.at(0));
  if (op == "mean_all") return mean_all(x.at(0));
  throw Error("unknown reduction " + op);
}

const std::vector<OpFixtures>& all_fixtures() {
  const std::vector<std::string> broadcast = {"same", "row", "both", "left", "rank0right"};
  static const std::vector<OpFixtures> table = {
      // ---- arithmetic, with broadcasting on either side
      {"add", {"same", "row", "both", "left", "rank0", "rank0right", "ones"}, binary_op, {}},
      {"sub", broadcast, binary_op, {}},
      {"mul", broadcast, binary_op, {}},
      {"div", broadcast, binary_op, {}},
      {"neg", {"basic"}, unary_op, {}},
      {"add_scalar",
       {"basic"},
       [](const Fixture& f, const std::vector<Variable>& x) {
         return x.at(0) + f.meta_float("scalar");
       },
       {}},
      {"mul_scalar",
       {"basic"},
       [](const Fixture& f, const std::vector<Variable>& x) {
         return x.at(0) * f.meta_float("scalar");
       },
       {}},
      // ---- matrix products and lookups
      {"matmul",
       {"nn", "nt", "tn", "tt", "batched-nn", "batched-nt", "batched-tn", "batched-tt", "outer",
        "dot"},
       [](const Fixture& f, const std::vector<Variable>& x) {
         return matmul(x.at(0), x.at(1), f.meta_bool("trans_a"), f.meta_bool("trans_b"));
       },
       {}},
      {"linear",
       {"rank2", "rank3", "nobias"},
       [](const Fixture&, const std::vector<Variable>& x) {
         return linear(x.at(0), x.at(1), x.size() > 2 ? x[2] : Variable());
       },
       {}},
      {"embedding",
       {"repeated", "vector"},
       [](const Fixture& f, const std::vector<Variable>& x) {
         return embedding(x.at(0), f.tensor("index"));
       },
       {}},
      // ---- shapes and reductions
      {"reshape",
       {"infer"},
       [](const Fixture& f, const std::vector<Variable>& x) {
         return reshape(x.at(0), f.meta_ints("shape"));
       },
       {}},
      {"permute",
       {"rank3", "rank4"},
       [](const Fixture& f, const std::vector<Variable>& x) {
         std::vector<int64_t> p = f.meta_ints("perm");
         return permute(x.at(0), std::vector<int>(p.begin(), p.end()));
       },
       {}},
      {"transpose",
       {"outer", "last2"},
       [](const Fixture& f, const std::vector<Variable>& x) {
         return transpose(x.at(0), f.meta_axis("axis0"), f.meta_axis("axis1"));
       },
       {}},
      {"slice",
       {"first", "middle", "last"},
       [](const Fixture& f, const std::vector<Variable>& x) {
         return slice(x.at(0), f.meta_axis("axis"), f.meta_int("start"), f.meta_int("length"));
       },
       {}},
      {"concat",
       {"first", "middle", "last"},
       [](const Fixture& f, const std::vector<Variable>& x) {
         return concat(x, f.meta_axis("axis"));
       },
       {}},
      {"sum", {"first", "middle-keepdim", "last", "last-keepdim"}, reduce_op, {}},
      {"mean", {"first", "middle-keepdim", "last", "last-keepdim"}, reduce_op, {}},
      {"sum_all", {"basic"}, reduce_op, {}},
      {"mean_all", {"basic"}, reduce_op, {}},
      // ---- activations and normalisation
      {"exp", {"basic"}, unary_op, {}},
      {"log", {"basic"}, unary_op, {}},
      {"sqrt", {"basic"}, unary_op, {}},
      {"relu", {"basic"}, unary_op, {}},
      {"gelu", {"basic"}, unary_op, {}},
      {"tanh", {"basic"}, unary_op, {}},
      {"sigmoid", {"basic"}, unary_op, {}},
      {"softmax", {"small", "large", "rank3", "masked"}, unary_op, {}},
      {"log_softmax", {"small", "large", "rank3", "masked"}, unary_op, {}},
      {"layer_norm",
       {"basic", "offset", "eps"},
       [](const Fixture& f, const std::vector<Variable>& x) {
         return layer_norm(x.at(0), x.at(1), x.at(2), f.meta_float("eps"));
       },
       {}},
      // Only the identities: the masks come from our own Philox stream (make_fixtures.py).
      {"dropout",
       {"p0", "eval"},
       [](const Fixture& f, const std::vector<Variable>& x) {
         Generator gen(1234);
         return dropout(x.at(0), f.meta_float("p"), gen, f.meta_bool("training"));
       },
       {}},
      {"cross_entropy",
       {"mean", "sum", "large", "ignore", "ignore-class", "one-left", "weight", "weight-sum",
        "rank3"},
       [](const Fixture& f, const std::vector<Variable>& x) {
         const std::string& r = f.meta("reduction");
         CLUSTR_CHECK(r == "mean" || r == "sum", f.file.path, ": unknown reduction ", r);
         return cross_entropy(x.at(0), f.tensor("target"),
                              f.has("weight") ? f.tensor("weight") : Tensor(),
                              static_cast<int>(f.meta_int("ignore_index")),
                              r == "mean" ? Reduction::mean : Reduction::sum);
       },
       {}},
  };
  return table;
}

std::string fixture_path(const std::string& name) {
  return std::string(CLUSTR_FIXTURE_DIR) + "/" + name + ".safetensors";
}

// Compares one tensor (shape, then values); `what` names it in the failure message.
void check_tensor(const std::string& what, const Tensor& actual, const Tensor& expected,
                  Tolerance tol) {
  INFO(what);
  REQUIRE_MESSAGE(actual.defined(), what, " is undefined (no gradient reached this input?)");
  CHECK_MESSAGE(actual.shape() == expected.shape(), what, " has shape ", to_string(actual.shape()),
                ", expected ", to_string(expected.shape()));
  if (actual.shape() == expected.shape())
    CHECK_CLOSE(actual.to_vector(), expected.to_vector(), tol.atol, tol.rtol);
}

// Runs one fixture through our op and backward and compares everything.
void check_fixture(const OpFixtures& op, const std::string& case_name) {
  const std::string name = op.op + "-" + case_name;
  INFO("fixture ", fixture_path(name));
  try {
    Fixture f{name, load_safetensors(fixture_path(name))};
    REQUIRE(f.meta("op") == op.op);
    REQUIRE(f.meta("case") == case_name);

    std::vector<Variable> inputs;
    for (int i = 0; f.has("input" + std::to_string(i)); ++i)
      inputs.emplace_back(f.tensor("input" + std::to_string(i)), /*requires_grad=*/true);
    REQUIRE_MESSAGE(!inputs.empty(), "the fixture has no input0");

    Variable out = op.run(f, inputs);
    check_tensor("out", out.data(), f.tensor("out"), op.tol);
    REQUIRE(out.requires_grad());
    out.backward(f.tensor("dout"));
    for (size_t i = 0; i < inputs.size(); ++i) {
      std::string g = "grad" + std::to_string(i);
      check_tensor(g, inputs[i].grad(), f.tensor(g), op.tol);
    }
  } catch (const std::exception& e) {
    FAIL_CHECK((std::string("threw: ") + e.what()));
  }
}

void check_op(const std::string& op_name) {
  const auto& table = all_fixtures();
  auto it = std::find_if(table.begin(), table.end(),
                         [&](const OpFixtures& o) { return o.op == op_name; });
  REQUIRE_MESSAGE(it != table.end(), "no fixtures listed for op ", op_name);
  for (const std::string& c : it->cases) check_fixture(*it, c);
}

}  // namespace

TEST_CASE("fixtures: the directory holds exactly the listed files") {
  std::set<std::string> listed;
  for (const OpFixtures& op : all_fixtures())
    for (const std::string& c : op.cases) listed.insert(op.op + "-" + c + ".safetensors");
  std::set<std::string> present;
  REQUIRE_MESSAGE(std::filesystem::is_directory(CLUSTR_FIXTURE_DIR), "fixture directory ",
                  CLUSTR_FIXTURE_DIR, " is missing");
  for (const auto& e : std::filesystem::directory_iterator(CLUSTR_FIXTURE_DIR))
    if (e.path().extension() == ".safetensors") present.insert(e.path().filename().string());
  for (const std::string& f : listed) CHECK_MESSAGE(present.count(f), "missing fixture ", f);
  for (const std::string& f : present)
    CHECK_MESSAGE(listed.count(f), "fixture ", f, " is checked by no test (add it to the table)");
}

TEST_CASE("fixtures: a wrong gradient is caught") {
  // The checker's own check: the matmul fixture with one reference element moved by 3x the
  // tolerance must fail the comparison.
  Fixture f{"matmul-nn", load_safetensors(fixture_path("matmul-nn"))};
  Variable a(f.tensor("input0"), true), b(f.tensor("input1"), true);
  Variable out = matmul(a, b);
  out.backward(f.tensor("dout"));
  std::vector<float> expected = f.tensor("grad0").to_vector();
  CHECK(test::compare_close(a.grad().to_vector(), expected, 1e-5, 1e-4).ok);
  expected[5] += 3.0f * (1e-5f + 1e-4f * std::fabs(expected[5]));
  test::CloseReport r = test::compare_close(a.grad().to_vector(), expected, 1e-5, 1e-4);
  CHECK_FALSE(r.ok);
  CHECK(r.message.find("worst at index 5") != std::string::npos);
}

TEST_CASE("fixtures: add") { check_op("add"); }
TEST_CASE("fixtures: sub") { check_op("sub"); }
TEST_CASE("fixtures: mul") { check_op("mul"); }
TEST_CASE("fixtures: div") { check_op("div"); }
TEST_CASE("fixtures: neg") { check_op("neg"); }
TEST_CASE("fixtures: add_scalar") { check_op("add_scalar"); }
TEST_CASE("fixtures: mul_scalar") { check_op("mul_scalar"); }
TEST_CASE("fixtures: matmul") { check_op("matmul"); }
TEST_CASE("fixtures: linear") { check_op("linear"); }
TEST_CASE("fixtures: embedding") { check_op("embedding"); }
TEST_CASE("fixtures: reshape") { check_op("reshape"); }
TEST_CASE("fixtures: permute") { check_op("permute"); }
TEST_CASE("fixtures: transpose") { check_op("transpose"); }
TEST_CASE("fixtures: slice") { check_op("slice"); }
TEST_CASE("fixtures: concat") { check_op("concat"); }
TEST_CASE("fixtures: sum") { check_op("sum"); }
TEST_CASE("fixtures: mean") { check_op("mean"); }
TEST_CASE("fixtures: sum_all") { check_op("sum_all"); }
TEST_CASE("fixtures: mean_all") { check_op("mean_all"); }
TEST_CASE("fixtures: exp") { check_op("exp"); }
TEST_CASE("fixtures: log") { check_op("log"); }
TEST_CASE("fixtures: sqrt") { check_op("sqrt"); }
TEST_CASE("fixtures: relu") { check_op("relu"); }
TEST_CASE("fixtures: gelu") { check_op("gelu"); }
TEST_CASE("fixtures: tanh") { check_op("tanh"); }
TEST_CASE("fixtures: sigmoid") { check_op("sigmoid"); }
TEST_CASE("fixtures: softmax") { check_op("softmax"); }
TEST_CASE("fixtures: log_softmax") { check_op("log_softmax"); }
TEST_CASE("fixtures: layer_norm") { check_op("layer_norm"); }
TEST_CASE("fixtures: dropout") { check_op("dropout"); }
TEST_CASE("fixtures: cross_entropy") { check_op("cross_entropy"); }

TEST_CASE("fixtures: every op in the table has a test case") {
  // The TEST_CASEs above name ops by hand; this keeps them and the table in step.
  const std::set<std::string> tested = {
      "add",        "sub",     "mul",          "div",     "neg",      "add_scalar", "mul_scalar",
      "matmul",     "linear",  "embedding",    "reshape", "permute",  "transpose",  "slice",
      "concat",     "sum",     "mean",         "sum_all", "mean_all", "exp",        "log",
      "sqrt",       "relu",    "gelu",         "tanh",    "sigmoid",  "softmax",    "log_softmax",
      "layer_norm", "dropout", "cross_entropy"};
  for (const OpFixtures& op : all_fixtures())
    CHECK_MESSAGE(tested.count(op.op), "op ", op.op, " has no TEST_CASE");
  CHECK(tested.size() == all_fixtures().size());
}
