"""The TorchRec peer benchmark: this library, TF 2.15 and TorchRec train the
same workload on CPU, side by side (`make bench-peers`).

Workload `peer26` (bench/peers/workload.py, the numpy data every side
generates with the same code and seed): 26 features, each its own table of
100,000 x 16, 1-3 Zipf ids per example (mean 2), combiner sum, embeddings
concatenated (416) -> 256 relu -> 128 relu -> 1, sigmoid cross-entropy,
batch 1024, Adagrad (lr 0.05, initial accumulator 0.1) on the tables and on
the dense variables, fp32, pre-batched data cycled.

Sides, each in its own interpreter (a subprocess, in its own process
group, killed past `--timeout`):

* `ours`: estimator_spec.TPUEstimator + tpu_embedding_columns, the spec's
  Adagrad on the host embedding engine (bench/peers/estimator_side.py, with
  the project's Python: `--project-python`, default this interpreter);
* `tf`: TF 2.15's TPUEstimator(use_tpu=False), whose CPU path skips the
  embedding optimizer: the model's Adagrad updates the tables' touched rows
  as graph variables (same script and Python);
* `torchrec`: an EmbeddingBagCollection in DistributedModelParallel on one
  rank with FBGEMM's fused EXACT_ADAGRAD, made TPU Adagrad (eps 0,
  accumulators from 0.1) (bench/peers/torchrec_side.py, with .venv-peers'
  Python: `--peers-python`; `make venv-peers` builds it);
* `torchrec-rowwise`: the same with FBGEMM's EXACT_ROWWISE_ADAGRAD,
  TorchRec's fastest CPU Adagrad, which is another optimizer: one
  accumulator per row (+= the mean of g * g over the row's 16 elements)
  instead of one per element. The same-work check allows exactly that
  difference for it and says so;
* `ours-fed`, `torchrec-fed`: the fed twins, for the embedding's cost: the
  same dense model, dense optimizer and loss as `ours` (e2e_bench's
  `peer26-fed`) and as the TorchRec sides (the MLP in
  DistributedDataParallel), trained on workload.fed_activations in place
  of the concatenated embeddings: no table, no lookup, no update, and no
  gradient for the activations. They have no tables to describe; each run
  reports its MLP's parameter count, which must be the workload's.

First the same-work check: every side with tables describes the work as
it built it (tables, ids looked up and unique rows touched per batch for
the first batches as fed, MLP parameters, the optimizers of tables and
dense variables); each must equal what workload.py defines, or the script
stops before timing. Then `--rounds` rounds, each running every side once
in turn (in the order of `--sides`); a run's rate is the examples of its
steps after `--warmup` over their wall time; a side's rate is the median
over rounds. Ratios: ours / torchrec, ours / torchrec-rowwise, ours / tf.
The embedding's cost of a side: its time per step (the batch over its
rate) less its fed twin's, over the twin's (ours against ours-fed, both
TorchRec sides against torchrec-fed). Each run also says how busy the
machine was with other work meanwhile (Linux: CPU time of the whole
machine, from /proc/stat, less the side's own, over the run's wall time):
numbers from a busy machine are not comparable, and the summary says so.

Usage: python -m bench.peers.compare [--rounds 3] [--steps 300] [--warmup 30]
"""
import argparse
import json
import os
import pathlib
import resource
import signal
import statistics
import subprocess
import sys
import time

from bench.peers import workload as peer

REPO = pathlib.Path(__file__).resolve().parents[2]
SIDES = ("ours", "tf", "torchrec", "torchrec-rowwise", "ours-fed",
         "torchrec-fed")
# The fed twin of each side with tables, for the embedding's cost.
TWINS = {"ours": "ours-fed", "torchrec": "torchrec-fed",
         "torchrec-rowwise": "torchrec-fed"}
# What a side is allowed to do differently, as the facts it reports instead.
ALLOWED = {"torchrec-rowwise": {"table_optimizer": "rowwise adagrad"}}
MARK = "PEER_RESULT "
BUSY = 0.2  # CPUs of other work above which a run was not on an idle machine


class SideFailed(RuntimeError):
  pass


