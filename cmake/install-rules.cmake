# Install rules for gpt2_attention (included when GPT2_ATTENTION_INSTALL is ON).
#
# Layout under the prefix:
#   include/gpt2/*.hpp                                   headers (core and io)
#   share/cmake/gpt2_attention/gpt2_attentionConfig.cmake   find_package(gpt2_attention CONFIG)
#   share/cmake/gpt2_attention/gpt2_attentionTargets.cmake  gpt2::attention
#   share/cmake/gpt2_attention/gpt2_attention_ioTargets.cmake gpt2::io (when built)
#   share/cmake/gpt2_attention/gpt2_attention_mpiTargets.cmake gpt2::mpi (when built)
#   share/pkgconfig/gpt2-attention.pc                    pkg-config: headers, Eigen, OpenMP flags
#   share/pkgconfig/gpt2-attention-io.pc                 pkg-config: + nlohmann_json (when built)
#   share/doc/gpt2_attention/LICENSE
#   bin/gpt2-attention                                   the CLI (when examples are built)
#
# Components: gpt2_attention_Development (headers, CMake package, pkg-config files),
# gpt2_attention_Runtime (CLI). The package is header-only, hence ARCH_INDEPENDENT and installed
# under the data directory.

include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(GPT2_ATTENTION_INSTALL_CMAKEDIR "${CMAKE_INSTALL_DATADIR}/cmake/gpt2_attention"
  CACHE STRING "Where gpt2_attentionConfig.cmake is installed, relative to the prefix")
set(GPT2_ATTENTION_INSTALL_PKGCONFIGDIR "${CMAKE_INSTALL_DATADIR}/pkgconfig"
  CACHE STRING "Where gpt2-attention.pc is installed, relative to the prefix")
mark_as_advanced(GPT2_ATTENTION_INSTALL_CMAKEDIR GPT2_ATTENTION_INSTALL_PKGCONFIGDIR)

# The CLI is installed only once it is built: `cmake --install` straight after configuring would
# otherwise stop on a missing file half-way through. This check runs first (before anything is
# copied) and says what to build; `--component gpt2_attention_Development` needs no build.
if(TARGET gpt2-attention)
  set(_gpt2_cli_check [=[
if(NOT EXISTS "@_gpt2_cli@")
  message(FATAL_ERROR "gpt2_attention: the gpt2-attention CLI is not built yet; nothing was installed.\n"
    "  Build it first:  cmake --build @PROJECT_BINARY_DIR@ --target gpt2-attention\n"
    "  (or everything:  cmake --build @PROJECT_BINARY_DIR@)\n"
    "  or install only the headers, CMake package and pkg-config files, which need no build:\n"
    "  cmake --install @PROJECT_BINARY_DIR@ --component gpt2_attention_Development")
endif()
]=])
  set(_gpt2_cli "$<TARGET_FILE:gpt2-attention>")
  string(CONFIGURE "${_gpt2_cli_check}" _gpt2_cli_check @ONLY)
  install(CODE "${_gpt2_cli_check}" COMPONENT gpt2_attention_Runtime)
  unset(_gpt2_cli)
  unset(_gpt2_cli_check)
endif()

install(TARGETS gpt2_attention
  EXPORT gpt2_attentionTargets
  FILE_SET HEADERS DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}"
  COMPONENT gpt2_attention_Development)
install(EXPORT gpt2_attentionTargets
  NAMESPACE gpt2::
  DESTINATION "${GPT2_ATTENTION_INSTALL_CMAKEDIR}"
  COMPONENT gpt2_attention_Development)

# The io component has its own export set: its targets file is loaded only when a consumer asks
# for COMPONENTS io, so nlohmann_json is never a dependency of the core.
if(TARGET gpt2_attention_io)
  install(TARGETS gpt2_attention_io
    EXPORT gpt2_attention_ioTargets
    FILE_SET HEADERS DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}"
    COMPONENT gpt2_attention_Development)
  install(EXPORT gpt2_attention_ioTargets
    NAMESPACE gpt2::
    DESTINATION "${GPT2_ATTENTION_INSTALL_CMAKEDIR}"
    COMPONENT gpt2_attention_Development)
endif()

# The mpi component likewise: MPI is a dependency only of consumers asking for COMPONENTS mpi.
if(TARGET gpt2_attention_mpi)
  install(TARGETS gpt2_attention_mpi
    EXPORT gpt2_attention_mpiTargets
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
write_basic_package_version_file(
  "${PROJECT_BINARY_DIR}/gpt2_attentionConfigVersion.cmake"
  COMPATIBILITY ${_gpt2_compatibility}
  ARCH_INDEPENDENT)
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
configure_file("${CMAKE_CURRENT_LIST_DIR}/gpt2-attention.pc.in"
  "${PROJECT_BINARY_DIR}/gpt2-attention.pc" @ONLY)
install(FILES "${PROJECT_BINARY_DIR}/gpt2-attention.pc"
  DESTINATION "${GPT2_ATTENTION_INSTALL_PKGCONFIGDIR}"
  COMPONENT gpt2_attention_Development)
if(TARGET gpt2_attention_io)
  configure_file("${CMAKE_CURRENT_LIST_DIR}/gpt2-attention-io.pc.in"
    "${PROJECT_BINARY_DIR}/gpt2-attention-io.pc" @ONLY)
  install(FILES "${PROJECT_BINARY_DIR}/gpt2-attention-io.pc"
    DESTINATION "${GPT2_ATTENTION_INSTALL_PKGCONFIGDIR}"
    COMPONENT gpt2_attention_Development)
endif()

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
