// The wire format of the job's key-value store (common/store_server, common/store_client).
//
// Handshake (the server speaks first):
//   server: kMagic, 1 byte (1: a token is required, 0: none), 16-byte server nonce
//   client: kMagic, 16-byte client nonce, HMAC-SHA256(token, "client" nonceS nonceC)
//   server: 'A' and HMAC-SHA256(token, "server" nonceS nonceC)   (the client checks it), or
//           'T' (wrong or missing token) and closes.
// Then frames, each a little-endian u32 length and that many bytes: a request is an op byte and
// its fields; a reply is a status byte (Status) and the result. Byte strings are u32 length + bytes.
#pragma once

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddp::comm::wire {

constexpr char kMagic[] = "DDPSTORE1\n";
constexpr std::size_t kMagicSize = sizeof(kMagic) - 1;
constexpr std::size_t kNonceSize = 16;
constexpr std::size_t kMacSize = 32;
constexpr std::size_t kServerHelloSize = kMagicSize + 1 + kNonceSize;
constexpr std::size_t kClientHelloSize = kMagicSize + kNonceSize + kMacSize;
constexpr char kAccepted = 'A';
constexpr char kRejected = 'T';
/// Largest frame either side accepts (a value of the store is small: addresses, ids, counters).
constexpr std::uint32_t kMaxFrame = 64u << 20;

enum class Op : std::uint8_t {
  kSet = 1,
  kGet,          // key, timeout ms: waits for the key
  kAdd,          // key, i64
  kCheck,        // n, keys
  kWait,         // n, keys, timeout ms
  kDelete,       // key
  kNumKeys,
  kCompareSet,   // key, expected, desired
  kAppend,       // key, value
  kMultiGet,     // n, keys, timeout ms
  kMultiSet,     // n, (key, value)...
};

enum class Status : std::uint8_t { kOk = 0, kTimeout = 1, kBadRequest = 2 };

inline std::string macMessage(const char* role, const std::string& serverNonce, const std::string& clientNonce) {
  return std::string(role) + serverNonce + clientNonce;
}

/// Appends fields to a frame body.
class Writer {
 public:
  Writer& u8(std::uint8_t v) {
    out_.push_back(static_cast<char>(v));
    return *this;
  }
  Writer& u32(std::uint32_t v) {
    for (int i = 0; i < 4; ++i) out_.push_back(static_cast<char>(v >> (8 * i)));
    return *this;
  }
  Writer& u64(std::uint64_t v) {
    for (int i = 0; i < 8; ++i) out_.push_back(static_cast<char>(v >> (8 * i)));
    return *this;
  }
  Writer& bytes(const void* data, std::size_t size) {
    u32(static_cast<std::uint32_t>(size));
    out_.append(static_cast<const char*>(data), size);
    return *this;
  }
  Writer& str(const std::string& s) { return bytes(s.data(), s.size()); }
  Writer& vec(const std::vector<std::uint8_t>& v) { return bytes(v.data(), v.size()); }
  /// The body written so far.
  const std::string& raw() const { return out_; }
  /// The frame: length prefix and body.
  std::string frame() const {
    Writer length;
    length.u32(static_cast<std::uint32_t>(out_.size()));
    return length.out_ + out_;
  }

 private:
  std::string out_;
};

/// Reads fields from a frame body; throws std::runtime_error on a short or malformed body.
class Reader {
 public:
  Reader(const char* data, std::size_t size) : data_(data), size_(size) {}
  std::uint8_t u8() { return static_cast<std::uint8_t>(*take(1)); }
  std::uint32_t u32() {
    const char* p = take(4);
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= std::uint32_t{static_cast<std::uint8_t>(p[i])} << (8 * i);
    return v;
  }
  std::uint64_t u64() {
    const char* p = take(8);
    std::uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= std::uint64_t{static_cast<std::uint8_t>(p[i])} << (8 * i);
    return v;
  }
  std::string str() {
    const std::uint32_t n = u32();
    const char* p = take(n);
    return std::string(p, n);
  }
  std::vector<std::uint8_t> vec() {
    const std::uint32_t n = u32();
    const char* p = take(n);
    return std::vector<std::uint8_t>(p, p + n);
  }
  bool done() const { return at_ == size_; }

 private:
  const char* take(std::size_t n) {
    if (n > size_ - at_) throw std::runtime_error("short frame");
    const char* p = data_ + at_;
    at_ += n;
    return p;
  }
  const char* data_;
  std::size_t size_;
  std::size_t at_ = 0;
};

}  // namespace ddp::comm::wire
