// The copy-task executables (copy_task, copy_sweep) on the command line: a smoke run whose loss
// must fall, evaluating its checkpoint, refused flags and folders, memory limits, the emulated
// device, and a tiny sweep. Each test case is one ctest test of the same name
// (tests/CMakeLists.txt: app_cli_test), which gives the order: the cases that read the smoke
// run's checkpoint require its fixture. The apps' library is tested in test_copy_app.cpp;
// Ctrl-C and the folder lock by tests/app_signal_test.sh.
#include "app_cli.h"

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

namespace {

using clustr::test::AppRun;
using clustr::test::cat;
using clustr::test::RunOptions;
using Args = std::vector<std::string>;

const std::string copy_out = CLUSTR_APP_COPY_OUT;  // the runs' folders (in the build tree)

AppRun copy_task(const Args& args, const RunOptions& options = {}) {
  return clustr::test::run_app(cat({{CLUSTR_APP_COPY_TASK}, args}), options);
}

// A tiny model (a full run of it takes a few seconds).
const Args copy_tiny = {"--heads", "2", "--head-dim", "16", "--feedforward", "64",
                        "--length", "5", "--symbols", "4", "--batch", "32", "--threads", "2",
                        "--log-interval", "50", "--eval-batches", "4",
                        "--final-eval-batches", "8"};

// A GPU hidden from the program in any build: the emulated device switched off,
// CUDA_VISIBLE_DEVICES hiding a real one.
const RunOptions no_gpu = {{{"CLUSTR_CUDA_EMULATION_DEVICES", "0"}, {"CUDA_VISIBLE_DEVICES", ""}}};

// Each ctest test names its case (--test-case=NAME); a name that matches none would run nothing
// and pass. This listener makes such a run fail instead.
struct NoCaseRunFails : doctest::IReporter {
  explicit NoCaseRunFails(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats& stats) override {
    if (stats.numTestCasesPassingFilters > 0) return;
    std::fprintf(stderr, "test_app_cli: no test case matches the filters\n");
    std::fflush(nullptr);
    std::_Exit(1);
  }
  void test_case_start(const doctest::TestCaseData&) override {}
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};
REGISTER_LISTENER("no_case_run_fails", 1, NoCaseRunFails);

}  // namespace

// The output checks themselves: CMake's pattern syntax, ".*" in order over a long output (one
// std::regex over a megabyte overflowed the stack under AddressSanitizer).
TEST_CASE("app_cli_pattern_matching") {
  AppRun r;
  r.output = "alpha 1\nbeta (x)\n" + std::string(1 << 20, 'z') + "\ngamma 3\n";
  CHECK(clustr::test::matches(r, "alpha [0-9].*beta \\(x\\).*gamma 3"));
  CHECK(clustr::test::matches(r, "alpha.1"));  // '.' matches the newline too, as in CMake
  CHECK(clustr::test::matches(r, "(beta|delta) \\(x\\)\n.*(gamma|delta) 3\n"));
  CHECK_FALSE(clustr::test::matches(r, "gamma.*alpha"));  // in order
  CHECK_FALSE(clustr::test::matches(r, "alpha [^\n]*gamma"));
  CHECK_FALSE(clustr::test::matches(r, "beta \\(y\\).*"));
}

// Smoke run: 300 steps of a tiny full-attention model; its final held-out loss must be below
// 0.2 (it starts at ln 4 = 1.39; it reaches about 0.001).
TEST_CASE("copy_task_smoke") {
  const AppRun r = copy_task(cat({copy_tiny,
                                  {"--layers", "1", "--attention", "full", "--steps", "300",
                                   "--lr", "1e-2", "--warmup", "50", "--eval-interval", "100",
                                   "--target-accuracy", "0", "--out", copy_out + "/smoke",
                                   "--overwrite"}}));
  CHECK_OUTPUT_MATCHES(r, "final held-out evaluation [^\n]*: loss 0\\.[01]");
  CHECK_STATUS(r, 0);
}

