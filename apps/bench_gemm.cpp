// GEMM benchmark: our GEMM against OpenBLAS's cblas_sgemm in the same process, interleaved run
// by run so that both see the same host speed (it drifts on a shared machine). Prints GFLOP/s
// (min / median / max over the repeats) and the median of the per-pair ratios; writes a CSV.
//
// OpenBLAS is loaded at run time with dlopen when it is installed (libopenblas0), after setting
// OPENBLAS_CORETYPE=SkylakeX unless the environment already names a core: OpenBLAS 0.3.21
// misdetects recent CPUs and otherwise falls back to a slow generic kernel.
//
// --device cuda: cuBLAS (cuda::gemm, TF32 off unless --tf32; cuda::gemm_bf16 with --precision
// bf16) on the same shapes, operands in device memory; each sample ends with
// cuda::synchronize() before the clock is read. No peer, no threads.
//
// --precision bf16: our bf16 GEMM (core/cpu/gemm_bf16.h; --kernel picks amx, avx512bf16 or
// generic) on bf16 operands (--operands f32: float32 operands rounded as they are packed, the
// precision policy's path), float32 C. OpenBLAS has no bf16 GEMM in Debian's build, so no peer
// runs here; apps/bench_gemm_torch.py runs this beside torch.matmul on bf16 tensors.
// --shapes encoder: the twelve products of one encoder-layer step (4096 tokens, D 192, F 768)
// with the operand types, bf16 results and row-sum epilogues the bf16 policy gives them.
#include <CLI/CLI.hpp>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "apps/common/device.h"
#include "apps/common/flags.h"
#include "apps/common/run_folder.h"
#include "core/cpu/gemm.h"
#include "core/cpu/gemm_bf16.h"
#include "core/cuda/cuda.h"
#include "core/error.h"
#include "core/parallel.h"
#include "core/random.h"
#include "core/tensor.h"

namespace {

using clustr::Tensor;

// ---- the peer, through dlopen --------------------------------------------------------------
struct OpenBlas {
  using Sgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*,
                         int, float, float*, int);
  Sgemm sgemm = nullptr;
  void (*set_threads)(int) = nullptr;
  char* (*corename)() = nullptr;
  char* (*config)() = nullptr;

  bool load() {
    setenv("OPENBLAS_CORETYPE", "SkylakeX", /*overwrite=*/0);
    void* h = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
    if (!h) return false;
    sgemm = reinterpret_cast<Sgemm>(dlsym(h, "cblas_sgemm"));
    set_threads = reinterpret_cast<void (*)(int)>(dlsym(h, "openblas_set_num_threads"));
    corename = reinterpret_cast<char* (*)()>(dlsym(h, "openblas_get_corename"));
    config = reinterpret_cast<char* (*)()>(dlsym(h, "openblas_get_config"));
    return sgemm && set_threads;
  }
  // cblas: CblasRowMajor = 101, CblasNoTrans = 111, CblasTrans = 112.
  void run(bool ta, bool tb, int M, int N, int K, const float* A, int lda, const float* B,
           int ldb, float* C, int ldc) const {
    sgemm(101, ta ? 112 : 111, tb ? 112 : 111, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, ldc);
  }
};

struct Case {
  std::string group;  // "square", "transformer", or in "encoder" the product's name
  int64_t M, K, N;
  bool ta, tb;
  // The encoder products under the bf16 policy (core/precision.h): which operands are stored
  // in bf16 (the others are float32, rounded as they are packed), whether C is stored in bf16,
  // and whether the epilogue sums the rows of op(A) (a bias gradient). Elsewhere --operands says.
  bool policy = false, a_bf16 = false, b_bf16 = false, c_bf16 = false, row_sums = false;
  std::string layout() const { return std::string(ta ? "T" : "N") + (tb ? "T" : "N"); }
};

