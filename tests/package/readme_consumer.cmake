# ctest package_readme_consumer: the consumer project README.md shows, built exactly as written
# (the compiled mode) and with the header-only targets its comment names in place of
# `gpt2::attention gpt2::io` (both must be in the block).
# The ```cmake block after the line `<!-- consumer: CMakeLists.txt -->` becomes CMakeLists.txt and
# the README's first C++ example (the ```cpp block after `<!-- snippet: usage -->`, which must be
# the first ```cpp block of the file) becomes main.cpp; the project is configured against the
# scratch prefix of the package_install fixture, built, and its `app` run (exit status 0).
#   cmake -DGPT2_SOURCE_DIR=<source tree> -DBINARY_DIR=<dir> -DGENERATOR=<gen> -DCXX_COMPILER=<c++>
#         [-DMAKE_PROGRAM=] [-DBUILD_TYPE=] [-DCXX_FLAGS=] [-DCXX_FLAGS_CONFIG=] [-DEXE_LINKER_FLAGS=]
#         -DPREFIX=<install prefix> -P readme_consumer.cmake
cmake_minimum_required(VERSION 3.24)
foreach(_var GPT2_SOURCE_DIR BINARY_DIR GENERATOR CXX_COMPILER PREFIX)
  if(NOT ${_var})
    message(FATAL_ERROR "readme_consumer.cmake: ${_var} is not set")
  endif()
endforeach()
set(_readme "${GPT2_SOURCE_DIR}/README.md")
file(READ "${_readme}" _text)

# The fenced block of language `lang` right after `marker` (the marker's line, then the fence).
function(block_after out marker lang)
  string(FIND "${_text}" "${marker}\n```${lang}\n" _at)
  if(_at EQUAL -1)
    message(FATAL_ERROR "${_readme}: no line '${marker}' followed by a ```${lang} block")
  endif()
  string(LENGTH "${marker}\n```${lang}\n" _len)
  math(EXPR _at "${_at} + ${_len}")
  string(SUBSTRING "${_text}" ${_at} -1 _rest)
  string(FIND "${_rest}" "\n```\n" _end)
  if(_end EQUAL -1)
    message(FATAL_ERROR "${_readme}: the ```${lang} block after '${marker}' is not closed")
  endif()
  math(EXPR _end "${_end} + 1")
  string(SUBSTRING "${_rest}" 0 ${_end} _block)
  set(${out} "${_block}" PARENT_SCOPE)
  set(${out}_at ${_at} PARENT_SCOPE)
endfunction()

block_after(_cmake "<!-- consumer: CMakeLists.txt -->" cmake)
block_after(_main "<!-- snippet: usage -->" cpp)
string(FIND "${_text}" "```cpp\n" _first_cpp)
math(EXPR _first_cpp "${_first_cpp} + 7")
if(NOT _first_cpp EQUAL _main_at)
  message(FATAL_ERROR "${_readme}: the usage example is not the first ```cpp block")
endif()
foreach(_needed "find_package(gpt2_attention" "COMPONENTS io" "add_executable(app main.cpp)"
                "target_link_libraries(app")
  string(FIND "${_cmake}" "${_needed}" _at)
  if(_at EQUAL -1)
    message(FATAL_ERROR "${_readme}: the consumer CMakeLists.txt has no '${_needed}'")
  endif()
endforeach()

set(_plain "gpt2::attention gpt2::io")
set(_header_only "gpt2::attention_header_only gpt2::io_header_only")
foreach(_needed "${_plain}" "${_header_only}")
  string(FIND "${_cmake}" "${_needed}" _at)
  if(_at EQUAL -1)
    message(FATAL_ERROR "${_readme}: the consumer CMakeLists.txt does not name '${_needed}'")
  endif()
endforeach()
file(REMOVE_RECURSE "${BINARY_DIR}")
function(run step)
  execute_process(COMMAND ${ARGN} COMMAND_ECHO STDOUT RESULT_VARIABLE _rc OUTPUT_VARIABLE _out
                  ERROR_VARIABLE _out)
  message("${_out}")
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "${step} failed (${_rc})")
  endif()
  set(_last_output "${_out}" PARENT_SCOPE)
endfunction()

foreach(_mode compiled header-only)
set(_dir "${BINARY_DIR}/${_mode}")
set(_cmake_mode "${_cmake}")
if(_mode STREQUAL "header-only")
  string(REPLACE "target_link_libraries(app PRIVATE ${_plain})"
         "target_link_libraries(app PRIVATE ${_header_only})" _cmake_mode "${_cmake}")
  if(_cmake_mode STREQUAL _cmake)
    message(FATAL_ERROR "${_readme}: no 'target_link_libraries(app PRIVATE ${_plain})' line")
  endif()
endif()
file(WRITE "${_dir}/src/CMakeLists.txt" "${_cmake_mode}")
file(WRITE "${_dir}/src/main.cpp" "${_main}")
set(_configure_args
  -G "${GENERATOR}"
  "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}"
  "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}"
  "-DCMAKE_EXE_LINKER_FLAGS=${EXE_LINKER_FLAGS}"
  "-DCMAKE_PREFIX_PATH=${PREFIX}"
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
if(MAKE_PROGRAM)
  list(APPEND _configure_args "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
endif()
if(BUILD_TYPE)
  string(TOUPPER "${BUILD_TYPE}" _upper)
  list(APPEND _configure_args "-DCMAKE_BUILD_TYPE=${BUILD_TYPE}"
    "-DCMAKE_CXX_FLAGS_${_upper}=${CXX_FLAGS_CONFIG}")
endif()
run(configure "${CMAKE_COMMAND}" -S "${_dir}/src" -B "${_dir}/build" --no-warn-unused-cli
    ${_configure_args})
# The package found is the one just installed.
file(STRINGS "${_dir}/build/CMakeCache.txt" _dir_line REGEX "^gpt2_attention_DIR:")
string(REGEX REPLACE "^[^=]*=" "" _pkg_dir "${_dir_line}")
cmake_path(IS_PREFIX PREFIX "${_pkg_dir}" NORMALIZE _in_prefix)
if(NOT _in_prefix)
  message(FATAL_ERROR "gpt2_attention found in '${_pkg_dir}', expected under ${PREFIX}")
endif()
run(build "${CMAKE_COMMAND}" --build "${_dir}/build")
run(run "${_dir}/build/app")
if(NOT _last_output MATCHES "max \\|y - out\\|")
  message(FATAL_ERROR "app printed '${_last_output}', expected the usage example's line")
endif()
message(STATUS "README consumer, ${_mode}: built and ran")
endforeach()
