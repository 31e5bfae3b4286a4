// hp-compare: checks a run against a reference run by docs/PARITY.md's rules.
// From metrics.jsonl it compares loss, grad_norm and eval_loss step by step
// (one table per key) and names the first step and key that break the bar
// and the phase that diverged; with --grads-step it assembles both sides'
// gradient dumps of that step from every rank's slices, checks them, and
// compares every gradient. A NaN or infinity anywhere fails. Exit 0 when
// every bar holds, 1 when one breaks, 2 on bad input.
#include <cstdlib>
#include <CLI/CLI.hpp>
#include <cstdio>
#include <stdexcept>

#include "tools/exit_now.h"
#include "tools/hp_compare/grad_parity.h"
#include "tools/hp_compare/metrics_parity.h"

namespace {

int run(int argc, char** argv) {
  CLI::App app{"hp-compare: parity of a run against a reference run (docs/PARITY.md)"};
  std::string ref, run;
  hp::compare::MetricsOptions m;
  hp::compare::GradOptions g;
  app.add_option("reference", ref, "Reference run directory (e.g. one process)")->required();
  app.add_option("run", run, "Run directory to check")->required();
  app.add_option(
      "--first-loss-rtol", m.first_rtol,
      "Bar for the first compared value of loss, grad_norm and eval_loss (default 1e-5)");
  app.add_option("--loss-rtol", m.loss_rtol,
                 "Bar for every later value of loss, grad_norm and eval_loss (default 1e-4)");
  app.add_option("--eval-rtol", m.eval_rtol,
                 "Bar for every eval_loss value (default: the loss bars); evaluation at the same "
                 "weights is held to 1e-5 by the parity tests");
  app.add_option("--norm-rtol", m.norm_rtol,
                 "Bar for every grad_norm value (default: the loss bars); the pipeline tests hold "
                 "losses to 1e-6 and the gradient norm to the gradient bar, 1e-5");
  app.add_option("--grad-rtol", g.rtol,
                 "Bar for every gradient: max|a-b| / (max|ref| + 1e-12) (default 1e-5)");
  std::vector<std::string> grad_bars;
  app.add_option("--grad-bar", grad_bars,
                 "PATTERN=RTOL: a bar of its own for the gradients whose names contain PATTERN "
                 "(repeatable; the first match wins), e.g. router.weight=1e-1");
  app.add_option(
      "--grads-step", g.step,
      "Compare the gradient dumps of this step (grads_step<N>/, training.dump_grads_at_step)");
  app.add_option("--from-step", m.from_step, "Compare metrics from this step on");
  app.add_option("--to-step", m.to_step, "Compare metrics up to this step (default: the last logged)");
  app.add_flag("--exact", m.exact,
               "Require bitwise-equal loss, grad_norm and eval_loss (grad_norm to --norm-rtol when given: "
               "stages that sum their squares in another grouping)");
  app.add_option("--phase", m.phase, "Name of the phase a later-step divergence points at");
  CLI11_PARSE(app, argc, argv);
  for (const auto& b : grad_bars) {
    const auto eq = b.find('=');
    char* end = nullptr;
    const double bar = eq == std::string::npos ? 0 : std::strtod(b.c_str() + eq + 1, &end);
    if (eq == std::string::npos || eq == 0 || !end || *end != '\0' || !(bar >= 0)) {
      std::fprintf(stderr, "hp-compare: --grad-bar %s: expected PATTERN=RTOL with RTOL a number >= 0 (e.g. "
                   "router.weight=1e-1)\n", b.c_str());
      return 2;
    }
    g.bars.emplace_back(b.substr(0, eq), bar);
  }

  try {
    const int metrics = hp::compare::compare_metrics(hp::compare::read_metrics(ref),
                                                     hp::compare::read_metrics(run), m);
    if (metrics == 2) return 2;
    int grads = 0;
    if (g.step > 0) grads = hp::compare::compare_grads(ref, run, g);
    if (metrics != 0 || grads != 0) return 1;
    std::printf("PASS\n");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hp-compare: %s\n", e.what());
    return 2;
  }
}

}  // namespace

int main(int argc, char** argv) { hp::tools::exit_now(run(argc, argv)); }
