# Every file under the source include/ directory must be installed under <prefix>/include, except
# the ones listed in NOT_INSTALLED ('|'-separated, relative to include/).
#   cmake -DSOURCE_INCLUDE_DIR=<dir> -DPREFIX=<prefix> [-DNOT_INSTALLED=a|b] -P check_installed_headers.cmake
cmake_minimum_required(VERSION 3.24)
string(REPLACE "|" ";" _not_installed "${NOT_INSTALLED}")
file(GLOB_RECURSE _source_headers RELATIVE "${SOURCE_INCLUDE_DIR}" "${SOURCE_INCLUDE_DIR}/*")
file(GLOB_RECURSE _installed_headers RELATIVE "${PREFIX}/include" "${PREFIX}/include/*")
set(_missing "")
foreach(_h IN LISTS _source_headers)
  if(NOT _h IN_LIST _installed_headers AND NOT _h IN_LIST _not_installed)
    list(APPEND _missing "${_h}")
  endif()
endforeach()
if(_missing)
  list(JOIN _missing ", " _missing)
  message(FATAL_ERROR "not installed (add them to the header lists in CMakeLists.txt): ${_missing}")
endif()
list(LENGTH _installed_headers _n)
message(STATUS "${_n} headers installed under ${PREFIX}/include")
