// One way to read the library's enums from their names (Backend, GradientCompression,
// GradientReducer, LrDecay): each enum has a name function, and its parser is this over its values.
#pragma once

#include <initializer_list>
#include <optional>
#include <string_view>

namespace ddp::detail {

/// The value among `values` whose name (`nameOf`) is `name`; nullopt when none has it.
template <typename E>
std::optional<E> fromName(std::string_view name, std::initializer_list<E> values, const char* (*nameOf)(E)) {
  for (E value : values) {
    if (name == nameOf(value)) return value;
  }
  return std::nullopt;
}

}  // namespace ddp::detail
