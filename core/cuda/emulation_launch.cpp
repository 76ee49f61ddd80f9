// Device emulation's kernel launcher (see core/cuda/emulation.h, part 2): a block's threads run
// in turn or as fibers (barriers, warp shuffles), in the order of the schedule
// (emulation_schedule.cpp), and ThreadSanitizer's view of them. The runtime subset is
// emulation.cpp. Compiled only with -DCLUSTR_CUDA=EMULATE.
#include <ucontext.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#define CLUSTR_TSAN_FIBERS 1
#endif
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#include "core/cuda/emulation.h"
#include "core/cuda/emulation_state.h"
#include "core/error.h"

// ---- the launcher ----------------------------------------------------------------------------------

namespace clustr::cuda::emulation {

void sync_without_barrier(const char* kernel) {
  throw Error(detail::cat("kernel '", kernel, "' called t.sync() but declares kUsesBarrier = "
                          "false; set it to true (the emulator then runs the block's threads "
                          "concurrently)"));
}

float atomic_add_f32(float* p, float v) {
  float expected;
  __atomic_load(p, &expected, __ATOMIC_RELAXED);
  float desired;
  do {
    desired = expected + v;
  } while (!__atomic_compare_exchange(p, &expected, &desired, false, __ATOMIC_RELAXED,
                                      __ATOMIC_RELAXED));
  return expected;
}

namespace {

std::atomic<uint64_t> launch_counter{0};

}  // namespace

namespace {

constexpr size_t kMaxSharedBytes = kMaxSharedPerBlock;  // with the opt-in that launch() makes

bool valid_config(const Launch& l) {
  const uint64_t threads = uint64_t(l.block[0]) * l.block[1] * l.block[2];
  return l.block[0] <= 1024 && l.block[1] <= 1024 && l.block[2] <= 64 && threads <= 1024 &&
         l.grid[0] <= 0x7fffffffu && l.grid[1] <= 65535 && l.grid[2] <= 65535 &&
         l.shared_bytes <= kMaxSharedBytes;
}

// Block number b (x fastest) as (x, y, z).
void block_coords(const Launch& l, uint64_t b, unsigned out[3]) {
  out[0] = static_cast<unsigned>(b % l.grid[0]);
  out[1] = static_cast<unsigned>(b / l.grid[0] % l.grid[1]);
  out[2] = static_cast<unsigned>(b / (uint64_t(l.grid[0]) * l.grid[1]));
}

ThreadState base_state(const Launch& l, unsigned char* shared, Fibers* fibers) {
  ThreadState s{};
  for (int d = 0; d < 3; ++d) {
    s.block_dim[d] = l.block[d];
    s.grid_dim[d] = l.grid[d];
  }
  s.shared = shared;
  s.fibers = fibers;
  s.kernel_name = l.name;
  return s;
}

// Fresh shared memory holds garbage on a GPU; here it holds NaN bytes, so that a kernel reading
// shared memory it never wrote computes NaN rather than a plausible 0.
std::vector<unsigned char> poisoned_shared(size_t bytes) {
  return std::vector<unsigned char>(bytes, 0xff);
}

// Thread number id of a block (x fastest) into s.thread.
void set_thread(const Launch& l, unsigned id, ThreadState& s) {
  s.thread[0] = id % l.block[0];
  s.thread[1] = id / l.block[0] % l.block[1];
  s.thread[2] = id / (l.block[0] * l.block[1]);
}

// No barrier: each block's threads run one after another, in the schedule's order; blocks in
// parallel when OpenMP is on (in the schedule's order on each thread).
void run_sequential(const Launch& l, uint64_t blocks, const Schedule& sched, uint64_t launch) {
  std::exception_ptr error;
  std::mutex error_mu;
  const unsigned n = l.block[0] * l.block[1] * l.block[2];
  const BlockOrder block_at(sched, launch, blocks);
#pragma omp parallel for schedule(dynamic, 1) if (blocks > 1)
  for (uint64_t i = 0; i < blocks; ++i) {
    try {
      const uint64_t b = block_at(i);
      std::vector<unsigned char> shared = poisoned_shared(l.shared_bytes);
      ThreadState s = base_state(l, shared.data(), nullptr);
      block_coords(l, b, s.block);
      std::vector<unsigned> order;
      thread_order(sched, launch, b, 0, order, n);
      for (unsigned id : order) {
        set_thread(l, id, s);
        l.run(l.kernel, s);
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mu);
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

// ---- barrier mode: the threads of a block as fibers ----
//
// A Fibers object belongs to one host thread and runs blocks one at a time. Each CUDA thread of
// the block is a fiber (Context, above) with its own stack; run_block() resumes the fibers in the
// schedule's order, each running until its next t.sync() or its end, and repeats these rounds:
// after a round every fiber is either waiting at a barrier (then all are resumed) or finished
// (the block is done); a mix of the two is a divergent barrier, and so are fibers waiting at
// different t.sync() calls.

#if defined(__SANITIZE_ADDRESS__)
#define CLUSTR_ASAN_FIBERS 1
#endif

#if defined(CLUSTR_ASAN_FIBERS) || defined(CLUSTR_TSAN_FIBERS)
constexpr size_t kFiberStack = 256 * 1024;  // a sanitizer's instrumentation needs more room
#else
constexpr size_t kFiberStack = 64 * 1024;
#endif

// Switching between fibers. On x86-64 a switch is a few instructions of our own (below): it
// pushes the callee-saved registers and the floating-point control words on the running
// fiber's stack, saves the stack pointer, and pops the other fiber's. glibc's swapcontext also
// saves and restores the signal mask, a system call each way, which was most of the time of a
// barrier-heavy test (and more so of the warp instructions, a warp barrier each). Elsewhere the
// switch is swapcontext. Neither is seen by the sanitizers' interceptors: the switches carry
// their own annotations (__sanitizer_start_switch_fiber and __sanitizer_finish_switch_fiber,
// __tsan_switch_to_fiber). A frame that leaves its redzones poisoned without returning is a fiber
// stopped for good inside a failed block: settle() clears its stack once.
#if defined(__x86_64__)
extern "C" void clustr_fiber_switch(void** save_sp, void* next_sp);
asm(R"(
  .text
  .p2align 4
  .globl clustr_fiber_switch
  .type clustr_fiber_switch, @function
clustr_fiber_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size clustr_fiber_switch, .-clustr_fiber_switch
  .section .note.GNU-stack,"",@progbits
  .text
)");

struct Context {
  void* sp = nullptr;
};
// A context that starts `entry` (which never returns) on the given stack at its first switch:
// the stack holds what clustr_fiber_switch pops (control words, six registers, entry as the
// return address) and a null return address for entry, 16-byte aligned as a call leaves it.
// Not instrumented by AddressSanitizer: the top of a reused stack may still be marked as the
// redzones of the frames an earlier fiber left there (its entry never returns).
__attribute__((no_sanitize("address"))) void make_context(Context& c, char* stack, size_t bytes,
                                                           void (*entry)()) {
  auto top = (reinterpret_cast<uintptr_t>(stack) + bytes) & ~uintptr_t(15);
  auto* slot = reinterpret_cast<uint64_t*>(top) - 9;  // 72 bytes below the top: 8 mod 16
  slot[0] = 0x037F00001F80ull;  // MXCSR 0x1F80 (its default), x87 control word 0x037F
  for (int r = 1; r <= 6; ++r) slot[r] = 0;
  slot[7] = reinterpret_cast<uint64_t>(entry);
  slot[8] = 0;
  c.sp = slot;
}
void switch_context(Context& from, Context& to) { clustr_fiber_switch(&from.sp, to.sp); }
#else
struct Context {
  ucontext_t uc;
};
void make_context(Context& c, char* stack, size_t bytes, void (*entry)()) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = bytes;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, entry, 0);
}
void switch_context(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
#endif

// ThreadSanitizer's view of the emulated threads (a -DCLUSTR_TSAN=ON build). Every CUDA thread
// is a fiber of its own to it (__tsan_create_fiber; switches without implied ordering), and the
// only orderings it is told of are the GPU's: the host's work before a launch happens before
// every thread of it, a block's threads before a t.sync() happen before its threads after it,
// and the whole launch before the host's next work. Accesses of two threads of a block between
// two barriers, or of two blocks of a launch, to the same byte (at least one a write, neither
// an atomic) are then a data race that it reports with both stacks. Blocks alternate between
// two teams of fibers, and the host orders each block only after the one before the previous
// (whose team's shared memory it refills), so each block is unordered with its neighbours in
// the schedule's block order: a race between blocks shows between any two neighbours.
// The fibers' own bookkeeping (their state, the scheduler's fields) is handed back and forth
// with the scheduler in coroutine order, which ThreadSanitizer is not told: the functions that
// a fiber runs outside the kernel's body (entry, sync) are not instrumented (CLUSTR_NO_TSAN),
// so that only the body's accesses are checked. (Ignore annotations would do the same at a
// stack capture each: most of a run's time, measured.)
#if defined(CLUSTR_TSAN_FIBERS)
#define CLUSTR_NO_TSAN __attribute__((no_sanitize("thread")))
// Not instrumented either: a function that switches fibers must not enter its frame on one
// fiber's shadow stack and leave it from another's.
CLUSTR_NO_TSAN void tsan_acquire(void* addr) { __tsan_acquire(addr); }
CLUSTR_NO_TSAN void tsan_release(void* addr) { __tsan_release(addr); }
CLUSTR_NO_TSAN void tsan_switch(void* fiber) {
  __tsan_switch_to_fiber(fiber, __tsan_switch_to_fiber_no_sync);
}
#else
#define CLUSTR_NO_TSAN
void tsan_acquire(void*) {}
void tsan_release(void*) {}
void tsan_switch(void*) {}
#endif

// Fiber stacks, kept per host thread for the next launch (allocating them is most of the cost
// of a short launch). malloc'ed and never touched beyond what a kernel uses, so the untouched
// pages of a stack cost no memory.
std::vector<std::unique_ptr<char[]>>& stack_cache() {
  thread_local std::vector<std::unique_ptr<char[]>> cache;
  return cache;
}

}  // namespace

class Fibers {
 public:
  // team: which of a host thread's teams (0 or 1) this is; each has its own fiber stacks.
  Fibers(const Launch& l, unsigned n, const Schedule& sched, uint64_t launch, unsigned team = 0)
      : l_(l),
        fibers_(n),
        shared_(l.shared_bytes),
        sched_order_(sched),
        launch_(launch),
        lanes_(2 * size_t(n)),
        warp_sync_(n / kWarp + 1) {
    auto& cache = stack_cache();
    while (cache.size() < (team + 1) * size_t(n)) cache.emplace_back(new char[kFiberStack]);
    for (unsigned id = 0; id < n; ++id) {
      Fiber& f = fibers_[id];
      f.stack = cache[team * size_t(n) + id].get();
      // A kernel without barriers gets no Fibers to sync on: its t.sync() stays an error.
      f.s = base_state(l, shared_.data(), l.uses_barrier ? this : nullptr);
      set_thread(l, id, f.s);
    }
#if defined(CLUSTR_TSAN_FIBERS)
    // ThreadSanitizer's fibers are costly to make (a thread's state each): kept per host thread
    // for the next launch, like the stacks (what orders launches is the host, not the fibers).
    // Any of them may run any CUDA thread: team t takes pool[t n, (t + 1) n).
    thread_local std::vector<void*> pool;
    while (pool.size() < (team + 1) * size_t(n)) pool.push_back(__tsan_create_fiber(0));
    host_fiber_ = __tsan_get_current_fiber();
    for (unsigned id = 0; id < n; ++id) fibers_[id].tsan = pool[team * size_t(n) + id];
#endif
  }
  Fibers(const Fibers&) = delete;
  Fibers& operator=(const Fibers&) = delete;

  // Runs block number b to its end; throws clustr::Error on a divergent barrier.
  void run_block(uint64_t b) {
    tsan_acquire(&end_sync_);  // the team's previous block is over: its shared memory is free
    std::fill(shared_.begin(), shared_.end(), static_cast<unsigned char>(0xff));
    for (Fiber& f : fibers_) {
      block_coords(l_, b, f.s.block);
      f.state = kRunning;
      f.shuffles = 0;
      f.complete = nullptr;
      f.copies = AsyncCopies{};
      make_context(f.ctx, f.stack, kFiberStack, &Fibers::entry);
    }
    tsan_release(&start_sync_);  // all of the above happens before the block's threads
    try {
      run_rounds(b);
    } catch (...) {
      settle();
      throw;
    }
  }

  // t.sync() of the running fiber: back to the scheduler until every fiber has arrived.
  CLUSTR_NO_TSAN void sync(SyncSite site) {
    tsan_release(&barrier_sync_);
    wait(fibers_[current_], kWaiting, site);
    tsan_acquire(&barrier_sync_);  // every thread of the block has released it by now
  }

  // t.sync_warp() of the running fiber: a barrier of its warp's 32 lanes (at one site), which
  // orders their memory accesses as __syncwarp does.
  CLUSTR_NO_TSAN void sync_warp(SyncSite site) {
    if (fibers_.size() % kWarp != 0)
      throw Error(detail::cat("kernel '", l_.name, "': t.sync_warp() needs whole warps of ",
                              kWarp, " lanes (block of ", fibers_.size(), " threads)"));
    Fiber& f = fibers_[current_];
    char* order = &warp_sync_[current_ / kWarp];
    tsan_release(order);
    f.complete = nullptr;
    wait(f, kWarpWaiting, site);
    tsan_acquire(order);  // every lane of the warp has released it by now
  }

 private:
  // The barrier rounds of block b (run_block).
  void run_rounds(uint64_t b) {
    const unsigned n = static_cast<unsigned>(fibers_.size());
    runnable_.assign(n, 1);
    for (uint64_t round = 0;; ++round) {
      thread_order(sched_order_, launch_, b, round, order_, n);
      for (unsigned i : order_) {
        if (!runnable_[i]) continue;
        switch_to(i);
        if (fibers_[i].state == kFailed) {
          tsan_acquire(&end_sync_);  // the failed thread set error_ before its release
          std::rethrow_exception(error_);
        }
      }
      unsigned at_block = 0, at_warp = 0, done = 0;
      for (const Fiber& f : fibers_)
        (f.state == kWaiting ? at_block : f.state == kWarpWaiting ? at_warp : done) += 1;
      if (done == n) return;
      unsigned c[3];
      block_coords(l_, b, c);
      const std::string where = detail::cat("kernel '", l_.name, "': in block (", c[0], ", ",
                                            c[1], ", ", c[2], ") ");
      if (at_warp > 0) {
        release_warps(where);
        continue;
      }
      if (at_block != n)
        throw Error(where + "some threads wait at t.sync() while others have returned; every "
                            "thread of a block must reach each barrier");
      for (unsigned i = 1; i < n; ++i) {
        const SyncSite &a = fibers_[0].site, &z = fibers_[i].site;
        if (!same_site(a, z))
          throw Error(detail::cat(where, "thread 0 waits at the t.sync() of ", a.file, ":",
                                  a.line, " and thread ", i, " at the one of ", z.file, ":",
                                  z.line, "; every thread of a block must wait at the same "
                                  "barrier"));
      }
      runnable_.assign(n, 1);
    }
  }

  static bool same_site(const SyncSite& a, const SyncSite& z) {
    return a.line == z.line && std::strcmp(a.file, z.file) == 0;
  }

  // After a round in which some threads stopped at a shuffle: the warps whose 32 lanes all
  // wait at the same shuffle run on (and only they); a warp with lanes elsewhere (at t.sync(),
  // returned, or at another shuffle) can never complete its shuffle, which is an error.
  void release_warps(const std::string& where) {
    runnable_.assign(fibers_.size(), 0);
    for (size_t w = 0; w * kWarp < fibers_.size(); ++w) {
      const Fiber* lane = &fibers_[w * kWarp];
      unsigned first = kWarp;  // the first lane waiting at a shuffle
      for (unsigned i = kWarp; i-- > 0;)
        if (lane[i].state == kWarpWaiting) first = i;
      if (first == kWarp) continue;
      const SyncSite& at = lane[first].site;
      for (unsigned i = 0; i < kWarp; ++i)
        if (lane[i].state != kWarpWaiting || !same_site(lane[i].site, at))
          throw Error(detail::cat(where, "lane ", first, " of warp ", w,
                                  " waits at the shuffle of ", at.file, ":", at.line,
                                  " but lane ", i,
                                  lane[i].state == kWarpWaiting
                                      ? detail::cat(" at the one of ", lane[i].site.file, ":",
                                                    lane[i].site.line)
                                      : std::string(lane[i].state == kWaiting
                                                        ? " waits at t.sync()"
                                                        : " has returned"),
                                  "; every lane of a warp must take part in each shuffle"));
      if (lane[first].complete != nullptr) complete_warp(static_cast<unsigned>(w));
      for (unsigned i = 0; i < kWarp; ++i) runnable_[w * kWarp + i] = 1;
    }
  }

  // The warp instruction that all 32 lanes of warp w wait at (checked by release_warps): runs
  // its completion over their records. Not instrumented: it reads the lanes' records and, for
  // ldmatrix, shared memory, which each lane has read itself before arriving (core/cuda/mma.h).
  CLUSTR_NO_TSAN void complete_warp(unsigned w) {
    const auto* lane = &fibers_[w * kWarp];
    void* records[kWarp];
    for (unsigned i = 0; i < kWarp; ++i) {
      if (lane[i].complete != lane[0].complete)
        throw Error(detail::cat("kernel '", l_.name, "': lanes 0 and ", i, " of warp ", w,
                                " wait at different warp instructions"));
      records[i] = lane[i].record;
    }
    WarpView view{l_.name, w, {lane[0].s.block[0], lane[0].s.block[1], lane[0].s.block[2]},
                  shared_.data(), shared_.size()};
    lane[0].complete(records, view);
  }

 public:
  // t.shfl_xor(v, m) of the running fiber: its value goes to the exchange slots, the warp
  // waits until all 32 lanes have written theirs, then each reads its partner's. The slots
  // alternate between two sets from one shuffle to the next, so a lane that runs ahead to its
  // next shuffle never overwrites a value its partner has still to read (it cannot run two
  // ahead: the next shuffle waits for the partner). A shuffle orders no memory (as on a GPU).
  CLUSTR_NO_TSAN uint64_t shfl_xor(uint64_t v, unsigned lane_mask, SyncSite site) {
    const unsigned id = current_;
    Fiber& f = fibers_[id];
    if (fibers_.size() % kWarp != 0 || lane_mask >= kWarp)
      throw Error(detail::cat("kernel '", l_.name, "': a shuffle needs whole warps of ", kWarp,
                              " lanes and a lane mask below ", kWarp, " (block of ",
                              fibers_.size(), " threads, mask ", lane_mask, ")"));
    uint64_t* slots = lanes_.data() + (f.shuffles++ % 2) * fibers_.size();
    slots[id] = v;
    f.complete = nullptr;
    wait(f, kWarpWaiting, site);
    return slots[id ^ lane_mask];
  }

  // A warp instruction of the running fiber (emulation_state.h): its record waits with it until
  // the warp's 32 lanes have arrived, and release_warps runs `complete` over the 32 records.
  CLUSTR_NO_TSAN void warp_instruction(void* record, WarpComplete complete, SyncSite site) {
    Fiber& f = fibers_[current_];
    if (fibers_.size() % kWarp != 0)
      throw Error(detail::cat("kernel '", l_.name, "': a warp instruction needs whole warps of ",
                              kWarp, " lanes (block of ", fibers_.size(), " threads)"));
    f.record = record;
    f.complete = complete;
    wait(f, kWarpWaiting, site);
  }

  AsyncCopies& async_copies() { return fibers_[current_].copies; }
  void shared_memory(unsigned char** begin, size_t* bytes) {
    *begin = shared_.data();
    *bytes = shared_.size();
  }
  std::string running_thread() const {
    const ThreadState& s = fibers_[current_].s;
    return detail::cat("thread (", s.thread[0], ", ", s.thread[1], ", ", s.thread[2],
                       ") of block (", s.block[0], ", ", s.block[1], ", ", s.block[2], ")");
  }

 private:

  // A block that failed leaves fibers stopped inside the kernel, which never release what they
  // did to the host: ThreadSanitizer is told that the host is past them (a switch there and
  // back, with ordering, and no context switch), or it would see the host's next use of what
  // they touched (the kernel's arguments on the host's stack) as a race.
  CLUSTR_NO_TSAN void settle() {
#if defined(CLUSTR_ASAN_FIBERS)
    for (Fiber& f : fibers_)
      if (f.state == kWaiting || f.state == kWarpWaiting || f.state == kRunning)
        __asan_unpoison_memory_region(f.stack, kFiberStack);
#endif
#if defined(CLUSTR_TSAN_FIBERS)
    for (Fiber& f : fibers_)
      if (f.state == kWaiting || f.state == kWarpWaiting || f.state == kRunning) {
        __tsan_switch_to_fiber(f.tsan, 0);
        __tsan_switch_to_fiber(host_fiber_, 0);
      }
#endif
  }

  enum State { kRunning, kWaiting, kWarpWaiting, kDone, kFailed };
  static constexpr unsigned kWarp = 32;
  struct Fiber {
    Context ctx;
    char* stack = nullptr;
    State state = kRunning;
    ThreadState s;
    SyncSite site;  // of the barrier (or shuffle) it waits at
    uint64_t shuffles = 0;  // shuffles so far in this block: which slots the next one uses
    void* record = nullptr;              // a warp instruction's operands and results
    WarpComplete complete = nullptr;     // the warp instruction it waits at (null: a shuffle)
    AsyncCopies copies;                  // its cp.async copies not yet waited for
    void* fake_stack = nullptr;
    void* tsan = nullptr;  // ThreadSanitizer's fiber (a CLUSTR_TSAN build)
  };

  // The running fiber f stops in `state` at `site` and switches to the scheduler, which resumes
  // it when its barrier (or shuffle) is complete.
  CLUSTR_NO_TSAN void wait(Fiber& f, State state, SyncSite site) {
    f.state = state;
    f.site = site;
#if defined(CLUSTR_ASAN_FIBERS)
    __sanitizer_start_switch_fiber(&f.fake_stack, sched_bottom_, sched_size_);
#endif
    tsan_switch(host_fiber_);
    switch_context(f.ctx, sched_);
#if defined(CLUSTR_ASAN_FIBERS)
    __sanitizer_finish_switch_fiber(f.fake_stack, &sched_bottom_, &sched_size_);
#endif
  }

  // The scheduler resumes fiber i and returns when it waits at a barrier or has finished.
  CLUSTR_NO_TSAN void switch_to(unsigned i) {
    current_ = i;
    fibers_[i].state = kRunning;
    entering() = this;
#if defined(CLUSTR_ASAN_FIBERS)
    void* fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, fibers_[i].stack, kFiberStack);
#endif
    Fiber& f = fibers_[i];  // read as the host, before ThreadSanitizer is told of the switch
    tsan_switch(f.tsan);
    switch_context(sched_, f.ctx);
#if defined(CLUSTR_ASAN_FIBERS)
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
  }

  // makecontext passes only int arguments: a fiber finds its Fibers through this.
  static Fibers*& entering() {
    thread_local Fibers* f = nullptr;
    return f;
  }

  CLUSTR_NO_TSAN static void entry() {
    Fibers* self = entering();
#if defined(CLUSTR_ASAN_FIBERS)
    __sanitizer_finish_switch_fiber(nullptr, &self->sched_bottom_, &self->sched_size_);
#endif
    tsan_acquire(&self->start_sync_);
    Fiber& f = self->fibers_[self->current_];
    try {
      self->l_.run(self->l_.kernel, f.s);
      if (!f.copies.pending.empty())
        throw Error(detail::cat("kernel '", self->l_.name, "': ", self->running_thread(),
                                " ended with ", f.copies.pending.size(),
                                " cp.async copies it never waited for (cp_async_wait)"));
      f.state = kDone;
    } catch (...) {
      if (!self->error_) self->error_ = std::current_exception();
      f.state = kFailed;
    }
    tsan_release(&self->end_sync_);
#if defined(CLUSTR_ASAN_FIBERS)
    __sanitizer_start_switch_fiber(nullptr, self->sched_bottom_, self->sched_size_);
#endif
    tsan_switch(self->host_fiber_);
    Context finished;
    switch_context(finished, self->sched_);  // a finished fiber is never resumed
  }

  const Launch& l_;
  std::vector<Fiber> fibers_;
  std::vector<unsigned char> shared_;
  Context sched_;
  unsigned current_ = 0;
  std::exception_ptr error_;
  const void* sched_bottom_ = nullptr;
  size_t sched_size_ = 0;
  Schedule sched_order_;
  uint64_t launch_ = 0;
  std::vector<unsigned> order_;
  std::vector<char> runnable_;  // the fibers the next round resumes
  std::vector<uint64_t> lanes_;  // two sets of exchange slots for shuffles (a value's bits)
  std::vector<char> warp_sync_;  // ThreadSanitizer's synchronization object of each warp

 public:
  // ThreadSanitizer's synchronization objects (their addresses) and the host's own fiber.
  char start_sync_ = 0, end_sync_ = 0, barrier_sync_ = 0;
  void* host_fiber_ = nullptr;
};

void block_sync(Fibers* block, SyncSite site) { block->sync(site); }
void warp_sync(Fibers* block, SyncSite site) { block->sync_warp(site); }
void warp_instruction(Fibers* block, void* record, WarpComplete complete, SyncSite site) {
  block->warp_instruction(record, complete, site);
}
AsyncCopies& async_copies(Fibers* block) { return block->async_copies(); }
void shared_memory(Fibers* block, unsigned char** begin, size_t* bytes) {
  block->shared_memory(begin, bytes);
}
std::string running_thread(Fibers* block) { return block->running_thread(); }
uint64_t warp_shfl_xor(Fibers* block, uint64_t v, unsigned lane_mask, SyncSite site) {
  return block->shfl_xor(v, lane_mask, site);
}

namespace {

// ThreadSanitizer tells threads apart only as fibers: there, kernels without barriers run as
// fibers too (each to its end in one go).
#if defined(CLUSTR_TSAN_FIBERS)
constexpr bool kEveryThreadAFiber = true;
#else
constexpr bool kEveryThreadAFiber = false;
#endif

void run_fibers(const Launch& l, uint64_t blocks, const Schedule& sched, uint64_t launch) {
  const unsigned n = l.block[0] * l.block[1] * l.block[2];
  std::exception_ptr error;
  std::mutex error_mu;
  std::atomic<bool> failed{false};
  auto record = [&] {
    std::lock_guard<std::mutex> lock(error_mu);
    if (!error) error = std::current_exception();
    failed = true;
  };
#if defined(CLUSTR_TSAN_FIBERS)
  // One host thread (a ThreadSanitizer build has no OpenMP), two teams taking turns (above).
  try {
    Fibers teams[2] = {Fibers(l, n, sched, launch, 0), Fibers(l, n, sched, launch, 1)};
    for (Fibers& t : teams) tsan_release(&t.end_sync_);
    const BlockOrder block_at(sched, launch, blocks);
    for (uint64_t i = 0; i < blocks && !failed; ++i) {
      try {
        teams[i % 2].run_block(block_at(i));
      } catch (...) {
        record();
      }
    }
    for (Fibers& t : teams) tsan_acquire(&t.end_sync_);  // the launch is over for the host
  } catch (...) {
    record();
  }
#else
#pragma omp parallel if (blocks > 1)
  {
    try {
      Fibers team(l, n, sched, launch);
      const BlockOrder block_at(sched, launch, blocks);
#pragma omp for schedule(dynamic, 1)
      for (uint64_t i = 0; i < blocks; ++i) {
        try {
          if (!failed) team.run_block(block_at(i));  // after a failure the rest are skipped
        } catch (...) {
          record();
        }
      }
    } catch (...) {  // out of memory for the stacks
      record();
    }
  }
#endif
  if (error) std::rethrow_exception(error);
}

}  // namespace

void run_launch(const Launch& l);  // runs every thread of a checked launch now

// CLUSTR_EMULATION_TRACE=1: a line on stderr per launch (its name, grid and block; "captured"
// when a graph records it), to see where a step's launches go.
bool trace_launches() {
  static const bool on = [] {
    const char* v = std::getenv("CLUSTR_EMULATION_TRACE");
    return v && *v && std::string(v) != "0";
  }();
  return on;
}

void launch(const Launch& l) {
  if (trace_launches())
    std::fprintf(stderr, "clustr device emulation: launch %s grid (%u, %u, %u) block (%u, %u, %u)%s\n",
                 l.name, l.grid[0], l.grid[1], l.grid[2], l.block[0], l.block[1], l.block[2],
                 state::capturing(l.stream) ? " captured" : "");
  for (int d = 0; d < 3; ++d)
    if (l.grid[d] == 0 || l.block[d] == 0) return;
  if (!valid_config(l)) {
    state::record_error(cudaErrorInvalidConfiguration);
    return;
  }
  if (!state::live_stream(l.stream)) {
    state::record_error(cudaErrorInvalidResourceHandle);
    return;
  }
  if (state::capturing(l.stream)) {  // recorded with a copy of its arguments, run at replay
    std::shared_ptr<const void> copy = l.clone(l.kernel);
    Launch stored = l;
    stored.kernel = copy.get();
    state::record(l.stream, [stored, copy] {
      try {
        run_launch(stored);
        return true;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "clustr device emulation: a launch of a CUDA graph failed: %s\n",
                     e.what());
        return false;
      }
    });
    return;
  }
  run_launch(l);
}

void run_launch(const Launch& l) {
  const uint64_t blocks = uint64_t(l.grid[0]) * l.grid[1] * l.grid[2];
  const Schedule sched = current_schedule();
  const uint64_t id = launch_counter.fetch_add(1, std::memory_order_relaxed);
  state::DeviceAccess open;  // the kernel's threads may touch any device memory
  if (l.uses_barrier || kEveryThreadAFiber)
    run_fibers(l, blocks, sched, id);
  else
    run_sequential(l, blocks, sched, id);
}

}  // namespace clustr::cuda::emulation
