// Opening one of the toolkit's libraries with dlopen, for the GPU build's core/cuda/blas.cu
// (cuBLAS) and blas_lt.cu (cuBLASLt): they are loaded at their first product on the device, not
// linked, because together they map more than 400 MB of address space, which a process that
// never uses the GPU must not pay.
#pragma once

#include <dlfcn.h>

#include <initializer_list>
#include <string>

#include "core/error.h"

namespace clustr::cuda {

// The first of `names` (a path, then a soname for the loader's path) that opens; throws naming
// each one tried and why it failed. `what` names the library and when it is loaded.
inline void* open_toolkit_library(std::initializer_list<const char*> names, const char* what) {
  std::string tried;
  for (const char* name : names) {
    if (void* lib = dlopen(name, RTLD_NOW | RTLD_LOCAL)) return lib;
    const char* why = dlerror();
    tried += detail::cat("\n  ", name, ": ", why ? why : "not found");
  }
  throw Error(detail::cat(what, ": cannot load the library:", tried));
}

}  // namespace clustr::cuda
