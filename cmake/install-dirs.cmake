# Where the package's files go under the install prefix (included by the top-level CMakeLists.txt
# before tests/, whose package tests need these paths on the first configure).
include(GNUInstallDirs)

if(GPT2_ATTENTION_HEADER_ONLY)
  set(_gpt2_package_root "${CMAKE_INSTALL_DATADIR}")
else()
  set(_gpt2_package_root "${CMAKE_INSTALL_LIBDIR}")
endif()
set(GPT2_ATTENTION_INSTALL_CMAKEDIR "${_gpt2_package_root}/cmake/gpt2_attention"
  CACHE STRING "Where gpt2_attentionConfig.cmake is installed, relative to the prefix")
set(GPT2_ATTENTION_INSTALL_PKGCONFIGDIR "${_gpt2_package_root}/pkgconfig"
  CACHE STRING "Where gpt2-attention.pc is installed, relative to the prefix")
mark_as_advanced(GPT2_ATTENTION_INSTALL_CMAKEDIR GPT2_ATTENTION_INSTALL_PKGCONFIGDIR)
