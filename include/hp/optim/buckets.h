#pragma once
// The one rule that cuts gradients into reduction buckets, shared by the
// all-reduce reducer and zero's reduce-scatter (so a bucket size means the
// same to both). PyTorch DDP's rule: tensors are taken in the order given
// (reverse parameter order: the last layers' gradients are ready first),
// and a bucket closes as soon as it holds at least its limit, so every
// bucket but the last reaches it. The first bucket's limit is the smaller
// of 1 MiB and the cap, so the first reduction can start early in
// backward; every later bucket's is the cap.
#include <cstddef>
#include <vector>

namespace hp {

/// Bytes at which the first bucket closes when the cap is larger.
constexpr double kFirstBucketBytes = 1024.0 * 1024.0;

/// Buckets a reducer that releases the gradients it sends keeps travelling
/// at once (each a flat copy of its gradients and the part it receives);
/// launching another first finishes the oldest. The planner's emulation of
/// that reducer keeps the same number.
constexpr std::size_t kBucketsInFlight = 2;

/// Consecutive runs of the tensors whose sizes are `bytes`, in order:
/// indices into `bytes`.
std::vector<std::vector<std::size_t>> cut_buckets(const std::vector<double>& bytes, double cap_bytes);

}  // namespace hp