std::vector<Case> make_cases(const std::string& which) {
  std::vector<Case> cases;
  if (which == "all" || which == "square")
    for (int64_t n : {256, 512, 1024, 2048}) cases.push_back({"square", n, n, n, false, false});
  if (which == "all" || which == "transformer") {
    // M x K x N of the copy-task model's linear layers (B*N = 4096 tokens, d = 192, ff 768).
    // NT is the forward pass (x W^T), NN the input gradient, TN the weight gradient.
    const int64_t shapes[3][3] = {{4096, 192, 576}, {4096, 192, 768}, {4096, 768, 192}};
    for (auto& s : shapes)
      for (auto [ta, tb] : {std::pair{false, true}, std::pair{false, false}, std::pair{true, false}})
        cases.push_back({"transformer", s[0], s[1], s[2], ta, tb});
  }
  if (which == "encoder") {
    // The twelve products of one step of the copy-task encoder layer (bench_encoder) at B N =
    // 4096 tokens, D 192, F 768, as the layer runs them: forward (Q/K/V fused, attention
    // output, feed-forward in and out), then each layer's input and weight gradients.
    const int64_t R = 4096, D = 192, F = 768;
    auto add = [&](const char* name, int64_t M, int64_t K, int64_t N, bool ta, bool tb, bool ab,
                   bool bb, bool cb, bool sums) {
      cases.push_back({name, M, K, N, ta, tb, true, ab, bb, cb, sums});
    };
    add("fwd qkv", R, D, 3 * D, false, true, false, false, false, false);
    add("fwd out", R, D, D, false, true, false, false, false, false);
    add("fwd ff1", R, D, F, false, true, false, false, true, false);   // H stored in bf16
    add("fwd ff2", R, F, D, false, true, true, false, false, false);   // reads H
    add("dX ff2", R, D, F, false, false, false, false, true, false);   // dP stored in bf16
    add("dW ff2", D, R, F, true, false, false, true, false, true);     // dy^T H, db2
    add("dX ff1", R, F, D, false, false, true, false, false, false);   // dP W1
    add("dW ff1", F, R, D, true, false, true, false, false, true);     // dP^T x, db1
    add("dX out", R, D, D, false, false, false, false, false, false);
    add("dW out", D, R, D, true, false, false, false, false, true);
    add("dX qkv", R, 3 * D, D, false, false, false, false, false, false);
    add("dW qkv", 3 * D, R, D, true, false, false, false, false, true);
  }
  CLUSTR_CHECK(!cases.empty(), "bench_gemm: --shapes must be all, square, transformer or "
               "encoder, got '", which, "'");
  return cases;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// One sample: an untimed call (wakes the library's sleeping threads, warms the caches), then
// `iters` timed calls. Returns GFLOP/s.
template <typename F>
double sample_gflops(F f, int iters, double flops) {
  f();
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) f();
  return flops * iters / seconds_since(t0) * 1e-9;
}

struct Stats {
  double min, median, max;
};
Stats stats(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v.front(), v[v.size() / 2], v.back()};
}

