// gpt2-attention: the library version, the one place it is written down.
// CMakeLists.txt reads these three numbers from this file.
#pragma once

#define GPT2_ATTENTION_VERSION_MAJOR 0
#define GPT2_ATTENTION_VERSION_MINOR 5
#define GPT2_ATTENTION_VERSION_PATCH 0

namespace gpt2 {
inline constexpr int version_major = GPT2_ATTENTION_VERSION_MAJOR;
inline constexpr int version_minor = GPT2_ATTENTION_VERSION_MINOR;
inline constexpr int version_patch = GPT2_ATTENTION_VERSION_PATCH;
}  // namespace gpt2
