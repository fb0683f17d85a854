# Torch and its CUDA runtime, for the build and for cqkConfig.cmake (installed
# beside it).
#
# The CUDA runtime that torch itself loads (the nvidia wheel's libcudart next
# to torch), so that a process holds one runtime; the toolkit's where there is
# none. The build uses it, and so does cqkConfig.cmake: an installed cqk links
# the consumer's copy, not a path on the machine that built it.
function(cqk_torch_cudart out)
  file(GLOB found "${TORCH_INSTALL_PREFIX}/../nvidia/cu*/lib/libcudart.so.*")
  if(found)
    list(GET found 0 found)
  else()
    set(found CUDA::cudart)
  endif()
  set(${out} ${found} PARENT_SCOPE)
endfunction()

# The PyPI torch is a CUDA build, whose CMake package stops where no CUDA
# toolkit is found unless torch::cudart exists. A cqk without CUDA kernels
# never links it: a placeholder lets a machine without a toolkit configure.
macro(cqk_allow_torch_without_cuda)
  if(NOT CQK_WITH_CUDA AND NOT TARGET torch::cudart)
    add_library(torch::cudart INTERFACE IMPORTED)
  endif()
endmacro()
