"""The cost of sampling lookup statistics (profile_data_directory) while
training, beside TF 2.15's TPUEstimator on the same work.

Workload: bench/e2e_bench.py's `dlrm` (the example model, 26 embedding
features in 24 tables, shared, sequence and weighted ones among them,
batch 1024, pre-batched input). Configurations of ours:

* `ours`: estimator_spec.TPUEstimator without a profile directory;
* `ours+stats`: the same with `profile_data_directory` at the default
  sampling rate (0.02: one step in 50 is sampled);
* `ours+stats@1`: every step sampled (rate 1): the most the sampling can
  cost.

The three differ by a few percent at most, less than this machine's
run-to-run spread between processes, so they are measured side by side in
ONE process (`--rounds` child processes, each holding the three
estimators): each round trains them in turn, `--segments` times (each
segment starting with the next configuration), each
`train()` call `--warmup` discarded steps then `--steps` timed steps. A
configuration's rate in a round is its examples over its timed wall time,
summed over segments; the cost is 1 - rate / rate(ours) of the same round,
and the median over rounds is printed.

Reference: TF 2.15's TPUEstimator(use_tpu=False) on the same model (it
ignores the embedding optimizer), one child process per round, alternating
with ours; ours / TF is printed with ours' rate from the paired rounds.

The small model (`--models small`): two identity features in their own
tables of 1,000 rows, dimension 8, one hidden layer of 16, batch 512:
steps of half a millisecond to a millisecond, where a fixed cost per step
of the statistics would show most. It is measured the same way (no TF
reference); its summary prints ours+stats / ours, the ratio of the rates
with and without statistics in the same process.

For both models the summary also prints the median step time of the steps
the default rate does not sample and of those it samples, for each
configuration (the medians move less with this shared machine's noise than
whole-run rates do), and the time the statistics hook itself spends on a
step it does not sample (its `before_run` and `after_run`, timed in the
training process), and, per configuration, the slowest step after the
first of a `train()` call (median over calls, warm-up included): a one-time
cost at start-up, such as a session building an executor for a new
combination of fetches, shows there and nowhere else.

`--what monitoring` measures, the same way and on the same two models,
what the estimator's monitoring costs (docs/estimator.md, 'Monitoring'):

* `quiet`: `RunConfig(save_summary_steps=None, log_step_count_steps=None)`,
  no summaries and no step logging at all;
* `tf-defaults`: RunConfig's defaults (summaries and step logging every 100
  steps: Estimator's own `loss`, `global_step/sec` and logging hooks), with
  this library's per-table summaries and progress hook taken out (for this
  configuration's graphs only);
* `monitored`: RunConfig's defaults with this library's monitoring, as a
  user gets them.

It prints the rates, `monitored / tf-defaults` (what this library adds)
and `monitored / quiet` (all of it), and the median step of the steps that
write no summary and of those that do.

Usage: .venv/bin/python -m bench.profile_bench [--quick] [--rounds N]
  [--models dlrm,small] [--what statistics|monitoring]
"""
import argparse
import contextlib
import multiprocessing
import os
import shutil
import statistics as stats_lib
import tempfile
import time
import warnings

import numpy as np
import tensorflow as tf

import estimator_spec
import tpu_embedding_columns
from bench import e2e_bench
from estimator_spec.estimator import monitoring
from estimator_spec.profiling import sampling

CONFIGS = (("ours", None), ("ours+stats", sampling.DEFAULT_SAMPLING_RATE),
           ("ours+stats@1", 1.0))


SMALL_FEATURES = ("s0", "s1")
SMALL_VOCAB = 1000


