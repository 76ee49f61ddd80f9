// Attention benchmark (the paper's supplementary C.1 measure): one or more attention types
// (full by default; --attention full clustered improved-clustered shared-full lsh-1 lsh-4: lsh-X
// is lsh attention with X hashing rounds), forward + backward through
// autograd, batch 1, H heads of E dims (6 x 64 by default), for each sequence length N. Prints
// the time and the peak extra memory per sequence element (time / N, bytes / N), writes a CSV
// and optionally the paper's Figure 4 as two PNGs: time per element (--png) and peak memory per
// element (--png-memory) against N, log-log, one line per attention type.
// apps/bench_attention_torch.py runs it beside PyTorch.
//
// Throughput of the measured forward + backward, the last two columns (tflops, gb_per_s):
//   TFLOP/s: full attention's FLOPs counted as FlashAttention's papers do: the forward's two
//            products Q K^T and P V, 2 flops a multiply-add, are 4 B H N S E (S = N keys); the
//            backward's five products 2.5 times that; so 14 B H N S E in all, halved with
//            --causal (only about half the weights exist). Only for full and shared-full ("-"
//            and an empty CSV field for the other types, which compute fewer products).
//   GB/s:    the least traffic of a forward + backward: read Q, K, V, dO, out and logsumexp,
//            write out, logsumexp, dQ, dK and dV, i.e. 9 B H N E + 2 B H N elements, 4 bytes
//            each (inputs and outputs are f32 tensors whatever --precision). The same count for
//            every type, shared-full included (its K and dK are Q and dQ), so that the figure
//            compares types by time on the same operands.
//
// Time: one untimed run (it also gives the memory figures), then --reps timed runs; the median
// and the minimum are reported. With several thread counts (--threads 1 2) the runs of the
// thread counts alternate (one run at each, then the next round), so that a shared host's
// drift falls on all of them alike, and each line also gives the speedup over the first count.
// Memory, two ways:
//   tensor: peak minus live bytes of tensor storage (memory_stats(Device::cpu)) over the run,
//           starting after the inputs Q, K, V and dO exist: outputs, saved tensors, gradients
//           and every kernel's scratch (the attention kernels and the clustering take their
//           scratch from tensors, so the allocator counts it). This is what the plot shows.
//   rss:    growth of the process's peak resident set over the run (VmHWM after the run minus
//           VmRSS before it, the peak reset through /proc/self/clear_refs), which also counts
//           GEMM packing buffers and anything else; -1 where /proc does not allow it. This is
//           how the PyTorch script measures its side. Blocks that the host cache kept from an
//           earlier N are reused without growing the resident set, so this under-counts after
//           the first N of a run; the tensor figure does not.
//
// --device cuda: the inputs live in device memory and every run ends with cuda::synchronize()
// before the clock is read. The tensor figure is the device allocator's peak minus live bytes
// (memory_stats(Device::cuda), reset before each run); rss is not measured there (-1).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "apps/common/device.h"
#include "apps/common/flags.h"
#include "apps/common/plot.h"
#include "apps/common/run_folder.h"
#include "autograd/variable.h"
#include "core/cuda/cuda.h"
#include "core/error.h"
#include "core/parallel.h"
#include "core/precision.h"
#include "core/random.h"
#include "core/tensor.h"
#include "layers/attention/attention.h"

namespace {

using clustr::Tensor;
using clustr::Variable;

// A field of /proc/self/status in bytes ("VmRSS", "VmHWM"), or -1.
long long proc_status_bytes(const char* field) {
  std::ifstream f("/proc/self/status");
  std::string key;
  while (f >> key) {
    if (key == std::string(field) + ":") {
      long long kb = 0;
      f >> kb;
      return kb * 1024;
    }
    std::getline(f, key);
  }
  return -1;
}

// Resets the peak resident set (VmHWM) to the current one; false where not allowed.
bool reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  f.flush();
  return f.good();
}

// FLOPs of one full-attention forward + backward (see the top of the file).
double full_attention_flops(int64_t B, int64_t H, int64_t N, int64_t E, bool causal) {
  const double flops = 14.0 * double(B) * double(H) * double(N) * double(N) * double(E);
  return causal ? flops / 2 : flops;
}

