// Where a relative path was looked for, for error lines: the process's working directory (the
// workers of ddp-launch inherit the directory it was started in).
#pragma once

#include <filesystem>
#include <string>
#include <system_error>

namespace ddp {

/// " (relative to the working directory /home/u)" for a relative `path`; "" for an absolute or empty one.
inline std::string relativePathNote(const std::string& path) {
  if (path.empty() || path[0] == '/') return "";
  std::error_code ec;
  const std::filesystem::path cwd = std::filesystem::current_path(ec);
  if (ec) return "";
  std::string note = " (relative to the working directory ";
  note.append(cwd.string()).append(")");
  return note;
}

}  // namespace ddp
