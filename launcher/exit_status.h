// How a worker ended, decoded from waitpid(2)'s status word.
#pragma once

#include <string>

namespace ddp::launcher {

/// A finished process: exited with a code, or was killed by a signal.
struct ExitStatus {
  bool signaled = false;    // true: killed by `signal`; false: exited with `code`
  int code = 0;             // exit code when !signaled
  int signal = 0;           // signal number when signaled
  bool coreDumped = false;  // only meaningful when signaled

  /// Decodes a status word from waitpid(2)/wait(2).
  static ExitStatus fromWaitStatus(int status);
  static ExitStatus exited(int code) { return ExitStatus{false, code, 0, false}; }
  static ExitStatus killedBy(int signal) { return ExitStatus{true, 0, signal, false}; }

  bool success() const { return !signaled && code == 0; }

  /// The shell convention: the exit code, or 128 + signal number.
  int shellCode() const { return signaled ? 128 + signal : code; }

  /// "exit code 3" or "SIGSEGV (core dumped)"; reads after "failed with" / "was killed by".
  std::string describe() const;
};

/// "SIGTERM" for 15, "SIGRTMIN+2" for real-time signals, "signal 77" when unknown.
std::string signalName(int signal);

}  // namespace ddp::launcher