// Bytes of the least traffic of one forward + backward (see the top of the file).
double attention_traffic_bytes(int64_t B, int64_t H, int64_t N, int64_t E) {
  const double rows = double(B) * double(H) * double(N);
  return 4.0 * (9.0 * rows * double(E) + 2.0 * rows);
}

struct Sample {
  double seconds;
  long long tensor_bytes, rss_bytes;
};

// The plot of one measure against N: log-log, one line per series.
void plot(const std::string& path, const std::vector<clustr::plot::Series>& series,
          const std::string& title, const std::string& y_label) {
  clustr::plot::Options o;
  o.title = title;
  o.x_label = "sequence length N";
  o.y_label = y_label;
  o.log_x = o.log_y = true;
  clustr::plot::write_line_plot(path, series, o);
  std::printf("wrote %s\n", path.c_str());
}

// One forward + backward of the configured attention, as a training step would run it (the
// clustered types include hashing and clustering).
// The tensors are on one device (q's), which the memory figures are taken on.
Sample run_once(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                const clustr::AttentionConfig& config, clustr::Precision precision,
                clustr::Generator& gen) {
  const clustr::Device device = q.device();
  const bool on_cuda = device == clustr::Device::cuda;
  // shared-full and lsh: one projection for queries and keys, so K is Q.
  Variable Q(q, true), K = clustr::shares_query_key(config.type) ? Q : Variable(k, true),
                       V(v, true);
  if (on_cuda) clustr::cuda::synchronize();
  const long long live = clustr::memory_stats(device).live_bytes;
  clustr::reset_peak_memory(device);
  const long long rss0 = on_cuda ? -1 : proc_status_bytes("VmRSS");
  const bool rss_ok = !on_cuda && reset_peak_rss() && rss0 >= 0;
  const auto t0 = std::chrono::steady_clock::now();
  {
    const clustr::PrecisionScope scope(precision);
    Variable out = clustr::attention(config, Q, K, V, Tensor(), gen, /*training=*/true);
    out.backward(dout);
  }
  if (on_cuda) clustr::cuda::synchronize();  // the kernels run asynchronously
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const long long hwm = rss_ok ? proc_status_bytes("VmHWM") : -1;
  return {seconds, clustr::memory_stats(device).peak_bytes - live,
          rss_ok && hwm >= 0 ? hwm - rss0 : -1};
}

}  // namespace

