# ctest package_pkg_config: the installed gpt2-attention.pc (the compiled mode),
# gpt2-attention-header-only.pc and gpt2-attention-io.pc used the way a build without CMake uses
# them, a plain compiler command line, as README.md gives it:
#   c++ -std=c++17 -O2 main.cpp $(pkg-config --cflags --libs gpt2-attention) -o app
# with PKG_CONFIG_PATH pointing into the scratch prefix of the package_install fixture.
# (The header-only build at -O0, as the other consumers: it is about the flags pkg-config gives.)
#   cmake -DPKG_CONFIG=<pkg-config> -DCXX_COMPILER=<c++> -DPREFIX=<prefix> -DSOURCE_DIR=<tests/package>
#         -DBINARY_DIR=<scratch dir> -DGPT2_VERSION=<x.y.z> -DOPENMP=<ON|OFF> -DHAVE_IO=<ON|OFF>
#         [-DPKGCONFIGDIR=lib/pkgconfig] -P pkg_config.cmake
cmake_minimum_required(VERSION 3.24)
if(NOT PKG_CONFIG)
  message(FATAL_ERROR "pkg-config not found when configuring (Debian: apt-get install pkgconf; "
                      "scripts/install-deps.sh installs it)")
endif()
foreach(_var CXX_COMPILER PREFIX SOURCE_DIR BINARY_DIR GPT2_VERSION)
  if(NOT ${_var})
    message(FATAL_ERROR "pkg_config.cmake: ${_var} is not set")
  endif()
endforeach()
if(NOT PKGCONFIGDIR)
  set(PKGCONFIGDIR lib/pkgconfig)
endif()

set(ENV{PKG_CONFIG_PATH} "${PREFIX}/${PKGCONFIGDIR}")
message(STATUS "PKG_CONFIG_PATH=$ENV{PKG_CONFIG_PATH}")

function(pkg_config out)
  execute_process(COMMAND "${PKG_CONFIG}" ${ARGN} OUTPUT_VARIABLE _out ERROR_VARIABLE _err
                  RESULT_VARIABLE _rc OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "pkg-config ${ARGN} failed (${_rc}): ${_err}")
  endif()
  message(STATUS "pkg-config ${ARGN}: ${_out}")
  set(${out} "${_out}" PARENT_SCOPE)
endfunction()

pkg_config(_version --modversion gpt2-attention)
if(NOT _version STREQUAL GPT2_VERSION)
  message(FATAL_ERROR "pkg-config --modversion gpt2-attention: ${_version}, expected ${GPT2_VERSION}")
endif()

# -I<prefix>/include (the .pc file finds the prefix from its own directory), Eigen's include
# directory (Requires: eigen3) and, when built with OpenMP, the OpenMP flag.
pkg_config(_cflags --cflags gpt2-attention)
separate_arguments(_cflag_list UNIX_COMMAND "${_cflags}")
file(REAL_PATH "${PREFIX}/include" _want_include)
set(_found_include FALSE)
set(_found_eigen FALSE)
set(_found_openmp FALSE)
foreach(_flag IN LISTS _cflag_list)
  if(_flag MATCHES "^-I(.*)$")
    file(REAL_PATH "${CMAKE_MATCH_1}" _dir)
    if(_dir STREQUAL _want_include)
      set(_found_include TRUE)
    endif()
    if(EXISTS "${_dir}/Eigen/Core")
      set(_found_eigen TRUE)
    endif()
  elseif(_flag MATCHES "^-fopenmp")
    set(_found_openmp TRUE)
  endif()
endforeach()
if(NOT _found_include)
  message(FATAL_ERROR "pkg-config --cflags gpt2-attention: no -I for ${_want_include}: ${_cflags}")
endif()
if(NOT _found_eigen AND NOT EXISTS "/usr/include/Eigen/Core")
  message(FATAL_ERROR "pkg-config --cflags gpt2-attention: no -I for Eigen: ${_cflags}")
endif()
if(OPENMP AND NOT _found_openmp)
  message(FATAL_ERROR "built with OpenMP, but pkg-config --cflags gpt2-attention has no -fopenmp: ${_cflags}")
elseif(NOT OPENMP AND _found_openmp)
  message(FATAL_ERROR "built without OpenMP, but pkg-config --cflags gpt2-attention has ${_cflags}")
endif()

# The plain command line, through the shell as a user types it.
file(REMOVE_RECURSE "${BINARY_DIR}")
file(MAKE_DIRECTORY "${BINARY_DIR}")
function(shell step command)
  execute_process(COMMAND sh -c "${command}" WORKING_DIRECTORY "${BINARY_DIR}" COMMAND_ECHO STDOUT
                  RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "${step} failed (${_rc}): ${command}")
  endif()
endfunction()
if(OPENMP)
  set(_openmp openmp)
else()
  set(_openmp no-openmp)
endif()
# The compiled mode: the define that selects it, and the library.
if(NOT _cflags MATCHES "-DGPT2_ATTENTION_SEPARATE_KERNELS")
  message(FATAL_ERROR "pkg-config --cflags gpt2-attention: no -DGPT2_ATTENTION_SEPARATE_KERNELS: ${_cflags}")
endif()
pkg_config(_libs --libs gpt2-attention)
if(NOT _libs MATCHES "-lgpt2_attention")
  message(FATAL_ERROR "pkg-config --libs gpt2-attention: no -lgpt2_attention: ${_libs}")
endif()
shell(build "'${CXX_COMPILER}' -std=c++17 -O2 '${SOURCE_DIR}/pkg_config/main.cpp' \$('${PKG_CONFIG}' --cflags --libs gpt2-attention) -o app")
shell(run "./app ${_version} ${_openmp} compiled")

# Header-only: the headers alone, no define, nothing to link.
pkg_config(_ho_cflags --cflags --libs gpt2-attention-header-only)
if(_ho_cflags MATCHES "SEPARATE_KERNELS|-lgpt2_attention")
  message(FATAL_ERROR "pkg-config gpt2-attention-header-only: ${_ho_cflags}")
endif()
shell(build_header_only "'${CXX_COMPILER}' -std=c++17 -O0 '${SOURCE_DIR}/pkg_config/main.cpp' \$('${PKG_CONFIG}' --cflags --libs gpt2-attention-header-only) -o app_header_only")
shell(run_header_only "./app_header_only ${_version} ${_openmp} header-only")

# The io component: its own .pc file (Requires: gpt2-attention, nlohmann_json), when installed.
execute_process(COMMAND "${PKG_CONFIG}" --exists gpt2-attention-io RESULT_VARIABLE _io_rc)
if(HAVE_IO)
  if(NOT _io_rc EQUAL 0)
    message(FATAL_ERROR "the io component was installed, but pkg-config finds no gpt2-attention-io")
  endif()
  pkg_config(_io_version --modversion gpt2-attention-io)
  if(NOT _io_version STREQUAL GPT2_VERSION)
    message(FATAL_ERROR "pkg-config --modversion gpt2-attention-io: ${_io_version}, expected ${GPT2_VERSION}")
  endif()
  shell(build_io "'${CXX_COMPILER}' -std=c++17 -O2 '${SOURCE_DIR}/find_package/main_io.cpp' \$('${PKG_CONFIG}' --cflags --libs gpt2-attention-io) -o app_io")
  shell(run_io "./app_io roundtrip.npy")
elseif(_io_rc EQUAL 0)
  message(FATAL_ERROR "gpt2-attention-io.pc installed by a build without the io component")
endif()
