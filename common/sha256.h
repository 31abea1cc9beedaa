// SHA-256 and HMAC-SHA256 (FIPS 180-4, RFC 2104), the job token's randomness and comparisons:
// what the store's challenge-response needs, without a crypto library in the launcher.
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace ddp::crypto {

using Digest = std::array<std::uint8_t, 32>;

Digest sha256(const std::string& message);

/// HMAC-SHA256 of `message` under `key` (any length).
Digest hmacSha256(const std::string& key, const std::string& message);

/// `count` bytes from the kernel's CSPRNG (getrandom); throws ddp::Error if it fails.
std::string randomBytes(std::size_t count);

/// Lower-case hex of `bytes`.
std::string toHex(const std::string& bytes);
std::string toHex(const Digest& digest);

/// Compares in time independent of where the inputs differ.
bool equalConstantTime(const std::string& a, const std::string& b);

}  // namespace ddp::crypto
