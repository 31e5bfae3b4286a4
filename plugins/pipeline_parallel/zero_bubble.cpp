// Zero-bubble schedules built and timed by greedy list scheduling (see
// zero_bubble.h).
#include "plugins/pipeline_parallel/zero_bubble.h"

#include <algorithm>
#include <limits>
#include <map>
#include <sstream>
#include <stdexcept>
#include <tuple>

namespace hp::pipeline::zb {

Scheme parse_scheme(const std::string& name) {
  if (name == "1f1b") return Scheme::kOneFOneB;
  if (name == "zb_h1") return Scheme::kZbH1;
  if (name == "zbv") return Scheme::kZbV;
  throw std::invalid_argument("unknown zero-bubble scheme '" + name +
                              "'; expected 1f1b, zb_h1 or zbv");
}

const char* to_string(Scheme s) {
  switch (s) {
    case Scheme::kOneFOneB:
      return "1f1b";
    case Scheme::kZbH1:
      return "zb_h1";
    case Scheme::kZbV:
      return "zbv";
  }
  return "?";
}

std::string Op::str() const {
  const char* k = kind == Kind::kF ? "F" : kind == Kind::kB ? "B" : "W";
  return k + std::to_string(chunk) + "." + std::to_string(mb);
}

double Plan::idle() const {
  if (makespan <= 0 || idle_fraction.empty()) return 0;
  double sum = 0;
  for (double f : idle_fraction) sum += f;
  return sum / static_cast<double>(idle_fraction.size());
}

Plan plan(Scheme scheme, int P, int M, Costs costs) {
  if (P < 1 || M < 1) throw std::invalid_argument("zero-bubble plan: P and M must be >= 1");
  if (costs.f <= 0 || costs.b <= 0 || costs.w <= 0)
    throw std::invalid_argument("zero-bubble plan: the costs of F, B and W must be > 0");
  Plan out;
  out.scheme = scheme;
  out.P = P;
  out.M = M;
  out.V = scheme == Scheme::kZbV ? 2 : 1;
  const int V = out.V, C = P * V;
  const bool fused = scheme == Scheme::kOneFOneB;  // B carries W's work
  // Chunk c's rank: c % P for one chunk per rank; a V for ZB-V.
  auto rank_of = [&](int c) { return V == 1 ? c : (c < P ? c : 2 * P - 1 - c); };
  // Activation units per chunk (a stage holds V chunks) and each rank's
  // gate: 1F1B's, P - rank micro-batches of a whole stage between F and B;
  // ZB-V, whose ranks hold both ends of the V, the first rank's: P.
  const double unit = 1.0 / V;
  auto limit_of = [&](int r) {
    return scheme == Scheme::kZbV ? static_cast<double>(P) : static_cast<double>(P - r);
  };

  std::map<std::tuple<int, int, int>, double> done;  // (kind, chunk, mb) -> finish
  auto ready_at = [&](Op::Kind k, int c,
                      int m) {  // when its inputs are done; +inf if some are not scheduled
    double t = 0;
    auto need = [&](Op::Kind kk, int cc) {
      const auto it = done.find({static_cast<int>(kk), cc, m});
      if (it == done.end()) return false;
      t = std::max(t, it->second);
      return true;
    };
    bool ok = true;
    if (k == Op::Kind::kF) ok = c == 0 || need(Op::Kind::kF, c - 1);
    if (k == Op::Kind::kB) ok = need(Op::Kind::kF, c) && (c == C - 1 || need(Op::Kind::kB, c + 1));
    if (k == Op::Kind::kW) ok = need(Op::Kind::kB, c);
    return ok ? t : std::numeric_limits<double>::infinity();
  };

  out.per_rank.assign(static_cast<std::size_t>(P), {});
  std::vector<double> free_at(static_cast<std::size_t>(P), 0.0),
      busy(static_cast<std::size_t>(P), 0.0);
  std::vector<double> held(static_cast<std::size_t>(P), 0.0);
  // What the F limit counts: activations from F to B (1F1B frees them at
  // its fused B; a W's inputs are a fraction of them, held until W runs).
  std::vector<double> gate(static_cast<std::size_t>(P), 0.0);
  out.peak_activations.assign(static_cast<std::size_t>(P), 0.0);
  // Per rank: its chunks, and per chunk the next micro-batch to forward and
  // to backward; the B's whose W is pending (oldest first).
  std::vector<std::vector<int>> chunks(static_cast<std::size_t>(P));
  for (int c = 0; c < C; ++c) chunks[static_cast<std::size_t>(rank_of(c))].push_back(c);
  std::map<int, int> next_f, next_b;
  std::vector<std::vector<std::pair<int, int>>> pending_w(static_cast<std::size_t>(P));
  const std::size_t total =
      static_cast<std::size_t>(C) * static_cast<std::size_t>(M) * (fused ? 2 : 3);
  std::size_t scheduled = 0;
  std::vector<double> finishes;  // every op's finish time, for waiting ranks
  std::vector<bool> stuck(static_cast<std::size_t>(P), false);
  std::vector<std::size_t> left(static_cast<std::size_t>(P));  // ops each rank has still to run
  for (int r = 0; r < P; ++r)
    left[static_cast<std::size_t>(r)] =
        chunks[static_cast<std::size_t>(r)].size() * static_cast<std::size_t>(M) * (fused ? 2 : 3);

  while (scheduled < total) {
    // The rank with ops left that is free earliest (the lowest on ties),
    // leaving out ranks found stuck at their time until an op is scheduled.
    int r = -1;
    for (int q = 0; q < P; ++q) {
      const auto uq = static_cast<std::size_t>(q);
      if (left[uq] > 0 && !stuck[uq] &&
          (r < 0 || free_at[uq] < free_at[static_cast<std::size_t>(r)]))
        r = q;
    }
    if (r < 0)
      throw std::logic_error(std::string("zero-bubble plan: ") + to_string(scheme) +
                             " deadlocked (every rank waits)");
    const auto ur = static_cast<std::size_t>(r);
    const double t = free_at[ur];
    // Candidates ready by t.
    int best_b = -1;
    double best_b_ready = std::numeric_limits<double>::infinity();
    for (int c : chunks[ur]) {
      const int m = next_b[c];
      if (m >= M) continue;
      const double at = ready_at(Op::Kind::kB, c, m);
      if (at <= t && at < best_b_ready) {
        best_b_ready = at;
        best_b = c;
      }
    }
    int best_f = -1;
    // 1F1B's gate: activations from F to B within P - rank; and, for the
    // zero-bubble schemes, activations from F to W within P (1F1B's peak).
    // Under ZB-V a micro-batch whose forward ran this rank's first chunk
    // owes its second chunk's forward here before any of its B can run: a
    // new micro-batch starts only with room left for the oldest of those
    // (whose B then frees what the rest wait on). Without it, costs of B
    // 1.75 F and W 0.25 F at two stages and 8 micro-batches filled both
    // ranks' gates with first chunks whose B waited for second chunks that
    // could no longer start: a deadlock.
    const bool owes = V == 2 && next_f[chunks[ur].front()] > next_f[chunks[ur].back()];
    for (int c : chunks[ur]) {  // the deepest chunk first: finish a micro-batch before starting another
      const double need = unit + (owes && c == chunks[ur].front() ? unit : 0.0);
      if (gate[ur] + need > limit_of(r) + 1e-9 ||
          (!fused && held[ur] + need > static_cast<double>(P) + 1e-9))
        continue;
      const int m = next_f[c];
      if (m >= M || ready_at(Op::Kind::kF, c, m) > t) continue;
      if (best_f < 0 || c > best_f) best_f = c;
    }
    // 1F1B runs a ready B first; the zero-bubble schemes a ready F first
    // (within the limits above): the W's wait for the bubbles.
    if (fused && best_b >= 0) best_f = -1;
    if (!fused && best_f >= 0) best_b = -1;
    Op op;
    double cost = 0;
    if (best_b >= 0) {
      op = {Op::Kind::kB, best_b, next_b[best_b]++, t, 0};
      cost = fused ? costs.b + costs.w : costs.b;
      gate[ur] -= unit;
      if (fused) {
        held[ur] -= unit;
      } else {
        pending_w[ur].emplace_back(op.chunk, op.mb);
      }
    } else if (best_f >= 0) {
      op = {Op::Kind::kF, best_f, next_f[best_f]++, t, 0};
      cost = costs.f;
      held[ur] += unit;
      gate[ur] += unit;
      out.peak_activations[ur] = std::max(out.peak_activations[ur], held[ur]);
    } else if (!pending_w[ur].empty()) {
      const auto [c, m] = pending_w[ur].front();
      pending_w[ur].erase(pending_w[ur].begin());
      op = {Op::Kind::kW, c, m, t, 0};
      cost = costs.w;
      held[ur] -= unit;
    } else {
      // Nothing to run: wait for the next op to finish after t anywhere; if
      // none is scheduled yet, for another rank to schedule one at t.
      double next = std::numeric_limits<double>::infinity();
      for (double f : finishes)
        if (f > t) next = std::min(next, f);
      if (next == std::numeric_limits<double>::infinity()) {
        stuck[ur] = true;
      } else {
        free_at[ur] = next;
      }
      continue;
    }
    std::fill(stuck.begin(), stuck.end(), false);
    op.finish = t + cost;
    done[{static_cast<int>(op.kind), op.chunk, op.mb}] = op.finish;
    finishes.push_back(op.finish);
    free_at[ur] = op.finish;
    busy[ur] += cost;
    out.per_rank[ur].push_back(op);
    --left[ur];
    ++scheduled;
  }
  for (int r = 0; r < P; ++r) {
    const auto& ops = out.per_rank[static_cast<std::size_t>(r)];
    if (!ops.empty()) out.makespan = std::max(out.makespan, ops.back().finish);
  }
  for (int r = 0; r < P; ++r)
    out.idle_fraction.push_back(1.0 - busy[static_cast<std::size_t>(r)] / out.makespan);
  return out;
}

std::string table(const Plan& p) {
  std::ostringstream out;
  out << "schedule " << to_string(p.scheme) << ": " << p.P << " ranks, " << p.M
      << " micro-batches, " << p.V << " chunk" << (p.V == 1 ? "" : "s")
      << " per rank (F forward, B "
      << (p.scheme == Scheme::kOneFOneB ? "backward" : "input gradient")
      << (p.scheme == Scheme::kOneFOneB ? "" : ", W weight gradient") << "; chunk.micro-batch)\n";
  for (std::size_t r = 0; r < p.per_rank.size(); ++r) {
    out << "  rank " << r << ":";
    for (const Op& op : p.per_rank[r]) out << ' ' << op.str();
    out << '\n';
  }
  char line[160];
  std::snprintf(line, sizeof line,
                "  idle fraction %.4f (simulated, equal costs unless measured); peak activations "
                "%.2f stages\n",
                p.idle(), *std::max_element(p.peak_activations.begin(), p.peak_activations.end()));
  out << line;
  return out.str();
}

}  // namespace hp::pipeline::zb
