// The `sharded_checkpoint` feature: every rank writes the slices it holds,
// with no gather; a slice held by several replicas (data-parallel or
// expert-data-parallel copies) is written by one of them, the replicas
// sharing the bytes (include/hp/checkpoint/write_plan.h). The manifest records each
// slice's global offsets and file, and the commit refuses a step whose slices do not
// tile every tensor. With `async: true` the slices are copied in memory at
// the step boundary and written by a background thread while training goes
// on; rank 0's thread commits once every rank's part is on disk, and
// `latest` moves only then. Loading is the framework's any-to-any reader
// (each rank reads only the byte ranges of its own slices), so a sharded
// checkpoint loads under any layout and a gathered one loads here.
#include <ATen/ATen.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "hp/comm/context.h"
#include "hp/comm/gather.h"
#include "hp/comm/group.h"
#include "hp/fault/fault.h"
#include "hp/fault/stop.h"
#include "hp/checkpoint/file_names.h"
#include "hp/checkpoint/writer.h"
#include "hp/checkpoint/write_plan.h"
#include "hp/config/config.h"
#include "hp/logging/logging.h"
#include "hp/metrics/registry.h"
#include "hp/plugin/feature_runtime.h"
#include "hp/plugin/plugin_export.h"
#include "hp/trainer/checkpoint_adapter.h"
#include "plugins/sharded_checkpoint/background_job.h"

