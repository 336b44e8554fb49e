// What one attention head does, read off its probabilities att[T, T] (row t: query position t,
// column s: key position s <= t).
//
// Statistics are averaged over the query rows t = 2 .. T-1: the rows where the previous token
// (t-1), the first token (0) and the token itself (t) are three different keys. (Row 0 sees only
// itself; in row 1 the previous token is the first token.)
//
//   prev       = mean_t att[t, t-1]
//   first      = mean_t att[t, 0]
//   self       = mean_t att[t, t]
//   mean_dist  = mean_t sum_s att[t, s] (t - s)              in tokens; uniform gives about T/4
//   evenness   = mean_t H(att[t, 0..t]) / log(t + 1)          1 = uniform over the visible keys
//
// The job is the first rule that holds (kDominant, kEven, kLocalDistance below):
//   previous-token  prev  >= 0.5        first-token  first >= 0.5        self  self >= 0.5
//   even            evenness >= 0.9     local        mean_dist <= 3      mixed otherwise
#pragma once

#include <cmath>
#include <string>

#include "gpt2/error.hpp"
#include "gpt2/types.hpp"

namespace gpt2::cli {

enum class Job { previous_token, first_token, self, even, local, mixed };

inline const char* job_name(Job job) {
  switch (job) {
    case Job::previous_token: return "previous-token";
    case Job::first_token: return "first-token";
    case Job::self: return "self";
    case Job::even: return "even";
    case Job::local: return "local";
    case Job::mixed: return "mixed";
  }
  return "?";
}

// Classification thresholds (see the top of this header).
inline constexpr double kDominant = 0.5;       // a share this large names the head's job
inline constexpr double kEven = 0.9;           // evenness at least this: even
inline constexpr double kLocalDistance = 3.0;  // mean distance at most this (tokens): local
inline constexpr Index kFirstAnalysedRow = 2;  // rows t = 2 .. T-1 are averaged

struct HeadStats {
  double prev = 0, first = 0, self = 0, mean_distance = 0, evenness = 0;
};

// Statistics of one head over rows t = 2 .. T-1.
//   att [T, T] (read), T >= 3; row t holds a distribution over keys 0 .. t.
template <class T>
HeadStats head_stats(const ConstMatrixRef<T>& att) {
  const Index T_ = att.rows();
  detail::check_shape("att", {T_, T_}, {att.rows(), att.cols()});
  if (T_ <= kFirstAnalysedRow)
    throw ShapeError("att: expected at least 3 rows (rows t >= 2 are analysed), got " +
                     std::to_string(T_));
  HeadStats s;
  for (Index t = kFirstAnalysedRow; t < T_; ++t) {
    double distance = 0, entropy = 0;
    for (Index k = 0; k <= t; ++k) {
      const double p = static_cast<double>(att(t, k));
      distance += p * static_cast<double>(t - k);
      if (p > 0) entropy -= p * std::log(p);
    }
    s.prev += static_cast<double>(att(t, t - 1));
    s.first += static_cast<double>(att(t, 0));
    s.self += static_cast<double>(att(t, t));
    s.mean_distance += distance;
    s.evenness += entropy / std::log(static_cast<double>(t + 1));
  }
  const auto rows = static_cast<double>(T_ - kFirstAnalysedRow);
  s.prev /= rows;
  s.first /= rows;
  s.self /= rows;
  s.mean_distance /= rows;
  s.evenness /= rows;
  return s;
}

// The job a head does, by the first rule that holds (see the top of this header).
inline Job classify(const HeadStats& s) {
  if (s.prev >= kDominant) return Job::previous_token;
  if (s.first >= kDominant) return Job::first_token;
  if (s.self >= kDominant) return Job::self;
  if (s.evenness >= kEven) return Job::even;
  if (s.mean_distance <= kLocalDistance) return Job::local;
  return Job::mixed;
}

}  // namespace gpt2::cli
