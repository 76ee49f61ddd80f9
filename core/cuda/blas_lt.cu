// Row-major GEMMs with a fused epilogue through cuBLASLt (core/cuda/cuda.h, gemm_epilogue): the
// bias (and ReLU) of a linear layer's forward in the product's store, and the bias gradient of
// its backward read off dy while the product of dW reads it, where gemm (blas.cu) would need a
// kernel of its own after each.
//
// The mapping to cuBLASLt's column-major product is blas.cu's: the row-major C = op(A) op(B) is
// the column-major C^T = op(B)^T op(A)^T, so cuBLASLt's A is our B (transposed as trans_b says),
// its B our A, and m = N, n = M, k = K. In those terms
//   bias (length N, one per row-major column)  = CUBLASLT_EPILOGUE_BIAS, a vector of D's rows;
//   relu_bias                                  = CUBLASLT_EPILOGUE_RELU_BIAS;
//   a_row_sums (length M, sums of op(A)'s rows) = CUBLASLT_EPILOGUE_BGRADB, the sums over k of
//                                                cuBLASLt's op(B), one per column of D.
// cuBLASLt's GELU epilogues are the tanh fit of GELU, not the exact form clustr's layers use
// (core/math.h), so GELU stays a kernel of its own.
//
// Algorithms: the heuristic's first choice with no workspace and no split-K reduction
// (CUBLASLT_REDUCTION_SCHEME_NONE), so a product's result does not depend on the order in
// which blocks finish: the same bits run after run, with and without CUDA graphs. The choice is
// asked once per shape, types, epilogue, TF32 setting and operand alignment, and kept. Where the
// heuristic has none (or cublasLtMatmul refuses its choice with CUBLAS_STATUS_NOT_SUPPORTED),
// gemm_epilogue returns false and the caller runs the unfused composition.
//
// In device emulation the cuBLASLt calls go to the host subset of core/cuda/emulation.h; on a
// GPU build libcublasLt is opened with dlopen at the first such product, as blas.cu opens cuBLAS.
#include <atomic>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>

#include "core/cuda/check.h"
#include "core/cuda/cuda.h"
#include "core/error.h"
#include "core/gemm_args.h"

#if !defined(CLUSTR_CUDA_EMULATION)
#include <cublasLt.h>
#include <dlfcn.h>

#include <type_traits>

#include "core/cuda/toolkit_library.h"
#endif

namespace clustr::cuda {

namespace {

// The cuBLASLt entry points this file calls.
struct LtApi {
  decltype(&cublasLtCreate) create;
  decltype(&cublasLtMatmulDescCreate) desc_create;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set;
  decltype(&cublasLtMatrixLayoutCreate) layout_create;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy;
  decltype(&cublasLtMatmulPreferenceCreate) pref_create;
  decltype(&cublasLtMatmulPreferenceDestroy) pref_destroy;
  decltype(&cublasLtMatmulPreferenceSetAttribute) pref_set;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic;
  decltype(&cublasLtMatmul) matmul;
};

#if defined(CLUSTR_CUDA_EMULATION)
const LtApi& lt() {
  static const LtApi api{&cublasLtCreate,
                         &cublasLtMatmulDescCreate,
                         &cublasLtMatmulDescDestroy,
                         &cublasLtMatmulDescSetAttribute,
                         &cublasLtMatrixLayoutCreate,
                         &cublasLtMatrixLayoutDestroy,
                         &cublasLtMatmulPreferenceCreate,
                         &cublasLtMatmulPreferenceDestroy,
                         &cublasLtMatmulPreferenceSetAttribute,
                         &cublasLtMatmulAlgoGetHeuristic,
                         &cublasLtMatmul};
  return api;
}
#else
// Opens libcublasLt (the toolkit's file that CMake found, then its soname) and resolves every
// entry point; throws naming what failed.
LtApi load_lt() {
  void* lib = open_toolkit_library({CLUSTR_CUBLASLT_LIBRARY, CLUSTR_CUBLASLT_SONAME},
                                   "cuBLASLt (loaded for the first product with an epilogue on "
                                   "the GPU)");
  LtApi api{};
  auto resolve = [&](auto& fn, const char* symbol) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, symbol));
    CLUSTR_CHECK(fn, "cuBLASLt: the library has no ", symbol,
                 " (a toolkit older than this build's?)");
  };
  resolve(api.create, "cublasLtCreate");
  resolve(api.desc_create, "cublasLtMatmulDescCreate");
  resolve(api.desc_destroy, "cublasLtMatmulDescDestroy");
  resolve(api.desc_set, "cublasLtMatmulDescSetAttribute");
  resolve(api.layout_create, "cublasLtMatrixLayoutCreate");
  resolve(api.layout_destroy, "cublasLtMatrixLayoutDestroy");
  resolve(api.pref_create, "cublasLtMatmulPreferenceCreate");
  resolve(api.pref_destroy, "cublasLtMatmulPreferenceDestroy");
  resolve(api.pref_set, "cublasLtMatmulPreferenceSetAttribute");
  resolve(api.heuristic, "cublasLtMatmulAlgoGetHeuristic");
  resolve(api.matmul, "cublasLtMatmul");
  return api;
}