namespace hp::sharded_checkpoint {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

const char* kAsync = "features.sharded_checkpoint.async";
/// Scheduling priority of the background writer thread (Linux nice values
/// are per thread): below the training threads.
constexpr int kWriterNice = 10;

/// One slice this rank holds.
struct Held {
  bool optimizer = false;
  const ParamEntry* entry = nullptr;
};

/// Where the background save is: what a SIGTERM's line says about it.
enum class Phase { kIdle, kWriting, kWaitingForParts, kCommitting };

/// Waits until every rank's manifest part is in `staging` (a rank that
/// failed leaves its failed_file_name() instead, and its reason is thrown).
/// `cancel` set: the run is ending on an error, the save is abandoned.
void wait_for_parts(const std::string& staging, int world, std::chrono::milliseconds timeout,
                    std::int64_t step, const std::atomic<bool>& cancel) {
  const auto deadline = Clock::now() + timeout;
  for (int r = 0; r < world;) {
    const fs::path failed = fs::path(staging) / ckpt::failed_file_name(r);
    std::error_code ec;
    if (fs::exists(failed, ec)) {
      std::ifstream in(failed);
      std::string why;
      std::getline(in, why);
      throw std::runtime_error("checkpoint step " + std::to_string(step) +
                               " not committed: " + why);
    }
    if (fs::exists(fs::path(staging) / ckpt::part_file_name(r), ec)) {
      ++r;
      continue;
    }
    if (cancel) {
      throw std::runtime_error("checkpoint step " + std::to_string(step) +
                               " abandoned: the run ended while waiting for rank " +
                               std::to_string(r) + "'s part; not committed");
    }
    if (Clock::now() > deadline) {
      throw std::runtime_error("checkpoint step " + std::to_string(step) + " not committed: rank " +
                               std::to_string(r) + " did not finish writing its part into " +
                               staging + " within " + std::to_string(timeout.count() / 1000) +
                               " s (is it alive? is the file system shared?)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

struct Shared {
  BackgroundJob job;
  std::atomic<Phase> phase{Phase::kIdle};
  std::atomic<std::int64_t> step{-1};
  /// Set when the run ends without waiting for the save (an error).
  std::atomic<bool> cancel{false};
  metrics::Gauge* write_seconds = nullptr;
  metrics::Gauge* written_bytes = nullptr;
};

class ShardedCheckpointIO : public CheckpointIO {
 public:
  ShardedCheckpointIO(CheckpointOptions o, const Config& config, dist::DistributedContext& dist,
                      std::shared_ptr<Shared> shared)
      : o_(std::move(o)),
        config_(config),
        dist_(dist),
        async_(config.get_bool(kAsync)),
        shared_(std::move(shared)),
        note_([shared = shared_, root = o_.root] { return describe_save(*shared, root); }) {}

  /// Reached without flush() only when the run ends on an error: a save
  /// still in the background is abandoned (rank 0 stops waiting for the
  /// other ranks' parts and never commits it).
  ~ShardedCheckpointIO() override {
    if (shared_->job.running()) shared_->cancel = true;
    try {
      shared_->job.wait();
    } catch (const std::exception& e) {
      log::logger()->error("{}", e.what());
    }
    shared_->cancel = false;
  }

  /// The clause of a SIGTERM's line about a save in flight, "" when none.
  static std::string describe_save(const Shared& s, const std::string& root) {
    const Phase phase = s.phase.load();
    if (phase == Phase::kIdle) return "";
    std::string latest = "nothing";
    std::ifstream in(fs::path(root) / ckpt::kLatestFileName);
    if (in) std::getline(in, latest);
    const std::string what = "the background save of step " + std::to_string(s.step.load());
    if (phase == Phase::kCommitting) {
      return what + " was being committed (atomically: latest, now " + latest +
             ", names it or the step before, each complete)";
    }
    return what + (phase == Phase::kWriting ? " was being written" : " waited for the other ranks") +
           ": abandoned, never committed (latest still names " + latest + ")";
  }

  void save(std::int64_t step, const std::vector<ParamEntry>& params,
            const std::vector<ParamEntry>& optimizer_state, const SavedState& state) override {
    shared_->job.wait();  // one save at a time; a failed one stops the run here
    const int rank = dist_.rank();
    auto& world = dist_.group("world");
    const auto mine = plan(params, optimizer_state);
    const auto commit = step_commit(dist_, o_, step, state, config_, all_ranks(world.size()));

    // The slices this rank writes: copied now when written in the background,
    // so training may change the parameters meanwhile.
    auto model = std::make_shared<std::vector<ckpt::ShardedTensor>>();
    auto optim = std::make_shared<std::vector<ckpt::ShardedTensor>>();
    std::uint64_t bytes = 0;
    for (const auto& h : mine) {
      const auto& e = *h.entry;
      at::Tensor t = e.tensor.detach();
      t = async_ ? t.clone(at::MemoryFormat::Contiguous) : t.contiguous();
      bytes += static_cast<std::uint64_t>(t.numel() * t.element_size());
      (h.optimizer ? optim : model)
          ->push_back({e.spec.name, t, e.spec.global_shape, e.spec.offsets(), e.spec.placements});
    }
    const int world_size = world.size();
    const auto timeout = world.timeout();
    auto shared = shared_;
    const auto root = o_.root;

    auto write = [=] {
      const auto t0 = Clock::now();
      ckpt::CheckpointWriter w(root, step, rank);
      std::string file;  // "": the one w.current_file() names
      try {
        if (async_ && fault::armed("checkpoint.async_write")) {
          file = ckpt::model_file_name(rank);
          const std::string tensor = model->empty() ? std::string("(none)") : model->front().name;
          fault::hit("checkpoint.async_write",
                     "cannot write " + file + " (tensor '" + tensor + "')");
          file.clear();
        }
        w.write_rank(*model, *optim);
      } catch (const std::exception& e) {
        if (file.empty()) file = w.current_file();
        std::string why = "rank " + std::to_string(rank) + ": checkpoint step " +
                          std::to_string(step) + ": writing " + file + " in " + w.staging_dir() +
                          " failed: " + e.what();
        why = why.substr(0, why.find('\n'));
        std::ofstream(fs::path(w.staging_dir()) / ckpt::failed_file_name(rank)) << why << "\n";
        throw std::runtime_error(why);
      }
      if (shared->written_bytes) shared->written_bytes->set(static_cast<double>(bytes));
      if (shared->write_seconds) {
        shared->write_seconds->set(std::chrono::duration<double>(Clock::now() - t0).count());
      }
    };

    if (!async_) {
      save_step(dist_, root, step, write, commit);
      return;
    }
    begin_save(dist_, root, step);
    shared_->job.start([=] {
      shared->step = step;
      shared->phase = Phase::kWriting;
      // Idle again however the job ends.
      struct Idle {
        Shared& s;
        ~Idle() { s.phase = Phase::kIdle; }
      } idle{*shared};
      // Training keeps the cores it was given; the writer takes what is left.
      ::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), kWriterNice);
      write();
      if (rank != 0) return;
      shared->phase = Phase::kWaitingForParts;
      wait_for_parts(ckpt::staging_dir(root, step), world_size, timeout, step, shared->cancel);
      shared->phase = Phase::kCommitting;
      commit();
      log::logger()->info("checkpoint step {} committed in the background", step);
    });
  }

  SavedState load(const std::string& step_dir, const std::vector<ParamEntry>& params,
                  const std::vector<ParamEntry>& optimizer_state) override {
    shared_->job.wait();
    return load_checkpoint(step_dir, params, optimizer_state, dist_, o_.strict);
  }

  void flush() override { shared_->job.wait(); }

 private:
  static std::vector<int> all_ranks(int n) {
    std::vector<int> out(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = i;
    return out;
  }

  /// The slices this rank writes: the same every save (shapes do not change),
  /// so the lists are exchanged once, at the first save.
  std::vector<Held> plan(const std::vector<ParamEntry>& params,
                         const std::vector<ParamEntry>& optimizer_state) {
    std::vector<Held> held;
    std::vector<ckpt::SliceDesc> desc;
    auto add = [&](const std::vector<ParamEntry>& entries, bool optimizer) {
      for (const auto& e : entries) {
        held.push_back({optimizer, &e});
        const auto bytes = static_cast<std::uint64_t>(e.tensor.numel() * e.tensor.element_size());
        desc.push_back({std::string(optimizer ? "optim:" : "model:") +
                            ckpt::slice_key(e.spec.name, e.spec.offsets(), e.spec.local_shape()),
                        bytes});
      }
    };
    add(params, false);
    add(optimizer_state, true);
    const std::string mine = ckpt::encode_slices(desc);
    // Planned once, at the first save, by every rank together; a later change
    // is refused on this rank rather than re-planned, since the other ranks
    // would not join a second exchange.
    if (planned_ && mine != planned_for_) {
      throw std::runtime_error(
          "rank " + std::to_string(dist_.rank()) +
          ": the parameters or optimizer state changed shape since the first sharded checkpoint "
          "of this run; the write plan cannot follow (please report)");
    }
    if (!planned_) {
      std::vector<std::vector<ckpt::SliceDesc>> by_rank;
      for (const auto& text : dist::all_gather_text(dist_.group("world"), mine))
        by_rank.push_back(ckpt::decode_slices(text));
      const auto plan = ckpt::plan_writers(by_rank);
      plan_ = plan[static_cast<std::size_t>(dist_.rank())];
      planned_for_ = mine;
      planned_ = true;
      const auto bytes = ckpt::bytes_per_rank(by_rank, plan);
      if (dist_.rank() == 0) {
        std::string per_rank;
        for (std::size_t r = 0; r < bytes.size(); ++r) {
          per_rank +=
              (r ? ", " : "") + std::to_string(r) + ": " + std::to_string(bytes[r] / 1024) + " KiB";
        }
        log::logger()->info("sharded checkpoint: bytes written per rank {}{}", per_rank,
                            async_ ? " (in the background)" : "");
      }
    }
    std::vector<Held> out;
    for (auto i : plan_) out.push_back(held.at(i));
    return out;
  }

  CheckpointOptions o_;
  const Config& config_;
  dist::DistributedContext& dist_;
  bool async_;
  std::shared_ptr<Shared> shared_;
  bool planned_ = false;
  std::string planned_for_;
  std::vector<std::size_t> plan_;
  stop::Note note_;  // last member: removed after the destructor's wait, before the rest
};

class ShardedCheckpointFeature : public Feature {
 public:
  void declare_options(Schema& s, const std::string& prefix) const override {
    s.add_bool(prefix + "async", false)
        .describe(
            "Write checkpoints in the background: the slices are copied in memory at the step "
            "boundary and "
            "written while training goes on; the next save and the end of the run wait for it, and "
            "`latest` "
            "moves only after the commit. A failed background write stops the run at the next "
            "step.");
  }

  void install(FeatureRuntime& rt) override {
    auto shared = std::make_shared<Shared>();
    if (rt.has_metrics()) {
      shared->write_seconds =
          &rt.metrics().gauge("hp_checkpoint_write_seconds",
                              "Seconds this rank spent writing its slices of the last checkpoint.");
      shared->written_bytes = &rt.metrics().gauge("hp_checkpoint_written_bytes",
                                                  "Bytes this rank wrote for the last checkpoint.");
    }
    rt.set_checkpoint_io("sharded_checkpoint", [shared](const CheckpointOptions& o, const Config& c,
                                                        dist::DistributedContext& d) {
      return std::make_unique<ShardedCheckpointIO>(o, c, d, shared);
    });
    // A background write that failed stops the run at the next step boundary.
    rt.add_hook(StepEvent::kStepEnd, "sharded_checkpoint", [shared](StepContext&) {
      const std::string why = shared->job.failure();
      if (!why.empty()) shared->job.wait();  // throws it
    });
  }
};

}  // namespace
}  // namespace hp::sharded_checkpoint

HP_FEATURE_PLUGIN(hp::sharded_checkpoint::ShardedCheckpointFeature)