int main(int argc, char** argv) try {
  CLI::App app{"clustr attention benchmark: forward + backward time and peak memory per element"};
  std::vector<int64_t> lengths = {512, 1024, 2048, 4096, 8192, 16384};
  int64_t heads = 6, dim = 64, batch = 1, max_full_n = 16384;
  int reps = 3;
  std::vector<int> thread_counts = {0};
  bool causal = false;
  std::vector<std::string> types = {"full"};
  std::string csv_path = "bench_attention.csv", png_path, png_memory_path;
  clustr::AttentionConfig config;
  std::string device_name = "cpu";
  app.add_option("--n", lengths, "sequence lengths N")->capture_default_str();
  app.add_option("--heads", heads, "attention heads H")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--dim", dim, "dims per head E (= M)")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--batch", batch, "batch size B")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--reps", reps, "timed runs per N (after one untimed)")->capture_default_str()
      ->check(CLI::Range(1, 1000));
  app.add_option("--threads", thread_counts,
                 "OpenMP threads (0: the default); several (1 2) alternate run by run")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_flag("--causal", causal, "causal mask (full attention)");
  app.add_option("--attention", types,
                 "one or more of full, clustered, improved-clustered, shared-full, lsh-X (X "
                 "hashing rounds; lsh: --rounds)")
      ->capture_default_str();
  app.add_option("--max-full-n", max_full_n, "longest N run with full and shared-full attention")
      ->capture_default_str();
  app.add_option("--rounds", config.rounds, "hashing rounds of lsh")->capture_default_str();
  app.add_option("--buckets", config.buckets, "hash buckets per round (lsh)")->capture_default_str();
  app.add_option("--chunk", config.chunk, "sorted positions per chunk (lsh)")->capture_default_str();
  app.add_option("--clusters", config.clusters, "clusters C")->capture_default_str();
  app.add_option("--bits", config.bits, "hash bits B")->capture_default_str();
  app.add_option("--iterations", config.iterations, "Lloyd iterations L")->capture_default_str();
  app.add_option("--topk", config.topk, "top-k keys per cluster (improved-clustered)")
      ->capture_default_str();
  app.add_option("--device", device_name, "cpu | cuda")->capture_default_str();
  std::string precision_name = "fp32";
  app.add_option("--precision", precision_name,
                 "fp32 | bf16 (the products with bf16 operands: full attention's, the "
                 "clustered types' C x S ones; the hashing and the per-cluster top-k products "
                 "stay f32)")
      ->capture_default_str();
  bool tf32 = false;
  app.add_flag("--tf32", tf32, "with --device cuda: TF32 tensor cores for the f32 products");
  app.add_option("--csv", csv_path, "CSV output file")->capture_default_str();
  app.add_option("--png", png_path, "also plot time per element against N (log-log) here");
  app.add_option("--png-memory", png_memory_path,
                 "also plot peak memory per element against N (log-log) here");
  bool overwrite = false;
  app.add_flag("--overwrite", overwrite, "replace --csv, --png and --png-memory if they exist");
  if (const int status = clustr::parse_or_exit(app, argc, argv); status >= 0) return status;
  clustr::check_output_file("--csv", csv_path, overwrite, /*folder_must_exist=*/true);
  if (!png_path.empty()) clustr::check_output_file("--png", png_path, overwrite, true);
  if (!png_memory_path.empty())
    clustr::check_output_file("--png-memory", png_memory_path, overwrite, true);
  for (int64_t N : lengths)
    CLUSTR_CHECK(N >= 1, "bench_attention: --n values must be >= 1, got ", N);
  const clustr::Device device = clustr::resolve_device(device_name);
  const clustr::Precision precision = clustr::parse_precision(precision_name);
  clustr::apply_tf32(tf32, device);
  const int default_threads = clustr::num_threads();
  for (int& t : thread_counts)
    if (t == 0) t = default_threads;

  // Each type's configuration (lsh-X: X rounds), all checked before anything is written.
  auto config_of = [&](const std::string& type) {
    clustr::AttentionConfig c = config;
    const clustr::NamedAttention named = clustr::parse_attention_name(type);
    c.type = named.type;
    if (named.rounds > 0) c.rounds = named.rounds;
    c.causal = causal;
    c.validate();
    return c;
  };
  for (const std::string& type : types) config_of(type);

  std::ofstream csv(csv_path);
  CLUSTR_CHECK(csv.good(), "bench_attention: cannot write ", csv_path);
  csv << "attention,N,B,H,E,threads,causal,seconds_median,seconds_min,us_per_element,"
         "tensor_peak_bytes,rss_peak_bytes,bytes_per_element,device,precision,tflops,gb_per_s\n";
  std::vector<clustr::plot::Series> time_series, memory_series;
  const bool several = thread_counts.size() > 1;

  clustr::Generator gen(1);
  for (const std::string& type : types) {
    const clustr::AttentionConfig run = config_of(type);
    std::string counts;
    for (int t : thread_counts) counts += (counts.empty() ? "" : ", ") + std::to_string(t);
    std::printf("%s attention, forward + backward on %s, %s products%s: B=%ld, H=%ld, "
                "E=M=%ld, %s threads, median of %d runs\n",
                run.describe().c_str(), device_name.c_str(), clustr::to_string(precision),
                tf32 ? " (f32 ones in TF32)" : "", long(batch), long(heads), long(dim),
                counts.c_str(), reps);
    std::printf("%7s %7s | %10s %10s %7s | %12s %10s %10s | %12s | %8s %8s\n", "N", "threads",
                "ms", "us/elem", "speedup", "tensor MB", "KB/elem", "B/N^2", "rss MB", "TFLOP/s",
                "GB/s");
    // TFLOP/s only where the full products are computed (see the top of the file).
    const bool full_products = run.type == clustr::AttentionType::full ||
                               run.type == clustr::AttentionType::shared_full;
    std::vector<clustr::plot::Series> series(thread_counts.size());
    clustr::plot::Series memory{type, {}, {}};
    for (size_t t = 0; t < thread_counts.size(); ++t)
      series[t].label =
          several ? type + ", " + std::to_string(thread_counts[t]) + " threads" : type;
    for (int64_t N : lengths) {
      if (full_products && N > max_full_n) continue;
      Tensor q = Tensor::empty({batch, heads, N, dim}), k = Tensor::empty({batch, heads, N, dim});
      Tensor v = Tensor::empty({batch, heads, N, dim}), dout = Tensor::empty({batch, heads, N, dim});
      for (Tensor* t : {&q, &k, &v, &dout}) {
        clustr::normal_(*t, gen);  // drawn on the host: the same inputs on every device
        if (device != clustr::Device::cpu) *t = t->to(device);
      }
      std::vector<Sample> first;
      std::vector<std::vector<double>> times(thread_counts.size());
      for (int r = -1; r < reps; ++r)  // r = -1: the untimed run of each thread count
        for (size_t t = 0; t < thread_counts.size(); ++t) {
          clustr::set_num_threads(thread_counts[t]);
          const Sample sample = run_once(q, k, v, dout, run, precision, gen);
          if (r < 0)
            first.push_back(sample);
          else
            times[t].push_back(sample.seconds);
        }
      double base = 0.0;
      for (size_t t = 0; t < thread_counts.size(); ++t) {
        std::sort(times[t].begin(), times[t].end());
        const double median = times[t][times[t].size() / 2];
        if (t == 0) base = median;
        const double us_per_elem = median / double(N) * 1e6;
        const double bytes_per_elem = double(first[t].tensor_bytes) / double(N);
        const double gb_per_s = attention_traffic_bytes(batch, heads, N, dim) / median * 1e-9;
        const double tflops = full_attention_flops(batch, heads, N, dim, causal) / median * 1e-12;
        char tflops_text[32] = "-";  // "-" (and an empty CSV field) without the full products
        if (full_products) std::snprintf(tflops_text, sizeof tflops_text, "%.2f", tflops);
        std::printf("%7ld %7d | %10.1f %10.2f %7.2f | %12.1f %10.1f %10.2f | %12.1f | %8s %8.2f\n",
                    long(N), thread_counts[t], median * 1e3, us_per_elem, base / median,
                    first[t].tensor_bytes / 1048576.0, bytes_per_elem / 1024.0,
                    double(first[t].tensor_bytes) / (double(N) * double(N)),
                    first[t].rss_bytes < 0 ? -1.0 : first[t].rss_bytes / 1048576.0,
                    tflops_text, gb_per_s);
        std::fflush(stdout);
        csv << type << ',' << N << ',' << batch << ',' << heads << ',' << dim << ','
            << thread_counts[t] << ',' << int(causal) << ',' << median << ',' << times[t].front()
            << ',' << us_per_elem << ',' << first[t].tensor_bytes << ',' << first[t].rss_bytes
            << ',' << bytes_per_elem << ',' << device_name << ',' << clustr::to_string(precision)
            << ',';
        if (full_products) csv << tflops;
        csv << ',' << gb_per_s << '\n';
        series[t].x.push_back(double(N));
        series[t].y.push_back(us_per_elem);
        if (t == thread_counts.size() - 1) {  // memory: at the last (largest) thread count
          memory.x.push_back(double(N));
          memory.y.push_back(bytes_per_elem / 1024.0);
        }
      }
    }
    for (clustr::plot::Series& s : series) time_series.push_back(std::move(s));
    memory_series.push_back(std::move(memory));
  }
  clustr::set_num_threads(default_threads);
  if (!png_path.empty())
    plot(png_path, time_series, "attention, forward + backward", "time per element (us)");
  if (!png_memory_path.empty())
    plot(png_memory_path, memory_series, "attention, forward + backward: peak memory",
         "peak memory per element (KB)");
  std::printf("wrote %s\n", csv_path.c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_attention: %s\n", e.what());
  return 1;
}