def _build_small(job, rate):
  """(estimator, input_fn) of the small model: two identity features of
  SMALL_VOCAB ids in their own tables (dimension 8), one hidden layer of
  16, batch `job['batch']`: steps of under a millisecond, where a fixed
  per-step cost of the statistics would show most."""
  features, labels = e2e_bench._identity_data(
      SMALL_FEATURES, SMALL_VOCAB, job["examples"], exponent=1.1, seed=0)
  columns = [
      tpu_embedding_columns.embedding_column(
          tf.feature_column.categorical_column_with_identity(
              name, SMALL_VOCAB), dimension=8, combiner="mean")
      for name in SMALL_FEATURES
  ]
  spec = estimator_spec.EmbeddingConfigSpec(
      feature_columns=columns,
      optimization_parameters=estimator_spec.AdagradParameters(
          learning_rate=0.05, initial_accumulator=0.1),
      profile_data_directory=(os.path.join(job["model_dir"], "profile")
                              if rate else None))
  model_fn = e2e_bench._mlp_model_fn(
      columns, estimator_spec.TPUEstimatorSpec, "adagrad", hidden=(16,))
  estimator = e2e_bench._estimator(
      e2e_bench.OURS, model_fn, job["model_dir"], job["batch"], spec, rate,
      summaries_every=job.get("summaries_every"))
  return estimator, e2e_bench._batched_input_fn(features, labels)


def _build(job, rate):
  if job["workload"] == "small":
    return _build_small(job, rate)
  return e2e_bench.build_estimator(dict(job, side=e2e_bench.OURS,
                                        profile_rate=rate))


def _time_the_hook():
  """Wraps `StatisticsHook.before_run`/`after_run` to record the time spent
  in them per step: [(sampled, seconds)] (this process only)."""
  hook_class = sampling.StatisticsHook
  calls = []
  before, after = hook_class.before_run, hook_class.after_run

  def timed_before(self, run_context):
    start = time.perf_counter()
    result = before(self, run_context)
    self._bench_before = time.perf_counter() - start
    return result

  def timed_after(self, run_context, run_values):
    start = time.perf_counter()
    after(self, run_context, run_values)
    calls.append((self._sampled, self._bench_before +
                  time.perf_counter() - start))

  hook_class.before_run, hook_class.after_run = timed_before, timed_after
  return calls


def _paired_round(job, segments, queue):
  """One process: the three configurations trained in turn, `segments`
  times; puts {"rates": {config: examples/s over its timed steps},
  "steps": {config: (median ms of the steps the default rate does not
  sample, median ms of those it samples)}} (the same step positions for
  every configuration)."""
  warnings.filterwarnings("ignore", category=UserWarning)
  tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
  period = sampling.sampling_period(sampling.DEFAULT_SAMPLING_RATE)
  hook_calls = _time_the_hook()
  root = tempfile.mkdtemp(prefix="profile_bench_")
  try:
    built = {}
    for label, rate in CONFIGS:
      built[label] = _build(dict(job, model_dir=os.path.join(root, label)),
                            rate)
    timed = {label: [0, 0.0] for label, _ in CONFIGS}  # steps, seconds
    durations = {label: ([], []) for label, _ in CONFIGS}
    in_hook = []
    slowest = {label: [] for label, _ in CONFIGS}
    for segment in range(segments):
      # Each segment starts with another configuration (order effects).
      order = CONFIGS[segment % 3:] + CONFIGS[:segment % 3]
      for label, _ in order:
        estimator, input_fn = built[label]
        hook = e2e_bench.StepTimes()
        del hook_calls[:]
        estimator.train(input_fn, steps=job["steps"], hooks=[hook])
        if label == "ours+stats":
          # The hook's own time on the steps it does not sample.
          in_hook.extend(t for sampled, t in hook_calls[job["warmup"]:]
                         if not sampled)
        slowest[label].append(float(np.max(np.diff(hook.times))))
        steady = np.diff(hook.times[job["warmup"]:])
        timed[label][0] += len(steady)
        timed[label][1] += float(steady.sum())
        # steady[j] is step warmup + 1 + j of this train() call (from 0);
        # the hook samples steps 0, period, 2 * period, ...
        sampled = (job["warmup"] + 1 + np.arange(len(steady))) % period == 0
        durations[label][0].extend(steady[~sampled].tolist())
        durations[label][1].extend(steady[sampled].tolist())
    queue.put(dict(
        _round_result(job, timed, durations),
        hook_us=1e6 * float(np.mean(in_hook)) if in_hook else 0.0,
        slowest_ms={label: 1000 * float(np.median(times))
                    for label, times in slowest.items()}))
  finally:
    shutil.rmtree(root, ignore_errors=True)


