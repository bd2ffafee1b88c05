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

Usage: .venv/bin/python -m bench.profile_bench [--quick] [--rounds N]
"""
import argparse
import multiprocessing
import os
import shutil
import statistics as stats_lib
import tempfile
import time
import warnings

import numpy as np
import tensorflow as tf

from bench import e2e_bench
from estimator_spec.engine import statistics

CONFIGS = (("ours", None), ("ours+stats", statistics.DEFAULT_SAMPLING_RATE),
           ("ours+stats@1", 1.0))


def _paired_round(job, segments, queue):
  """One process: the three configurations trained in turn, `segments`
  times; puts {config: examples/s over its timed steps}."""
  warnings.filterwarnings("ignore", category=UserWarning)
  tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
  root = tempfile.mkdtemp(prefix="profile_bench_")
  try:
    built = {}
    for label, rate in CONFIGS:
      built[label] = e2e_bench.build_estimator(dict(
          job, side=e2e_bench.OURS, profile_rate=rate,
          model_dir=os.path.join(root, label)))
    timed = {label: [0, 0.0] for label, _ in CONFIGS}  # steps, seconds
    for segment in range(segments):
      # Each segment starts with another configuration (order effects).
      order = CONFIGS[segment % 3:] + CONFIGS[:segment % 3]
      for label, _ in order:
        estimator, input_fn = built[label]
        hook = e2e_bench.StepTimes()
        estimator.train(input_fn, steps=job["steps"], hooks=[hook])
        steady = np.diff(hook.times[job["warmup"]:])
        timed[label][0] += len(steady)
        timed[label][1] += float(steady.sum())
    queue.put({label: job["batch"] * n / seconds
               for label, (n, seconds) in timed.items()})
  finally:
    shutil.rmtree(root, ignore_errors=True)


def _run_paired(job, segments):
  context = multiprocessing.get_context("spawn")
  queue = context.Queue()
  process = context.Process(target=_paired_round, args=(job, segments, queue))
  process.start()
  try:
    return queue.get(timeout=3600)
  finally:
    process.join()


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true",
                      help="smoke run: one round, one short segment")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--segments", type=int, default=None,
                      help="train() calls per configuration and round; "
                      "default 3, --quick 1")
  parser.add_argument("--steps", type=int, default=None,
                      help="timed steps per train() call; default 200 (four "
                      "sampled at the default rate), --quick 50")
  parser.add_argument("--warmup", type=int, default=None,
                      help="discarded steps per train() call; default 10, "
                      "--quick 2")
  parser.add_argument("--scale", type=float, default=0.05)
  parser.add_argument("--batch", type=int, default=1024)
  args = parser.parse_args()
  steps = args.steps or (50 if args.quick else 200)
  warmup = args.warmup if args.warmup is not None else (2 if args.quick
                                                         else 10)
  segments = args.segments or (1 if args.quick else 3)
  rounds = 1 if args.quick else args.rounds
  job = {"workload": "dlrm", "scale": args.scale, "batch": args.batch,
         "examples": 16 * args.batch, "steps": warmup + steps,
         "warmup": warmup, "input": "batched"}
  period = statistics.sampling_period(statistics.DEFAULT_SAMPLING_RATE)
  print(f"profile_bench: {os.cpu_count()} CPUs, TF {tf.__version__}; "
        f"example model (examples/dlrm.py) at scale {args.scale}, batch "
        f"{args.batch}; {rounds} round(s); per round and configuration "
        f"{segments} train() call(s) of {warmup} warm-up + {steps} timed "
        f"steps", flush=True)
  begin = time.perf_counter()
  paired, reference = [], []
  for r in range(rounds):
    rates = _run_paired(job, segments)
    paired.append(rates)
    print(f"  round {r + 1} " + "  ".join(
        f"{label} {rate:8,.0f}" for label, rate in rates.items()) +
          " examples/s", flush=True)
    tf_run = e2e_bench.run_in_child(dict(job, side=e2e_bench.TF))
    reference.append(tf_run["examples_per_s"])
    print(f"  round {r + 1} tf {tf_run['examples_per_s']:8,.0f} examples/s",
          flush=True)

  print("\nSummary (medians over rounds):")
  ours = stats_lib.median(p["ours"] for p in paired)
  for label, rate in CONFIGS:
    value = stats_lib.median(p[label] for p in paired)
    line = f"  {label:13s} {value:8,.0f} examples/s"
    if rate is not None:
      costs = [100 * (1 - p[label] / p["ours"]) for p in paired]
      line += (f"  cost {stats_lib.median(costs):+5.2f}% of step time "
               f"(rounds: {', '.join(f'{c:+.2f}%' for c in costs)})")
    print(line)
  tf_rate = stats_lib.median(reference)
  print(f"  {'tf':13s} {tf_rate:8,.0f} examples/s")
  print(f"  the default rate samples one step in {period}; ours / TF "
        f"{ours / tf_rate:.2f}x, ours+stats / TF "
        f"{stats_lib.median(p['ours+stats'] for p in paired) / tf_rate:.2f}x")
  print(f"({time.perf_counter() - begin:.0f} s)")


if __name__ == "__main__":
  main()
