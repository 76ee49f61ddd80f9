// CLUSTR_ROW_CLONES marks a hot loop function to be compiled for AVX-512, AVX2 and plain x86-64,
// the loader picking one for this CPU (GCC's target_clones: an ifunc); _NO_CONTRACT also keeps
// multiply-adds unfused in every clone, so that all of them round alike. Where target_clones
// does not exist, or under ThreadSanitizer (the loader runs ifunc resolvers before the
// sanitizer's runtime is up, and an instrumented resolver crashes there), the function is
// compiled once, for the baseline.
#pragma once

#if defined(__x86_64__) && defined(__ELF__) && defined(__has_attribute) && \
    !defined(__SANITIZE_THREAD__)
#if __has_attribute(target_clones)
#define CLUSTR_ROW_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#define CLUSTR_ROW_CLONES_NO_CONTRACT \
  __attribute__((target_clones("avx512f", "avx2", "default"), optimize("fp-contract=off")))
#endif
#endif
#ifndef CLUSTR_ROW_CLONES
#define CLUSTR_ROW_CLONES
#define CLUSTR_ROW_CLONES_NO_CONTRACT
#endif
