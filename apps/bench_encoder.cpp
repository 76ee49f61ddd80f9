// Encoder-layer benchmark: one EncoderLayer of the copy-task model (D = 192, 6 heads x 32,
// feed-forward 768, ReLU, post-norm, full attention, dropout 0), forward + backward through
// autograd with the input requiring grad (as inside a stack), for batch x length shapes.
// Prints microseconds per token (time of one step / (B * N)) and writes a CSV.
// apps/bench_encoder_torch.py runs it beside PyTorch's nn.TransformerEncoderLayer.
// --precision bf16: the products with bf16 operands (core/precision.h), as PyTorch's autocast.
// --device cuda: the layer and its inputs in device memory; each step ends with
// cuda::synchronize() before the clock is read, and the table gives the kernel launches and
// cuBLAS calls of a step.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "apps/common/device.h"
#include "apps/common/flags.h"
#include "apps/common/run_folder.h"
#include "core/cpu/gemm.h"
#include "core/cpu/gemm_bf16.h"
#include "core/cuda/cuda.h"
#include "core/error.h"
#include "core/parallel.h"
#include "core/precision.h"
#include "core/random.h"
#include "layers/encoder.h"

namespace {

using clustr::Tensor;
using clustr::Variable;

struct Shape2 {
  int64_t batch, length;
};

// "32x64" -> {32, 64}: two whole numbers from 1 to 2^20 around one 'x', nothing else.
Shape2 parse_shape(const std::string& s) {
  auto number = [&](const std::string& part) {
    int64_t v = 0;
    bool ok = !part.empty() && part.size() <= 7;
    for (char ch : part) ok = ok && ch >= '0' && ch <= '9';
    if (ok) v = std::stoll(part);
    CLUSTR_CHECK(ok && v >= 1 && v <= (int64_t{1} << 20), "--shapes expects ",
                 "B x N as two whole numbers from 1 to 1048576 joined by 'x' (e.g. 32x64), got '",
                 s, "'");
    return v;
  };
  const size_t x = s.find('x');
  CLUSTR_CHECK(x != std::string::npos, "--shapes expects B x N as 32x64, got '",
               s, "'");
  return {number(s.substr(0, x)), number(s.substr(x + 1))};
}

}  // namespace

int main(int argc, char** argv) try {
  CLI::App app{"clustr encoder-layer benchmark (forward + backward)"};
  std::vector<std::string> shapes = {"32x64", "32x128", "32x256", "32x512",
                                     "4x1024", "4x2048", "4x4096"};
  int64_t dim = 192, heads = 6, hidden = 768;
  int reps = 5, threads = 0;
  std::string csv_path = "bench_encoder.csv";
  app.add_option("--shapes", shapes, "batch x length, e.g. 32x64 (several: spaces or commas)")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--dim", dim, "model width D")->capture_default_str();
  app.add_option("--heads", heads, "heads H")->capture_default_str();
  app.add_option("--hidden", hidden, "feed-forward width")->capture_default_str();
  app.add_option("--reps", reps, "timed steps per shape (after one untimed)")
      ->capture_default_str()->check(CLI::Range(1, 1000));
  app.add_option("--threads", threads, "OpenMP threads (0: the default)")->capture_default_str();
  app.add_option("--csv", csv_path, "CSV output file")->capture_default_str();
  bool overwrite = false;
  app.add_flag("--overwrite", overwrite, "replace --csv if it exists");
  std::string precision_name = "fp32";
  app.add_option("--precision", precision_name, "fp32 | bf16 (the products' precision)")
      ->capture_default_str();
  std::string device_name = "cpu";
  app.add_option("--device", device_name, "cpu | cuda")->capture_default_str();
  bool tf32 = false;
  app.add_flag("--tf32", tf32, "with --device cuda: TF32 tensor cores for the f32 products");
  if (const int status = clustr::parse_or_exit(app, argc, argv); status >= 0) return status;
  clustr::check_output_file("--csv", csv_path, overwrite, /*folder_must_exist=*/true);
  if (threads > 0) clustr::set_num_threads(threads);
  const clustr::Precision precision = clustr::parse_precision(precision_name);
  const clustr::Device device = clustr::resolve_device(device_name);
  const bool on_cuda = device == clustr::Device::cuda;
  clustr::apply_tf32(tf32, device);
  std::vector<Shape2> parsed;  // all checked before the first one runs
  for (const std::string& s : shapes) parsed.push_back(parse_shape(s));

  clustr::Generator gen(1);
  clustr::AttentionConfig attention;  // full
  clustr::EncoderLayer layer(dim, heads, hidden, attention, 0.0f, clustr::Activation::relu,
                             /*pre_norm=*/false, gen);
  layer.to(device);
  std::ofstream csv(csv_path);
  CLUSTR_CHECK(csv.good(), "cannot write ", csv_path);
  csv << "batch,length,precision,us_per_token_median,us_per_token_min,device,tf32,"
         "launches_per_step,cublas_per_step\n";
  std::printf("encoder layer D=%ld H=%ld F=%ld, forward + backward on %s, %d threads, %s "
              "products (GEMM %s)\n",
              long(dim), long(heads), long(hidden), device_name.c_str(), clustr::num_threads(),
              clustr::to_string(precision),
              on_cuda ? (tf32 ? "cuBLAS, TF32" : "cuBLAS")
              : precision == clustr::Precision::bf16 ? clustr::cpu::gemm_bf16_kernel_name()
                                                     : clustr::cpu::gemm_kernel_name());
  std::printf("%6s %6s | %12s %12s | %9s %6s\n", "B", "N", "us/token med", "us/token min",
              "launches", "cuBLAS");
  for (const Shape2& shape : parsed) {
    Tensor x0 = Tensor::empty({shape.batch, shape.length, dim});
    Tensor dout = Tensor::empty({shape.batch, shape.length, dim});
    clustr::normal_(x0, gen);  // drawn on the host: the same inputs on every device
    clustr::normal_(dout, gen);
    x0 = clustr::on_device(x0, device);
    dout = clustr::on_device(dout, device);
    Variable x(x0, true);
    auto step = [&] {
      const clustr::PrecisionScope scope(precision);
      layer.forward(x, Tensor(), gen).backward(dout);
      layer.zero_grad();
      x.zero_grad();
      if (on_cuda) clustr::cuda::synchronize();  // the kernels run asynchronously
    };
    step();
    std::vector<double> us;
    clustr::cuda::LaunchCounts before{};
    if (on_cuda) before = clustr::cuda::launch_counts();
    for (int r = 0; r < reps; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      step();
      double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      us.push_back(sec * 1e6 / double(shape.batch * shape.length));
    }
    double launches = -1, blas = -1;
    if (on_cuda) {
      const clustr::cuda::LaunchCounts after = clustr::cuda::launch_counts();
      launches = double(after.kernels - before.kernels) / reps;
      blas = double(after.blas - before.blas) / reps;
    }
    std::sort(us.begin(), us.end());
    std::printf("%6ld %6ld | %12.2f %12.2f | ", long(shape.batch), long(shape.length),
                us[us.size() / 2], us.front());
    if (on_cuda)
      std::printf("%9.0f %6.0f\n", launches, blas);
    else
      std::printf("%9s %6s\n", "-", "-");
    std::fflush(stdout);
    csv << shape.batch << ',' << shape.length << ',' << clustr::to_string(precision) << ','
        << us[us.size() / 2] << ',' << us.front() << ',' << device_name << ',' << (tf32 ? 1 : 0)
        << ',' << launches << ',' << blas << '\n';
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_encoder: %s\n", e.what());
  return 1;
}