TEST_CASE("copy_task_evaluate_with") {
  const AppRun r = copy_task({"--checkpoint", copy_out + "/smoke", "--evaluate-with",
                              "improved-clustered", "--clusters", "3", "--topk", "6"});
  CHECK_OUTPUT_HAS(r, "evaluated with improved-clustered (C=3, k=6");
  CHECK_STATUS(r, 0);
}

// Oracle-top (each query's 2 best keys of full attention) evaluates a trained model; it cannot
// train one.
TEST_CASE("copy_task_evaluate_oracle_top") {
  const AppRun r = copy_task({"--checkpoint", copy_out + "/smoke", "--evaluate-with",
                              "oracle-top", "--topk", "2"});
  CHECK_OUTPUT_MATCHES(r, "evaluated with oracle-top \\(k=2\\)[^\n]*masked accuracy [01]\\.[0-9]+");
  CHECK_STATUS(r, 0);
  const AppRun train = copy_task({"--attention", "oracle-top", "--steps", "2"});
  CHECK_OUTPUT_HAS(train, "--attention oracle-top is for evaluation only");
  CHECK_STATUS(train, 1);
}

// A model trained in fp32 evaluates with bf16 products (its weights are f32 either way).
TEST_CASE("copy_task_evaluate_bf16") {
  const AppRun r = copy_task({"--checkpoint", copy_out + "/smoke", "--precision", "bf16"});
  CHECK_OUTPUT_MATCHES(r, "products in bf16 \\(trained in fp32\\).*trained with");
  CHECK_STATUS(r, 0);
}

TEST_CASE("copy_task_bad_precision") {
  CHECK_FAILS_WITH(copy_task({"--precision", "fp16"}),
                   "unknown precision 'fp16' (expected fp32 or bf16)");
}

// The configuration table names the kernels that run; the bf16 GEMM's portable one says that
// bf16 gains nothing with it.
TEST_CASE("copy_task_generic_kernels") {
  const AppRun r = copy_task(
      cat({copy_tiny, {"--steps", "1", "--precision", "bf16", "--out", copy_out + "/generic",
                       "--overwrite"}}),
      {{{"CLUSTR_GEMM_KERNEL", "generic"}}});
  CHECK_OUTPUT_MATCHES(r, "GEMM micro-kernel +generic\n  bf16 GEMM kernel +generic \\(portable "
                          "C\\+\\+: without AMX or AVX512-BF16, --precision bf16 gains "
                          "nothing\\)\n");
  CHECK_STATUS(r, 0);
}

TEST_CASE("copy_task_bad_hamming_kernel") {
  CHECK_FAILS_WITH(copy_task(cat({copy_tiny, {"--steps", "1", "--out", copy_out + "/hamming",
                                              "--overwrite"}}),
                             {{{"CLUSTR_HAMMING_KERNEL", "sse"}}}),
                   "cluster_queries: CLUSTR_HAMMING_KERNEL=sse names an unknown kernel (known "
                   "here: ");
}

TEST_CASE("copy_task_tf32_cpu") {
  CHECK_FAILS_WITH(copy_task({"--tf32"}), "--tf32 applies to the GPU's f32 products");
}

TEST_CASE("copy_task_resume_other_model") {
  const AppRun r = copy_task(cat({copy_tiny,
                                  {"--attention", "full", "--layers", "2", "--steps", "400",
                                   "--resume", copy_out + "/smoke", "--out",
                                   copy_out + "/resume_other_model"}}));
  CHECK_OUTPUT_MATCHES(r, "other settings.*--layers: checkpoint 1, now 2");
  CHECK_STATUS(r, 1);
}

