// A strict parser for the Python dict literal in a .npy header (string keys; string, True/False
// and integer-tuple values) and the "label: problem" FormatError of the npy reader and writer.
// Part of gpt2/npy.hpp; not part of the public API.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "gpt2/detail/io_util.hpp"
#include "gpt2/error.hpp"

namespace gpt2::npy::detail {

// "label: problem"
inline FormatError error(const std::string& label, const std::string& problem) {
  return gpt2::detail::file_error(label, problem);
}

// A strict parser for the header's Python dict literal: string keys, and values that are strings,
// True/False, or tuples of integers. Nothing else (no nesting, no escapes) occurs in a valid
// header for the arrays this reader accepts.
class DictParser {
 public:
  DictParser(const std::string& text, const std::string& label) : s_(text), label_(label) {}

  // One parsed value.
  struct Value {
    enum class Kind { String, Bool, Tuple } kind = Kind::String;
    std::string text;                // String
    bool flag = false;               // Bool
    std::vector<std::int64_t> ints;  // Tuple
    std::string source;              // as written, for messages
  };

  // Parses the dict; calls on_item(key, value) for each item. The whole text must be consumed.
  template <class OnItem>
  void parse(OnItem on_item) {
    expect('{');
    skip_space();
    while (peek() != '}') {
      const std::string key = parse_string("a quoted key");
      expect(':');
      on_item(key, parse_value());
      skip_space();
      if (peek() == ',') {
        ++pos_;
        skip_space();
      } else if (peek() != '}') {
        fail("expected ',' or '}'");
      }
    }
    ++pos_;
    skip_space();
    if (pos_ != s_.size()) fail("unexpected text after the closing '}'");
  }

 private:
  // Throws "label: malformed header at offset N: what (header: <its first 200 bytes, printable>)".
  [[noreturn]] void fail(const std::string& what) const {
    std::string shown = s_.substr(0, 200);
    for (char& c : shown)
      if (c < 0x20 || c > 0x7E) c = '?';
    throw error(label_, "malformed header at offset " + std::to_string(pos_) + ": " + what +
                            " (header: " + shown + ")");
  }
  char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  void skip_space() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r'))
      ++pos_;
  }
  void expect(char c) {
    skip_space();
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++pos_;
  }
  std::string parse_string(const char* what) {
    skip_space();
    const char quote = peek();
    if (quote != '\'' && quote != '"') fail(std::string("expected ") + what);
    const std::size_t start = ++pos_;
    while (pos_ < s_.size() && s_[pos_] != quote) {
      if (s_[pos_] == '\\' || s_[pos_] == '\n') fail("unsupported character in a string");
      ++pos_;
    }
    if (pos_ == s_.size()) fail("unterminated string");
    return s_.substr(start, pos_++ - start);
  }
  std::int64_t parse_int() {
    skip_space();
    const bool negative = peek() == '-';
    if (negative) ++pos_;
    if (peek() < '0' || peek() > '9') fail("expected an integer");
    std::uint64_t v = 0;
    while (peek() >= '0' && peek() <= '9') {
      const unsigned digit = static_cast<unsigned>(peek() - '0');
      if (v > (static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) - digit) / 10)
        fail("integer too large");
      v = v * 10 + digit;
      ++pos_;
    }
    return negative ? -static_cast<std::int64_t>(v) : static_cast<std::int64_t>(v);
  }
  // "()" or "(a,)" or "(a, b)" or "(a, b,)": a one-element tuple needs its comma, "(a)" is an int.
  std::vector<std::int64_t> parse_tuple() {
    std::vector<std::int64_t> ints;
    ++pos_;  // '('
    skip_space();
    bool trailing_comma = false;
    while (peek() != ')') {
      ints.push_back(parse_int());
      skip_space();
      trailing_comma = peek() == ',';
      if (trailing_comma) {
        ++pos_;
        skip_space();
      } else if (peek() != ')') {
        fail("expected ',' or ')' in a tuple");
      }
    }
    ++pos_;
    if (ints.size() == 1 && !trailing_comma)
      fail("'(n)' is not a tuple; a 1-d shape is written '(n,)'");
    return ints;
  }
  Value parse_value() {
    skip_space();
    Value v;
    const std::size_t start = pos_;
    const char c = peek();
    if (c == '\'' || c == '"') {
      v.kind = Value::Kind::String;
      v.text = parse_string("a string");
    } else if (c == '(') {
      v.kind = Value::Kind::Tuple;
      v.ints = parse_tuple();
    } else if (s_.compare(pos_, 4, "True") == 0 || s_.compare(pos_, 5, "False") == 0) {
      v.kind = Value::Kind::Bool;
      v.flag = s_[pos_] == 'T';
      pos_ += v.flag ? 4 : 5;
    } else {
      fail("expected a string, True, False or a tuple");
    }
    v.source = s_.substr(start, pos_ - start);
    return v;
  }

  const std::string& s_;
  const std::string& label_;
  std::size_t pos_ = 0;
};

}  // namespace gpt2::npy::detail
