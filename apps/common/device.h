// The apps' --device flag: "cpu" or "cuda" -> the Device, checked before any work is done.
#pragma once

#include <string>

#include "core/tensor.h"
#include "layers/module.h"

namespace clustr {

// "cpu" -> Device::cpu; "cuda" -> Device::cuda when the build has the CUDA backend and a usable
// GPU (or the emulated device) is present. Otherwise throws one line that says why (the
// driver's reason, cuda::unavailable_reason()) and suggests --device cpu.
Device resolve_device(const std::string& device);

// t on `device`: t itself when it is there already, else a copy.
Tensor on_device(const Tensor& t, Device device);

// The device of a model's parameters (cpu for a model without any).
Device device_of(const Module& model);

}  // namespace clustr
