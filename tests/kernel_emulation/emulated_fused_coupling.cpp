// kernels/coupling_kernels.cu compiled as C++ for the emulator: this target's
// include/ (stand-ins for cuda_runtime.h and cuda_bf16.h) comes first on the
// include path, and __CUDA_ARCH__ selects the kernels' device branches.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#define __CUDA_ARCH__ 900
#include "coupling_kernels.cu"
