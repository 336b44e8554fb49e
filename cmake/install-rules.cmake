# Install rules for gpt2_attention (included when GPT2_ATTENTION_INSTALL is ON).
#
# Layout under the prefix:
#   include/gpt2/*.hpp                                   headers (core and io)
#   share/cmake/gpt2_attention/gpt2_attentionConfig.cmake   find_package(gpt2_attention CONFIG)
#   share/cmake/gpt2_attention/gpt2_attentionTargets.cmake  gpt2::attention
#   share/cmake/gpt2_attention/gpt2_attention_ioTargets.cmake gpt2::io (when built)
#   share/cmake/gpt2_attention/gpt2_attention_mpiTargets.cmake gpt2::mpi (when built)
#   bin/gpt2-attention                                   the CLI (when examples are built)
#
# Components: gpt2_attention_Development (headers + CMake package), gpt2_attention_Runtime (CLI).
# The package is header-only, hence ARCH_INDEPENDENT and installed under the data directory.

include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(GPT2_ATTENTION_INSTALL_CMAKEDIR "${CMAKE_INSTALL_DATADIR}/cmake/gpt2_attention"
  CACHE STRING "Where gpt2_attentionConfig.cmake is installed, relative to the prefix")
mark_as_advanced(GPT2_ATTENTION_INSTALL_CMAKEDIR)

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
write_basic_package_version_file(
  "${PROJECT_BINARY_DIR}/gpt2_attentionConfigVersion.cmake"
  COMPATIBILITY SameMajorVersion
  ARCH_INDEPENDENT)
install(FILES
  "${PROJECT_BINARY_DIR}/gpt2_attentionConfig.cmake"
  "${PROJECT_BINARY_DIR}/gpt2_attentionConfigVersion.cmake"
  DESTINATION "${GPT2_ATTENTION_INSTALL_CMAKEDIR}"
  COMPONENT gpt2_attention_Development)

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
