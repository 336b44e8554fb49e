// Command-line parsing for gpt2-attention: one subcommand followed by flags, each written
// `--name VALUE` or `--name=VALUE`, or a switch `--name` (no value), each given at most once.
// `--help` / `-h` anywhere asks for help.
//
// A malformed command line is a UsageError (exit status 2); everything found wrong while reading
// or checking data is a gpt2::Error (exit status 1). See main.cpp.
#pragma once

#include <cerrno>
#include <algorithm>
#include <climits>
#include <cstdlib>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace gpt2::cli {

// The command line itself is wrong: unknown, missing or repeated flag, flag without a value,
// a value that is not a number or out of range, an unknown dtype, a stray argument.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A data error already reported (by rank 0 of a tensor-parallel run, whose error every rank
// shares): exit status 1 without another message. See tensor_parallel_run.hpp.
class ReportedElsewhere : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The flags of one subcommand, after parse_flags: each known, given once, with a non-empty value.
class Flags {
 public:
  static constexpr long long kNoMax = LLONG_MAX;  // integer_or's max when there is no upper bound

  bool help = false;  // --help or -h was given: print the usage, ignore everything else

  bool has(const std::string& name) const { return values_.count(name) != 0; }

  // The value of --name; UsageError "missing required flag --name" when it was not given.
  const std::string& required(const std::string& name) const {
    const auto it = values_.find(name);
    if (it == values_.end()) throw UsageError("missing required flag --" + name);
    return it->second;
  }

  // The value of --name, or `fallback` when it was not given.
  std::string text_or(const std::string& name, const std::string& fallback) const {
    const auto it = values_.find(name);
    return it == values_.end() ? fallback : it->second;
  }

  // --name as an integer in [min, max], or `fallback` when it was not given: decimal digits only
  // (no sign, no space; every min is >= 0, so "+2" and "-0" are refused like "-1"). UsageError
  // "--layer: expected an integer in [0, 1000000], got 'x'" for anything else ("expected an
  // integer >= 0" when max is kNoMax); the value is echoed as echoed_value() gives it.
  long long integer_or(const std::string& name, long long fallback, long long min,
                       long long max) const {
    const auto it = values_.find(name);
    if (it == values_.end()) return fallback;
    const std::string& text = it->second;
    const std::string range = max == kNoMax ? " >= " + std::to_string(min)
                                            : " in [" + std::to_string(min) + ", " +
                                                  std::to_string(max) + "]";
    const std::string expected =
        "--" + name + ": expected an integer" + range + ", got '" + echoed_value(text) + "'";
    if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos)
      throw UsageError(expected);
    errno = 0;
    const long long value = std::strtoll(text.c_str(), nullptr, 10);
    if (errno == ERANGE || value < min || value > max) throw UsageError(expected);
    return value;
  }

  // --name as a comma-separated list of integers >= 0 ("3,0,7"), or nothing when it was not
  // given. UsageError "--lengths: expected comma-separated integers >= 0, got '3,,4'" for anything
  // else: an empty item, a sign, a space, any other character, a value too large for long long
  // (the value echoed as echoed_value() gives it). An empty list cannot be given: parse_flags
  // refuses an empty value (so for B = 0 the flag must be left out).
  std::optional<std::vector<long long>> count_list(const std::string& name) const {
    const auto it = values_.find(name);
    if (it == values_.end()) return std::nullopt;
    const std::string& text = it->second;
    const UsageError bad("--" + name + ": expected comma-separated integers >= 0, got '" +
                         echoed_value(text) + "'");
    std::vector<long long> counts;
    std::size_t begin = 0;
    for (;;) {
      const std::size_t end = std::min(text.find(',', begin), text.size());
      const std::string item = text.substr(begin, end - begin);
      if (item.empty() || item.find_first_not_of("0123456789") != std::string::npos) throw bad;
      errno = 0;
      const long long value = std::strtoll(item.c_str(), nullptr, 10);
      if (errno == ERANGE) throw bad;
      counts.push_back(value);
      if (end == text.size()) return counts;
      begin = end + 1;
    }
  }

  // A flag's value as error messages echo it: at most kEchoMax characters, longer ones cut to
  // their first kEchoMax - 3 followed by "...".
  static constexpr std::size_t kEchoMax = 80;
  static std::string echoed_value(const std::string& text) {
    return text.size() <= kEchoMax ? text : text.substr(0, kEchoMax - 3) + "...";
  }

  // Records --name=value; UsageError if --name was already given.
  void set(const std::string& name, const std::string& value) {
    if (!values_.emplace(name, value).second)
      throw UsageError("flag --" + name + " given more than once");
  }

 private:
  std::map<std::string, std::string> values_;
};

// Parses the arguments after the subcommand. `known` lists the flag names without "--", and
// `switches` the flags that take no value (recorded as "1"; `--name=value` is refused).
//   run --weights W.safetensors --input=X.npy ...  ->  {weights: W.safetensors, input: X.npy, ...}
// A value may not start with "--" (that is the next flag: the value is missing) and may not be
// empty. Throws UsageError naming the offending argument.
inline Flags parse_flags(const std::string& command, const std::vector<std::string>& args,
                         const std::vector<std::string>& known,
                         const std::vector<std::string>& switches = {}) {
  Flags flags;
  for (const std::string& arg : args)
    if (arg == "--help" || arg == "-h") {
      flags.help = true;
      return flags;
    }
  const auto is_known = [&](const std::string& name) {
    for (const std::string& k : known)
      if (k == name) return true;
    return false;
  };
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg.rfind("--", 0) != 0) {
      if (arg.rfind("-", 0) == 0 && arg.size() > 1)
        throw UsageError(command + ": unknown flag '" + arg + "'");
      throw UsageError(command + ": unexpected argument '" + arg + "'");
    }
    const std::size_t eq = arg.find('=');
    const std::string name = arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    if (std::find(switches.begin(), switches.end(), name) != switches.end()) {
      if (eq != std::string::npos) throw UsageError("flag --" + name + " takes no value");
      flags.set(name, "1");
      continue;
    }
    if (!is_known(name))
      throw UsageError(command + ": unknown flag '--" + name + "'");
    std::string value;
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
    } else if (i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) {
      value = args[++i];
    } else {
      throw UsageError("flag --" + name + " needs a value");
    }
    if (value.empty()) throw UsageError("flag --" + name + " needs a value, got an empty one");
    flags.set(name, value);
  }
  return flags;
}

// `message` with every line break replaced by a space: errors are reported on one line.
inline std::string one_line(std::string message) {
  for (char& c : message)
    if (c == '\n' || c == '\r') c = ' ';
  return message;
}

// Puts a library message about a file into context:
//   in_context("input", "X.npy", "X.npy: cannot open: No such file or directory")
//     -> "input X.npy: cannot open: No such file or directory"
// (the library's own leading "path: " is dropped so the path is not repeated).
inline std::string in_context(const std::string& role, const std::string& path,
                              const std::string& message) {
  const std::string prefix = path + ": ";
  const std::string rest = message.rfind(prefix, 0) == 0 ? message.substr(prefix.size()) : message;
  return role + " " + path + ": " + rest;
}

}  // namespace gpt2::cli