def _round_result(job, timed, durations):
  """A round's rates ({config: examples/s}, from `timed`: {config: [steps,
  seconds]}) and median step times ({config: (ms, ms)}, from `durations`:
  {config: (step seconds, step seconds)})."""
  return {
      "rates": {label: job["batch"] * n / seconds
                for label, (n, seconds) in timed.items()},
      "steps": {label: tuple(1000 * float(np.median(d)) if d else 0.0
                             for d in pair)
                for label, pair in durations.items()}}


def _run_paired(job, segments, target=None):
  """`target` (default `_paired_round`) in a child process: its result."""
  context = multiprocessing.get_context("spawn")
  queue = context.Queue()
  process = context.Process(target=target or _paired_round,
                            args=(job, segments, queue))
  process.start()
  try:
    return queue.get(timeout=3600)
  finally:
    process.join()


def _measure(job, rounds, segments, reference):
  """Paired rounds of `job`; with `reference`, TF's TPUEstimator on the
  same model after each round. Prints each round and the summary."""
  paired, steps, hook_us, tf_rates, slowest = [], [], [], [], []
  for r in range(rounds):
    result = _run_paired(job, segments)
    rates = result["rates"]
    paired.append(rates)
    steps.append(result["steps"])
    hook_us.append(result["hook_us"])
    slowest.append(result["slowest_ms"])
    print(f"  round {r + 1} " + "  ".join(
        f"{label} {rate:8,.0f}" for label, rate in rates.items()) +
          " examples/s", flush=True)
    if reference:
      tf_run = e2e_bench.run_in_child(dict(job, side=e2e_bench.TF))
      tf_rates.append(tf_run["examples_per_s"])
      print(f"  round {r + 1} tf {tf_run['examples_per_s']:8,.0f} "
            "examples/s", flush=True)
  print("Summary (medians over rounds):")
  ours = stats_lib.median(p["ours"] for p in paired)
  for label, rate in CONFIGS:
    value = stats_lib.median(p[label] for p in paired)
    line = (f"  {label:13s} {value:8,.0f} examples/s, "
            f"{1000 * job['batch'] / value:6.3f} ms/step")
    if rate is not None:
      costs = [100 * (1 - p[label] / p["ours"]) for p in paired]
      ratios = [p[label] / p["ours"] for p in paired]
      line += (f"  {label} / ours {stats_lib.median(ratios):.3f}, cost "
               f"{stats_lib.median(costs):+5.2f}% of step time (rounds: "
               f"{', '.join(f'{c:+.2f}%' for c in costs)})")
    print(line)
  unsampled = {label: stats_lib.median(s[label][0] for s in steps)
               for label, _ in CONFIGS}
  sampled = {label: stats_lib.median(s[label][1] for s in steps)
             for label, _ in CONFIGS}
  print("  median step, ms (steps the default rate does not sample / "
        "those it samples): " + ", ".join(
            f"{label} {unsampled[label]:.3f} / {sampled[label]:.3f}"
            for label, _ in CONFIGS))
  period = sampling.sampling_period(sampling.DEFAULT_SAMPLING_RATE)
  extra = (sampled["ours+stats"] - sampled["ours"]) / period
  print(f"  ours+stats / ours on the steps not sampled: "
        f"{unsampled['ours+stats'] / unsampled['ours']:.3f}; a sampled step "
        f"takes {sampled['ours+stats'] - sampled['ours']:+.3f} ms, once in "
        f"{period} steps: {100 * extra / unsampled['ours']:+.2f}% of step "
        "time (from the medians, which the machine's noise moves less)")
  print(f"  time in the statistics hook on a step it does not sample: "
        f"{stats_lib.median(hook_us):.1f} us, "
        f"{stats_lib.median(hook_us) / 10 / unsampled['ours']:.2f}% of the "
        "median step")
  print("  slowest step after the first of a train() call, ms: " + ", ".join(
      f"{label} {stats_lib.median(s[label] for s in slowest):.1f}"
      for label, _ in CONFIGS))
  if reference:
    tf_rate = stats_lib.median(tf_rates)
    print(f"  {'tf':13s} {tf_rate:8,.0f} examples/s")
    print(f"  ours / TF {ours / tf_rate:.2f}x, ours+stats / TF "
          f"{stats_lib.median(p['ours+stats'] for p in paired) / tf_rate:.2f}x")


