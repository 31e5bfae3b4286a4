// The framework's own options. Feature plugins declare theirs under
// `features.<name>.` when they are loaded.
#include <filesystem>

#include "hp/config/config.h"
#include "hp/config/schema.h"
#include "hp/optim/param_groups.h"
#include "framework/data/registry.h"
#include "framework/model/registry.h"
#include "framework/util/build_info.h"

namespace hp {

const std::vector<std::string>& top_level_sections() {
  static const std::vector<std::string> kSections = {
      "run",         "model",      "data",    "training", "optimizer", "distributed",
      "checkpoint",  "metrics",    "logging", "plugins",  "features"};
  return kSections;
}

void declare_core_options(Schema& s) {
  // run
  s.add_string("run.name", "hp-run").describe("Name of the run, used in logs and metrics.");
  s.add_string("run.output_dir", "runs/hp-run")
      .describe("Directory for the resolved config, metrics.jsonl and logs.");
  s.add_int("run.seed", 1234).range(0, 4294967295.0)
      .describe("Seed for weights (with each parameter's global name), data order and dropout.");
  s.add_bool("run.profile.enabled", false)
      .describe("Record a timeline of the steps run.profile.steps names on every rank (forward and backward of each "
                "micro-batch and chunk, stage-message waits, collectives with group and bytes, optimizer step, "
                "checkpoint saves, evaluation) into <run.output_dir>/trace.json (Chrome trace events, Perfetto).");
  s.add_int_list("run.profile.steps", {3, 4}).at_least(1)
      .describe("Steps to record when run.profile.enabled (counted from 1, as in the progress line).");
  s.add_bool("run.keep_freed_memory", true)
      .describe("Keep memory freed during a step for reuse by the next (mimalloc, which hp-train links: no decommit; "
                "glibc: no mmap below 1 GiB, heap trimmed only above 1 GiB free) instead of returning it to the system "
                "and page-faulting it back every step.")
      .note("measured: zero at dp=2 4.3k -> 5.6k tokens/s; the resident size stays near the peak between steps");
  s.add_bool("run.large_block_pool", true)
      .describe("With run.keep_freed_memory: tensors of 64 KiB and more come from one best-fit pool (free neighbours "
                "joined) instead of the malloc heap, so where a block lands depends only on the order of large "
                "requests and frees, and a freed block serves the next request it fits.")
      .note("measured (mimalloc without -> with): GPT 4 x 256 at dp=2 136 -> 124 MiB above start, ZeRO-1 129 or 150 "
            "(varies run to run) -> 112, pp=2 x dp=2 144 -> 97, MoE GPT dp=2 566 -> 516; step time -6..+9 % over two "
            "runs (bench/results/bench_allocator.md)");
  s.add_bool("run.report", false)
      .describe("At the end of a successful run, write <run.output_dir>/report.html (what hp-report writes: curves of "
                "metrics.jsonl, the config and, when profiled, one step's timeline); written by rank 0 at the end of "
                "Trainer::fit, so hp-train and a C++ application get it alike.");

  // model: the type picks a registered model, which declares its own options
  s.add_enum("model.type", "gpt", models().names())
      .describe("Which registered model to build. Shipped: gpt, mlp (gpt without attention), unet (a "
                "skip-connection encoder-decoder over a field; needs data.type field).");
  s.add_int("model.seq_len", 128).range(1, 1048576).describe("Tokens per sample.");
  s.add_float("model.init_std", 0.02).range(1e-6, 10.0)
      .describe("Standard deviation of the normal initialisation.");
  for (const auto& m : models().entries()) {
    if (m.declare_options) m.declare_options(s);
  }

  // data
  s.add_enum("data.type", "text", datasets().names())
      .describe("`text`: byte tokens from a file or directory; `synthetic`: a generated learnable task; "
                "`field`: a generated field-regression task for the unet model; `tokens`: shards made by hp-data "
                "prepare (data.path or data.blend; model.vocab_size defaults to the tokenizer's).");
  s.add_string("data.path", "/usr/share/games/fortunes")
      .describe("data.type text: a text file or directory of text files (binary files are skipped); data.type "
                "tokens: a directory made by hp-data prepare.");
  s.add_string_list("data.blend", {})
      .describe("data.type tokens: several prepared corpora mixed by weight, [{path: DIR, weight: W}, ...] "
                "(Megatron's rule: each global sample's corpus chosen deterministically so every prefix follows "
                "the weights); when set, data.path is not read.");
  s.add_bool("data.document_attention", false)
      .describe("data.type tokens: attention stays inside each document (a position attends to the earlier "
                "positions of its own document only; Megatron's reset_attention_mask, torchtitan's block-causal "
                "mask), in the eager, block and ring (context parallel) attention. Positions are not reset.");
  s.add_string("data.tokenizer", "")
      .describe("data.type tokens: the tokenizer (tokenizer.json, SentencePiece .model or bytes) the run expects; "
                "refused before start unless the corpus was prepared with it. Empty: the corpus's own copy.");
  // Read by `hp-data prepare --config` (not by hp-train): how data.path is made.
  s.add_string_list("data.prepare.inputs", {})
      .describe("hp-data prepare --config: text files, directories or .jsonl files tokenized into data.path.");
  s.add_string("data.prepare.tokenizer", "")
      .describe("hp-data prepare --config: a tokenizer.json, a SentencePiece .model, or bytes; with "
                "data.prepare.train_vocab_size > 0 a SentencePiece model trained there on the inputs when absent.");
  s.add_int("data.prepare.train_vocab_size", 0).range(0, 16777216)
      .describe("hp-data prepare --config: 0 uses data.prepare.tokenizer as it is; N > 0 trains a SentencePiece "
                "model of N pieces at that path first, unless the file exists.");
  s.add_string("data.prepare.split_on", "")
      .describe("hp-data prepare --config: a line equal to this ends a document in text files (fortune files: %).");
  s.add_string("data.prepare.text_field", "text").describe("hp-data prepare --config: the JSON Lines text field.");
  s.add_float("data.prepare.shard_mb", 64).range(0.001, 1e6).describe("hp-data prepare --config: text per shard, MB.");
  s.add_float("data.valid_fraction", 0.05).range(0.0, 0.5)
      .describe("Fraction of the corpus held out for evaluation.");

  // training
  s.add_int("training.max_steps", 100).range(1, 1e12).describe("Optimizer steps to run.");
  s.add_int("training.global_batch_size", 16).range(1, 1e9)
      .describe("Samples per optimizer step over all data-parallel ranks.");
  s.add_int("training.micro_batch_size", 4).range(1, 1e9)
      .describe("Samples per forward/backward pass on one rank.");
  s.add_int("training.log_interval", 10).range(1, 1e12).describe("Steps between progress lines.");
  s.add_int("training.eval_interval", 0).range(0, 1e12)
      .describe("Steps between evaluations on the valid split.").note("0 turns evaluation off");
  s.add_int("training.sample_interval", 0).range(0, 1e12)
      .describe("Steps between samples: the model as trained so far continues training.sample_prompt greedily "
                "(the key/value cache, at the run's layout); rank 0 logs the text and writes it to metrics.jsonl "
                "as `sample` (the report page lists them).")
      .note("0 turns sampling off; needs data.type text or tokens (a tokenizer)");
  s.add_string("training.sample_prompt", "")
      .describe("The prompt training.sample_interval continues (encoded by the run's tokenizer).");
  s.add_int("training.sample_tokens", 32).range(1, 1e6).describe("Tokens each sample generates.");
  s.add_int("training.dump_grads_at_step", 0).range(0, 1e12)
      .describe("Every rank writes its gradient slices of this step, with their placement, to <run.output_dir>/grads_step<N>/ (for hp-compare).")
      .note("0 turns it off");
  s.add_int_list("training.dump_routing_steps", {}).at_least(1)
      .describe("Every rank writes each MoE layer's routing of these steps' training forward (router logits, "
                "probabilities, selection scores, chosen experts, capacity decisions, global positions) to "
                "<run.output_dir>/routing_step<N>/ (tools/hp_dump/hp_dump.py routing compares two runs).")
      .note("empty: none");
  s.add_int_list("training.dump_activations_steps", {}).at_least(1)
      .describe("Every rank writes every layer's forward output (and the routing) of these steps' training "
                "forward to <run.output_dir>/activations_step<N>/ (tools/hp_dump/hp_dump.py diff names the first tensor "
                "two runs disagree on).")
      .note("empty: none; layers are wrapped to record only when it is set");
  s.add_int("training.eval_samples", 0).range(0, 1e12)
      .describe("Validation samples per evaluation, over all data-parallel ranks (each evaluates its share), so "
                "the evaluation set does not depend on the layout.")
      .note("0: one global batch (training.global_batch_size); must be divisible by micro_batch_size x "
            "data-parallel size");

  // optimizer
  s.add_enum("optimizer.type", "adamw", {"sgd", "adam", "adamw"}).describe("Optimizer.");
  s.add_float("optimizer.lr", 1e-3).range(0.0, 10.0).describe("Peak learning rate.");
  s.add_float("optimizer.min_lr", 0.0).range(0.0, 10.0).describe("Final learning rate of the cosine schedule.");
  s.add_enum("optimizer.schedule", "warmup_cosine", {"constant", "warmup_cosine"})
      .describe("Learning-rate schedule.");
  s.add_int("optimizer.warmup_steps", 0).range(0, 1e12).describe("Linear warm-up steps.");
  s.add_float("optimizer.weight_decay", 0.0).range(0.0, 10.0).describe("Weight decay.");
  s.add_enum("optimizer.weight_decay_on", "matrices", {"matrices", "matrices_and_embeddings", "all"})
      .describe("Which parameters outside optimizer.groups get optimizer.weight_decay: matrices (not "
                "one-dimensional parameters, i.e. norm gains and biases, nor embedding tables; Megatron's and "
                "most recipes' rule), matrices_and_embeddings, or all (every parameter: the behaviour, and the "
                "numbers, of runs before parameter groups existed; a checkpoint written then resumes with it).");
  s.add_string_list("optimizer.groups", {})
      .describe("Named parameter groups, first match wins: {match: GLOB over the global parameter name, "
                "weight_decay: X, lr_scale: Y, name: N}, e.g. [{match: \"*.ln*\", weight_decay: 0}, "
                "{match: \"embed*\", lr_scale: 0.1}]; each sets its parameters' weight decay and/or scales "
                "their learning rate.");
  s.add_rule([](const Config& c, ConfigErrors& e) {
    if (c.ok({"optimizer.groups"})) parse_group_rules(c.get_string_list("optimizer.groups"), &e);
  });
  s.add_float("optimizer.momentum", 0.0).range(0.0, 0.9999).describe("SGD momentum.");
  s.add_float("optimizer.beta1", 0.9).range(0.0, 0.9999).describe("Adam beta1.");
  s.add_float("optimizer.beta2", 0.999).range(0.0, 0.999999).describe("Adam beta2.");
  s.add_float("optimizer.eps", 1e-8).range(1e-12, 1.0).describe("Adam epsilon.");
  s.add_float("optimizer.grad_clip", 1.0).range(0.0, 1e6)
      .describe("Global gradient-norm clip.").note("0 turns clipping off");

  // distributed
  s.add_enum("distributed.backend", "auto", {"auto", "gloo", "nccl"})
      .describe("Communication backend; auto means gloo (the NCCL process group is not wired yet).");
  s.add_int("distributed.data_parallel_size", 0).range(0, 1e6)
      .describe("Data-parallel size.").note("0 derives it as world / (product of the feature-claimed mesh dimensions)");
  s.add_string("distributed.mesh_order", "")
      .describe("Rank layout of the mesh: its dimensions joined by '-', innermost (fastest-varying) first, e.g. tp-dp-pp.")
      .note("empty orders by role: split dimensions, sequence, replicate (dp), partition; --dry-run prints it");
  s.add_float("distributed.timeout_seconds", 300.0).range(0.1, 86400.0)
      .describe("Timeout of every collective and of rendezvous.");
  s.add_float("distributed.bucket_size_mb", 4.0).range(0.001, 4096.0)
      .describe("Gradient reduction bucket size: buckets are cut in reverse parameter order, each closing once it holds "
                "this many MiB (the first at 1 MiB when this is larger), as PyTorch DDP cuts them.")
      .note("4 MiB gives the shipped 13 MB GPT four buckets to overlap with backward");
  s.add_bool("distributed.overlap", true)
      .describe("Launch each gradient bucket's reduction during backward, as soon as its last gradient is accumulated "
                "(from the second step; the first counts each parameter's gradients); false reduces every bucket after "
                "backward. Bitwise the same numbers either way.")
      .note("false keeps the blocking path, for comparison");
  s.add_bool("distributed.rebuild_buckets", true)
      .describe("With distributed.overlap: after the first step, cut the gradient buckets again in the order the "
                "gradients arrived in (as PyTorch DDP rebuilds its buckets), so each bucket completes as early as the "
                "backward allows; every replica checks it cut the same buckets, otherwise none rebuilds. Bitwise "
                "the same numbers at dp=2 (a sum of two terms in any order); at more replicas a ring's order of "
                "terms follows the buckets' layout: within the parity bars. A feature that takes over the gradient "
                "reducer cuts its own buckets.");
  s.add_bool("distributed.shm_collectives", true)
      .describe("Sums (all-reduce, reduce-scatter) of float tensors, all-gathers and all-to-alls inside a group whose "
                "ranks share a host go through one shared-memory segment per group (gradient buckets, zero's shards, "
                "tensor-parallel sums, expert-parallel exchanges, losses), summed in rank order, instead of Gloo's TCP "
                "loopback; groups spanning hosts stay on Gloo. With two ranks the sums are bitwise Gloo's.")
      .note("false keeps every collective on Gloo");
  s.add_bool("distributed.flight_recorder", true)
      .describe("Record every collective and stage message (a ring per rank), publish heartbeats to "
                "<run.output_dir>/flight/, name the rank behind on a stall, and write flight/rank<RRRRR>.json on a failure.");
  s.add_int("distributed.flight_entries", 4096).range(16, 1e7)
      .describe("Operations each rank's flight recorder keeps (the oldest are overwritten).");
  s.add_float("distributed.heartbeat_seconds", 1.0).range(0.05, 60.0)
      .describe("Seconds between a rank's heartbeats (its progress per group and current action).");
  s.add_float("distributed.stall_seconds", 30.0).range(0.1, 86400.0)
      .describe("A rank that has waited this long in one collective or stage receive reports which rank is behind.")
      .note("must be below distributed.timeout_seconds");
  s.add_enum("distributed.on_stall", "warn", {"warn", "abort"})
      .describe("On a stall: warn (report, keep waiting until the timeout) or abort (report, write the flight "
                "record and end the job).");
  s.add_enum("distributed.init_method", "env", {"env", "file"})
      .describe("`env`: TCPStore at MASTER_ADDR:MASTER_PORT; `file`: FileStore at distributed.init_file.");
  s.add_string("distributed.init_file", "").describe("FileStore path for init_method: file.");
  s.add_string("distributed.gloo_hostname", "")
      .describe("Address Gloo binds to.").note("empty: 127.0.0.1 when MASTER_ADDR is local, else this host's name");

  // checkpoint
  s.add_string("checkpoint.dir", "").describe("Checkpoint directory.").note("empty means <run.output_dir>/checkpoints");
  s.add_int("checkpoint.interval", 0).range(0, 1e12)
      .describe("Steps between checkpoints.").note("0 saves only at the end");
  s.add_string("checkpoint.resume", "auto")
      .describe("Where to resume from.").note("auto (latest in checkpoint.dir if any), never, or a checkpoint path");
  s.add_int("checkpoint.keep", 0).range(0, 1e6)
      .describe("Checkpoints to keep.").note("0 keeps all");
  s.add_bool("checkpoint.strict", true)
      .describe("Resume strictly, as load_state_dict(strict=True): a checkpoint tensor (model or optimizer) the run "
                "does not have, a run tensor the checkpoint lacks, or a changed model.* option the model does not "
                "declare free is refused, naming it. false is a partial load (fine-tuning): the changed model "
                "options are allowed, the tensors that match are loaded, the rest skipped or left at their "
                "initial values and listed in one log line; a shape mismatch is still refused.");

  // metrics
  s.add_bool("metrics.prometheus.enabled", false).describe("Serve /metrics over HTTP.");
  s.add_int("metrics.prometheus.port", 9400).range(1, 65535)
      .describe("Base port; each local rank serves on port + local rank.");
  s.add_string("metrics.prometheus.bind", "127.0.0.1").describe("Address the HTTP endpoint binds to.");
  s.add_float("metrics.peak_flops", 0.0).range(0.0, 1e21)
      .describe("Peak FLOP/s of one rank in the type the products run in (fp32, or bf16 under "
                "features.mixed_precision), the denominator of MFU (model FLOP/s per rank / peak).")
      .note("0 measures it at start-up with a short matmul probe on each rank (fp32, and bf16 too under mixed "
            "precision)");
  s.add_bool("metrics.jsonl", true).describe("Append one JSON object per logged step to <run.output_dir>/metrics.jsonl.");

  // logging
  s.add_enum("logging.level", "info", {"trace", "debug", "info", "warn", "error", "off"})
      .describe("Log level; the environment variable HP_LOG_LEVEL overrides it.");
  s.add_string("logging.file", "").describe("Also write logs to this file (rank suffix added).");

  // plugins
  s.add_string_list("plugins.path", {})
      .describe("Directories searched first for feature plugins (then HP_PLUGIN_PATH, then the install directory).");

  // ---- cross-field rules needing no feature ------------------------------
  s.add_rule([](const Config& c, ConfigErrors& e) {
    // The model's own rules, then the dataset against what the model reads.
    if (!c.ok({"model.type"})) return;
    const ModelEntry* m = models().find(c.get_string("model.type"));
    if (!m) return;
    if (m->validate) m->validate(c, e);
    ModelInfo info;
    try {
      info = model_info(c);
    } catch (const std::exception&) {
      return;  // its options were refused on their own
    }
    check_data_against_model(c, info, e);
  });
  s.add_rule([](const Config& c, ConfigErrors& e) {
    if (!c.ok({"training.global_batch_size", "training.micro_batch_size"})) return;
    auto g = c.get_int("training.global_batch_size"), m = c.get_int("training.micro_batch_size");
    if (m > g) {
      e.add("training.micro_batch_size", std::to_string(m),
            "is larger than training.global_batch_size = " + std::to_string(g),
            "1 .. " + std::to_string(g));
    }
  });
  s.add_rule([](const Config& c, ConfigErrors& e) {
    if (!c.ok({"distributed.backend"})) return;
    if (c.get_string("distributed.backend") == "nccl" && !build_info::has_cuda()) {
      e.add("distributed.backend", "nccl",
            "this hyperparallel was built against a LibTorch without CUDA, so the NCCL backend "
            "does not exist in it",
            "auto, gloo");
    }
  });
  s.add_rule([](const Config& c, ConfigErrors& e) {
    if (!c.ok({"distributed.init_method", "distributed.init_file"})) return;
    if (c.get_string("distributed.init_method") == "file" &&
        c.get_string("distributed.init_file").empty()) {
      e.add("distributed.init_file", "\"\"", "is required when distributed.init_method is file",
            "a path on a file system every rank can see");
    }
  });
  s.add_rule([](const Config& c, ConfigErrors& e) {
    if (!c.ok({"distributed.stall_seconds", "distributed.timeout_seconds"})) return;
    if (c.get_float("distributed.stall_seconds") >= c.get_float("distributed.timeout_seconds")) {
      e.add("distributed.stall_seconds", to_string(c.value("distributed.stall_seconds")),
            "must be below distributed.timeout_seconds = " + to_string(c.value("distributed.timeout_seconds")) +
                " (a stall is reported while the others still wait)",
            "less than " + to_string(c.value("distributed.timeout_seconds")));
    }
  });
  s.add_rule([](const Config& c, ConfigErrors& e) {
    if (!c.ok({"run.profile.enabled", "run.profile.steps", "training.max_steps"})) return;
    if (!c.get_bool("run.profile.enabled")) return;
    const auto max_steps = c.get_int("training.max_steps");
    for (const auto step : c.get_int_list("run.profile.steps")) {
      if (step > max_steps) {
        e.add("run.profile.steps", to_string(c.value("run.profile.steps")),
              "step " + std::to_string(step) + " is past training.max_steps = " + std::to_string(max_steps) +
                  ", so it would never be recorded",
              "steps 1 .. " + std::to_string(max_steps));
        return;
      }
    }
  });
  s.add_rule([](const Config& c, ConfigErrors& e) {
    if (!c.ok({"optimizer.lr", "optimizer.min_lr"})) return;
    if (c.get_float("optimizer.min_lr") > c.get_float("optimizer.lr")) {
      e.add("optimizer.min_lr", to_string(c.value("optimizer.min_lr")),
            "is above optimizer.lr = " + to_string(c.value("optimizer.lr")),
            "0 .. optimizer.lr");
    }
  });
}

}  // namespace hp
