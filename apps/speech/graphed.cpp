// The speech app's training step in CUDA graphs (graphed.h).
#include "apps/speech/graphed.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace clustr::speech {

namespace {

// The device words a step's random draws take in its DrawPlan (see the copy task's): far more
// than the presets need.
constexpr int64_t kPlanWords = 1 << 18;

// A batch's lengths followed by its CTC layout: what the step reads as i32 words.
std::vector<int32_t> step_words(const SpeechBatch& b, const CtcLayout& layout) {
  std::vector<int32_t> w = b.lengths.to_int_vector();
  w.insert(w.end(), layout.words.begin(), layout.words.end());
  return w;
}

}  // namespace

GraphedSteps::GraphedSteps(SpeechModel& model, optim::Optimizer& optimizer, float clip,
                           Generator& gen, int32_t window, size_t max_graphs)
    : model_(model), optimizer_(optimizer), gen_(gen), max_graphs_(max_graphs) {
  CLUSTR_CHECK(max_graphs >= 1, "GraphedSteps: keep at least one graph, got ", max_graphs);
  cuda::StreamGuard on_stream(stream_);
  device_steps_ = std::make_unique<optim::DeviceSteps>(optimizer_, clip, window);
}

void GraphedSteps::begin(const std::function<float(int64_t done)>& lr_at) {
  cuda::StreamGuard on_stream(stream_);
  device_steps_->prepare(lr_at);
}

std::vector<optim::math::StepRecord> GraphedSteps::end() {
  cuda::StreamGuard on_stream(stream_);
  std::vector<optim::math::StepRecord> records = device_steps_->collect();
  cuda::raise_device_errors();
  return records;
}

void GraphedSteps::body(const Tensor& features, const Tensor& words, const CtcLayout& layout) {
  const int64_t B = layout.B;
  optimizer_.zero_grad();
  model_.train();
  const Variable logits = model_.forward(features, words.rows(0, B), gen_);  // (B, T, V)
  CtcOptions co;
  co.zero_infinity = true;
  const CtcLoss loss = ctc_loss(logits, layout, words.rows(B, words.numel()), co);
  loss.loss.backward();
  device_steps_->queue_step(loss.loss.data());
}

GraphedSteps::Entry& GraphedSteps::make_entry(const Shape3& shape, const SpeechBatch& b,
                                              const CtcLayout& layout) {
  if (graphs_.size() >= max_graphs_) {
    auto oldest = std::min_element(graphs_.begin(), graphs_.end(),
                                   [](const auto& x, const auto& y) {
                                     return x.second.last_use < y.second.last_use;
                                   });
    graphs_.erase(oldest);
    ++counts_.evicted;
  }
  Entry e;
  e.features = Tensor::empty(b.features.shape(), DType::f32, Device::cuda);
  e.words = Tensor::empty({layout.B + static_cast<int64_t>(layout.words.size())}, DType::i32,
                          Device::cuda);
  e.draws = std::make_unique<DrawPlan>(kPlanWords, Device::cuda);
  return graphs_.emplace(shape, std::move(e)).first->second;
}

void GraphedSteps::step(const SpeechBatch& b, const CtcLayout& layout) {
  cuda::StreamGuard on_stream(stream_);
  const int64_t T = b.features.size(1);
  // A graph reads the positional table it was captured with: one made anew (here, or in a
  // forward outside the graphs, e.g. an evaluation's) drops them all.
  model_.reserve_positions(T, Device::cuda);
  if (model_.positions_generation() != table_generation_) {
    counts_.invalidated += static_cast<int64_t>(graphs_.size());
    graphs_.clear();
    table_generation_ = model_.positions_generation();
  }
  const Shape3 shape{layout.B, T, layout.Pmax};
  auto it = graphs_.find(shape);
  if (it == graphs_.end() && off_reason_.empty() && seen_.count(shape)) {
    // Seen before: capture it, into the pool of the graphs kept (any one of them).
    Entry& e = make_entry(shape, b, layout);
    const cuda::Graph* pool_of = nullptr;
    for (const auto& kept : graphs_)
      if (&kept.second != &e) pool_of = &kept.second.graph;
    gen_.record_into(e.draws.get());  // the step's draws become the plan's, drawn per replay
    try {
      e.graph.capture([&] { body(e.features, e.words, layout); }, pool_of);
      ++counts_.captures;
    } catch (const Error& err) {
      off_reason_ = detail::cat("the step of batch shape (", layout.B, " utterances, ", T,
                                " frames) could not be captured: ", err.what());
    }
    gen_.record_into(nullptr);
    optimizer_.zero_grad();  // the graph keeps its own gradients
    if (off_reason_.empty()) {
      it = graphs_.find(shape);
    } else {
      graphs_.erase(shape);
    }
  }
  seen_.insert(shape);
  if (it == graphs_.end()) {  // op by op
    ++counts_.op_by_op;
    const std::vector<int32_t> w = step_words(b, layout);
    body(b.features.to(Device::cuda),
         Tensor::from_int_vector(w, {static_cast<int64_t>(w.size())}, Device::cuda), layout);
    return;
  }
  Entry& e = it->second;
  e.last_use = ++uses_;
  // The replay's inputs go through the next pinned buffer: its copies are queued, and the host
  // goes on to the next batch while the device copies and replays.
  const size_t feature_bytes = static_cast<size_t>(b.features.numel()) * sizeof(float);
  const size_t length_bytes = static_cast<size_t>(layout.B) * sizeof(int32_t);
  const size_t word_bytes = length_bytes + layout.words.size() * sizeof(int32_t);
  const size_t draw_bytes = static_cast<size_t>(e.draws->words()) * sizeof(float);
  auto aligned = [](size_t n) { return (n + 63) / 64 * 64; };
  const size_t at_words = aligned(feature_bytes), at_draws = at_words + aligned(word_bytes);
  Staging& s = staging_[next_staging_];
  next_staging_ ^= 1;
  if (s.queued) s.copied.synchronize();  // its copies of two replays ago have run
  if (s.buffer.bytes() < at_draws + draw_bytes)
    s.buffer = cuda::PinnedBuffer((at_draws + draw_bytes) * 3 / 2);
  char* host = static_cast<char*>(s.buffer.data());
  std::memcpy(host, b.features.f32(), feature_bytes);
  std::memcpy(host + at_words, b.lengths.i32(), length_bytes);  // step_words' order
  std::memcpy(host + at_words + length_bytes, layout.words.data(), word_bytes - length_bytes);
  if (draw_bytes > 0) e.draws->fill(gen_, reinterpret_cast<float*>(host + at_draws));
  cuda::copy_h2d_async(e.features.f32(), host, feature_bytes);
  cuda::copy_h2d_async(e.words.i32(), host + at_words, word_bytes);
  cuda::copy_h2d_async(e.draws->memory().f32(), host + at_draws, draw_bytes);
  s.copied.record();
  s.queued = true;
  e.graph.replay();
  ++counts_.replays;
}

}  // namespace clustr::speech
