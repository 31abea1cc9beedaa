// The errors ddp-launch's library raises: catch ddp::Error for all of them, or one
// kind. what() is one line that says what is wrong and how to fix it.
#pragma once

#include <stdexcept>
#include <string>

namespace ddp {

/// Base of every error ddp-launch and the worker raise on purpose.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

/// Bad configuration, command line or environment: the user can fix it.
class ConfigError : public Error {
 public:
  using Error::Error;
};

/// A collective, rendezvous or process-group failure.
class CommError : public Error {
 public:
  using Error::Error;
};

/// Something did not happen within its time limit.
class TimeoutError : public CommError {
 public:
  using CommError::CommError;
};

/// A checkpoint or exported model could not be written or read.
class CheckpointError : public Error {
 public:
  using Error::Error;
};

/// Every checkpoint in a Checkpointer's directory is damaged (Checkpointer::resume): nothing was
/// loaded; restarting the job meets them again, so a launcher should not (the worker exits 2).
class CheckpointsDamagedError : public CheckpointError {
 public:
  using CheckpointError::CheckpointError;
};

/// Data set files missing or malformed.
class DataError : public Error {
 public:
  using Error::Error;
};

}  // namespace ddp
