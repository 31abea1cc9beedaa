// Where temporary files go: $TMPDIR when it is set and not empty, else /tmp (mkdtemp(3)'s and
// Python's tempfile's choice, so the launcher's directories sit beside torchrun's).
#pragma once

#include <cstdlib>
#include <string>

namespace ddp {

inline std::string temporaryRoot() {
  const char* tmp = std::getenv("TMPDIR");
  return tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
}

}  // namespace ddp