MONITORING_CONFIGS = ("quiet", "tf-defaults", "monitored")
SUMMARY_EVERY = 100  # RunConfig's default save_summary_steps


class _NoHook(tf.compat.v1.train.SessionRunHook):
  """Stands for the progress hook where it is taken out."""

  def __init__(self, *args, **kwargs):
    del args, kwargs


@contextlib.contextmanager
def _without_our_monitoring():
  """This library's per-table summaries and progress hook taken out of the
  graphs built in the block (the `tf-defaults` configuration)."""
  saved = monitoring.add_table_summaries, monitoring.ProgressHook
  monitoring.add_table_summaries = lambda *args, **kwargs: None
  monitoring.ProgressHook = _NoHook
  try:
    yield
  finally:
    monitoring.add_table_summaries, monitoring.ProgressHook = saved


def _build_monitored(job, label):
  """(estimator, input_fn) of `job` in configuration `label`: RunConfig's
  defaults for summaries and step logging, but for `quiet`."""
  return _build(dict(job, summaries_every=None if label == "quiet" else
                     SUMMARY_EVERY), None)


def _monitoring_round(job, segments, queue):
  """One process: the three monitoring configurations trained in turn,
  `segments` times; puts {"rates": {config: examples/s}, "steps": {config:
  (median ms of the steps that write no summary, of those that do)}}."""
  warnings.filterwarnings("ignore", category=UserWarning)
  tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
  root = tempfile.mkdtemp(prefix="monitoring_bench_")
  devnull = open(os.devnull, "w")  # the progress lines
  try:
    built = {label: _build_monitored(
        dict(job, model_dir=os.path.join(root, label)), label)
             for label in MONITORING_CONFIGS}
    timed = {label: [0, 0.0] for label in MONITORING_CONFIGS}
    durations = {label: ([], []) for label in MONITORING_CONFIGS}
    for segment in range(segments):
      order = (MONITORING_CONFIGS[segment % 3:] +
               MONITORING_CONFIGS[:segment % 3])
      for label in order:
        estimator, input_fn = built[label]
        hook = e2e_bench.StepTimes()
        start = estimator.get_variable_value("global_step") if (
            estimator.latest_checkpoint()) else 0
        with (_without_our_monitoring() if label == "tf-defaults" else
              contextlib.nullcontext()), contextlib.redirect_stderr(devnull):
          estimator.train(input_fn, steps=job["steps"], hooks=[hook])
        steady = np.diff(hook.times[job["warmup"]:])
        timed[label][0] += len(steady)
        timed[label][1] += float(steady.sum())
        # steady[j] ends global step start + warmup + 2 + j; Estimator
        # writes summaries at its first step and every SUMMARY_EVERY.
        ends = start + job["warmup"] + 2 + np.arange(len(steady))
        writes = (ends - start - 1) % SUMMARY_EVERY == 0
        durations[label][0].extend(steady[~writes].tolist())
        durations[label][1].extend(steady[writes].tolist())
    queue.put(_round_result(job, timed, durations))
  finally:
    devnull.close()
    shutil.rmtree(root, ignore_errors=True)


