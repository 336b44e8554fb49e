# gpt2::stb: Debian's stb (libstb-dev: headers in include/stb/, the implementations compiled into
# libstb.so), for the PNG writer of the CLI (examples/cli/png_image.hpp) and its tests, which also
# decode PNGs with stb_image. Included by examples/ and tests/; defines the target once.
if(NOT TARGET gpt2::stb)
  find_path(GPT2_STB_INCLUDE_DIR stb_image_write.h PATH_SUFFIXES stb)
  find_library(GPT2_STB_LIBRARY stb)
  if(NOT GPT2_STB_INCLUDE_DIR OR NOT GPT2_STB_LIBRARY)
    message(FATAL_ERROR
      "the gpt2-attention CLI (and the tests that include its headers) writes PNGs with stb_image_write, "
      "which was not found (Debian: libstb-dev; scripts/install-deps.sh installs it). Install it or "
      "configure with -DGPT2_ATTENTION_BUILD_EXAMPLES=OFF.")
  endif()
  add_library(gpt2_stb UNKNOWN IMPORTED)
  add_library(gpt2::stb ALIAS gpt2_stb)
  set_target_properties(gpt2_stb PROPERTIES
    IMPORTED_LOCATION "${GPT2_STB_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${GPT2_STB_INCLUDE_DIR}")
endif()
