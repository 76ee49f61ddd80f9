// Device emulation of stream capture and CUDA graphs (declared in core/cuda/emulation.h): while
// a stream captures, the launcher, the cuBLAS subset and device-to-device copies record their
// work here instead of running it, and the calls a GPU refuses during capture fail it; a graph
// is the record, and launching its executable runs the record in order. Compiled only with
// -DCLUSTR_CUDA=EMULATE.
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include "core/cuda/emulation.h"
#include "core/cuda/emulation_state.h"

// The graph and its executable: the recorded work, shared (instantiating copies no work).
using Work = std::vector<std::function<bool()>>;
struct CUgraph_st {
  std::shared_ptr<const Work> work;
};
struct CUgraphExec_st {
  std::shared_ptr<const Work> work;
};

namespace {

struct Capture {
  std::shared_ptr<Work> work = std::make_shared<Work>();
  bool invalidated = false;
};

struct Captures {
  std::mutex mu;
  std::map<cudaStream_t, Capture> by_stream;
  std::set<const void*> graphs, execs;  // the live ones
};

// Never destroyed, like the emulator's other registries.
Captures& captures() {
  static Captures* c = new Captures;
  return *c;
}

cudaError_t fail(cudaError_t e) {
  clustr::cuda::emulation::state::record_error(e);
  return e;
}

}  // namespace

namespace clustr::cuda::emulation::state {

bool capturing(cudaStream_t s) {
  Captures& c = captures();
  std::lock_guard<std::mutex> lock(c.mu);
  return c.by_stream.count(s) == 1;
}

bool capturing_any() {
  Captures& c = captures();
  std::lock_guard<std::mutex> lock(c.mu);
  return !c.by_stream.empty();
}

void record(cudaStream_t s, std::function<bool()> work) {
  Captures& c = captures();
  std::lock_guard<std::mutex> lock(c.mu);
  auto it = c.by_stream.find(s);
  if (it != c.by_stream.end() && !it->second.invalidated) it->second.work->push_back(std::move(work));
}

cudaError_t refuse_in_capture(cudaStream_t s, const char* call, const char* why) {
  {
    Captures& c = captures();
    std::lock_guard<std::mutex> lock(c.mu);
    auto it = c.by_stream.find(s);
    if (it != c.by_stream.end()) it->second.invalidated = true;
  }
  std::fprintf(stderr, "clustr device emulation: %s while stream %p captures a CUDA graph: %s\n",
               call, static_cast<const void*>(s), why);
  return fail(cudaErrorStreamCaptureUnsupported);
}

}  // namespace clustr::cuda::emulation::state

using namespace clustr::cuda::emulation;

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
      mode != cudaStreamCaptureModeRelaxed)
    return fail(cudaErrorInvalidValue);
  if (!state::live_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
  if (stream == nullptr) {
    std::fprintf(stderr, "clustr device emulation: cudaStreamBeginCapture on the legacy default "
                 "stream, which cannot capture\n");
    return fail(cudaErrorStreamCaptureUnsupported);
  }
  Captures& c = captures();
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.by_stream.count(stream)) return fail(cudaErrorStreamCaptureUnsupported);  // nested
  c.by_stream[stream];
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  if (graph == nullptr) return fail(cudaErrorInvalidValue);
  *graph = nullptr;
  Captures& c = captures();
  std::lock_guard<std::mutex> lock(c.mu);
  auto it = c.by_stream.find(stream);
  if (it == c.by_stream.end()) return fail(cudaErrorInvalidValue);  // not capturing
  const bool invalidated = it->second.invalidated;
  std::shared_ptr<const Work> work = std::move(it->second.work);
  c.by_stream.erase(it);
  if (invalidated) return fail(cudaErrorStreamCaptureInvalidated);
  *graph = new CUgraph_st{std::move(work)};
  c.graphs.insert(*graph);
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  if (status == nullptr) return fail(cudaErrorInvalidValue);
  if (!state::live_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
  Captures& c = captures();
  std::lock_guard<std::mutex> lock(c.mu);
  auto it = c.by_stream.find(stream);
  *status = it == c.by_stream.end() ? cudaStreamCaptureStatusNone
            : it->second.invalidated ? cudaStreamCaptureStatusInvalidated
                                     : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph,
                                 unsigned long long flags) {
  if (exec == nullptr || flags != 0) return fail(cudaErrorInvalidValue);
  Captures& c = captures();
  std::lock_guard<std::mutex> lock(c.mu);
  if (!c.graphs.count(graph)) return fail(cudaErrorInvalidValue);
  *exec = new CUgraphExec_st{graph->work};
  c.execs.insert(*exec);
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  std::shared_ptr<const Work> work;
  {
    Captures& c = captures();
    std::lock_guard<std::mutex> lock(c.mu);
    if (!c.execs.count(exec)) return fail(cudaErrorInvalidValue);
    work = exec->work;
  }
  if (!state::live_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
  if (state::capturing(stream))
    return state::refuse_in_capture(stream, "cudaGraphLaunch", "graphs within graphs are not "
                                    "emulated");
  for (const std::function<bool()>& w : *work)
    if (!w()) return fail(cudaErrorLaunchFailure);  // the piece said why on stderr
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  Captures& c = captures();
  std::lock_guard<std::mutex> lock(c.mu);
  if (!c.execs.erase(exec)) return fail(cudaErrorInvalidValue);
  delete exec;
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  Captures& c = captures();
  std::lock_guard<std::mutex> lock(c.mu);
  if (!c.graphs.erase(graph)) return fail(cudaErrorInvalidValue);
  delete graph;
  return cudaSuccess;
}
