#include "framework/trainer/options.h"

#include "hp/comm/context.h"
#include "hp/config/config.h"
#include "framework/model/tensor_dump.h"

#include <algorithm>

namespace hp {

RunOptions RunOptions::from(const Config& c) {
  RunOptions o;
  o.output_dir = c.get_string("run.output_dir");
  o.seed = static_cast<std::uint64_t>(c.get_int("run.seed"));
  return o;
}

TrainingOptions TrainingOptions::from(const Config& c) {
  TrainingOptions o;
  o.max_steps = c.get_int("training.max_steps");
  o.global_batch = c.get_int("training.global_batch_size");
  o.micro_batch = c.get_int("training.micro_batch_size");
  o.seq_len = c.get_int("model.seq_len");
  o.document_attention = c.get_bool("data.document_attention");
  o.log_interval = c.get_int("training.log_interval");
  o.eval_interval = c.get_int("training.eval_interval");
  // 0: one global batch.
  o.eval_samples = c.get_int("training.eval_samples");
  if (o.eval_samples == 0) o.eval_samples = c.get_int("training.global_batch_size");
  o.dump_grads_at = c.get_int("training.dump_grads_at_step");
  o.sample_interval = c.get_int("training.sample_interval");
  o.sample_tokens = c.get_int("training.sample_tokens");
  o.sample_prompt = c.get_string("training.sample_prompt");
  o.dump_routing_at = c.get_int_list("training.dump_routing_steps");
  o.dump_activations_at = c.get_int_list("training.dump_activations_steps");
  return o;
}

unsigned TrainingOptions::dumps_at(std::int64_t step) const {
  auto has = [step](const std::vector<std::int64_t>& v) { return std::find(v.begin(), v.end(), step) != v.end(); };
  return (has(dump_routing_at) ? tensor_dump::kRouting : 0u) |
         (has(dump_activations_at) ? tensor_dump::kActivations : 0u);
}

dist::ContextOptions context_options(const Config& c) {
  dist::ContextOptions o;
  const std::string& backend = c.get_string("distributed.backend");
  o.backend = backend == "auto" ? "gloo" : backend;
  o.init_method = c.get_string("distributed.init_method");
  o.init_file = c.get_string("distributed.init_file");
  o.gloo_hostname = c.get_string("distributed.gloo_hostname");
  o.timeout = std::chrono::milliseconds(static_cast<long long>(c.get_float("distributed.timeout_seconds") * 1000));
  o.shm_collectives = c.get_bool("distributed.shm_collectives");
  o.flight_entries =
      c.get_bool("distributed.flight_recorder") ? static_cast<std::size_t>(c.get_int("distributed.flight_entries")) : 0;
  return o;
}

}  // namespace hp
