#include "launcher/exit_status.h"

#include <csignal>
#include <sys/wait.h>

namespace ddp::launcher {

ExitStatus ExitStatus::fromWaitStatus(int status) {
  if (WIFSIGNALED(status)) {
    ExitStatus result = killedBy(WTERMSIG(status));
#ifdef WCOREDUMP
    result.coreDumped = WCOREDUMP(status);
#endif
    return result;
  }
  return exited(WIFEXITED(status) ? WEXITSTATUS(status) : 0);
}

std::string ExitStatus::describe() const {
  if (!signaled) return "exit code " + std::to_string(code);
  return signalName(signal) + (coreDumped ? " (core dumped)" : "");
}

std::string signalName(int signal) {
  // Our own table: sigabbrev_np() needs glibc 2.32 and strsignal() gives prose.
  struct Entry {
    int number;
    const char* name;
  };
  static const Entry kNames[] = {
      {SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},       {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},
      {SIGTRAP, "SIGTRAP"}, {SIGABRT, "SIGABRT"},     {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},
      {SIGKILL, "SIGKILL"}, {SIGUSR1, "SIGUSR1"},     {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"},
      {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"},     {SIGTERM, "SIGTERM"}, {SIGCHLD, "SIGCHLD"},
      {SIGCONT, "SIGCONT"}, {SIGSTOP, "SIGSTOP"},     {SIGTSTP, "SIGTSTP"}, {SIGTTIN, "SIGTTIN"},
      {SIGTTOU, "SIGTTOU"}, {SIGURG, "SIGURG"},       {SIGXCPU, "SIGXCPU"}, {SIGXFSZ, "SIGXFSZ"},
      {SIGVTALRM, "SIGVTALRM"}, {SIGPROF, "SIGPROF"}, {SIGWINCH, "SIGWINCH"}, {SIGIO, "SIGIO"},
      {SIGPWR, "SIGPWR"},   {SIGSYS, "SIGSYS"},
#ifdef SIGSTKFLT
      {SIGSTKFLT, "SIGSTKFLT"},
#endif
  };
  for (const Entry& entry : kNames) {
    if (entry.number == signal) return entry.name;
  }
  if (signal >= SIGRTMIN && signal <= SIGRTMAX) {
    return signal == SIGRTMIN ? "SIGRTMIN" : "SIGRTMIN+" + std::to_string(signal - SIGRTMIN);
  }
  return "signal " + std::to_string(signal);
}

}  // namespace ddp::launcher
