# Installs the built cqk into a scratch prefix, runs the installed tool with an
# empty environment (its run path must find LibTorch), then configures, builds
# and runs tests/consumer against the prefix, as a user's project would.
set(prefix ${BUILD_DIR}/consumer/prefix)
set(build ${BUILD_DIR}/consumer/build)
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}")
  endif()
endfunction()
file(REMOVE_RECURSE ${prefix})
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
run(env -i ${prefix}/bin/cqk --version)
run(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${build} -G ${GENERATOR} -DCMAKE_BUILD_TYPE=Release
    -Dcqk_DIR=${prefix}/lib/cmake/cqk -DTorch_DIR=${PREFIX_PATH}/Torch)
run(${CMAKE_COMMAND} --build ${build})
run(${build}/cqk_consumer)
