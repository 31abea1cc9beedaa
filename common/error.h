// The project's error family: every failure the user can cause or meet is one
// of these, and the program edge turns it into one clear line and exit code.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#include "ddp/error.h"

namespace ddp {

namespace detail {

template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream out;
  (out << ... << std::forward<Args>(args));
  return out.str();
}

}  // namespace detail
}  // namespace ddp

/// Throws `ErrorType` with the message pieces streamed together.
#define DDP_THROW(ErrorType, ...) throw ErrorType(::ddp::detail::concat(__VA_ARGS__))

/// Like Gloo's GLOO_ENFORCE: throws ddp::Error naming the condition and the place.
#define DDP_ENFORCE(cond, ...)                                                    \
  do {                                                                            \
    if (!(cond)) {                                                                \
      throw ::ddp::Error(::ddp::detail::concat(__FILE__, ":", __LINE__, ": ",     \
                                               "check '" #cond "' failed: ",      \
                                               ##__VA_ARGS__));                   \
    }                                                                             \
  } while (0)

/// Like GLOO_ENFORCE_EQ: prints both values.
#define DDP_ENFORCE_EQ(a, b, ...)                                                 \
  do {                                                                            \
    const auto& ddp_a_ = (a);                                                     \
    const auto& ddp_b_ = (b);                                                     \
    if (!(ddp_a_ == ddp_b_)) {                                                    \
      throw ::ddp::Error(::ddp::detail::concat(__FILE__, ":", __LINE__, ": ",     \
                                               #a " == " #b " failed (", ddp_a_,  \
                                               " vs ", ddp_b_, ") ", ##__VA_ARGS__)); \
    }                                                                             \
  } while (0)
