#include "core/precision.h"

#include "core/error.h"

namespace clustr {

namespace {
thread_local Precision t_precision = Precision::fp32;
}  // namespace

const char* to_string(Precision p) { return p == Precision::bf16 ? "bf16" : "fp32"; }

Precision parse_precision(const std::string& name) {
  if (name == "fp32") return Precision::fp32;
  if (name == "bf16") return Precision::bf16;
  throw Error(detail::cat("unknown precision '", name, "' (expected fp32 or bf16)"));
}

Precision current_precision() { return t_precision; }

PrecisionScope::PrecisionScope(Precision p) : previous_(t_precision) { t_precision = p; }
PrecisionScope::~PrecisionScope() { t_precision = previous_; }

}  // namespace clustr
