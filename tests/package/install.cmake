# ctest fixture package_install: installs the library (component gpt2_attention_Development:
# headers, the compiled libraries, CMake package, pkg-config files; not the CLI) into a clean
# scratch prefix.
#   cmake -DBUILD_DIR=<build tree> -DPREFIX=<scratch prefix> -DCMAKEDIR=<config dir, relative>
#         [-DCONFIG=<config>] -P install.cmake
cmake_minimum_required(VERSION 3.24)
foreach(_var BUILD_DIR PREFIX CMAKEDIR)
  if(NOT ${_var})
    message(FATAL_ERROR "install.cmake: ${_var} is not set")
  endif()
endforeach()

file(REMOVE_RECURSE "${PREFIX}")
set(_config_args "")
if(CONFIG)
  set(_config_args --config "${CONFIG}")
endif()
execute_process(
  COMMAND "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${PREFIX}"
    --component gpt2_attention_Development ${_config_args}
  COMMAND_ECHO STDOUT
  RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "cmake --install failed (${_rc})")
endif()
if(NOT EXISTS "${PREFIX}/${CMAKEDIR}/gpt2_attentionConfig.cmake")
  message(FATAL_ERROR "${PREFIX}/${CMAKEDIR}/gpt2_attentionConfig.cmake was not installed")
endif()
