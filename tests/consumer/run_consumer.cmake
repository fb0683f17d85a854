# Installs the built cqk into a scratch prefix, runs the installed tool with an
# empty environment (its run path must find LibTorch), then configures, builds
# and runs tests/consumer against the prefix, as a user's project would, with
# README.md's C++ block as a second program.
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
# The exported targets must hold no path of this machine's Python environment:
# a prefix moved to another machine, or a rebuilt environment, must still link.
file(GLOB exported ${prefix}/lib/cmake/cqk/cqkTargets*.cmake)
foreach(file ${exported})
  file(READ ${file} text)
  string(REGEX MATCH "[^\"; ]*(site-packages|libcudart\\.so)[^\"; ]*" machine_path "${text}")
  if(machine_path)
    message(FATAL_ERROR "${file} names a path of the machine that built cqk: ${machine_path}")
  endif()
endforeach()

# README.md's C++ block, as printed, in a main() that gives it its `x`.
file(READ ${README} readme)
string(FIND "${readme}" "\n### Using the library from CMake\n" section)
if(section EQUAL -1)
  message(FATAL_ERROR "README.md has no section '### Using the library from CMake'")
endif()
string(SUBSTRING "${readme}" ${section} -1 readme)
string(FIND "${readme}" "\n```cpp\n" open)
if(open EQUAL -1)
  message(FATAL_ERROR "README.md has no ```cpp block under '### Using the library from CMake'")
endif()
math(EXPR open "${open} + 8")
string(SUBSTRING "${readme}" ${open} -1 readme)
string(FIND "${readme}" "\n```" close)
string(SUBSTRING "${readme}" 0 ${close} block)
string(REGEX MATCHALL "#include[^\n]*" includes "${block}")
string(REGEX REPLACE "#include[^\n]*\n" "" body "${block}")
list(JOIN includes "\n" includes)
set(snippet ${build}/readme_snippet.cpp)
file(WRITE ${snippet} "${includes}\nint main() {\nconst auto x = at::randn({2, 16, 512});\n${body}\n"
  "return y.sizes() == x.sizes() ? 0 : 1;\n}\n")

run(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${build} -G ${GENERATOR} -DCMAKE_BUILD_TYPE=Release
    -Dcqk_DIR=${prefix}/lib/cmake/cqk -DTorch_DIR=${PREFIX_PATH}/Torch -DREADME_SNIPPET=${snippet})
run(${CMAKE_COMMAND} --build ${build})
run(${build}/cqk_consumer)
run(${build}/readme_snippet)
