# The BuildTreeAndConsume test (cmake -P): configures, builds and runs the consumer project beside this file against
# the build tree itself (attograd_DIR = BUILD_DIR: its attogradConfig.cmake, exported targets and FindxxHash.cmake),
# no install involved. In: SOURCE_DIR, BUILD_DIR, WORK_DIR, CXX_COMPILER, CXX_LAUNCHER (may be empty), BUILD_TYPE.
cmake_minimum_required(VERSION 3.25)

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT status EQUAL 0)
    string(REPLACE ";" " " cmd "${ARGN}")
    message(FATAL_ERROR "failed (${status}): ${cmd}\n${out}\n${err}")
  endif()
  set(run_output "${out}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE ${WORK_DIR}/consumer ${WORK_DIR}/tmp)
file(MAKE_DIRECTORY ${WORK_DIR}/tmp)
run(${CMAKE_COMMAND} --build ${BUILD_DIR} --target attograd_tools)  # up to date after a full build; else makes it so
set(launcher)
if(CXX_LAUNCHER)
  set(launcher -DCMAKE_CXX_COMPILER_LAUNCHER=${CXX_LAUNCHER})
endif()
run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/install -B ${WORK_DIR}/consumer -DCMAKE_BUILD_TYPE=${BUILD_TYPE}
  -DCMAKE_CXX_COMPILER=${CXX_COMPILER} ${launcher} -Dattograd_DIR=${BUILD_DIR} -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
file(READ ${WORK_DIR}/consumer/CMakeCache.txt cache)
if(NOT cache MATCHES "attograd_DIR:[A-Z]+=${BUILD_DIR}\n")
  message(FATAL_ERROR "the consumer did not find attograd in the build tree ${BUILD_DIR}")
endif()
run(${CMAKE_COMMAND} --build ${WORK_DIR}/consumer)
# <attograd/attograd.h> comes through BUILD_DIR/include; Eigen stays private.
file(READ ${WORK_DIR}/consumer/compile_commands.json commands)
if(commands MATCHES "[Ee]igen" OR NOT commands MATCHES "${BUILD_DIR}/include")
  message(FATAL_ERROR "the consumer's compile command names Eigen or misses ${BUILD_DIR}/include: ${commands}")
endif()
set(ENV{CONSUMER_TMP} ${WORK_DIR}/tmp)
run(${WORK_DIR}/consumer/consumer)
message("${run_output}")
