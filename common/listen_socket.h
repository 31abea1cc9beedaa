// A listening TCP socket bound to one address: the job's store port, taken once and kept, so
// nothing can take it between a check and the bind, and bound only where the store is served.
#pragma once

#include <string>
#include <vector>

namespace ddp {

/// Owns a listening socket (close-on-exec) bound to host:port (port 0: the kernel picks).
class ListenSocket {
 public:
  /// Throws ddp::ConfigError naming host:port and the cause ("address already in use",
  /// "not an address of this machine", a name that does not resolve). A host that resolves to
  /// several addresses of this machine (localhost: ::1 and 127.0.0.1; a dual-stack name) listens on
  /// the first and holds the port on the others without listening (clients trying one of those
  /// first are refused and try the next): another process listening on any of them could take
  /// the ranks' connections and relay them, so the port held there is a ConfigError too.
  ListenSocket(const std::string& host, int port);
  /// As the constructor, for a host that would resolve to these addresses in this order (numeric,
  /// e.g. {"127.0.0.1", "127.0.0.2"}): what a name of several addresses gets, for tests.
  static ListenSocket onAddresses(const std::vector<std::string>& numericHosts, int port);
  /// Adopts `fd`, which must be a listening TCP socket; throws ddp::ConfigError otherwise.
  static ListenSocket adopt(int fd, const std::string& what);
  ~ListenSocket();
  ListenSocket(ListenSocket&& other) noexcept;
  ListenSocket& operator=(ListenSocket&&) = delete;
  ListenSocket(const ListenSocket&) = delete;
  ListenSocket& operator=(const ListenSocket&) = delete;

  int fd() const { return fd_; }
  int port() const { return port_; }
  /// Gives up ownership of the listening fd (the caller closes it); the port held on the host's
  /// other addresses stays with this object: keep it while the fd is served.
  int release();

 private:
  ListenSocket() = default;
  struct Candidate;  // one address getaddrinfo gave
  static std::vector<Candidate> resolve(const std::string& host, int port, int flags);
  void bindAll(const std::string& host, int port, const std::vector<Candidate>& candidates);
  /// One try: 0 when bound, else the port another socket holds on guardText_'s address (nothing held).
  int tryBindAll(const std::string& host, int port, const std::vector<Candidate>& candidates);
  void closeAll();
  int fd_ = -1;
  int port_ = 0;
  std::vector<int> guards_;  // the port held, not listening, on the host's other addresses
  std::string guardText_;    // the address where another socket held the port (tryBindAll)
};

}  // namespace ddp
