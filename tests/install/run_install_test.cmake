# The InstallAndConsume test (cmake -P): installs the built library into WORK_DIR/prefix, checks the installed
# headers, then configures, builds and runs the consumer project beside this file against that prefix only.
# In: SOURCE_DIR, BUILD_DIR, WORK_DIR, INCLUDE_DIR (relative), CXX_COMPILER, CXX_LAUNCHER (may be empty), BUILD_TYPE.
cmake_minimum_required(VERSION 3.25)
include(${WORK_DIR}/headers.cmake)  # ATTOGRAD_PUBLIC_HEADERS, ATTOGRAD_INTERNAL_HEADERS (top-level CMakeLists.txt)

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT status EQUAL 0)
    string(REPLACE ";" " " cmd "${ARGN}")
    message(FATAL_ERROR "failed (${status}): ${cmd}\n${out}\n${err}")
  endif()
  set(run_output "${out}" PARENT_SCOPE)
endfunction()

# 1. Every header of the source tree is classified, and the umbrella includes every other public one.
file(GLOB_RECURSE tree_headers RELATIVE ${SOURCE_DIR} ${SOURCE_DIR}/autograd/*.h ${SOURCE_DIR}/nn/*.h
  ${SOURCE_DIR}/train/*.h)
foreach(h ${tree_headers})
  if(NOT h IN_LIST ATTOGRAD_PUBLIC_HEADERS AND NOT h IN_LIST ATTOGRAD_INTERNAL_HEADERS)
    message(FATAL_ERROR "${h} is neither public nor internal: add it to ATTOGRAD_PUBLIC_HEADERS (and attograd.h) or "
                        "ATTOGRAD_INTERNAL_HEADERS in CMakeLists.txt")
  endif()
endforeach()
file(STRINGS ${SOURCE_DIR}/attograd.h umbrella_includes REGEX "^#include \"")
foreach(h ${ATTOGRAD_PUBLIC_HEADERS})
  if(NOT h STREQUAL "attograd.h" AND NOT "#include \"${h}\"" IN_LIST umbrella_includes)
    message(FATAL_ERROR "attograd.h does not include the public header ${h}")
  endif()
endforeach()

# 2. Install into a scratch prefix: exactly the public headers, none of which includes Eigen or an internal header.
file(REMOVE_RECURSE ${WORK_DIR}/prefix ${WORK_DIR}/consumer ${WORK_DIR}/tmp)
file(MAKE_DIRECTORY ${WORK_DIR}/tmp)
run(${CMAKE_COMMAND} --build ${BUILD_DIR} --target attograd_tools)  # up to date after a full build; else makes it so
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix --component attograd)
set(installed_root ${WORK_DIR}/prefix/${INCLUDE_DIR}/attograd)
file(GLOB_RECURSE installed RELATIVE ${installed_root} ${installed_root}/*)
list(SORT installed)
set(expected ${ATTOGRAD_PUBLIC_HEADERS})
list(SORT expected)
if(NOT installed STREQUAL expected)
  message(FATAL_ERROR "installed headers differ from the public list\n installed: ${installed}\n public: ${expected}")
endif()
foreach(h ${installed})
  file(STRINGS ${installed_root}/${h} includes REGEX "^[ \t]*#[ \t]*include")
  foreach(line ${includes})
    if(line MATCHES "<Eigen/|<unsupported/Eigen|<cereal/|<nlohmann/|<xxhash")
      message(FATAL_ERROR "installed ${h} includes a private dependency: ${line}")
    endif()
    if(line MATCHES "\"([^\"]+)\"" AND NOT CMAKE_MATCH_1 IN_LIST ATTOGRAD_PUBLIC_HEADERS)
      message(FATAL_ERROR "installed ${h} includes ${CMAKE_MATCH_1}, which is not installed")
    endif()
  endforeach()
endforeach()

# 3. The consumer, configured with find_package(Eigen3) disabled, built, and run.
set(launcher)
if(CXX_LAUNCHER)
  set(launcher -DCMAKE_CXX_COMPILER_LAUNCHER=${CXX_LAUNCHER})
endif()
run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/install -B ${WORK_DIR}/consumer -DCMAKE_BUILD_TYPE=${BUILD_TYPE}
  -DCMAKE_CXX_COMPILER=${CXX_COMPILER} ${launcher} -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DCMAKE_DISABLE_FIND_PACKAGE_Eigen3=ON)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/consumer)
file(READ ${WORK_DIR}/consumer/compile_commands.json commands)
if(commands MATCHES "[Ee]igen" OR NOT commands MATCHES "${WORK_DIR}/prefix/${INCLUDE_DIR}")
  message(FATAL_ERROR "the consumer's compile command names Eigen or misses the prefix: ${commands}")
endif()
set(ENV{CONSUMER_TMP} ${WORK_DIR}/tmp)
run(${WORK_DIR}/consumer/consumer)
message("${run_output}")
