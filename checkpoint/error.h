#pragma once
// The exceptions of the checkpoint layer.
#include <stdexcept>
#include <string>

namespace hp::ckpt {

/// A failure the user can act on: a missing, damaged or mismatched checkpoint,
/// or an I/O error. The message names the file and, where one is involved,
/// the tensor.
class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A broken invariant inside hyperparallel (for example shards that do not
/// tile their tensor at commit): a bug to report, not a user's mistake.
/// Derives from CheckpointError so one handler catches every checkpoint failure.
class CheckpointInternalError : public CheckpointError {
 public:
  explicit CheckpointInternalError(const std::string& what)
      : CheckpointError("hyperparallel internal error (please report this bug): " + what) {}
};

}  // namespace hp::ckpt
