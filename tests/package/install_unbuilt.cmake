# ctest package_install_unbuilt: `cmake --install` straight after configuring, nothing built.
# An install must stop before copying anything, with a message saying what to build: the whole
# tree, and the gpt2_attention_Development component alone (its libraries are compiled). A tree
# configured with GPT2_ATTENTION_HEADER_ONLY=ON compiles nothing: its Development component (headers,
# CMake package, pkg-config files, under share/) needs no build.
#   cmake -DGPT2_SOURCE_DIR=<source tree> -DBINARY_DIR=<scratch dir> -DGENERATOR=<gen>
#         -DCXX_COMPILER=<c++> [-DMAKE_PROGRAM=] -P install_unbuilt.cmake
cmake_minimum_required(VERSION 3.24)
foreach(_var GPT2_SOURCE_DIR BINARY_DIR GENERATOR CXX_COMPILER)
  if(NOT ${_var})
    message(FATAL_ERROR "install_unbuilt.cmake: ${_var} is not set")
  endif()
endforeach()
file(REMOVE_RECURSE "${BINARY_DIR}")
set(_build "${BINARY_DIR}/build")
set(_args -G "${GENERATOR}" "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}"
  -DGPT2_ATTENTION_BUILD_TESTS=OFF -DGPT2_ATTENTION_BUILD_BENCH=OFF
  -DGPT2_ATTENTION_BUILD_EXAMPLES=ON -DGPT2_ATTENTION_EXAMPLE_PROGRAMS=OFF)
if(MAKE_PROGRAM)
  list(APPEND _args "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
endif()
execute_process(COMMAND "${CMAKE_COMMAND}" -S "${GPT2_SOURCE_DIR}" -B "${_build}" ${_args}
                RESULT_VARIABLE _rc OUTPUT_QUIET)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "configure failed (${_rc})")
endif()

# 1. Everything, and the Development component alone, nothing built: refused, with what to do,
# and nothing under the prefix.
foreach(_case all dev)
  set(_component_args "")
  if(_case STREQUAL "dev")
    set(_component_args --component gpt2_attention_Development)
  endif()
  execute_process(COMMAND "${CMAKE_COMMAND}" --install "${_build}" --prefix "${BINARY_DIR}/${_case}"
                          ${_component_args}
                  RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
  message(STATUS "cmake --install ${_component_args} (nothing built): exit ${_rc}\n${_out}${_err}")
  if(_rc EQUAL 0)
    message(FATAL_ERROR "cmake --install ${_component_args} succeeded although nothing was built")
  endif()
  # CMake wraps the message's lines: compare with runs of white space made one space.
  string(REGEX REPLACE "[ \t\r\n]+" " " _err "${_err}")
  foreach(_needed "gpt2_attention is not built yet; nothing was installed"
                  "cmake --build ${_build}")
    string(FIND "${_err}" "${_needed}" _at)
    if(_at EQUAL -1)
      message(FATAL_ERROR "the message does not say '${_needed}'")
    endif()
  endforeach()
  file(GLOB_RECURSE _installed "${BINARY_DIR}/${_case}/*")
  if(_installed)
    message(FATAL_ERROR "the refused install left files behind: ${_installed}")
  endif()
endforeach()

# 2. A header-only tree: the development component alone needs no build.
set(_build_ho "${BINARY_DIR}/build-header-only")
execute_process(COMMAND "${CMAKE_COMMAND}" -S "${GPT2_SOURCE_DIR}" -B "${_build_ho}" ${_args}
                        -DGPT2_ATTENTION_HEADER_ONLY=ON
                RESULT_VARIABLE _rc OUTPUT_QUIET)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "configure (header-only) failed (${_rc})")
endif()
execute_process(COMMAND "${CMAKE_COMMAND}" --install "${_build_ho}" --prefix "${BINARY_DIR}/ho"
                        --component gpt2_attention_Development
                RESULT_VARIABLE _rc OUTPUT_QUIET)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "cmake --install --component gpt2_attention_Development (header-only) failed (${_rc})")
endif()
foreach(_file include/gpt2/attention.hpp share/cmake/gpt2_attention/gpt2_attentionConfig.cmake
              share/pkgconfig/gpt2-attention.pc share/pkgconfig/gpt2-attention-header-only.pc)
  if(NOT EXISTS "${BINARY_DIR}/ho/${_file}")
    message(FATAL_ERROR "--component gpt2_attention_Development (header-only) did not install ${_file}")
  endif()
endforeach()
file(GLOB_RECURSE _archives "${BINARY_DIR}/ho/*.a")
if(EXISTS "${BINARY_DIR}/ho/bin" OR _archives)
  message(FATAL_ERROR "--component gpt2_attention_Development (header-only) installed bin/ or a library: ${_archives}")
endif()