def run_side(command, timeout):
  """Runs one side's command from the checkout; its PEER_RESULT dict.

  The command runs in its own session; past `timeout` seconds its whole
  process group is killed (children included)."""
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  env["PYTHONPATH"] = os.pathsep.join(
      [str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                     if p])
  process = subprocess.Popen(command, cwd=REPO, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, start_new_session=True)
  try:
    out, err = process.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:
    os.killpg(process.pid, signal.SIGKILL)
    process.communicate()
    raise SideFailed(f"{' '.join(command)}: stopped after {timeout:.0f} s")
  finally:
    try:  # whatever the side left behind in its group
      os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
  lines = [l for l in out.splitlines() if l.startswith(MARK)]
  if process.returncode != 0 or not lines:
    tail = "\n".join((err or out).strip().splitlines()[-15:])
    raise SideFailed(f"{' '.join(command)}: exit code {process.returncode}"
                     f"\n{tail}")
  return json.loads(lines[-1][len(MARK):])


def machine_busy_s():
  """CPU seconds the whole machine has been busy (Linux), else None."""
  try:
    with open("/proc/stat", encoding="ascii") as stat:
      fields = [int(x) for x in stat.readline().split()[1:]]
  except (OSError, ValueError):
    return None
  idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle, iowait
  return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def children_cpu_s():
  usage = resource.getrusage(resource.RUSAGE_CHILDREN)
  return usage.ru_utime + usage.ru_stime


def run_measured(command, timeout):
  """run_side, and `others_cpus`: the CPUs other work kept busy on average
  while it ran (the machine's busy time less the side's own), or None."""
  busy, own, start = machine_busy_s(), children_cpu_s(), time.monotonic()
  result = run_side(command, timeout)
  after = machine_busy_s()
  if busy is not None and after is not None:
    others = (after - busy) - (children_cpu_s() - own)
    result["others_cpus"] = max(0.0, others / (time.monotonic() - start))
  return result


def is_twin(side):
  return side.endswith("-fed")


def side_command(side, args, describe=False):
  if describe and is_twin(side):
    raise ValueError(f"{side} is a fed twin: it has no tables to describe")
  base = side[:-len("-fed")] if is_twin(side) else side
  if base.startswith("torchrec"):
    command = [args.peers_python, "-m", "bench.peers.torchrec_side",
               "--threads", str(args.threads)]
    if not is_twin(side):
      command += ["--table-optimizer",
                  "rowwise" if base == "torchrec-rowwise" else "exact"]
  else:
    command = [args.project_python, "-m", "bench.peers.estimator_side",
               "--side", base]
  if describe:
    return command + ["--describe"]
  if is_twin(side):
    command.append("--fed")
  return command + ["--steps", str(args.steps), "--warmup", str(args.warmup)]


def check_twin(side, result, expected):
  """Raises SideFailed unless a fed twin's run trained the workload's MLP."""
  if is_twin(side) and result.get("mlp") != expected["mlp"]:
    raise SideFailed(
        f"{side}: its MLP has {result.get('mlp')} parameters; the "
        f"workload's has {expected['mlp']}")


def embedding_costs(rate, batch=peer.BATCH):
  """[(side, ms per step, twin, twin's ms per step)] for each side with
  tables whose twin ran too; a step's time is the batch over the rate."""
  return [(side, 1e3 * batch / rate[side], TWINS[side],
           1e3 * batch / rate[TWINS[side]])
          for side in rate if side in TWINS and TWINS[side] in rate]


def same_work(descriptions, expected):
  """Lines of the check; raises SideFailed when a side's work differs from
  the workload's."""
  lines = [f"  workload: {peer.summary(expected)}"]
  failures = []
  for side, work in descriptions.items():
    allowed = ALLOWED.get(side, {})
    found = peer.differences(work, dict(expected, **allowed),
                             names=(side, "workload"))
    verdict = "same" if not found else "DIFFERENT"
    if allowed and not found:
      verdict += " but " + ", ".join(f"{k.replace('_', ' ')} {v}"
                                     for k, v in allowed.items())
    lines.append(f"  {side:16s} {verdict}: "
                 f"tables by {work.get('table_optimizer_detail')}; dense "
                 f"{work.get('dense_optimizer_detail')}")
    for key in ("update_check", "sharding", "version"):
      if key in work:
        lines.append(f"  {'':16s} {key.replace('_', ' ')}: {work[key]}")
    failures += [f"{side}: {line}" for line in found]
  if failures:
    raise SideFailed("the sides do not do the same work:\n  " +
                     "\n  ".join(failures))
  return lines