const LtApi& lt() {
  static const LtApi api = load_lt();
  return api;
}
#endif

// A cuBLASLt status other than success, as an error naming the call.
void check_lt(cublasStatus_t s, const char* what) {
  CLUSTR_CHECK(s == CUBLAS_STATUS_SUCCESS, "cuBLASLt: ", what, " failed: ",
               checks::cublas_status_name(s));
}

// CLUSTR_GEMM_EPILOGUES, read once: unset or "on" uses cuBLASLt, "off" never does.
bool epilogues_on() {
  static const bool on = [] {
    const char* v = std::getenv("CLUSTR_GEMM_EPILOGUES");
    if (v == nullptr || std::strcmp(v, "on") == 0) return true;
    if (std::strcmp(v, "off") == 0) return false;
    throw Error(detail::cat("CLUSTR_GEMM_EPILOGUES='", v, "': expected on or off"));
  }();
  return on;
}

// The one handle (thread-safe: the stream is an argument of each product), made on first use
// and never destroyed (as blas.cu's).
cublasLtHandle_t handle() {
  static const cublasLtHandle_t h = [] {
    cublasLtHandle_t made = nullptr;
    check_lt(lt().create(&made), "cublasLtCreate");
    return made;
  }();
  return h;
}

// The descriptors of one product, destroyed with it.
struct Descriptors {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  Descriptors() = default;
  Descriptors(const Descriptors&) = delete;
  Descriptors& operator=(const Descriptors&) = delete;
  ~Descriptors() {
    if (desc) lt().desc_destroy(desc);
    for (cublasLtMatrixLayout_t l : {a, b, c})
      if (l) lt().layout_destroy(l);
  }
};

// The largest power of two, up to 16, that divides the address: cuBLASLt's algorithms depend on
// the operands' alignment, so a choice is kept per alignment.
int alignment(const void* p) {
  const auto u = reinterpret_cast<uintptr_t>(p);
  int a = 1;
  while (a < 16 && u % (2 * a) == 0) a *= 2;
  return a;
}

// The emulated heuristic's answers change when a test switches it (emulation.h); a GPU's do not.
uint64_t heuristic_generation() {
#if defined(CLUSTR_CUDA_EMULATION)
  return emulation::lt_generation();
#else
  return 0;
#endif
}

using PlanKey = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool,
                           int, bool, int, int, int, int, uint64_t>;
struct Plan {
  bool found = false;
  cublasLtMatmulAlgo_t algo{};
};

std::mutex& plans_mutex() {
  static std::mutex m;
  return m;
}

std::map<PlanKey, Plan>& plans() {
  static std::map<PlanKey, Plan> p;
  return p;
}

}  // namespace