// A new run refuses the folder of an earlier one (and names the ways out). (The cases that
// resume from smoke write into folders of their own: a run holds its folder's lock, and ctest
// runs tests side by side.)
TEST_CASE("copy_task_refuses_earlier_run") {
  const AppRun r = copy_task(cat({copy_tiny, {"--steps", "2", "--out", copy_out + "/smoke"}}));
  CHECK_OUTPUT_MATCHES(r, "--out [^\n]*smoke already holds files \\(accuracy.png, "
                 "checkpoint.safetensors.*--resume.*--overwrite");
  CHECK_STATUS(r, 1);
}

TEST_CASE("copy_task_resume_below_steps") {
  CHECK_FAILS_WITH(copy_task(cat({copy_tiny,
                                  {"--attention", "full", "--layers", "1", "--steps", "10",
                                   "--resume", copy_out + "/smoke", "--out",
                                   copy_out + "/resume_below_steps"}})),
                   "is at step 300, past --steps 10");
}

TEST_CASE("copy_task_overwrite_and_resume") {
  const AppRun r = copy_task({"--overwrite", "--resume", copy_out + "/smoke"});
  CHECK_OUTPUT_MATCHES(r, "--overwrite starts a new run.*give one of them");
  CHECK_STATUS(r, 1);
}

TEST_CASE("copy_task_bad_steps") {
  CHECK_FAILS_WITH(copy_task({"--steps", "-5"}), "--steps must be >= 1, got -5");
}

// bench_encoder checks every --shapes entry before it runs any ("32x64,32x128" is two shapes).
TEST_CASE("bench_encoder_bad_shapes") {
  for (const char* bad : {"32x6a4", "0x64", "32x", "32", "32x64x2", "99999999x1"}) {
    const AppRun r = clustr::test::run_app(
        {CLUSTR_APP_BENCH_ENCODER, "--shapes", std::string("4x8,") + bad, "--reps", "1",
         "--csv", copy_out + "/bench_encoder_bad.csv"});
    CHECK_OUTPUT_HAS(r, std::string("--shapes expects B x N"));
    CHECK_OUTPUT_HAS(r, std::string("got '") + bad + "'");
    CHECK_RUN(r, r.output.find("us/token") == std::string::npos);  // nothing ran
    CHECK_STATUS(r, 1);
  }
}

// bench_gemm --shapes encoder: the twelve products of an encoder step, each a row of the table;
// an unknown group is refused by name.
TEST_CASE("bench_gemm_encoder_products") {
  const AppRun r = clustr::test::run_app(
      {CLUSTR_APP_BENCH_GEMM, "--precision", "bf16", "--shapes", "encoder", "--threads", "1",
       "--reps", "1", "--sample-ms", "1", "--pause-ms", "0", "--csv",
       copy_out + "/bench_gemm_encoder.csv", "--overwrite"});
  for (const char* row : {"fwd qkv      4096x192x576      NT", "dW ff1       768x4096x192      TN",
                          "dW qkv       576x4096x192      TN"})
    CHECK_OUTPUT_HAS(r, std::string(row));
  CHECK_STATUS(r, 0);
  const AppRun bad = clustr::test::run_app(
      {CLUSTR_APP_BENCH_GEMM, "--shapes", "encoders", "--csv", copy_out + "/bench_gemm_bad.csv"});
  CHECK_OUTPUT_HAS(bad, std::string("--shapes must be all, square, transformer or encoder, got "
                                    "'encoders'"));
  CHECK_STATUS(bad, 1);
}

