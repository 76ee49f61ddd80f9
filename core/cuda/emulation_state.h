// What the emulated cuBLAS (emulation_blas.cpp) and the launcher (emulation_launch.cpp) ask of
// the emulated runtime (emulation.cpp): access to the device's memory, whether devices are
// switched off, whether a stream is live, whether a range of bytes lies inside one live device
// allocation, and recording an error for cudaGetLastError; and what the warp instructions and
// asynchronous copies (emulation_mma.cpp) ask of the launcher's fibers (emulation_launch.cpp);
// and the schedules (emulation_schedule.cpp) the launcher runs blocks and threads in.
// Internal to device emulation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/cuda/emulation.h"

namespace clustr::cuda::emulation::state {

// While one lives, the device arena (emulation.cpp) is open to the calling code: the emulator's
// own work on device memory (a launch, a copy, a GEMM, a fill). Outside every such scope host
// code that touches device memory faults, and the emulator names it.
class DeviceAccess {
 public:
  DeviceAccess();
  ~DeviceAccess();
  DeviceAccess(const DeviceAccess&) = delete;
  DeviceAccess& operator=(const DeviceAccess&) = delete;
};

bool no_devices();  // CLUSTR_CUDA_EMULATION_DEVICES=0
// Stream capture (emulation_graph.cpp): whether `s` is capturing; recording one piece of work
// (run in order when the graph is launched; a piece that fails returns false and has said why
// on stderr); and failing the capture of `s` for a call a GPU refuses there (its name and why,
// on stderr): returns cudaErrorStreamCaptureUnsupported, also recorded as the last error.
bool capturing(cudaStream_t s);
bool capturing_any();
void record(cudaStream_t s, std::function<bool()> work);
cudaError_t refuse_in_capture(cudaStream_t s, const char* call, const char* why);
void record_error(cudaError_t e);  // what the host thread's next cudaGetLastError returns
bool live_stream(cudaStream_t s);
bool in_one_allocation(const void* p, size_t bytes);

}  // namespace clustr::cuda::emulation::state

namespace clustr::cuda::emulation {

// The warp whose 32 lanes have all arrived at one warp instruction, for its completion.
struct WarpView {
  const char* kernel;
  unsigned warp;                 // of the block
  unsigned block[3];             // the block's coordinates
  const unsigned char* shared;   // the block's shared memory
  size_t shared_bytes;
};
// Runs once per warp instruction, with the lanes' records in lane order: reads their operands
// and writes their results (throws clustr::Error on bad operands).
using WarpComplete = void (*)(void* const* records, const WarpView& warp);
// The running fiber hands its record and waits until its warp's 32 lanes have all arrived at
// the same site; then `complete` has run, and the record holds this lane's results.
void warp_instruction(Fibers* block, void* record, WarpComplete complete, SyncSite site);

// The asynchronous copies of one thread (cp.async), in the order they were started.
struct AsyncCopy {
  unsigned char* dst;
  const unsigned char* src;
  unsigned bytes, src_bytes;
  uint64_t group;  // the commit group it belongs to
};
struct AsyncCopies {
  std::vector<AsyncCopy> pending;
  uint64_t open_group = 0;  // the group that the next copies join (groups before it: committed)
};
// The running fiber's copies, and the block's shared memory (for checking addresses).
AsyncCopies& async_copies(Fibers* block);
void shared_memory(Fibers* block, unsigned char** begin, size_t* bytes);
// "thread (x, y, z) of block (x, y, z)" of the running fiber, for messages.
std::string running_thread(Fibers* block);

// ---- schedules (emulation_schedule.cpp), for the launcher ----

// The order of n threads of a block for one round: out[i] = the i-th to run.
void thread_order(const Schedule& s, uint64_t launch, uint64_t block, uint64_t round,
                  std::vector<unsigned>& out, unsigned n);

// The block that runs i-th of `blocks`: forward, reverse, or an affine bijection of [0, blocks)
// (multiplier coprime with blocks) whose constants the launch draws.
struct BlockOrder {
  Order order = Order::forward;
  uint64_t blocks = 1, mul = 1, add = 0;
  BlockOrder(const Schedule& s, uint64_t launch, uint64_t n);
  uint64_t operator()(uint64_t i) const;
};

}  // namespace clustr::cuda::emulation
