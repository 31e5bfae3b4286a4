#include "framework/plan/emulated_slicer.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "hp/optim/buckets.h"
#include "hp/optim/grad_sync.h"

namespace hp::plan {

EmulatedSlicer::EmulatedSlicer(const std::vector<ParamEntry>& params, double bucket_bytes) : params_(params) {
  // The reducers' own rule over the parameters in reverse order.
  std::vector<std::size_t> reversed;
  std::vector<double> bytes;
  for (std::size_t k = params.size(); k-- > 0;) {
    if (!params[k].tensor.requires_grad()) continue;
    reversed.push_back(k);
    bytes.push_back(static_cast<double>(params[k].tensor.nbytes()));
  }
  for (const auto& run : cut_buckets(bytes, bucket_bytes)) {
    buckets_.emplace_back();
    for (std::size_t i : run) buckets_.back().push_back(reversed[i]);
  }
  std::vector<std::size_t> order;
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    std::int64_t n = 0;
    for (std::size_t i : buckets_[b]) n += params[i].tensor.numel();
    halves_.push_back(at::zeros({(n + 1) / 2}, params[buckets_[b].front()].tensor.options()));
    order.push_back(b);
  }
  launcher_ = std::make_unique<BucketLauncher>(params, buckets_, std::vector<std::vector<std::size_t>>{order},
                                               std::vector<bool>{true}, true, 0, [this](std::size_t b) { launch(b); });
  launcher_->learn_rounds();
}

EmulatedSlicer::~EmulatedSlicer() = default;

void EmulatedSlicer::begin_step(int micro_batches) { launcher_->guess_first_step(micro_batches); }

void EmulatedSlicer::end_backward() {
  launcher_->flush();
  while (!in_flight_.empty()) finish_oldest();
  launcher_->end_step();
}

double EmulatedSlicer::half_bytes() const {
  double b = 0;
  for (const auto& h : halves_) b += static_cast<double>(h.nbytes());
  return b;
}

void EmulatedSlicer::launch(std::size_t b) {
  c10::NoGradGuard no_grad;
  std::vector<at::Tensor> grads;
  for (std::size_t i : buckets_[b]) {
    auto& p = params_[i].tensor;
    if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
    grads.push_back(p.grad().reshape({-1}));
  }
  at::Tensor flat = at::cat(grads);
  grads.clear();
  at::Tensor half = flat.narrow(0, 0, halves_[b].numel()).clone();
  for (std::size_t i : buckets_[b]) params_[i].tensor.mutable_grad() = at::Tensor();
  in_flight_.push_back({b, flat, half});
  ++launches_;
  // The new bucket's copies are made before the oldest is summed, as the
  // reducer does: one more than kBucketsInFlight for that moment.
  while (in_flight_.size() > kBucketsInFlight) finish_oldest();
  peak_in_flight_ = std::max(peak_in_flight_, in_flight_.size());
}

void EmulatedSlicer::finish_oldest() {
  auto& f = in_flight_.front();
  halves_[f.bucket].add_(f.half);
  in_flight_.pop_front();
}

}  // namespace hp::plan
