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