def _load():
  return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--steps", type=int, default=300,
                      help="timed steps per run (after the warm-up)")
  parser.add_argument("--warmup", type=int, default=30,
                      help="discarded steps per run")
  parser.add_argument("--threads", type=int, default=os.cpu_count(),
                      help="torch.set_num_threads of the TorchRec side "
                      "(TF's sides use TF's default: all CPUs)")
  parser.add_argument("--project-python", default=sys.executable,
                      help="Python of the project's environment (TF 2.15) "
                      "for ours and tf")
  parser.add_argument("--peers-python",
                      default=str(REPO / ".venv-peers" / "bin" / "python"),
                      help="Python of .venv-peers (torchrec) for torchrec")
  parser.add_argument("--sides", default=",".join(SIDES),
                      help="comma-separated, from the default")
  parser.add_argument("--timeout", type=float, default=900.0,
                      help="seconds before a side's run is killed")
  args = parser.parse_args()
  sides = [s for s in args.sides.split(",") if s]
  unknown = sorted(set(sides) - set(SIDES))
  if unknown:
    parser.error(f"--sides: unknown {unknown}; choose from {','.join(SIDES)}")
  if (any(s.startswith("torchrec") for s in sides) and
      not os.path.exists(args.peers_python)):
    parser.error(f"{args.peers_python} does not exist: `make venv-peers` "
                 "builds .venv-peers")

  print(f"bench-peers: {os.cpu_count()} CPUs, {_load()}; {args.rounds} "
        f"round(s) of {args.warmup} warm-up + {args.steps} timed steps per "
        "side", flush=True)
  begin = time.perf_counter()
  try:
    print("\nSame work (every side describes what it built and feeds):",
          flush=True)
    data, _ = peer.make_data()
    expected = peer.expected_work(data)
    descriptions = {s: run_side(side_command(s, args, describe=True),
                                args.timeout) for s in sides
                    if not is_twin(s)}
    print("\n".join(same_work(descriptions, expected)), flush=True)
    twins = [s for s in sides if is_twin(s)]
    if twins:
      print(f"  {', '.join(twins)}: fed twins, checked to train the "
            f"workload's MLP ({expected['mlp']:,} parameters) in every run",
            flush=True)

    print("\nThroughput (examples/s of the steps after the warm-up):",
          flush=True)
    results = {s: [] for s in sides}
    for r in range(args.rounds):
      for side in sides:
        result = run_measured(side_command(side, args), args.timeout)
        check_twin(side, result, expected)
        results[side].append(result)
        others = result.get("others_cpus")
        print(f"  round {r + 1} {side:16s} {result['examples_per_s']:9,.0f} "
              f"examples/s  median step {result['median_step_ms']:6.1f} ms  "
              f"peak RSS {result['max_rss_mb']:,.0f} MB  other work "
              f"{'?' if others is None else f'{others:.2f}'} CPUs",
              flush=True)
  except SideFailed as error:
    print(f"\nbench-peers: {error}", file=sys.stderr)
    return 1

  rate = {s: statistics.median(r["examples_per_s"] for r in results[s])
          for s in sides}
  print(f"\nSummary (median over {args.rounds} round(s)):")
  for side in sides:
    last = results[side][-1]
    print(f"  {side:16s} {rate[side]:9,.0f} examples/s  threads: "
          f"{last['threads']}; {last['version']}")
  for other in ("torchrec", "torchrec-rowwise", "tf"):
    if "ours" in sides and other in sides:
      print(f"  ours / {other:16s} {rate['ours'] / rate[other]:5.2f}x")
  costs = embedding_costs(rate)
  if costs:
    print("  Embedding cost (time per step less the fed twin's, over the "
          "twin's):")
    for side, full, twin, fed in costs:
      print(f"    {side:16s} {full:6.2f} ms - {fed:6.2f} ms ({twin}) = "
            f"{full - fed:6.2f} ms = {100 * (full - fed) / fed:4.0f}%")
  busiest = max((r.get("others_cpus") or 0.0) for runs in results.values()
                for r in runs)
  if busiest > BUSY:
    print(f"  NOT IDLE: other work kept up to {busiest:.2f} CPUs busy during "
          "a run; these numbers are not comparable with an idle machine's")
  print(f"\n{_load()} at the end; total wall time "
        f"{time.perf_counter() - begin:.0f} s")
  return 0


if __name__ == "__main__":
  sys.exit(main())
