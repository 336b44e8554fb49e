# Install rules for gpt2_attention (included when GPT2_ATTENTION_INSTALL is ON).
#
# Layout under the prefix (LIBDIR: lib, or lib/<multiarch> on Debian):
#   include/gpt2/*.hpp                                   headers (core, io, mpi)
#   LIBDIR/libgpt2_attention.a, libgpt2_attention_io.a, libgpt2_attention_mpi.a (when built)
#                                                        the compiled mode's libraries
#   LIBDIR/cmake/gpt2_attention/gpt2_attentionConfig.cmake   find_package(gpt2_attention CONFIG)
#   LIBDIR/cmake/gpt2_attention/gpt2_attentionTargets.cmake  gpt2::attention, gpt2::attention_header_only
#   LIBDIR/cmake/gpt2_attention/gpt2_attention_ioTargets.cmake gpt2::io, gpt2::io_header_only (when built)
#   LIBDIR/cmake/gpt2_attention/gpt2_attention_mpiTargets.cmake gpt2::mpi (when built)
#   LIBDIR/pkgconfig/gpt2-attention.pc                   pkg-config: the compiled mode (headers, library)
#   LIBDIR/pkgconfig/gpt2-attention-header-only.pc       pkg-config: the headers alone
#   LIBDIR/pkgconfig/gpt2-attention-io.pc, gpt2-attention-io-header-only.pc   the io component
#   share/doc/gpt2_attention/LICENSE
#   bin/gpt2-attention                                   the CLI (when examples are built)
# With GPT2_ATTENTION_HEADER_ONLY=ON nothing is compiled: the package is then architecture-independent
# and goes under share/ (share/cmake/gpt2_attention, share/pkgconfig), without the .a files.
#
# Components: gpt2_attention_Development (headers, libraries, CMake package, pkg-config files),
# gpt2_attention_Runtime (CLI).

include(GNUInstallDirs)
include(CMakePackageConfigHelpers)
# GPT2_ATTENTION_INSTALL_CMAKEDIR, GPT2_ATTENTION_INSTALL_PKGCONFIGDIR: cmake/install-dirs.cmake.

# What `cmake --install` needs built first: the CLI (when examples are built) and the compiled
# libraries. The check runs before anything is copied and says what to build; a half-installed
# prefix is never left behind.
set(_gpt2_built_targets "")
foreach(_t gpt2_attention gpt2_attention_io gpt2_attention_mpi gpt2-attention)
  if(TARGET ${_t})
    get_target_property(_type ${_t} TYPE)
    if(NOT _type STREQUAL "INTERFACE_LIBRARY")
      list(APPEND _gpt2_built_targets ${_t})
    endif()
  endif()
endforeach()
set(_gpt2_library_targets ${_gpt2_built_targets})
list(REMOVE_ITEM _gpt2_library_targets gpt2-attention)
list(JOIN _gpt2_library_targets " " _gpt2_library_targets)
foreach(_t IN LISTS _gpt2_built_targets)
  set(_gpt2_file "$<TARGET_FILE:${_t}>")
  set(_gpt2_check [=[
if(NOT EXISTS "@_gpt2_file@")
  message(FATAL_ERROR "gpt2_attention is not built yet; nothing was installed (@_t@ is missing).\n"
    "  Build first:  cmake --build @PROJECT_BINARY_DIR@\n"
    "  (the library alone, for --component gpt2_attention_Development:\n"
    "   cmake --build @PROJECT_BINARY_DIR@ --target @_gpt2_library_targets@)")
endif()
]=])
  string(CONFIGURE "${_gpt2_check}" _gpt2_check @ONLY)
  if(_t STREQUAL "gpt2-attention")
    set(_component gpt2_attention_Runtime)
  else()
    set(_component gpt2_attention_Development)
  endif()
  install(CODE "${_gpt2_check}" COMPONENT ${_component})
endforeach()
unset(_gpt2_file)
unset(_gpt2_check)

install(TARGETS gpt2_attention gpt2_attention_header_only
  EXPORT gpt2_attentionTargets
  ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}" COMPONENT gpt2_attention_Development
  FILE_SET HEADERS DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}" COMPONENT gpt2_attention_Development)
install(EXPORT gpt2_attentionTargets
  NAMESPACE gpt2::
  DESTINATION "${GPT2_ATTENTION_INSTALL_CMAKEDIR}"
  COMPONENT gpt2_attention_Development)

# The io component has its own export set: its targets file is loaded only when a consumer asks
# for COMPONENTS io, so nlohmann_json is never a dependency of the core.
if(TARGET gpt2_attention_io)
  install(TARGETS gpt2_attention_io gpt2_attention_io_header_only
    EXPORT gpt2_attention_ioTargets
    ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}" COMPONENT gpt2_attention_Development
    FILE_SET HEADERS DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}" COMPONENT gpt2_attention_Development)
  install(EXPORT gpt2_attention_ioTargets
    NAMESPACE gpt2::
    DESTINATION "${GPT2_ATTENTION_INSTALL_CMAKEDIR}"
    COMPONENT gpt2_attention_Development)
endif()

# The mpi component likewise: MPI is a dependency only of consumers asking for COMPONENTS mpi.
if(TARGET gpt2_attention_mpi)
  install(TARGETS gpt2_attention_mpi
    EXPORT gpt2_attention_mpiTargets
    ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}" COMPONENT gpt2_attention_Development
    FILE_SET HEADERS DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}"
    COMPONENT gpt2_attention_Development)
  install(EXPORT gpt2_attention_mpiTargets
    NAMESPACE gpt2::
    DESTINATION "${GPT2_ATTENTION_INSTALL_CMAKEDIR}"
    COMPONENT gpt2_attention_Development)
