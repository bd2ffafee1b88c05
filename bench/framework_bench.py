"""The TPUEstimator on TF 2.15 over its two Estimator frameworks, beside TF.

On TF 2.15 `estimator_spec.TPUEstimator` stands on tensorflow-estimator's
Estimator; `ESTIMATOR_SPEC_FRAMEWORK=own` puts it on the library's own
framework instead, the one it stands on in current TensorFlow
(docs/estimator.md, 'Two stacks'). This bench runs e2e_bench's workloads
(bench/e2e_bench.py) for three sides, alternating within each round, each
in a fresh child process:

* `tfe`: ours on tensorflow-estimator's Estimator (TF 2.15's default),
* `own`: ours on the library's framework,
* `TF`:  TF 2.15's own `TPUEstimator(use_tpu=False)`, the reference,

and prints examples/s (throughput workloads) or the seconds to the first
step (`startup`), the ratios own/tfe and each against TF, and for each run
the CPUs other work kept busy (an idle machine shows ~0.0).

    .venv/bin/python -m bench.framework_bench [--rounds 3] [--steps 200]
        [--workloads peer26,dlrm,startup] [--startup-features 260]
"""
import argparse
import os
import resource
import statistics
import sys
import time

from bench import e2e_bench
from bench.peers import compare

VARIABLE = "ESTIMATOR_SPEC_FRAMEWORK"
SIDES = (("tfe", e2e_bench.OURS, None), ("own", e2e_bench.OURS, "own"),
         ("TF", e2e_bench.TF, None))


def _children_cpu_s():
  usage = resource.getrusage(resource.RUSAGE_CHILDREN)
  return usage.ru_utime + usage.ru_stime


def run_side(job, side, framework, startup_limit):
  """One child run of `job` on `side` with the framework asked for; the
  result with `others_cpus` (other work's CPUs during the run)."""
  if framework is None:
    os.environ.pop(VARIABLE, None)
  else:
    os.environ[VARIABLE] = framework
  busy, own, start = (compare.machine_busy_s(), _children_cpu_s(),
                      time.monotonic())
  try:
    result = e2e_bench.run_in_child(
        dict(job, side=side),
        time_limit=startup_limit if job["workload"] == "startup" else None)
  finally:
    os.environ.pop(VARIABLE, None)
  after = compare.machine_busy_s()
  if busy is not None and after is not None:
    others = (after - busy) - (_children_cpu_s() - own)
    result["others_cpus"] = max(0.0, others / (time.monotonic() - start))
  return result


def _value(job, result):
  """examples/s, or seconds to the first step for `startup`."""
  if "stopped" in result:
    return float("nan")
  if job["workload"] == "startup":
    return result["first_step_s"]
  return result["examples_per_s"]


def _line(name, job, result):
  if job["workload"] == "startup":
    what = f"first step {_value(job, result):6.2f} s"
  else:
    what = (f"{_value(job, result):9,.0f} examples/s  median step "
            f"{result['median_step_ms']:6.1f} ms")
  return (f"  {name:4s} {what}  peak RSS {result['max_rss_mb']:,.0f} MB  "
          f"others {result.get('others_cpus', float('nan')):.2f} CPUs")


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--steps", type=int, default=200)
  parser.add_argument("--warmup", type=int, default=20)
  parser.add_argument("--workloads", default="peer26,dlrm,startup")
  parser.add_argument("--startup-features", default="260")
  args = parser.parse_args(argv)
  _, jobs, _, _, _ = e2e_bench.plan([
      "--workloads", args.workloads, "--rounds", "1", "--steps",
      str(args.steps), "--warmup", str(args.warmup), "--startup-features",
      args.startup_features])
  print(f"framework_bench: TF 2.15 TPUEstimator on tensorflow-estimator "
        f"('tfe') and on the library's framework ('own'), TF's own as the "
        f"reference; {args.rounds} alternating rounds; load average "
        + " ".join(f"{x:.2f}" for x in os.getloadavg()),
        flush=True)
  values = {}
  for label, job, _ in jobs:
    print(f"\n[{label}]", flush=True)
    values[label] = {name: [] for name, _, _ in SIDES}
    for r in range(args.rounds):
      order = SIDES if r % 2 == 0 else SIDES[::-1]
      for name, side, framework in order:
        result = run_side(job, side, framework, 300)
        values[label][name].append(_value(job, result))
        print(f"  round {r + 1}" + _line(name, job, result), flush=True)
  _summary(jobs, values)
  return 0


def _summary(jobs, values):
  print("\nSummary (medians over rounds). Throughput ratios are examples/s "
        "over examples/s; startup ratios are seconds over seconds (lower is "
        "faster).")
  for label, job, _ in jobs:
    median = {name: statistics.median(v) for name, v in values[label].items()}
    unit = "s to first step" if job["workload"] == "startup" else "ex/s"
    print(f"  {label}: tfe {median['tfe']:,.2f}, own {median['own']:,.2f}, "
          f"TF {median['TF']:,.2f} {unit}; own/tfe "
          f"{median['own'] / median['tfe']:.3f}, tfe/TF "
          f"{median['tfe'] / median['TF']:.2f}, own/TF "
          f"{median['own'] / median['TF']:.2f}")


if __name__ == "__main__":
  sys.exit(main())
