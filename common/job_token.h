// The job's secret: what a rank proves it holds before the store admits it (see docs/security.md).
// ddp-launch makes one per single-node job; multi-node jobs share one from a file.
#pragma once

#include <optional>
#include <string>

namespace ddp {

/// Environment variables of the contract: the token itself (set by ddp-launch for its workers;
/// never on a command line), or a file holding it (the user's, for multi-node and srun/mpirun jobs).
constexpr const char* kTokenEnv = "DDP_RDZV_TOKEN";
constexpr const char* kTokenFileEnv = "DDP_RDZV_TOKEN_FILE";
/// The fd of the listening socket ddp-launch hands to rank 0 (bound at MASTER_ADDR:MASTER_PORT).
constexpr const char* kStoreFdEnv = "DDP_STORE_FD";

/// Fewest characters a token may have.
constexpr std::size_t kMinTokenChars = 16;

/// A fresh token: 128 random bits as 32 hex characters.
std::string newJobToken();

/// The token in `path`: a text file's content without its surrounding whitespace, or, when the file
/// holds other bytes than printable ASCII (a NUL, raw random bytes), all its bytes as hex, so the
/// secret is the whole file wherever it travels. Throws ddp::ConfigError (one line: what is wrong
/// and the fix) when the file is missing, not a regular file (a FIFO, a device: refused without
/// waiting), owned by another user than the caller or root, readable or writable by group or
/// others, over 64 KiB, or holds fewer than kMinTokenChars characters (bytes) or one repeated.
std::string readTokenFile(const std::string& path);

/// Checks a token given directly (DDP_RDZV_TOKEN); throws ddp::ConfigError when too short or one
/// character repeated.
std::string checkedToken(const std::string& token, const std::string& source);

}  // namespace ddp