endif()

configure_package_config_file(
  "${CMAKE_CURRENT_LIST_DIR}/gpt2_attentionConfig.cmake.in"
  "${PROJECT_BINARY_DIR}/gpt2_attentionConfig.cmake"
  INSTALL_DESTINATION "${GPT2_ATTENTION_INSTALL_CMAKEDIR}"
  NO_SET_AND_CHECK_MACRO)
# While the major version is 0 every minor version may break the API: 0.1.x satisfies a request
# for 0.1 but not for 0.2 (nor 0.2 one for 0.1). From 1.0 on, any later minor of the same major.
if(PROJECT_VERSION_MAJOR EQUAL 0)
  set(_gpt2_compatibility SameMinorVersion)
else()
  set(_gpt2_compatibility SameMajorVersion)
endif()
if(GPT2_ATTENTION_HEADER_ONLY)
  set(_gpt2_arch ARCH_INDEPENDENT)
else()
  set(_gpt2_arch "")  # the libraries: a 32-bit consumer must not take a 64-bit package
endif()
write_basic_package_version_file(
  "${PROJECT_BINARY_DIR}/gpt2_attentionConfigVersion.cmake"
  COMPATIBILITY ${_gpt2_compatibility}
  ${_gpt2_arch})
install(FILES
  "${PROJECT_BINARY_DIR}/gpt2_attentionConfig.cmake"
  "${PROJECT_BINARY_DIR}/gpt2_attentionConfigVersion.cmake"
  DESTINATION "${GPT2_ATTENTION_INSTALL_CMAKEDIR}"
  COMPONENT gpt2_attention_Development)

# pkg-config files, relocatable: the prefix is found from the .pc file's own directory, so they
# are right wherever the tree is installed (cmake --install --prefix included).
if(IS_ABSOLUTE "${GPT2_ATTENTION_INSTALL_PKGCONFIGDIR}")
  message(FATAL_ERROR "GPT2_ATTENTION_INSTALL_PKGCONFIGDIR must be relative to the prefix")
endif()
file(RELATIVE_PATH GPT2_PC_PREFIX_FROM_PCDIR "/prefix/${GPT2_ATTENTION_INSTALL_PKGCONFIGDIR}" "/prefix")
string(REGEX REPLACE "/$" "" GPT2_PC_PREFIX_FROM_PCDIR "${GPT2_PC_PREFIX_FROM_PCDIR}")  # "../.."
set(GPT2_PC_OPENMP_FLAGS "")
if(GPT2_ATTENTION_OPENMP)
  # The compiler's own flag (-fopenmp for g++; -fopenmp=libomp for clang), at compile and link.
  set(GPT2_PC_OPENMP_FLAGS " ${OpenMP_CXX_FLAGS}")
endif()
# gpt2-attention and gpt2-attention-io: the compiled mode (the header-only files' content when
# the installation is header-only); the -header-only files: the headers alone.
set(_gpt2_pc_files gpt2-attention gpt2-attention-header-only)
if(TARGET gpt2_attention_io)
  list(APPEND _gpt2_pc_files gpt2-attention-io gpt2-attention-io-header-only)
endif()
foreach(_pc IN LISTS _gpt2_pc_files)
  set(_template "${_pc}")
  if(GPT2_ATTENTION_HEADER_ONLY AND NOT _pc MATCHES "header-only$")
    set(_template "${_pc}-header-only")
  endif()
  configure_file("${CMAKE_CURRENT_LIST_DIR}/${_template}.pc.in" "${PROJECT_BINARY_DIR}/${_pc}.pc.tmp" @ONLY)
  if(NOT _template STREQUAL _pc)  # the header-only content under the plain name
    file(READ "${PROJECT_BINARY_DIR}/${_pc}.pc.tmp" _content)
    string(REPLACE "Name: ${_template}" "Name: ${_pc}" _content "${_content}")
    string(REPLACE "gpt2-attention-header-only = " "gpt2-attention = " _content "${_content}")
    file(WRITE "${PROJECT_BINARY_DIR}/${_pc}.pc.tmp" "${_content}")
  endif()
  configure_file("${PROJECT_BINARY_DIR}/${_pc}.pc.tmp" "${PROJECT_BINARY_DIR}/${_pc}.pc" COPYONLY)
  install(FILES "${PROJECT_BINARY_DIR}/${_pc}.pc"
    DESTINATION "${GPT2_ATTENTION_INSTALL_PKGCONFIGDIR}"
    COMPONENT gpt2_attention_Development)
endforeach()

if(EXISTS "${PROJECT_SOURCE_DIR}/LICENSE")
  install(FILES "${PROJECT_SOURCE_DIR}/LICENSE"
    DESTINATION "${CMAKE_INSTALL_DATADIR}/doc/gpt2_attention"
    COMPONENT gpt2_attention_Development)
endif()

# The CLI, when the examples are built (target defined in examples/CMakeLists.txt).
if(TARGET gpt2-attention)
  install(TARGETS gpt2-attention
    RUNTIME DESTINATION "${CMAKE_INSTALL_BINDIR}"
    COMPONENT gpt2_attention_Runtime)
endif()
