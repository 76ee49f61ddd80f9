// CTC loss benchmark: forward + backward of layers/ctc.h on random logits (B, T, V) with
// targets of min..max labels (spread evenly over the batch), every input full length,
// reduction mean. The timed step includes the log-softmax (the op takes logits), the alpha and
// beta recursions, the gradient, and the backward that scales it. Prints milliseconds per step
// (median and min) and writes a CSV. apps/bench_ctc_torch.py runs it beside PyTorch's
// log_softmax + ctc_loss + backward. --device cuda: the logits live in device memory (the
// lengths and targets stay on the host, as a training batch's do) and each step ends with
// cuda::synchronize().
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
#include "core/cuda/cuda.h"
#include "core/error.h"
#include "core/parallel.h"
#include "core/random.h"
#include "layers/ctc.h"

namespace {

using clustr::Tensor;
using clustr::Variable;

// Labels per utterance: min..max spread evenly over the batch.
std::vector<int32_t> target_lengths(int64_t batch, int min_labels, int max_labels) {
  std::vector<int32_t> out;
  for (int64_t b = 0; b < batch; ++b)
    out.push_back(batch == 1 ? min_labels
                             : min_labels + static_cast<int32_t>(
                                                ((max_labels - min_labels) * b + (batch - 1) / 2) /
                                                (batch - 1)));
  return out;
}

}  // namespace

int main(int argc, char** argv) try {
  CLI::App app{"clustr CTC loss benchmark (forward + backward)"};
  int64_t frames = 800, batch = 8, classes = 50;
  int min_labels = 90, max_labels = 110, reps = 20, threads = 0;
  std::string csv_path = "bench_ctc.csv", device_name = "cpu";
  app.add_option("--frames", frames, "T")->capture_default_str();
  app.add_option("--batch", batch, "B")->capture_default_str();
  app.add_option("--classes", classes, "V, blank included")->capture_default_str();
  app.add_option("--min-labels", min_labels, "shortest target")->capture_default_str();
  app.add_option("--max-labels", max_labels, "longest target")->capture_default_str();
  app.add_option("--reps", reps, "timed steps (after one untimed)")
      ->capture_default_str()
      ->check(CLI::Range(1, 10000));
  app.add_option("--threads", threads, "OpenMP threads (0: the default)")->capture_default_str();
  app.add_option("--csv", csv_path, "CSV output file")->capture_default_str();
  app.add_option("--device", device_name, "cpu | cuda")->capture_default_str();
  bool overwrite = false;
  app.add_flag("--overwrite", overwrite, "replace --csv if it exists");
  if (const int status = clustr::parse_or_exit(app, argc, argv); status >= 0) return status;
  clustr::check_output_file("--csv", csv_path, overwrite, /*folder_must_exist=*/true);
  if (threads > 0) clustr::set_num_threads(threads);
  CLUSTR_CHECK(classes >= 2 && min_labels >= 0 && max_labels >= min_labels,
               "bench_ctc: need --classes >= 2 and 0 <= --min-labels <= --max-labels");

  const clustr::Device device = clustr::resolve_device(device_name);
  const bool on_cuda = device == clustr::Device::cuda;

  clustr::Generator gen(1);
  Tensor logits = Tensor::empty({batch, frames, classes});
  clustr::normal_(logits, gen);
  const std::vector<int32_t> lengths = target_lengths(batch, min_labels, max_labels);
  int64_t total = 0;
  for (int32_t n : lengths) total += n;
  Tensor draw = Tensor::empty({total});
  clustr::uniform_(draw, gen, 1.0f, static_cast<float>(classes));
  std::vector<int32_t> labels;
  for (float v : draw.to_vector())
    labels.push_back(std::min(static_cast<int32_t>(v), static_cast<int32_t>(classes - 1)));
  const Tensor targets = Tensor::from_int_vector(labels, {total});
  const Tensor tl = Tensor::from_int_vector(lengths, {batch});
  const Tensor il = Tensor::from_int_vector(
      std::vector<int32_t>(static_cast<size_t>(batch), static_cast<int32_t>(frames)), {batch});

  Variable x(on_cuda ? logits.to(device) : logits, true);
  auto step = [&] {
    clustr::ctc_loss(x, il, targets, tl).loss.backward();
    x.zero_grad();
    if (on_cuda) clustr::cuda::synchronize();  // the kernels run asynchronously
  };
  step();
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    step();
    ms.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() *
                 1e3);
  }
  std::sort(ms.begin(), ms.end());
  std::printf(
      "ctc loss, logits -> loss -> backward (log-softmax included): T=%ld B=%ld V=%ld, "
      "%d..%d labels, %s\n",
      long(frames), long(batch), long(classes), min_labels, max_labels,
      on_cuda ? "the CUDA kernel"
              : clustr::detail::cat(clustr::num_threads(), " threads, ", clustr::ctc_kernel_name(),
                                    " kernel")
                    .c_str());
  std::printf("ms/step median %.3f  min %.3f  (%d steps)\n", ms[ms.size() / 2], ms.front(), reps);
  std::ofstream csv(csv_path);
  CLUSTR_CHECK(csv.good(), "bench_ctc: cannot write ", csv_path);
  csv << "device,frames,batch,classes,min_labels,max_labels,threads,ms_median,ms_min\n"
      << device_name << ',' << frames << ',' << batch << ',' << classes << ',' << min_labels << ',' << max_labels << ','
      << clustr::num_threads() << ',' << ms[ms.size() / 2] << ',' << ms.front() << '\n';
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_ctc: %s\n", e.what());
  return 1;
}
