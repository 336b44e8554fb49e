// Test helpers for checking what is thrown: the message of the exception a call throws, and a
// substring assertion that prints both strings when it fails.
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <string>

namespace gpt2::test {

// What `f()` throws, which must be an E: the message of the E. Anything else derived from
// std::exception, or no exception at all, is a test failure (ADD_FAILURE) and gives "".
template <class E, class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "unexpected exception type: " << e.what();
    return "";
  }
  ADD_FAILURE() << "no exception";
  return "";
}

// Passes when `message` contains `part`.
inline ::testing::AssertionResult Contains(const std::string& message, const std::string& part) {
  if (message.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << message << "' does not contain '" << part << "'";
}

}  // namespace gpt2::test
