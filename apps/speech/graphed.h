// --cuda-graphs on for the speech app: the training step (forward, CTC loss, backward, and the
// clipping and update decided on the device, optim::DeviceSteps) captured in a CUDA graph per
// batch shape and replayed.
//
// Shapes: a batch's shape is (B utterances, T frames, Pmax), Pmax the positions of its longest
// extended CTC target; length buckets make many of them, each seen once an epoch. A shape seen
// for the first time runs op by op, through the same device step, so that its bits are a
// replay's; seen again, it is captured, and replayed from then on. At most `max_graphs` graphs
// are kept, the least recently used dropped first. They share one memory pool
// (cuda::Graph::capture's share_pool_of): replayed one after another on one stream, they hold
// one step's scratch between them.
//
// Inputs: each graph reads its batch from device buffers of its own (features; lengths and the
// CTC layout, layers/ctc.h's CtcLayout), copied before each replay from one of two pinned host
// buffers used in turn (cuda::PinnedBuffer): the copies are queued without waiting, so the host
// prepares the next batch while the device copies and replays this one, and it waits for a
// buffer's copies (an event recorded after them) only before filling it again. Random draws
// (dropout's stream offsets, the clustered types' hashing) are recorded in the graph's DrawPlan
// at capture and drawn on the host from the training stream before each replay, in the order
// the step op by op draws them (core/random.h), so the stream is where an op-by-op run leaves
// it.
//
// The positional table: a graph reads the table it was captured with, so before each step the
// table is made to hold the step's T positions, and when it was made anew since the graphs were
// captured (by that, or by a forward outside them, e.g. an evaluation of longer utterances),
// every graph is dropped (PositionalEncoding::reserve, generation).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "apps/speech/model.h"
#include "core/cuda/cuda.h"
#include "core/random.h"
#include "data/speech_batch.h"
#include "layers/ctc.h"
#include "optim/optimizer.h"

namespace clustr::speech {

class GraphedSteps {
 public:
  // model and optimizer on the CUDA device; clip as --clip (0: measured only); gen: the
  // training stream; window: the most steps between begin() and end().
  GraphedSteps(SpeechModel& model, optim::Optimizer& optimizer, float clip, Generator& gen,
               int32_t window, size_t max_graphs);
  GraphedSteps(const GraphedSteps&) = delete;
  GraphedSteps& operator=(const GraphedSteps&) = delete;

  int32_t window() const { return device_steps_->window(); }
  // Opens a window: the lr of the update after `done` updates is lr_at(done).
  void begin(const std::function<float(int64_t done)>& lr_at);
  // Queues one step on `batch` (its features and lengths on the cpu, spec-augmented already)
  // with `layout` = ctc_layout of it. When the capture of a new shape fails, the reason is kept
  // (off_reason()) and the step runs op by op; the caller ends the window and goes on without
  // graphs.
  void step(const SpeechBatch& batch, const CtcLayout& layout);
  // Waits for the device: one record per step since begin().
  std::vector<optim::math::StepRecord> end();

  const std::string& off_reason() const { return off_reason_; }
  // Steps run op by op and replayed, captures, graphs dropped as the least recently used and
  // dropped because the positional table was made anew.
  struct Counts {
    int64_t op_by_op = 0, replays = 0, captures = 0, evicted = 0, invalidated = 0;
  };
  const Counts& counts() const { return counts_; }
  size_t graphs() const { return graphs_.size(); }

 private:
  using Shape3 = std::tuple<int64_t, int64_t, int64_t>;  // B, T, Pmax
  struct Entry {
    cuda::Graph graph;
    Tensor features, words;  // (B, T, F); lengths (B) then the layout's words
    std::unique_ptr<DrawPlan> draws;
    uint64_t last_use = 0;
  };
  // forward, loss, backward and the queued device step, reading the given device tensors.
  void body(const Tensor& features, const Tensor& words, const CtcLayout& layout);
  // The new entry's buffers, with the least recently used graph dropped when at the limit.
  Entry& make_entry(const Shape3& shape, const SpeechBatch& batch, const CtcLayout& layout);

  SpeechModel& model_;
  optim::Optimizer& optimizer_;
  Generator& gen_;
  size_t max_graphs_;
  cuda::Stream stream_;
  std::unique_ptr<optim::DeviceSteps> device_steps_;
  std::map<Shape3, Entry> graphs_;
  std::set<Shape3> seen_;  // shapes stepped at least once
  uint64_t uses_ = 0;
  uint64_t table_generation_ = 0;  // the positional table's the graphs were captured with
  std::string off_reason_;
  Counts counts_;
  // The replays' inputs are copied from two pinned buffers in turn: the host fills one while the
  // other's copies may still be queued, and waits for a buffer's event before filling it again.
  struct Staging {
    cuda::PinnedBuffer buffer;
    cuda::Event copied;  // recorded after its copies
    bool queued = false;
  };
  Staging staging_[2];
  int next_staging_ = 0;
};

}  // namespace clustr::speech