// --device cuda: GFLOP/s of cuBLAS on each case, min / median / max over the samples.
int run_cuda(const std::vector<Case>& cases, int reps, double sample_ms, double pause_ms,
             const std::string& csv_path, bool bf16) {
  std::printf("cuBLAS %s, %d samples per case; %.0f ms pause between samples\n\n",
              bf16 ? "bf16 GEMM (cublasGemmEx, f32 accumulation)"
                   : clustr::cuda::tf32() ? "SGEMM (TF32 on)" : "SGEMM (TF32 off)",
              reps, pause_ms);
  std::ofstream csv(csv_path);
  CLUSTR_CHECK(csv.good(), "bench_gemm: cannot write ", csv_path);
  csv << "group,M,K,N,layout,device,precision,tf32,gflops_min,gflops_median,gflops_max\n";
  std::printf("%-12s %-17s %-3s | %s\n", "group", "M x K x N", "op", "cuBLAS GFLOP/s min/med/max");
  clustr::Generator gen(1);
  for (const Case& c : cases) {
    Tensor A = Tensor::empty({c.M * c.K}), B = Tensor::empty({c.K * c.N});
    clustr::uniform_(A, gen, -1, 1);
    clustr::uniform_(B, gen, -1, 1);
    A = A.to(clustr::Device::cuda);
    B = B.to(clustr::Device::cuda);
    const Tensor Ah = bf16 ? A.astype(clustr::DType::bf16) : Tensor();
    const Tensor Bh = bf16 ? B.astype(clustr::DType::bf16) : Tensor();
    Tensor C = Tensor::zeros({c.M * c.N}, clustr::DType::f32, clustr::Device::cuda);
    const int64_t lda = c.ta ? c.M : c.K, ldb = c.tb ? c.K : c.N;
    const double flops = 2.0 * c.M * c.N * c.K;
    // The launches are asynchronous: synchronize after the last call of a sample.
    auto calls = [&](int n) {
      for (int i = 0; i < n; ++i)
        if (bf16)
          clustr::cuda::gemm_bf16(c.ta, c.tb, c.M, c.N, c.K, 1.0f, Ah.bf16(), lda, Bh.bf16(), ldb,
                                  0.0f, C.f32(), c.N);
        else
          clustr::cuda::gemm(c.ta, c.tb, c.M, c.N, c.K, 1.0f, A.f32(), lda, B.f32(), ldb, 0.0f,
                             C.f32(), c.N);
      clustr::cuda::synchronize();
    };
    auto sample = [&](int n) {
      calls(1);
      const auto t0 = std::chrono::steady_clock::now();
      calls(n);
      return flops * n / seconds_since(t0) * 1e-9;
    };
    const double one = flops / sample(3) * 1e-9;  // seconds per call
    const int iters = std::max(1, int(sample_ms * 1e-3 / one));
    std::vector<double> g;
    for (int r = 0; r < reps; ++r) {
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(pause_ms));
      g.push_back(sample(iters));
    }
    const Stats s = stats(g);
    char dims[64];
    std::snprintf(dims, sizeof dims, "%ldx%ldx%ld", long(c.M), long(c.K), long(c.N));
    std::printf("%-12s %-17s %-3s | %8.1f %8.1f %8.1f\n", c.group.c_str(), dims,
                c.layout().c_str(), s.min, s.median, s.max);
    std::fflush(stdout);
    csv << c.group << ',' << c.M << ',' << c.K << ',' << c.N << ',' << c.layout() << ",cuda,"
        << (bf16 ? "bf16" : "fp32") << ',' << int(clustr::cuda::tf32()) << ',' << s.min << ',' << s.median << ',' << s.max << '\n';
  }
  std::printf("\nwrote %s\n", csv_path.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  CLI::App app{"clustr GEMM benchmark: ours vs OpenBLAS (cblas_sgemm), interleaved"};
  std::string shapes = "all", csv_path = "bench_gemm.csv";
  std::vector<int> threads = {1, 2};
  int reps = 7;
  double sample_ms = 40, pause_ms = 100;
  bool no_peer = false;
  std::string device = "cpu";
  app.add_option("--shapes", shapes,
                 "all, square, transformer, or encoder (with --precision bf16: one encoder "
                 "step's products as the bf16 policy runs them)")
      ->capture_default_str();
  app.add_option("--threads", threads, "thread counts to run")->capture_default_str();
  app.add_option("--reps", reps, "timed samples per case and library")->capture_default_str()
      ->check(CLI::Range(1, 1000));
  app.add_option("--sample-ms", sample_ms, "target length of one sample")->capture_default_str();
  app.add_option("--pause-ms", pause_ms,
                 "pause between samples, so idle threads of the other library stop spinning")
      ->capture_default_str();
  app.add_option("--csv", csv_path, "CSV output file")->capture_default_str();
  bool overwrite = false;
  app.add_flag("--overwrite", overwrite, "replace --csv if it exists");
  app.add_flag("--no-peer", no_peer, "do not run OpenBLAS");
  app.add_option("--device", device, "cpu (ours and OpenBLAS) or cuda (cuBLAS)")
      ->capture_default_str();
  std::string precision = "fp32", operands = "bf16", kernel;
  app.add_option("--precision", precision, "fp32, or bf16 (our bf16 GEMM, no peer)")
      ->capture_default_str()->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_option("--operands", operands,
                 "with --precision bf16: bf16 operands, or f32 ones rounded as they are packed")
      ->capture_default_str()->check(CLI::IsMember({"bf16", "f32"}));
  app.add_option("--kernel", kernel, "with --precision bf16: amx, avx512bf16 or generic "
                 "(default: the best this CPU has)");
  bool tf32 = false;
  app.add_flag("--tf32", tf32, "with --device cuda: TF32 tensor cores for the f32 GEMM");
  if (const int status = clustr::parse_or_exit(app, argc, argv); status >= 0) return status;
  const std::vector<Case> cases = make_cases(shapes);  // checked before anything is written
  clustr::check_output_file("--csv", csv_path, overwrite, /*folder_must_exist=*/true);
  const bool bf16 = precision == "bf16";
  if (bf16) {
    if (!kernel.empty()) clustr::cpu::set_gemm_bf16_kernel(kernel.c_str());
    no_peer = true;
  }
  const clustr::Device on = clustr::resolve_device(device);
  clustr::apply_tf32(tf32, on);
  if (on == clustr::Device::cuda)
    return run_cuda(cases, reps, sample_ms, pause_ms, csv_path, bf16);

  OpenBlas blas;
  bool peer = !no_peer && blas.load();
  if (bf16)
    std::printf("clustr bf16 GEMM kernel: %s, %s operands, float32 C\n",
                clustr::cpu::gemm_bf16_kernel_name(), operands.c_str());
  else
    std::printf("clustr GEMM kernel: %s\n", clustr::cpu::gemm_kernel_name());
  if (peer)
    std::printf("peer: OpenBLAS %s, core %s (OPENBLAS_CORETYPE=%s)\n",
                blas.config ? blas.config() : "?", blas.corename ? blas.corename() : "?",
                std::getenv("OPENBLAS_CORETYPE"));
  else
    std::printf("peer: none (%s)\n", bf16      ? "bf16: see apps/bench_gemm_torch.py"
                                      : no_peer ? "--no-peer"
                                                : "libopenblas.so.0 not found; apt-get install libopenblas0");
  std::printf("%d samples per case and library, interleaved; %.0f ms pause between samples\n\n",
              reps, pause_ms);

  std::ofstream csv(csv_path);
  CLUSTR_CHECK(csv.good(), "bench_gemm: cannot write ", csv_path);
  csv << "group,M,K,N,layout,precision,operands,kernel,threads,ours_min,ours_median,ours_max,"
         "peer_min,peer_median,peer_max,ratio_median\n";
  std::printf("%-12s %-17s %-3s %3s | %-23s | %-23s | %s\n", "group", "M x K x N", "op", "thr",
              "ours GFLOP/s min/med/max", "OpenBLAS min/med/max", "ratio");

  clustr::Generator gen(1);
  for (const Case& c : cases) {
    // Stored shapes: A is M x K (K x M when transposed), B is K x N (N x K when transposed).
    Tensor A = Tensor::empty({c.M * c.K}), B = Tensor::empty({c.K * c.N});
    Tensor C = Tensor::zeros({c.M * c.N}), Cp = Tensor::zeros({c.M * c.N});
    clustr::uniform_(A, gen, -1, 1);
    clustr::uniform_(B, gen, -1, 1);
    int64_t lda = c.ta ? c.M : c.K, ldb = c.tb ? c.K : c.N;
    double flops = 2.0 * c.M * c.N * c.K;
    // The bf16 operands: the same values rounded (--operands bf16), or the floats themselves.
    const Tensor Ah = bf16 ? A.astype(clustr::DType::bf16) : Tensor();
    const Tensor Bh = bf16 ? B.astype(clustr::DType::bf16) : Tensor();
    const bool f32_ops = operands == "f32";
    const bool a_h = bf16 && (c.policy ? c.a_bf16 : !f32_ops);
    const bool b_h = bf16 && (c.policy ? c.b_bf16 : !f32_ops);
    using clustr::cpu::Operand;
    Tensor Ch = c.c_bf16 ? Tensor::zeros({c.M * c.N}, clustr::DType::bf16) : Tensor();
    std::vector<float> sums(c.row_sums ? size_t(c.M) : 0);
    clustr::cpu::GemmEpilogue epilogue{};
    if (c.row_sums) epilogue.a_row_sums = sums.data();
    const clustr::cpu::GemmBf16Call bf16_call{
        c.ta, c.tb, c.M, c.N, c.K, 1.0f,
        a_h ? static_cast<const void*>(Ah.bf16()) : static_cast<const void*>(A.f32()),
        a_h ? Operand::bf16 : Operand::f32,
        lda,
        b_h ? static_cast<const void*>(Bh.bf16()) : static_cast<const void*>(B.f32()),
        b_h ? Operand::bf16 : Operand::f32,
        ldb, 0.0f, c.c_bf16 ? nullptr : C.f32(), c.N, epilogue,
        c.c_bf16 ? Ch.bf16() : nullptr, nullptr};
    for (int t : threads) {
      clustr::set_num_threads(t);
      if (peer) blas.set_threads(t);
      auto ours = [&] {
        if (bf16) return clustr::cpu::gemm_bf16_call(bf16_call);
        clustr::cpu::gemm(c.ta, c.tb, c.M, c.N, c.K, 1.0f, A.f32(), lda, B.f32(), ldb, 0.0f,
                          C.f32(), c.N);
      };
      auto theirs = [&] {
        blas.run(c.ta, c.tb, int(c.M), int(c.N), int(c.K), A.f32(), int(lda), B.f32(), int(ldb),
                 Cp.f32(), int(c.N));
      };
      // Calibrate the number of calls per sample on ours, so that a sample lasts sample_ms.
      double one = flops / sample_gflops(ours, 3, flops) * 1e-9;  // seconds per call
      int iters = std::max(1, int(sample_ms * 1e-3 / one));
      std::vector<double> g_ours, g_peer, ratio;
      for (int r = 0; r < reps; ++r) {
        std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(pause_ms));
        g_ours.push_back(sample_gflops(ours, iters, flops));
        if (!peer) continue;
        std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(pause_ms));
        g_peer.push_back(sample_gflops(theirs, iters, flops));
        ratio.push_back(g_ours.back() / g_peer.back());
      }
      Stats so = stats(g_ours);
      Stats sp = peer ? stats(g_peer) : Stats{0, 0, 0};
      double rm = peer ? stats(ratio).median : 0;
      char dims[64];
      std::snprintf(dims, sizeof dims, "%ldx%ldx%ld", long(c.M), long(c.K), long(c.N));
      std::printf("%-12s %-17s %-3s %3d | %6.1f %6.1f %6.1f    | %6.1f %6.1f %6.1f    | %.2f\n",
                  c.group.c_str(), dims, c.layout().c_str(), t, so.min, so.median, so.max, sp.min,
                  sp.median, sp.max, rm);
      std::fflush(stdout);
      csv << c.group << ',' << c.M << ',' << c.K << ',' << c.N << ',' << c.layout() << ','
          << precision << ',' << (!bf16 ? "f32" : c.policy ? "policy" : operands.c_str()) << ','
          << (bf16 ? clustr::cpu::gemm_bf16_kernel_name() : clustr::cpu::gemm_kernel_name())
          << ',' << t << ',' << so.min << ',' << so.median << ',' << so.max << ',' << sp.min << ','
          << sp.median << ',' << sp.max << ',' << rm << '\n';
    }
  }
  std::printf("\nwrote %s\n", csv_path.c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_gemm: %s\n", e.what());
  return 1;
}
