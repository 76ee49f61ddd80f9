// Thread count for the CPU kernels (OpenMP). Results never depend on it.
#pragma once

namespace clustr {
int num_threads();           // threads the next parallel region will use
void set_num_threads(int n);  // n >= 1

// Sets the thread count for one scope and restores the previous one. Inside a parallel region
// it changes only the calling thread's setting (each thread of a team has its own), which is
// how a kernel runs a library call (a GEMM) on one thread per task.
class ThreadCountScope {
 public:
  explicit ThreadCountScope(int n) : previous_(num_threads()) { set_num_threads(n); }
  ~ThreadCountScope() { set_num_threads(previous_); }
  ThreadCountScope(const ThreadCountScope&) = delete;
  ThreadCountScope& operator=(const ThreadCountScope&) = delete;

 private:
  int previous_;
};

}  // namespace clustr
