#pragma once
// A peak to compute MFU against, measured on the spot: the FLOP/s of a large
// square matmul in the training dtype on the training device.
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

namespace cqk {

double measure_matmul_flops(const c10::Device& device, c10::ScalarType dtype, int64_t size = 1024, int repeats = 5);

}  // namespace cqk