bool gemm_epilogue(const EpilogueGemm& g) {
  const char* op = "cuda::gemm_epilogue";
  ::clustr::check_gemm_args(op, g.trans_a, g.trans_b, g.M, g.N, g.K, g.lda, g.ldb, g.ldc);
  if (g.M == 0 || g.N == 0 || g.K == 0 || !epilogues_on()) return false;
  CLUSTR_CHECK(g.A && g.B && g.C && g.vec, op, ": null A, B, C or vector for a ", g.M, " x ",
               g.N, " x ", g.K, " product");
  for (int64_t v : {g.M, g.N, g.K, g.lda, g.ldb, g.ldc})
    CLUSTR_CHECK(v <= INT_MAX, op, ": a size or leading dimension ", v,
                 " exceeds cuBLASLt's 32-bit limit here");
  require(op);
  const bool tf32_math = !g.bf16 && tf32();
  const cublasLtEpilogue_t epilogue = g.epilogue == GemmEpilogue::bias ? CUBLASLT_EPILOGUE_BIAS
                                      : g.epilogue == GemmEpilogue::relu_bias
                                          ? CUBLASLT_EPILOGUE_RELU_BIAS
                                          : CUBLASLT_EPILOGUE_BGRADB;
  const cudaDataType ab_type = g.bf16 ? CUDA_R_16BF : CUDA_R_32F;
  const cublasComputeType_t compute =
      tf32_math ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  // cuBLASLt's operands (see the top of the file): its A is our B, its B our A.
  const cublasOperation_t op_a = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const uint64_t a_rows = g.trans_b ? g.K : g.N, a_cols = g.trans_b ? g.N : g.K;
  const uint64_t b_rows = g.trans_a ? g.M : g.K, b_cols = g.trans_a ? g.K : g.M;

  const PlanKey key{g.trans_a, g.trans_b, g.M, g.N, g.K, g.lda, g.ldb, g.ldc, g.bf16,
                    static_cast<int>(g.epilogue), tf32_math, alignment(g.A), alignment(g.B),
                    alignment(g.C), alignment(g.vec), heuristic_generation()};
  {  // a product known to have no algorithm goes to the composed path before any descriptor
    std::lock_guard<std::mutex> lock(plans_mutex());
    const auto it = plans().find(key);
    if (it != plans().end() && !it->second.found) return false;
  }
  Descriptors d;
  check_lt(lt().desc_create(&d.desc, compute, CUDA_R_32F), "cublasLtMatmulDescCreate");
  const void* vec = g.vec;
  check_lt(lt().desc_set(d.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a),
           "setting TRANSA");
  check_lt(lt().desc_set(d.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b),
           "setting TRANSB");
  const uint32_t e = epilogue;
  check_lt(lt().desc_set(d.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e), "setting EPILOGUE");
  check_lt(lt().desc_set(d.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &vec, sizeof vec),
           "setting BIAS_POINTER");
  check_lt(lt().layout_create(&d.a, ab_type, a_rows, a_cols, g.ldb), "cublasLtMatrixLayoutCreate");
  check_lt(lt().layout_create(&d.b, ab_type, b_rows, b_cols, g.lda), "cublasLtMatrixLayoutCreate");
  check_lt(lt().layout_create(&d.c, CUDA_R_32F, g.N, g.M, g.ldc), "cublasLtMatrixLayoutCreate");

  Plan plan;
  {
    std::lock_guard<std::mutex> lock(plans_mutex());
    const auto it = plans().find(key);
    if (it != plans().end()) {
      plan = it->second;
    } else {
      cublasLtMatmulPreference_t pref = nullptr;
      check_lt(lt().pref_create(&pref), "cublasLtMatmulPreferenceCreate");
      const uint64_t workspace = 0;
      const uint32_t reduction = CUBLASLT_REDUCTION_SCHEME_NONE;
      cublasStatus_t s = lt().pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                        sizeof workspace);
      if (s == CUBLAS_STATUS_SUCCESS)
        s = lt().pref_set(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reduction,
                          sizeof reduction);
      cublasLtMatmulHeuristicResult_t result{};
      int returned = 0;
      if (s == CUBLAS_STATUS_SUCCESS)
        s = lt().heuristic(handle(), d.desc, d.a, d.b, d.c, d.c, pref, 1, &result, &returned);
      lt().pref_destroy(pref);
      // No algorithm (CUBLAS_STATUS_NOT_SUPPORTED, or none returned): the unfused path.
      CLUSTR_CHECK(s == CUBLAS_STATUS_SUCCESS || s == CUBLAS_STATUS_NOT_SUPPORTED,
                   "cuBLASLt: cublasLtMatmulAlgoGetHeuristic failed: ",
                   checks::cublas_status_name(s));
      plan.found = s == CUBLAS_STATUS_SUCCESS && returned > 0 &&
                   result.state == CUBLAS_STATUS_SUCCESS && result.workspaceSize == 0;
      plan.algo = result.algo;
      plans()[key] = plan;
    }
  }
  if (!plan.found) return false;
  const float alpha = 1.0f, beta = 0.0f;
  const cublasStatus_t s = lt().matmul(handle(), d.desc, &alpha, g.B, d.a, g.A, d.b, &beta, g.C,
                                       d.c, g.C, d.c, &plan.algo, nullptr, 0, current_stream());
  if (s == CUBLAS_STATUS_NOT_SUPPORTED) {  // refused after all: the composed path from now on
    std::lock_guard<std::mutex> lock(plans_mutex());
    plans()[key].found = false;
    return false;
  }
  check_lt(s, "cublasLtMatmul");
  counting::blas_call();
  return true;
}

}  // namespace clustr::cuda
