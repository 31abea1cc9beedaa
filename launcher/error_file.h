// torchrun's TORCHELASTIC_ERROR_FILE: each worker gets a file of its own to write its exception
// into (Python's @record from torch.distributed.elastic.multiprocessing.errors does; our worker
// does too), and the launcher shows what a failed rank wrote in its failure summary.
#pragma once

#include <string>

namespace ddp::launcher {

/// A private directory (mode 700, under $TMPDIR or /tmp, ddp-launch-errors-HOST-PIDNS-PID-XXXXXX) for one
/// attempt's error files, removed with everything in it when this goes. Making one first removes
/// this user's directories on this host whose launcher is gone (one SIGKILLed cannot remove its own).
class ErrorFiles {
 public:
  ErrorFiles();
  ~ErrorFiles();
  ErrorFiles(const ErrorFiles&) = delete;
  ErrorFiles& operator=(const ErrorFiles&) = delete;

  /// The file rank `rank` writes into (not created: no file = nothing written); "" when the
  /// directory could not be made (then workers get no TORCHELASTIC_ERROR_FILE).
  std::string pathFor(int rank) const;

 private:
  std::string dir_;
};

/// What torchrun shows of an error file: "ValueError: boom (train.py, line 12, in main)" — the
/// message and the innermost frame of its traceback; "" when there is no file or it is not
/// torchrun's JSON ({"message": {"message": ..., "extraInfo": {"py_callstack": ...}}} or
/// {"message": "..."}).
std::string readErrorFile(const std::string& path);

}  // namespace ddp::launcher
