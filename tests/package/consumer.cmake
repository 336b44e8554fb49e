# Configures, builds and runs one consumer project from scratch (its own ctest runs its programs).
#   cmake -DSOURCE_DIR=<consumer> -DBINARY_DIR=<dir> -DGENERATOR=<gen> -DCXX_COMPILER=<c++>
#         [-DMAKE_PROGRAM=] [-DBUILD_TYPE=] [-DCONFIG=] [-DCXX_FLAGS=] [-DCXX_FLAGS_CONFIG=]
#         [-DEXE_LINKER_FLAGS=] -DPREFIX=<install prefix> -DGPT2_SOURCE_DIR=<library source tree>
#         -DGPT2_VERSION=<x.y.z> [-DGPT2_SMALL_WEIGHTS=<gpt2-small-h0-attention.safetensors>]
#         -P consumer.cmake
# GPT2_SMALL_WEIGHTS, when set, is passed on to the consumer's configure step.
cmake_minimum_required(VERSION 3.24)
foreach(_var SOURCE_DIR BINARY_DIR GENERATOR CXX_COMPILER PREFIX GPT2_SOURCE_DIR GPT2_VERSION)
  if(NOT ${_var})
    message(FATAL_ERROR "consumer.cmake: ${_var} is not set")
  endif()
endforeach()

function(run step)
  execute_process(COMMAND ${ARGN} COMMAND_ECHO STDOUT RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "${step} failed (${_rc})")
  endif()
endfunction()

set(_configure_args
  -G "${GENERATOR}"
  "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}"
  "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}"
  "-DCMAKE_EXE_LINKER_FLAGS=${EXE_LINKER_FLAGS}"
  "-DCMAKE_PREFIX_PATH=${PREFIX}"
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
  "-DGPT2_ATTENTION_SOURCE_DIR=${GPT2_SOURCE_DIR}"
  "-DGPT2_EXPECTED_PREFIX=${PREFIX}"
  "-DGPT2_EXPECTED_VERSION=${GPT2_VERSION}")
if(MAKE_PROGRAM)
  list(APPEND _configure_args "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
endif()
if(GPT2_SMALL_WEIGHTS)
  list(APPEND _configure_args "-DGPT2_SMALL_WEIGHTS=${GPT2_SMALL_WEIGHTS}")
endif()
if(BUILD_TYPE)
  string(TOUPPER "${BUILD_TYPE}" _upper)
  list(APPEND _configure_args "-DCMAKE_BUILD_TYPE=${BUILD_TYPE}"
    "-DCMAKE_CXX_FLAGS_${_upper}=${CXX_FLAGS_CONFIG}")
endif()
set(_config_args "")
if(CONFIG)
  set(_config_args --config "${CONFIG}")
endif()

file(REMOVE_RECURSE "${BINARY_DIR}")
run(configure "${CMAKE_COMMAND}" -S "${SOURCE_DIR}" -B "${BINARY_DIR}" --no-warn-unused-cli ${_configure_args})
run(build "${CMAKE_COMMAND}" --build "${BINARY_DIR}" ${_config_args})
set(_ctest_config "")
if(CONFIG)
  set(_ctest_config -C "${CONFIG}")
endif()
run(run "${CMAKE_CTEST_COMMAND}" --test-dir "${BINARY_DIR}" --verbose --no-tests=error
  ${_ctest_config})
