// kernels/rope_kernels.cu compiled as C++ for the emulator (as emulated_fused_coupling.cpp).
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#define __CUDA_ARCH__ 900
#include "rope_kernels.cu"
