"""The cost of sampling lookup statistics (profile_data_directory) while
training, beside TF 2.15's TPUEstimator on the same work.

Workload: bench/e2e_bench.py's `dlrm` (the example model, 26 embedding
features including shared, sequence and weighted ones, batch 1024,
pre-batched input). Sides, each run in its own child process with a fresh
model_dir, alternating round by round:

* `ours`: estimator_spec.TPUEstimator without a profile directory;
* `ours+stats`: the same with `profile_data_directory` at the default
  sampling rate (0.03: one step in 33 is sampled);
* `ours+stats@1`: every step sampled (rate 1), which shows the cost of one
  sampled step;
* `tf`: TF 2.15's TPUEstimator(use_tpu=False) on the same model (it
  ignores the embedding optimizer; the reference of the other benches).

A run's rate is the examples of its timed steps over their wall time (the
first `--warmup` steps discarded); a side's rate is the median over rounds.
Printed: each side's examples/s; the cost of statistics at the default rate
measured directly (1 - rate(ours+stats) / rate(ours)), which is within the
noise of the machine, and derived from the sampled steps (the extra time of
a step at rate 1, times 1/33), which is not; ours / TF.

Usage: .venv/bin/python -m bench.profile_bench [--quick] [--rounds N]
"""
import argparse
import os
import statistics as stats_lib
import time

import tensorflow as tf

from bench import e2e_bench
from estimator_spec.engine import statistics

SIDES = (("ours", e2e_bench.OURS, None),
         ("ours+stats", e2e_bench.OURS, statistics.DEFAULT_SAMPLING_RATE),
         ("ours+stats@1", e2e_bench.OURS, 1.0),
         ("tf", e2e_bench.TF, None))


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true",
                      help="smoke run: a few steps, one round")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--steps", type=int, default=None,
                      help="timed steps per run; default 132, --quick 6")
  parser.add_argument("--warmup", type=int, default=None,
                      help="discarded steps per run; default 20, --quick 2")
  parser.add_argument("--scale", type=float, default=0.05)
  parser.add_argument("--batch", type=int, default=1024)
  args = parser.parse_args()
  steps = args.steps or (6 if args.quick else 132)
  warmup = args.warmup if args.warmup is not None else (2 if args.quick
                                                         else 20)
  rounds = 1 if args.quick else args.rounds
  job = {"workload": "dlrm", "scale": args.scale, "batch": args.batch,
         "examples": 16 * args.batch, "steps": warmup + steps,
         "warmup": warmup, "input": "batched"}
  print(f"profile_bench: {os.cpu_count()} CPUs, TF {tf.__version__}; "
        f"example model (examples/dlrm.py) at scale {args.scale}, batch "
        f"{args.batch}; {rounds} alternating round(s) of "
        f"{warmup} warm-up + {steps} timed steps", flush=True)
  rates = {label: [] for label, _, _ in SIDES}
  begin = time.perf_counter()
  for r in range(rounds):
    for label, side, rate in SIDES:
      result = e2e_bench.run_in_child(dict(job, side=side, profile_rate=rate))
      rates[label].append(result["examples_per_s"])
      print(f"  round {r + 1} {label:13s} {result['examples_per_s']:8,.0f} "
            f"examples/s  median step {result['median_step_ms']:6.1f} ms",
            flush=True)
  median = {label: stats_lib.median(values) for label, values in
            rates.items()}
  period = statistics.sampling_period(statistics.DEFAULT_SAMPLING_RATE)
  step = {label: args.batch / value for label, value in median.items()}
  sampled_extra = step["ours+stats@1"] - step["ours"]
  print("\nSummary (median examples/s over rounds):")
  for label, _, _ in SIDES:
    print(f"  {label:13s} {median[label]:8,.0f} examples/s  "
          f"{1e3 * step[label]:6.1f} ms/step")
  print(f"  statistics at the default rate ({statistics.DEFAULT_SAMPLING_RATE}"
        f", one step in {period}), measured: "
        f"{100 * (1 - median['ours+stats'] / median['ours']):+.2f}% of step "
        "time (run-to-run noise is about 1-2% here)")
  print(f"  a sampled step costs {1e3 * sampled_extra:.1f} ms more "
        f"({100 * sampled_extra / step['ours']:.1f}% of a step); at one step "
        f"in {period}: {100 * sampled_extra / period / step['ours']:.2f}% of "
        "step time")
  print(f"  ours / TF: {median['ours'] / median['tf']:.2f}x; ours+stats / "
        f"TF: {median['ours+stats'] / median['tf']:.2f}x")
  print(f"({time.perf_counter() - begin:.0f} s)")


if __name__ == "__main__":
  main()