def _measure_monitoring(job, rounds, segments):
  paired, steps = [], []
  for r in range(rounds):
    result = _run_paired(job, segments, _monitoring_round)
    paired.append(result["rates"])
    steps.append(result["steps"])
    print(f"  round {r + 1} " + "  ".join(
        f"{label} {rate:8,.0f}" for label, rate in result["rates"].items()) +
          " examples/s", flush=True)
  print("Summary (medians over rounds):")
  for label in MONITORING_CONFIGS:
    value = stats_lib.median(p[label] for p in paired)
    quiet_steps = stats_lib.median(s[label][0] for s in steps)
    summary_steps = stats_lib.median(s[label][1] for s in steps)
    print(f"  {label:12s} {value:8,.0f} examples/s; median step "
          f"{quiet_steps:.3f} ms, {summary_steps:.3f} ms at summary steps")
  ours = [p["monitored"] / p["tf-defaults"] for p in paired]
  whole = [p["monitored"] / p["quiet"] for p in paired]
  print(f"  monitored / tf-defaults (this library's monitoring) "
        f"{stats_lib.median(ours):.3f} (rounds: "
        f"{', '.join(f'{r:.3f}' for r in ours)}); monitored / quiet (all "
        f"of it) {stats_lib.median(whole):.3f}")


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true",
                      help="smoke run: one round, one short segment")
  parser.add_argument("--models", default="dlrm,small",
                      help="which models: dlrm (the 24-table example), "
                      "small (two tables, ~1 ms steps), or both")
  parser.add_argument("--what", choices=("statistics", "monitoring"),
                      default="statistics",
                      help="what to measure the cost of (default: "
                      "statistics)")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--segments", type=int, default=None,
                      help="train() calls per configuration and round; "
                      "default 3, --quick 1")
  parser.add_argument("--steps", type=int, default=None,
                      help="timed steps per train() call of dlrm; default "
                      "200 (four sampled at the default rate), --quick 50")
  parser.add_argument("--small-steps", type=int, default=None,
                      help="timed steps per train() call of the small "
                      "model; default 1000 (20 sampled), --quick 200")
  parser.add_argument("--warmup", type=int, default=None,
                      help="discarded steps per train() call; default 10, "
                      "--quick 2")
  parser.add_argument("--scale", type=float, default=0.05)
  parser.add_argument("--batch", type=int, default=1024)
  parser.add_argument("--small-batch", type=int, default=512)
  args = parser.parse_args()
  models = [m for m in args.models.split(",") if m]
  if not models or set(models) - {"dlrm", "small"}:
    parser.error(f"--models: choose from dlrm, small; got {args.models!r}")
  steps = args.steps or (50 if args.quick else 200)
  small_steps = args.small_steps or (200 if args.quick else 1000)
  warmup = args.warmup if args.warmup is not None else (2 if args.quick
                                                         else 10)
  segments = args.segments or (1 if args.quick else 3)
  rounds = 1 if args.quick else args.rounds
  period = sampling.sampling_period(sampling.DEFAULT_SAMPLING_RATE)
  print(f"profile_bench: {os.cpu_count()} CPUs, TF {tf.__version__}; "
        f"{rounds} round(s); per round and configuration {segments} train() "
        f"call(s) of {warmup} warm-up + the timed steps; the default rate "
        f"samples one step in {period}", flush=True)
  begin = time.perf_counter()
  if "dlrm" in models:
    print(f"\nexample model (examples/dlrm.py, 24 tables) at scale "
          f"{args.scale}, batch {args.batch}, {steps} timed steps:",
          flush=True)
    job = {"workload": "dlrm", "scale": args.scale, "batch": args.batch,
           "examples": 16 * args.batch, "steps": warmup + steps,
           "warmup": warmup, "input": "batched"}
    if args.what == "monitoring":
      _measure_monitoring(job, rounds, segments)
    else:
      _measure(job, rounds, segments, reference=True)
  if "small" in models:
    print(f"\nsmall model (2 tables of {SMALL_VOCAB} rows, dimension 8, one "
          f"hidden layer of 16), batch {args.small_batch}, {small_steps} "
          "timed steps:", flush=True)
    job = {"workload": "small", "batch": args.small_batch,
           "examples": 16 * args.small_batch,
           "steps": warmup + small_steps, "warmup": warmup}
    if args.what == "monitoring":
      _measure_monitoring(job, rounds, segments)
    else:
      _measure(job, rounds, segments, reference=False)
  print(f"({time.perf_counter() - begin:.0f} s)")


if __name__ == "__main__":
  main()
