// kernels/attention_kernels.cu compiled as C++ for the emulator (see
// emulated_fused_coupling.cpp).
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#define __CUDA_ARCH__ 900
#include "attention_kernels.cu"