// The benchmarks keep an existing output file unless --overwrite: each refuses it by name
// before it measures anything, and leaves it as it was.
TEST_CASE("bench_outputs_kept") {
  const std::string kept = copy_out + "/bench_kept.csv";
  auto write = [&](const std::string& text) { std::ofstream(kept) << text; };
  auto read = [&] {
    std::ifstream in(kept);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  write("the user's results\n");
  const std::vector<Args> runs = {
      {CLUSTR_APP_BENCH_ENCODER, "--shapes", "2x8", "--reps", "1", "--dim", "8", "--heads", "2",
       "--hidden", "16", "--csv", kept},
      {CLUSTR_APP_BENCH_GEMM, "--shapes", "square", "--threads", "1", "--reps", "1", "--no-peer",
       "--csv", kept},
      {CLUSTR_APP_BENCH_ATTENTION, "--n", "16", "--heads", "1", "--dim", "8", "--reps", "1",
       "--csv", kept},
      {CLUSTR_APP_BENCH_ATTENTION, "--n", "16", "--heads", "1", "--dim", "8", "--reps", "1",
       "--csv", copy_out + "/bench_kept_new.csv", "--png", kept},
      {CLUSTR_APP_BENCH_CTC, "--frames", "20", "--batch", "1", "--classes", "5", "--min-labels",
       "2", "--max-labels", "3", "--reps", "1", "--csv", kept}};
  for (const Args& args : runs) {
    const AppRun r = clustr::test::run_app(args);
    CHECK_OUTPUT_HAS(r, kept + " exists: pass --overwrite to replace it");
    CHECK_STATUS(r, 1);
    CHECK_RUN(r, read() == "the user's results\n");
  }
  const AppRun r = clustr::test::run_app(cat({runs[0], {"--overwrite"}}));
  CHECK_STATUS(r, 0);
  CHECK_RUN(r, read().rfind("batch,length,precision,", 0) == 0);  // replaced, as asked
}

#ifdef CLUSTR_APP_CLI_MEMORY_LIMIT
// A CPU run never loads the CUDA libraries (cuBLAS and cuBLASLt alone map more than 400 MB):
// it runs under a 400 MB address-space limit. (Not under the sanitizers, whose shadow memory
// needs far more address space than that.)
TEST_CASE("copy_task_cpu_under_memory_limit") {
  RunOptions limited;
  limited.address_space_kib = 400000;
  const AppRun r = copy_task(
      cat({copy_tiny, {"--steps", "2", "--out", copy_out + "/memory_limit", "--overwrite"}}),
      limited);
  CHECK_OUTPUT_MATCHES(
      r, "CUDA +(off|compiled, not used \\(--device cpu\\)).*final held-out evaluation");
  CHECK_STATUS(r, 0);
}

// Out of memory names the allocation and the flags that size it.
TEST_CASE("copy_task_out_of_memory") {
  RunOptions limited;
  limited.address_space_kib = 400000;
  const AppRun r = copy_task({"--length", "5", "--symbols", "4", "--threads", "1", "--batch",
                              "300000", "--eval-batches", "1", "--final-eval-batches", "1",
                              "--steps", "2", "--out", copy_out + "/out_of_memory", "--overwrite"},
                             limited);
  CHECK_OUTPUT_MATCHES(r, "out of host memory allocating [0-9]+ bytes\n"
                 "  this run's memory grows with --batch 300000");
  CHECK_STATUS(r, 1);
}
#endif

// Settings that would take the machine's memory or threads are refused, naming the flag;
// integers past their type are refused, not wrapped or saturated.
TEST_CASE("copy_task_huge_eval") {
  const AppRun r = copy_task({"--eval-batches", "1000000000"});
  CHECK_OUTPUT_MATCHES(r, "--eval-batches x --batch x N must be at most 100000000 held-out tokens.*"
                 "got 1000000000");
  CHECK_STATUS(r, 1);
}

TEST_CASE("copy_task_huge_threads") {
  CHECK_FAILS_WITH(copy_task({"--threads", "100000"}), "--threads must be in [0, 256]");
}

TEST_CASE("copy_task_negative_seed") {
  CHECK_FAILS_WITH(copy_task({"--seed", "-1"}), "--seed -1: expected a whole number from 0 to");
}

TEST_CASE("copy_task_huge_steps") {
  CHECK_FAILS_WITH(copy_task({"--steps", "99999999999999999999"}),
                   "--steps 99999999999999999999: out of range");
}

// Flags that the checkpoint's model overrides are named, not silently ignored (and only
// those: the line after the note does not start another "note").
TEST_CASE("copy_task_checkpoint_ignores_flags") {
  const AppRun r = copy_task({"--checkpoint", copy_out + "/smoke", "--layers", "3", "--symbols",
                              "4"});
  CHECK_OUTPUT_MATCHES(r, "note: --layers 3 is not used: [^\n]* was trained with --layers 1\n[^n]");
  CHECK_STATUS(r, 0);
}

TEST_CASE("copy_task_bad_attention") {
  CHECK_FAILS_WITH(copy_task({"--attention", "linear"}), "unknown attention type 'linear'");
}

TEST_CASE("copy_task_bad_clusters") {
  CHECK_FAILS_WITH(copy_task({"--clusters", "0"}), "--clusters must be >= 1, got 0");
}

TEST_CASE("copy_task_bad_mask_ratio") {
  CHECK_FAILS_WITH(copy_task({"--mask-ratio", "0.7"}), "--mask-ratio must be in (0, 0.5]");
}

TEST_CASE("copy_task_missing_resume") {
  CHECK_FAILS_WITH(copy_task({"--resume", copy_out + "/does-not-exist"}),
                   "no such checkpoint file or folder");
}

// --device cuda without a usable GPU: none is visible to this case in any build.
TEST_CASE("copy_task_cuda") {
  const AppRun r = copy_task({"--device", "cuda"}, no_gpu);
  CHECK_OUTPUT_MATCHES(
      r, "--device cuda: (clustr was built without the CUDA backend|no usable GPU)");
  CHECK_STATUS(r, 1);
}

#ifdef CLUSTR_APP_CLI_CUDA_EMULATION
// The app on the emulated device: a short full-attention run, a checkpoint, a resume (sizes
// far below copy_tiny's: emulated kernels are slow).
namespace {
const Args copy_cuda_tiny = {"--layers", "1", "--heads", "2", "--head-dim", "8",
                             "--feedforward", "16", "--length", "5", "--symbols", "4",
                             "--batch", "4", "--threads", "2", "--log-interval", "2",
                             "--eval-batches", "1", "--final-eval-batches", "1",
                             "--eval-interval", "2", "--attention", "full",
                             "--target-accuracy", "0", "--device", "cuda"};
}  // namespace

TEST_CASE("copy_task_cuda_run") {
  const AppRun r = copy_task(
      cat({copy_cuda_tiny, {"--steps", "4", "--out", copy_out + "/cuda", "--overwrite"}}));
  CHECK_OUTPUT_MATCHES(r, "--device +cuda.*final held-out evaluation");
  CHECK_STATUS(r, 0);
}

TEST_CASE("copy_task_cuda_resume") {
  const AppRun r =
      copy_task(cat({copy_cuda_tiny, {"--steps", "6", "--resume", copy_out + "/cuda"}}));
  CHECK_OUTPUT_MATCHES(r, "resumed from .* at step 4.*steps 4\\.\\.6");
  CHECK_STATUS(r, 0);
}

// Device memory running out (the emulated device capped at 48 KiB) is a clear error: the
// tensor's shape, the bytes asked for and free, the flags that size the run; the status is 1,
// and the checkpoint the run resumed from is left as it was, with nothing written beside it.
TEST_CASE("copy_task_cuda_out_of_memory") {
  const std::string out = copy_out + "/cuda_oom";
  const AppRun first = copy_task(cat({copy_cuda_tiny, {"--steps", "2", "--out", out,
                                                       "--overwrite"}}));
  CHECK_STATUS(first, 0);
  const auto files = [&] {
    std::map<std::string, std::string> bytes;
    for (const auto& e : std::filesystem::directory_iterator(out))
      if (e.path().filename() != ".lock") {
        std::ifstream in(e.path(), std::ios::binary);
        bytes[e.path().filename().string()] = std::string(std::istreambuf_iterator<char>(in), {});
      }
    return bytes;
  };
  const auto before = files();
  REQUIRE(before.count("checkpoint.safetensors") == 1);
  RunOptions capped;
  capped.env = {{"CLUSTR_EMULATION_MEMORY", "48K"}};
  const AppRun r = copy_task(cat({copy_cuda_tiny, {"--steps", "4", "--resume", out}}), capped);
  CHECK_OUTPUT_MATCHES(r, "tensor of shape \\([0-9, ]*\\) does not fit on the device: "
                          "cuda::alloc: out of device memory allocating [0-9]+ bytes.*the device "
                          "has [0-9]+ of 49152 bytes free");
  CHECK_OUTPUT_HAS(r, "this run's memory grows with --batch 4, --length 5");
  CHECK_STATUS(r, 1);
  CHECK_MESSAGE(files() == before, "the run folder changed");
  RunOptions bad;
  bad.env = {{"CLUSTR_EMULATION_MEMORY", "lots"}};
  CHECK_FAILS_WITH(copy_task(cat({copy_cuda_tiny, {"--steps", "4", "--resume", out}}), bad),
                   "CLUSTR_EMULATION_MEMORY='lots': expected a positive number of bytes");
}

// bf16 products on the device, and the f32 ones (the loss's) in TF32.
TEST_CASE("copy_task_cuda_bf16") {
  const AppRun r = copy_task(cat({copy_cuda_tiny,
                                  {"--steps", "2", "--precision", "bf16", "--tf32", "--out",
                                   copy_out + "/cuda_bf16", "--overwrite"}}));
  CHECK_OUTPUT_MATCHES(r, "--precision +bf16.*--tf32 +true.*final held-out evaluation");
  CHECK_STATUS(r, 0);
}
#endif

// The sweep on a tiny grid (2 lengths x 1 cluster count x 3 types, 20 steps each).
TEST_CASE("copy_sweep_tiny") {
  const AppRun r = clustr::test::run_app(
      {CLUSTR_APP_COPY_SWEEP, "--layers", "1", "--heads", "2", "--head-dim", "8", "--feedforward",
       "32", "--batch", "8", "--lengths", "3", "4", "--clusters", "2", "--topk", "3", "--steps",
       "20", "--eval-interval", "10", "--eval-batches", "2", "--final-eval-batches", "2",
       "--threads", "2", "--out", copy_out + "/sweep", "--overwrite"});
  CHECK_OUTPUT_MATCHES(r, "\\[6/6\\] full[^\n]*held-out accuracy.*wrote");
  CHECK_STATUS(r, 0);
}

// Reformer's rows of Figure 5: lsh-X runs once per length, beside full attention.
TEST_CASE("copy_sweep_lsh") {
  const AppRun r = clustr::test::run_app(
      {CLUSTR_APP_COPY_SWEEP, "--layers", "1", "--heads", "2", "--head-dim", "8", "--feedforward",
       "32", "--batch", "8", "--lengths", "3", "--attentions", "full", "lsh-1", "lsh-2",
       "--buckets", "4", "--chunk", "4", "--steps", "20", "--eval-interval", "10",
       "--eval-batches", "2", "--final-eval-batches", "2", "--threads", "2", "--out",
       copy_out + "/sweep_lsh", "--overwrite"});
  CHECK_OUTPUT_MATCHES(r, "3 runs.*\\[2/3\\] lsh \\(rounds=1[^\n]*held-out accuracy.*"
                          "\\[3/3\\] lsh \\(rounds=2.*wrote");
  CHECK_STATUS(r, 0);
  CHECK_FAILS(clustr::test::run_app({CLUSTR_APP_COPY_SWEEP, "--attentions", "lsh-0"}),
              "lsh needs at least 1 hashing round");
}
