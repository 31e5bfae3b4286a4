#include "backends/dist/group.h"

#include <ATen/ATen.h>
#include "backends/dist/detail/pg_handle.h"
#include "backends/dist/flight_recorder.h"
#include "backends/profile/trace.h"

#include <algorithm>
#include <chrono>

namespace hp::dist {

namespace {

c10d::ReduceOp to_c10d(ReduceKind k) {
  switch (k) {
    case ReduceKind::kMax: return c10d::ReduceOp::MAX;
    case ReduceKind::kMin: return c10d::ReduceOp::MIN;
    default: return c10d::ReduceOp::SUM;
  }
}

std::uint64_t nbytes(const at::Tensor& t) {
  return static_cast<std::uint64_t>(t.numel()) * t.element_size();
}

/// Gloo rejects bfloat16/half reductions; compute them in fp32.
bool needs_upcast(const at::Tensor& t) {
  return t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf;
}

}  // namespace

Group::Group(std::string name, std::vector<int> global_ranks, int my_global_rank,
             std::shared_ptr<PgHandle> pg, std::chrono::milliseconds timeout)
    : name_(std::move(name)),
      ranks_(std::move(global_ranks)),
      my_global_rank_(my_global_rank),
      pg_(std::move(pg)),
      timeout_(timeout) {
  auto it = std::find(ranks_.begin(), ranks_.end(), my_global_rank_);
  if (it == ranks_.end()) {
    throw std::logic_error("internal error: rank " + std::to_string(my_global_rank_) +
                           " is not a member of group '" + name_ + "', please report");
  }
  my_index_ = static_cast<int>(it - ranks_.begin());
  if (!pg_ && ranks_.size() > 1) {
    throw std::logic_error("internal error: group '" + name_ + "' of " +
                           std::to_string(ranks_.size()) + " ranks has no process group");
  }
}

Group::~Group() = default;

void Group::fail(const std::string& op, const std::string& cause) const {
  std::string members;
  for (std::size_t i = 0; i < ranks_.size(); ++i) {
    members += (i ? "," : "") + std::to_string(ranks_[i]);
  }
  throw CommError("rank " + std::to_string(my_global_rank_) + ": " + op + " on group '" + name_ +
                  "' (global ranks [" + members + "], timeout " +
                  std::to_string(timeout_.count() / 1000.0).substr(0, 6) + " s) failed: " + cause);
}

template <typename Start>
void Group::run(const std::string& op, std::uint64_t bytes, Start&& start, flight::Kind kind, int peer) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string short_op = op.substr(0, op.find(' '));
  profile::Span span("comm", short_op);
  if (span.active()) {
    span.arg("group", name_).arg("bytes", bytes);
    if (peer >= 0) span.arg("peer", peer);
  }
  const std::uint64_t id = recorder_ ? recorder_->issue(name_, short_op, kind, peer, bytes) : 0;
  try {
    c10::intrusive_ptr<c10d::Work> work = start(*pg_->pg);
    work->wait(timeout_);
  } catch (const CommError&) {
    if (recorder_) recorder_->finish(id, false);
    throw;
  } catch (const std::exception& e) {
    if (recorder_) recorder_->finish(id, false);
    std::string what = e.what();
    // c10 errors carry a C++ backtrace after the first line; keep the cause.
    auto nl = what.find('\n');
    fail(op, nl == std::string::npos ? what : what.substr(0, nl));
  }
  if (recorder_) recorder_->finish(id, true);
  auto& s = stats_[short_op];
  s.calls += 1;
  s.bytes += bytes;
  s.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void Group::all_reduce(at::Tensor& t, ReduceKind op) {
  if (size() == 1) return;
  at::Tensor buf = needs_upcast(t) ? t.to(at::kFloat) : (t.is_contiguous() ? t : t.contiguous());
  std::vector<at::Tensor> v{buf};
  c10d::AllreduceOptions o;
  o.reduceOp = to_c10d(op);
  o.timeout = timeout_;
  run("all_reduce", nbytes(buf), [&](c10d::ProcessGroup& pg) { return pg.allreduce(v, o); }, flight::Kind::kCollective);
  if (op == ReduceKind::kAvg) buf.div_(size());
  if (!buf.is_same(t)) t.copy_(buf);
}

void Group::broadcast(at::Tensor& t, int root) {
  if (size() == 1) return;
  at::Tensor buf = t.is_contiguous() ? t : t.contiguous();
  std::vector<at::Tensor> v{buf};
  c10d::BroadcastOptions o;
  o.rootRank = root;
  o.timeout = timeout_;
  run("broadcast", nbytes(buf), [&](c10d::ProcessGroup& pg) { return pg.broadcast(v, o); }, flight::Kind::kCollective);
  if (!buf.is_same(t)) t.copy_(buf);
}

std::vector<at::Tensor> Group::all_gather_list(const at::Tensor& t) {
  if (size() == 1) return {t.clone()};
  at::Tensor in = t.contiguous();
  std::vector<std::vector<at::Tensor>> out(1);
  for (int i = 0; i < size(); ++i) out[0].push_back(at::empty_like(in));
  std::vector<at::Tensor> inputs{in};
  c10d::AllgatherOptions o;
  o.timeout = timeout_;
  run("all_gather", nbytes(in) * static_cast<std::uint64_t>(size() - 1), [&](c10d::ProcessGroup& pg) { return pg.allgather(out, inputs, o); }, flight::Kind::kCollective);
  return out[0];
}

at::Tensor Group::all_gather(const at::Tensor& t, std::int64_t dim) {
  if (size() == 1) return t.clone();
  return at::cat(all_gather_list(t), dim);
}

at::Tensor Group::reduce_scatter(const at::Tensor& t, std::int64_t dim, ReduceKind op) {
  if (dim < 0) dim += t.dim();
  const std::int64_t n = size();
  if (t.size(dim) % n != 0) {
    fail("reduce_scatter", "dimension " + std::to_string(dim) + " has size " +
                               std::to_string(t.size(dim)) + ", not divisible by the group size " +
                               std::to_string(n));
  }
  if (n == 1) return t.clone();
  // Chunk i goes to member i: lay the chunks out along dim 0 and scatter them.
  const std::int64_t chunk = t.size(dim) / n;
  std::vector<std::int64_t> shape = t.sizes().vec();
  shape[dim] = chunk;
  shape.insert(shape.begin() + dim, n);
  // Member i's chunk is then rows [i * per, (i + 1) * per) of `rows`, and
  // the sum of the chunks has the shape of the result.
  at::Tensor rows = t.reshape(shape).movedim(dim, 0).flatten(0, 1);
  return reduce_scatter(rows, std::vector<std::int64_t>(n, rows.size(0) / n), op);
}

at::Tensor Group::reduce_scatter(const at::Tensor& t, const std::vector<std::int64_t>& counts,
                                 ReduceKind op) {
  const auto n = static_cast<std::int64_t>(size());
  std::int64_t total = 0;
  for (auto c : counts) total += c;
  if (static_cast<std::int64_t>(counts.size()) != n || total != t.size(0)) {
    fail("reduce_scatter", "expected " + std::to_string(n) + " chunk lengths adding up to the " +
                               std::to_string(t.size(0)) + " rows of the tensor, got " +
                               std::to_string(counts.size()) + " adding up to " +
                               std::to_string(total));
  }
  if (n == 1) return t.clone();
  // One all-to-all exchanges the chunks, then the n received copies of this
  // member's chunk are reduced locally. Every member adds in the same order
  // (member 0 first), so results agree bitwise.
  at::Tensor send = (needs_upcast(t) ? t.to(at::kFloat) : t).contiguous();
  const std::int64_t mine = counts[static_cast<std::size_t>(rank())];
  std::vector<std::int64_t> recv_shape = send.sizes().vec();
  recv_shape[0] = n * mine;
  at::Tensor recv = at::empty(recv_shape, send.options());
  std::vector<std::int64_t> send_counts = counts, recv_counts(static_cast<std::size_t>(n), mine);
  c10d::AllToAllOptions o;
  o.timeout = timeout_;
  const std::uint64_t row = t.size(0) ? nbytes(send) / static_cast<std::uint64_t>(t.size(0)) : 0;
  run("reduce_scatter", static_cast<std::uint64_t>(total - mine) * row,
      [&](c10d::ProcessGroup& pg) {
        return pg.alltoall_base(recv, send, recv_counts, send_counts, o);
      },
      flight::Kind::kCollective);
  recv_shape[0] = mine;
  recv_shape.insert(recv_shape.begin(), n);
  recv = recv.view(recv_shape);
  at::Tensor out;
  switch (op) {
    case ReduceKind::kMax: out = std::get<0>(recv.max(0)); break;
    case ReduceKind::kMin: out = std::get<0>(recv.min(0)); break;
    default: {
      out = recv[0].clone();
      for (std::int64_t i = 1; i < n; ++i) out.add_(recv[i]);
      if (op == ReduceKind::kAvg) out.div_(n);
    }
  }
  return out.to(t.scalar_type());
}

at::Tensor Group::all_to_all(const at::Tensor& t, const std::vector<std::int64_t>& send_counts,
                             const std::vector<std::int64_t>& recv_counts) {
  const auto n = static_cast<std::size_t>(size());
  if (send_counts.size() != n || recv_counts.size() != n) {
    fail("all_to_all", "expected " + std::to_string(n) + " send and receive counts, got " +
                           std::to_string(send_counts.size()) + " and " +
                           std::to_string(recv_counts.size()));
  }
  std::int64_t total_send = 0, total_recv = 0;
  for (auto c : send_counts) total_send += c;
  for (auto c : recv_counts) total_recv += c;
  if (total_send != t.size(0)) {
    fail("all_to_all", "send counts add up to " + std::to_string(total_send) +
                           " rows but the tensor has " + std::to_string(t.size(0)));
  }
  std::vector<std::int64_t> shape = t.sizes().vec();
  shape[0] = total_recv;
  if (n == 1) return t.clone();
  at::Tensor in = t.contiguous();
  at::Tensor out = at::empty(shape, t.options());
  std::vector<std::int64_t> sc = send_counts, rc = recv_counts;
  c10d::AllToAllOptions o;
  o.timeout = timeout_;
  const std::int64_t row = t.size(0) ? static_cast<std::int64_t>(nbytes(in)) / t.size(0) : 0;
  run("all_to_all", static_cast<std::uint64_t>((total_send - send_counts[rank()]) * row),
      [&](c10d::ProcessGroup& pg) { return pg.alltoall_base(out, in, rc, sc, o); }, flight::Kind::kCollective);
  return out;
}

void Group::send(const at::Tensor& t, int dst, int tag) {
  at::Tensor buf = t.contiguous();
  std::vector<at::Tensor> v{buf};
  run("send to member " + std::to_string(dst), nbytes(buf),
      [&](c10d::ProcessGroup& pg) { return pg.send(v, dst, tag); }, flight::Kind::kSend, dst);
}

void Group::recv(at::Tensor& t, int src, int tag) {
  at::Tensor buf = t.is_contiguous() ? t : t.contiguous();
  std::vector<at::Tensor> v{buf};
  run("recv from member " + std::to_string(src), 0, [&](c10d::ProcessGroup& pg) { return pg.recv(v, src, tag); }, flight::Kind::kRecv, src);
  if (!buf.is_same(t)) t.copy_(buf);
}

struct PendingSend::Impl {
  Group* group;
  int dst;
  std::uint64_t flight_id = 0;
  at::Tensor buf;
  c10::intrusive_ptr<c10d::Work> work;
  bool waited = false;
};

PendingSend::PendingSend(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

PendingSend::~PendingSend() {
  try {
    wait();
  } catch (...) {
    // Already failing elsewhere (the receiver is gone); nothing to add here.
  }
}

bool PendingSend::done() { return impl_->waited || impl_->work->isCompleted(); }

void PendingSend::wait() {
  if (impl_->waited) return;
  impl_->waited = true;
  Group& g = *impl_->group;
  profile::Span span("comm", "send_wait");
  if (span.active()) span.arg("group", g.name_).arg("peer", impl_->dst);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    impl_->work->wait(g.timeout_);
    if (g.recorder_) g.recorder_->finish(impl_->flight_id, true);
  } catch (const std::exception& e) {
    if (g.recorder_) g.recorder_->finish(impl_->flight_id, false);
    std::string what = e.what();
    auto nl = what.find('\n');
    g.fail("send to member " + std::to_string(impl_->dst), nl == std::string::npos ? what : what.substr(0, nl));
  }
  g.stats_["send"].seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::unique_ptr<PendingSend> Group::isend(const at::Tensor& t, int dst, int tag) {
  auto impl = std::make_unique<PendingSend::Impl>();
  impl->group = this;
  impl->dst = dst;
  impl->buf = t.contiguous();
  std::vector<at::Tensor> v{impl->buf};
  if (recorder_) impl->flight_id = recorder_->issue(name_, "send", flight::Kind::kSend, dst, nbytes(impl->buf));
  try {
    impl->work = pg_->pg->send(v, dst, tag);
  } catch (const std::exception& e) {
    std::string what = e.what();
    auto nl = what.find('\n');
    fail("send to member " + std::to_string(dst), nl == std::string::npos ? what : what.substr(0, nl));
  }
  auto& s = stats_["send"];
  s.calls += 1;
  s.bytes += nbytes(impl->buf);
  return std::unique_ptr<PendingSend>(new PendingSend(std::move(impl)));
}

void Group::barrier() {
  if (size() == 1) return;
  c10d::BarrierOptions o;
  o.timeout = timeout_;
  run("barrier", 0, [&](c10d::ProcessGroup& pg) { return pg.barrier(o); }, flight::Kind::kCollective);
}

}  // namespace hp::dist
