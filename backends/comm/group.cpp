#include "hp/comm/group.h"

#include <ATen/ATen.h>
#include "backends/comm/detail/pg_handle.h"
#include "backends/comm/detail/shm_collectives.h"
#include "hp/comm/flight_recorder.h"
#include "hp/profile/trace.h"

#include <algorithm>
#include <atomic>
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

/// Gloo in LibTorch 1.13 has no bfloat16 at all and no half sums: their
/// sums are built from exchanges of their own bytes and a local fp32 sum,
/// so the bytes on the wire stay halved.
bool needs_upcast(const at::Tensor& t) {
  return t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf;
}

/// What Gloo moves for `t`: its bytes, a bfloat16 tensor viewed as half (same
/// element size; copies never look at the values).
at::Tensor wire(const at::Tensor& t) { return t.scalar_type() == at::kBFloat16 ? t.view(at::kHalf) : t; }
/// The tensor a wire tensor carries, as type `dtype` again.
at::Tensor unwire(const at::Tensor& t, at::ScalarType dtype) { return t.scalar_type() == dtype ? t : t.view(dtype); }

/// Reduces the n members' parts (dim 0 of `parts`) in member order, in fp32
/// for bfloat16/half, so every member gets the same bits.
at::Tensor reduce_parts(const at::Tensor& parts, ReduceKind op, std::int64_t n) {
  switch (op) {
    case ReduceKind::kMax: return std::get<0>(parts.max(0));
    case ReduceKind::kMin: return std::get<0>(parts.min(0));
    default: {
      at::Tensor out = needs_upcast(parts) ? parts[0].to(at::kFloat) : parts[0].clone();
      for (std::int64_t i = 1; i < n; ++i) out.add_(parts[i]);
      if (op == ReduceKind::kAvg) out.div_(n);
      return out;
    }
  }
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

static std::string first_line(const std::string& s) {
  auto nl = s.find('\n');
  return nl == std::string::npos ? s : s.substr(0, nl);
}

struct Work::Impl {
  Group* group = nullptr;
  std::string op;        ///< as errors name it: "send to member 1"
  std::string short_op;  ///< as stats, traces and the flight recorder name it: "send"
  std::uint64_t bytes = 0;
  int peer = -1;
  flight::Kind kind = flight::Kind::kCollective;
  std::uint64_t flight_id = 0;
  bool profiled = false;  ///< recording was on when it was issued
  bool blocking = false;  ///< a blocking call: its span goes on the caller's track
  std::int64_t issued_ns = 0;
  std::chrono::steady_clock::time_point t0;
  c10::intrusive_ptr<c10d::Work> work;  ///< null: complete already
  /// Completion time on the profile clock, stamped by the communication
  /// thread (0 until then, or when c10d offers no completion callback).
  std::shared_ptr<std::atomic<std::int64_t>> done_ns;
  std::function<at::Tensor()> finish;
  bool waited = false;
  std::string error;  ///< the CommError text, once it failed
  at::Tensor result;
};

Work::Work(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Work::~Work() {
  if (!impl_->waited && impl_->kind == flight::Kind::kRecv && impl_->work && !impl_->work->isCompleted()) {
    // A receive posted ahead whose message never came (the step is failing):
    // waiting would hold this rank for the whole timeout, and freeing Gloo's
    // buffer under a late message would corrupt memory. Leave it to the
    // process's end (the c10d work keeps its tensor alive).
    if (impl_->group->recorder_ && impl_->flight_id) impl_->group->recorder_->finish(impl_->flight_id, false);
    (void)impl_->work.release();
    return;
  }
  try {
    wait();
  } catch (...) {
    // Surfaced at wait() already, or failing elsewhere (a peer is gone).
  }
}

const std::string& Work::op() const { return impl_->op; }

bool Work::completed() { return impl_->waited || !impl_->work || impl_->work->isCompleted(); }

at::Tensor Work::wait() {
  Impl& w = *impl_;
  if (w.waited) {
    if (!w.error.empty()) throw CommError(w.error);
    return w.result;
  }
  w.waited = true;
  Group& g = *w.group;
  bool ok = true;
  std::string cause;
  if (w.work) {
    // A send blocks until the peer takes it (Gloo hands it over on the
    // receiver's request): from here on a stall on it is this rank's to report.
    if (g.recorder_ && w.flight_id && w.kind == flight::Kind::kSend && !w.work->isCompleted()) {
      g.recorder_->waiting(w.flight_id);
    }
    try {
      w.work->wait(g.timeout_);
    } catch (const std::exception& e) {
      ok = false;
      cause = first_line(e.what());
    }
  }
  const std::int64_t end = w.done_ns && w.done_ns->load() > 0 ? w.done_ns->load() : profile::now_ns();
  if (g.recorder_ && w.flight_id) g.recorder_->finish(w.flight_id, ok);
  auto& st = g.stats_[w.short_op];
  st.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - w.t0).count();
  if (w.profiled) {
    profile::Event e;
    e.name = w.short_op;
    e.category = "comm";
    if (w.blocking) {
      // As a Span on the calling thread would be.
      e.begin_ns = w.issued_ns;
      e.end_ns = profile::now_ns();
      e.thread = profile::this_thread_track();
    } else {
      // On the group's track; it ran once the group's previous op ended.
      e.thread = g.trace_track();
      e.begin_ns = std::max(w.issued_ns, g.track_busy_until_ns_);
      e.end_ns = std::max(end, e.begin_ns);
      g.track_busy_until_ns_ = e.end_ns;
      e.args.push_back({"async", {}, 1, true});
    }
    e.args.push_back({"group", g.name_, 0, false});
    e.args.push_back({"bytes", {}, static_cast<double>(w.bytes), true});
    if (w.peer >= 0) e.args.push_back({"peer", {}, static_cast<double>(w.peer), true});
    profile::record(std::move(e));
  }
  if (!ok) {
    try {
      g.fail(w.op, cause);
    } catch (const CommError& e) {
      w.error = e.what();
      throw;
    }
  }
  if (w.finish) {
    w.result = w.finish();
    w.finish = nullptr;
  }
  return w.result;
}

int Group::trace_track() {
  if (trace_track_ < 0) trace_track_ = profile::track("in flight on " + name_);
  return trace_track_;
}

std::unique_ptr<Work> Group::local(const std::string& op, at::Tensor result) {
  auto impl = std::make_unique<Work::Impl>();
  impl->group = this;
  impl->op = impl->short_op = op;
  impl->waited = true;
  impl->result = std::move(result);
  return std::unique_ptr<Work>(new Work(std::move(impl)));
}

template <typename Start>
std::unique_ptr<Work> Group::launch(const std::string& op, std::uint64_t bytes, Start&& start, flight::Kind kind,
                                    int peer, std::function<at::Tensor()> finish) {
  auto impl = std::make_unique<Work::Impl>();
  Work::Impl& w = *impl;
  w.group = this;
  w.op = op;
  w.short_op = op.substr(0, op.find(' '));
  w.bytes = bytes;
  w.peer = peer;
  w.kind = kind;
  w.finish = std::move(finish);
  w.profiled = profile::recording();
  w.t0 = std::chrono::steady_clock::now();
  w.issued_ns = w.profiled ? profile::now_ns() : 0;
  if (recorder_) w.flight_id = recorder_->issue(name_, w.short_op, kind, peer, bytes);
  if (!pg_->pg) fail(op, "a planning context (DistributedContext::planning) does not communicate");
  try {
    w.work = start(*pg_->pg);
  } catch (const std::exception& e) {
    if (recorder_) recorder_->finish(w.flight_id, false);
    fail(op, first_line(e.what()));
  }
  auto& s = stats_[w.short_op];
  s.calls += 1;
  s.bytes += bytes;
  if (kind == flight::Kind::kCollective) {
    // Collectives complete a future on the communication thread: stamp the
    // time and close the flight entry there, not when someone waits.
    w.done_ns = std::make_shared<std::atomic<std::int64_t>>(0);
    try {
      auto fut = w.work->getFuture();
      auto done = w.done_ns;
      auto rec = recorder_;
      const std::uint64_t id = w.flight_id;
      fut->addCallback([done, rec, id](c10::ivalue::Future& f) {
        done->store(profile::now_ns());
        if (rec && id) rec->finish(id, !f.hasError());
      });
    } catch (const std::exception&) {
      // No future for this op: it closes when waited.
    }
  }
  return std::unique_ptr<Work>(new Work(std::move(impl)));
}

std::unique_ptr<Work> Group::all_reduce_async(const at::Tensor& t, ReduceKind op) {
  if (size() == 1) return local("all_reduce", t);
  if (needs_upcast(t)) return all_reduce_narrow(t, op);
  at::Tensor buf = t.is_contiguous() ? t : t.contiguous();
  std::vector<at::Tensor> v{buf};
  c10d::AllreduceOptions o;
  o.reduceOp = to_c10d(op);
  o.timeout = timeout_;
  const int n = size();
  ShmCollectives* shm =
      pg_->shm && (op == ReduceKind::kSum || op == ReduceKind::kAvg) && ShmCollectives::supports_sum(buf)
          ? pg_->shm.get()
          : nullptr;
  return launch(
      "all_reduce", nbytes(buf),
      [&](c10d::ProcessGroup& pg) { return shm ? shm->all_reduce_sum(buf) : pg.allreduce(v, o); },
      flight::Kind::kCollective, -1, [buf, t, op, n]() {
        if (op == ReduceKind::kAvg) buf.div_(n);
        if (!buf.is_same(t)) t.copy_(buf);
        return t;
      });
}

void Group::all_reduce(at::Tensor& t, ReduceKind op) { wait_here(all_reduce_async(t, op)); }

std::unique_ptr<Work> Group::all_reduce_narrow(const at::Tensor& t, ReduceKind op) {
  // Every member's bytes gathered, then summed here in fp32 in member order:
  // (n - 1) x the tensor's bytes per member, half of an fp32 exchange.
  const at::Tensor in = t.contiguous().view({-1});
  const std::int64_t n = size(), len = in.numel();
  const auto dtype = t.scalar_type();
  const std::uint64_t bytes = nbytes(in) * static_cast<std::uint64_t>(n - 1);
  auto done = [t, op, n, len, dtype](const at::Tensor& flat) {
    at::Tensor sum = reduce_parts(unwire(flat, dtype).view({n, len}), op, n);
    t.copy_(sum.view(t.sizes()));
    return t;
  };
  if (pg_->shm && ShmCollectives::supports_copy(in)) {
    at::Tensor flat = at::empty({n * len}, in.options());
    ShmCollectives* shm = pg_->shm.get();
    return launch(
        "all_reduce", bytes, [&](c10d::ProcessGroup&) { return shm->all_gather(in, flat); },
        flight::Kind::kCollective, -1, [flat, done]() { return done(flat); });
  }
  const at::Tensor w = wire(in);
  auto out = std::make_shared<std::vector<std::vector<at::Tensor>>>(1);
  for (std::int64_t i = 0; i < n; ++i) (*out)[0].push_back(at::empty_like(w));
  std::vector<at::Tensor> inputs{w};
  c10d::AllgatherOptions o;
  o.timeout = timeout_;
  return launch(
      "all_reduce", bytes, [&](c10d::ProcessGroup& pg) { return pg.allgather(*out, inputs, o); },
      flight::Kind::kCollective, -1, [out, done]() { return done(at::cat((*out)[0])); });
}

std::unique_ptr<Work> Group::broadcast_async(const at::Tensor& t, int root) {
  if (size() == 1) return local("broadcast", t);
  at::Tensor buf = t.is_contiguous() ? t : t.contiguous();
  std::vector<at::Tensor> v{wire(buf)};
  c10d::BroadcastOptions o;
  o.rootRank = root;
  o.timeout = timeout_;
  return launch(
      "broadcast", nbytes(buf), [&](c10d::ProcessGroup& pg) { return pg.broadcast(v, o); },
      flight::Kind::kCollective, -1, [buf, t]() {
        if (!buf.is_same(t)) t.copy_(buf);
        return t;
      });
}

void Group::broadcast(at::Tensor& t, int root) { wait_here(broadcast_async(t, root)); }

std::vector<at::Tensor> Group::all_gather_list(const at::Tensor& t) {
  if (size() == 1) return {t.clone()};
  at::Tensor in = t.contiguous();
  if (pg_->shm && in.dim() > 0 && ShmCollectives::supports_copy(in)) {
    return wait_here(all_gather_async(in, 0)).chunk(size(), 0);
  }
  std::vector<std::vector<at::Tensor>> out(1);
  for (int i = 0; i < size(); ++i) out[0].push_back(at::empty_like(wire(in)));
  std::vector<at::Tensor> inputs{wire(in)};
  c10d::AllgatherOptions o;
  o.timeout = timeout_;
  wait_here(launch(
      "all_gather", nbytes(in) * static_cast<std::uint64_t>(size() - 1),
      [&](c10d::ProcessGroup& pg) { return pg.allgather(out, inputs, o); }, flight::Kind::kCollective, -1,
      nullptr));
  for (auto& p : out[0]) p = unwire(p, in.scalar_type());
  return out[0];
}

std::unique_ptr<Work> Group::all_gather_async(const at::Tensor& t, std::int64_t dim) {
  if (size() == 1) return local("all_gather", t.clone());
  at::Tensor in = t.contiguous();
  if (pg_->shm && in.dim() > 0 && ShmCollectives::supports_copy(in)) {
    // Every member's tensor one after the other: along dim 0 that already
    // is the concatenation.
    at::Tensor flat = at::empty({size() * in.numel()}, in.options());
    std::vector<std::int64_t> shape = in.sizes().vec();
    shape.insert(shape.begin(), size());
    ShmCollectives* shm = pg_->shm.get();
    return launch(
        "all_gather", nbytes(in) * static_cast<std::uint64_t>(size() - 1),
        [&](c10d::ProcessGroup&) { return shm->all_gather(in, flat); }, flight::Kind::kCollective, -1,
        [in, flat, shape, dim]() {
          const at::Tensor parts = flat.view(shape);
          return dim == 0 ? parts.flatten(0, 1) : at::cat(parts.unbind(0), dim);
        });
  }
  auto out = std::make_shared<std::vector<std::vector<at::Tensor>>>(1);
  for (int i = 0; i < size(); ++i) (*out)[0].push_back(at::empty_like(wire(in)));
  std::vector<at::Tensor> inputs{wire(in)};
  c10d::AllgatherOptions o;
  o.timeout = timeout_;
  const auto dtype = in.scalar_type();
  return launch(
      "all_gather", nbytes(in) * static_cast<std::uint64_t>(size() - 1),
      [&](c10d::ProcessGroup& pg) { return pg.allgather(*out, inputs, o); }, flight::Kind::kCollective, -1,
      [out, dim, dtype]() { return unwire(at::cat((*out)[0], dim), dtype); });
}

std::unique_ptr<Work> Group::all_gather_into_async(const at::Tensor& in, std::vector<std::vector<at::Tensor>> out) {
  std::vector<std::int64_t> lens(out.size(), 0);
  for (std::size_t m = 0; m < out.size(); ++m) {
    for (const auto& p : out[m]) {
      if (!p.is_contiguous() || p.scalar_type() != in.scalar_type()) {
        throw std::logic_error("internal error: all_gather_into on group '" + name_ +
                               "' got a destination piece that is not contiguous or not of the input's type; please report");
      }
      lens[m] += p.numel();
    }
  }
  if (static_cast<int>(out.size()) != size() || in.dim() != 1 || !in.is_contiguous() ||
      lens[static_cast<std::size_t>(my_index_)] != in.numel()) {
    throw std::logic_error("internal error: all_gather_into on group '" + name_ + "' got pieces for " +
                           std::to_string(out.size()) + " members (group of " + std::to_string(size()) +
                           ") or not this member's length " + std::to_string(in.numel()) + "; please report");
  }
  // Member m's stream from `all` (its elements first) into its pieces.
  auto place = [](const std::vector<at::Tensor>& pieces, const at::Tensor& all) {
    std::int64_t off = 0;
    for (const auto& p : pieces) {
      p.view({-1}).copy_(all.narrow(0, off, p.numel()));
      off += p.numel();
    }
  };
  if (size() == 1) {
    place(out[0], in);
    return local("all_gather", in);
  }
  const std::uint64_t bytes = nbytes(in) * static_cast<std::uint64_t>(size() - 1);
  // Members decide alike: the segment and the device are the group's.
  if (pg_->shm && in.device().is_cpu()) {
    ShmCollectives* shm = pg_->shm.get();
    return launch(
        "all_gather", bytes, [&](c10d::ProcessGroup&) { return shm->all_gather_into(in, std::move(out)); },
        flight::Kind::kCollective, -1, [in]() { return in; });
  }
  const std::int64_t longest = std::max<std::int64_t>(*std::max_element(lens.begin(), lens.end()), 1);
  at::Tensor padded = in.numel() == longest ? in : at::cat({in, at::zeros({longest - in.numel()}, in.options())});
  auto gathered = std::make_shared<std::vector<std::vector<at::Tensor>>>(1);
  for (int i = 0; i < size(); ++i) (*gathered)[0].push_back(at::empty_like(padded));
  std::vector<at::Tensor> inputs{wire(padded)};
  std::vector<std::vector<at::Tensor>> wired(1);
  for (const auto& g : (*gathered)[0]) wired[0].push_back(wire(g));
  c10d::AllgatherOptions o;
  o.timeout = timeout_;
  auto dests = std::make_shared<std::vector<std::vector<at::Tensor>>>(std::move(out));
  return launch(
      "all_gather", bytes, [&](c10d::ProcessGroup& pg) { return pg.allgather(wired, inputs, o); },
      flight::Kind::kCollective, -1, [gathered, dests, place, in]() {
        for (std::size_t m = 0; m < dests->size(); ++m) place((*dests)[m], (*gathered)[0][m]);
        return in;
      });
}

at::Tensor Group::all_gather(const at::Tensor& t, std::int64_t dim) {
  if (size() == 1) return t.clone();
  return at::cat(all_gather_list(t), dim);
}

std::unique_ptr<Work> Group::reduce_scatter_async(const at::Tensor& t, std::int64_t dim, ReduceKind op) {
  if (dim < 0) dim += t.dim();
  const std::int64_t n = size();
  if (t.size(dim) % n != 0) {
    fail("reduce_scatter", "dimension " + std::to_string(dim) + " has size " +
                               std::to_string(t.size(dim)) + ", not divisible by the group size " +
                               std::to_string(n));
  }
  if (n == 1) return local("reduce_scatter", t.clone());
  // Chunk i goes to member i: lay the chunks out along dim 0 and scatter them.
  const std::int64_t chunk = t.size(dim) / n;
  std::vector<std::int64_t> shape = t.sizes().vec();
  shape[dim] = chunk;
  shape.insert(shape.begin() + dim, n);
  // Member i's chunk is then rows [i * per, (i + 1) * per) of `rows`, and
  // the sum of the chunks has the shape of the result.
  at::Tensor rows = t.reshape(shape).movedim(dim, 0).flatten(0, 1);
  return reduce_scatter_async(rows, std::vector<std::int64_t>(n, rows.size(0) / n), op);
}

at::Tensor Group::reduce_scatter(const at::Tensor& t, const std::vector<std::int64_t>& counts,
                                 ReduceKind op) {
  return wait_here(reduce_scatter_async(t, counts, op));
}

std::unique_ptr<Work> Group::reduce_scatter_async(const at::Tensor& t,
                                                  const std::vector<std::int64_t>& counts,
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
  if (n == 1) return local("reduce_scatter", t.clone());
  // One all-to-all exchanges the chunks, then the n received copies of this
  // member's chunk are reduced locally. Every member adds in the same order
  // (member 0 first), so results agree bitwise.
  // bfloat16/half cross as their own bytes and are summed here in fp32.
  at::Tensor send = t.contiguous();
  const std::int64_t mine = counts[static_cast<std::size_t>(rank())];
  std::vector<std::int64_t> recv_shape = send.sizes().vec();
  recv_shape[0] = n * mine;
  at::Tensor recv = at::empty(recv_shape, send.options());
  std::vector<std::int64_t> parts_shape = recv_shape;  // [n, mine, ...]
  parts_shape[0] = mine;
  parts_shape.insert(parts_shape.begin(), n);
  std::vector<std::int64_t> send_counts = counts, recv_counts(static_cast<std::size_t>(n), mine);
  c10d::AllToAllOptions o;
  o.timeout = timeout_;
  const std::uint64_t row = t.size(0) ? nbytes(send) / static_cast<std::uint64_t>(t.size(0)) : 0;
  const auto dtype = t.scalar_type();
  if (pg_->shm && (op == ReduceKind::kSum || op == ReduceKind::kAvg) && ShmCollectives::supports_sum(send)) {
    // Member m's chunk is elements [offsets[m], offsets[m + 1]) of `send`.
    const std::int64_t row_elems = send.numel() / send.size(0);
    std::vector<std::int64_t> offsets{0};
    for (auto c : counts) offsets.push_back(offsets.back() + c * row_elems);
    std::vector<std::int64_t> out_shape = send.sizes().vec();
    out_shape[0] = mine;
    at::Tensor out = at::empty(out_shape, send.options());
    ShmCollectives* shm = pg_->shm.get();
    return launch(
        "reduce_scatter", static_cast<std::uint64_t>(total - mine) * row,
        [&](c10d::ProcessGroup&) { return shm->reduce_scatter_sum(send, out, offsets); }, flight::Kind::kCollective,
        -1, [send, out, op, n, dtype]() {
          if (op == ReduceKind::kAvg) out.div_(n);
          return out.to(dtype);
        });
  }
  auto finish = [send, recv, parts_shape, op, n, dtype]() {
    return reduce_parts(recv.view(parts_shape), op, n).to(dtype);
  };
  if (pg_->shm && send.device().is_cpu()) {
    // A type shared memory does not sum (bfloat16, half, integers): the
    // chunks are exchanged through it and summed here.
    std::vector<std::int64_t> sb, rb;
    for (auto c : send_counts) sb.push_back(c * static_cast<std::int64_t>(row));
    for (auto c : recv_counts) rb.push_back(c * static_cast<std::int64_t>(row));
    ShmCollectives* shm = pg_->shm.get();
    return launch(
        "reduce_scatter", static_cast<std::uint64_t>(total - mine) * row,
        [&](c10d::ProcessGroup&) { return shm->all_to_all(send, recv, std::move(sb), std::move(rb), false); },
        flight::Kind::kCollective, -1, finish);
  }
  return launch(
      "reduce_scatter", static_cast<std::uint64_t>(total - mine) * row,
      [&](c10d::ProcessGroup& pg) {
        at::Tensor wr = wire(recv), ws = wire(send);
        return pg.alltoall_base(wr, ws, recv_counts, send_counts, o);
      },
      flight::Kind::kCollective, -1, finish);
}

at::Tensor Group::reduce_scatter(const at::Tensor& t, std::int64_t dim, ReduceKind op) {
  return wait_here(reduce_scatter_async(t, dim, op));
}

std::unique_ptr<Work> Group::all_to_all_async(const at::Tensor& t, const std::vector<std::int64_t>& send_counts,
                                              const std::vector<std::int64_t>& recv_counts) {
  return start_all_to_all(t, send_counts, recv_counts, false);
}

std::unique_ptr<Work> Group::start_all_to_all(const at::Tensor& t, const std::vector<std::int64_t>& send_counts,
                                              const std::vector<std::int64_t>& recv_counts, bool now) {
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
  if (n == 1) return local("all_to_all", t.clone());
  at::Tensor in = t.contiguous();
  at::Tensor out = at::empty(shape, t.options());
  std::vector<std::int64_t> sc = send_counts, rc = recv_counts;
  c10d::AllToAllOptions o;
  o.timeout = timeout_;
  std::int64_t row = 1;
  for (std::int64_t d = 1; d < t.dim(); ++d) row *= t.size(d);
  row *= static_cast<std::int64_t>(t.element_size());
  // Members decide alike: the segment and the device are the group's.
  if (pg_->shm && in.device().is_cpu()) {
    std::vector<std::int64_t> sb, rb;
    for (auto c : sc) sb.push_back(c * row);
    for (auto c : rc) rb.push_back(c * row);
    ShmCollectives* shm = pg_->shm.get();
    return launch(
        "all_to_all", static_cast<std::uint64_t>((total_send - send_counts[rank()]) * row),
        [&](c10d::ProcessGroup&) { return shm->all_to_all(in, out, std::move(sb), std::move(rb), now); },
        flight::Kind::kCollective, -1, [in, out]() { return out; });
  }
  return launch(
      "all_to_all", static_cast<std::uint64_t>((total_send - send_counts[rank()]) * row),
      [&](c10d::ProcessGroup& pg) {
        at::Tensor wo = wire(out), wi = wire(in);
        return pg.alltoall_base(wo, wi, rc, sc, o);
      },
      flight::Kind::kCollective,
      -1, [in, out]() { return out; });
}

at::Tensor Group::all_to_all(const at::Tensor& t, const std::vector<std::int64_t>& send_counts,
                             const std::vector<std::int64_t>& recv_counts) {
  return wait_here(start_all_to_all(t, send_counts, recv_counts, true));
}

std::unique_ptr<Work> Group::isend(const at::Tensor& t, int dst, int tag) {
  at::Tensor buf = t.contiguous();
  std::vector<at::Tensor> v{wire(buf)};
  return launch(
      "send to member " + std::to_string(dst), nbytes(buf),
      [&](c10d::ProcessGroup& pg) { return pg.send(v, dst, tag); }, flight::Kind::kSend, dst,
      [buf]() { return at::Tensor(); });
}

void Group::send(const at::Tensor& t, int dst, int tag) { wait_here(isend(t, dst, tag)); }

std::unique_ptr<Work> Group::irecv(const at::Tensor& t, int src, int tag) {
  if (!t.is_contiguous()) {
    fail("recv from member " + std::to_string(src), "the receive buffer must be contiguous, please report");
  }
  std::vector<at::Tensor> v{wire(t)};
  return launch(
      "recv from member " + std::to_string(src), 0,
      [&](c10d::ProcessGroup& pg) { return pg.recv(v, src, tag); }, flight::Kind::kRecv, src,
      [t]() { return t; });
}

void Group::recv(at::Tensor& t, int src, int tag) {
  at::Tensor buf = t.is_contiguous() ? t : t.contiguous();
  wait_here(irecv(buf, src, tag));
  if (!buf.is_same(t)) t.copy_(buf);
}

std::unique_ptr<Work> Group::barrier_async() {
  if (size() == 1) return local("barrier", at::Tensor());
  c10d::BarrierOptions o;
  o.timeout = timeout_;
  return launch(
      "barrier", 0, [&](c10d::ProcessGroup& pg) { return pg.barrier(o); }, flight::Kind::kCollective, -1,
      nullptr);
}

void Group::barrier() { wait_here(barrier_async()); }

at::Tensor Group::wait_here(std::unique_ptr<Work> w) {
  w->impl_->blocking = true;
  return w->wait();
}

}  // namespace hp::dist
