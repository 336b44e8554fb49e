// Errors thrown by gpt2-attention. Every message names the tensor (or value) that is wrong,
// what was expected and what was found, e.g.
//   "c_attn.weight: expected shape [768, 2304], got [768, 768]".
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace gpt2 {

// Base class of everything the library throws on bad input.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A tensor or buffer whose shape or size does not match what the operation needs.
class ShapeError : public Error {
 public:
  using Error::Error;
};

// An invalid configuration (n_embd, n_head, ...).
class ConfigError : public Error {
 public:
  using Error::Error;
};

// A KV cache without room for the tokens of a forward, e.g. "KV cache: 1020 cached + 8 new
// tokens exceed its capacity of 1024 tokens". The cache is left unchanged.
class CapacityError : public Error {
 public:
  using Error::Error;
};

// A file that is malformed or cannot be read/written (safetensors, .npy). The message names the
// file and the problem, e.g. "model.safetensors: tensor 'h.0.attn.c_attn.bias': data_offsets
// [0, 9000] end past the data section (9216 bytes)".
class FormatError : public Error {
 public:
  using Error::Error;
};

namespace detail {

// "[768, 2304]"
inline std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::ostringstream s;
  s << '[';
  for (std::size_t i = 0; i < shape.size(); ++i) s << (i ? ", " : "") << shape[i];
  s << ']';
  return s.str();
}

// Throws ShapeError "<what>: expected shape [a, b], got [c, d]" unless the two shapes are equal.
// Allocates nothing unless it throws (it runs on every call of the allocation-free paths).
inline void check_shape(const char* what, std::initializer_list<std::int64_t> expected,
                        std::initializer_list<std::int64_t> actual) {
  if (expected.size() == actual.size() &&
      std::equal(expected.begin(), expected.end(), actual.begin()))
    return;
  throw ShapeError(std::string(what) + ": expected shape " + shape_string(expected) + ", got " +
                   shape_string(actual));
}

inline void check_shape(const std::string& what, const std::vector<std::int64_t>& expected,
                        const std::vector<std::int64_t>& actual) {
  if (expected != actual)
    throw ShapeError(what + ": expected shape " + shape_string(expected) + ", got " +
                     shape_string(actual));
}

}  // namespace detail
}  // namespace gpt2
