"""The embedding step against its floor: the host engine's lookup, backward
and Adagrad update of one table, next to a bare compiled loop doing the
same work on the same ids (issue 52: the engine within 1.3x of the floor).

The work, per step, is scale_bench's table and batches: one table of V rows
x 32, combiner 'sum', Adagrad (lr 0.05, initial accumulator 0.1), a batch
of 2,048 examples x 8 ids drawn by `scale_bench.zipf_ids` (exponent 1.05;
the same batches as scale_bench's first steps), and a fixed [2,048, 32]
gradient of the activations (no dense model).

* floor: bench/floor_loop.cc, compiled here at run time (`$CXX`, else
  g++, `FLAGS`, into a temporary directory): one thread, per step
  the distinct ids (a hash set sized for the batch) and each example's sum
  of its 8 rows in one pass, each distinct id's gradient sum, Adagrad on
  each distinct id's row; the table and accumulator on huge pages, written
  before timing. The engine runs a table's step as one op after another
  (lookup, gradient sums, row update), each on one thread, so one thread is
  the floor of what it does.
* engine: `HostEmbeddingEngine` as the estimator builds it (an
  `EmbeddingConfig` of the spec, its compiled kernels required:
  `HOST_EMBEDDING_KERNELS=1`, docs/install.md), in a TF graph run by
  a session with the estimator's default session config: the ids come as
  SparseTensors from a prefetching tf.data pipeline, the train op is the
  lookup (its activations computed) and `apply_gradients` of the fixed
  gradient. Besides its time, two figures say what the time is made of
  (neither is part of it): the median of as many session steps that only
  take the input's ids (the session's own cost a step), and the time of
  each op type over `--trace` more steps run with TF's full trace.

Each side runs in its own child process, sides alternating (floor, engine,
floor, ... with `--rounds`); a side's time is the median ms of its steps
after `--warmup`, the median over rounds; each child reports its peak RSS
and the CPUs it kept busy while timed. Idle check: the CPUs other work kept
busy during each run (bench/peers/compare.py's `run_measured`); above 0.2
the summary says the numbers are not an idle machine's.

Usage: .venv/bin/python -m bench.floor_bench [--rows 1M 8M 32M]
           [--rounds 1] [--steps 50] [--warmup 10]
"""
import argparse
import collections
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from bench import scale_bench
from bench.peers import compare

SIDES = ("floor", "engine")
SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                      "floor_loop.cc")
DIMENSION = scale_bench.DIMENSION
BATCH = scale_bench.BATCH
IDS_PER_EXAMPLE = scale_bench.IDS_PER_EXAMPLE
LEARNING_RATE = 0.05
INITIAL_ACCUMULATOR = 0.1
FEATURE = "ids"
MARK = compare.MARK
# -fno-math-errno: sqrt need not set errno, so the Adagrad loop vectorizes
# (the engine's kernels are built with it too).
FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-std=c++17")


class FloorError(RuntimeError):
  """The floor could not be compiled."""


def compile_floor(directory):
  """Compiles bench/floor_loop.cc into `directory`; the program's path."""
  compiler = os.environ.get("CXX") or "g++"
  if shutil.which(compiler) is None:
    raise FloorError(
        f"no C++ compiler: {compiler!r} is not on PATH (set $CXX); the "
        "floor is compiled at run time")
  binary = os.path.join(directory, "floor_loop")
  done = subprocess.run(
      [compiler] + list(FLAGS) + [SOURCE, "-o", binary],
      capture_output=True, text=True, check=False)
  if done.returncode:
    raise FloorError(f"{compiler} could not compile {SOURCE}:\n"
                     + done.stderr[-3000:])
  return binary


def make_batches(rows, count, seed=0):
  """([count, BATCH, 8] int64 ids, the fixed [BATCH, 32] float32 gradient):
  with seed 0, the ids of scale_bench's first `count` steps."""
  ids = scale_bench.zipf_ids(np.random.RandomState(seed), rows,
                             (count, BATCH, IDS_PER_EXAMPLE))
  grad = np.random.RandomState(seed + 1).normal(
      0.0, 0.01, (BATCH, DIMENSION)).astype(np.float32)
  return ids, grad


def write_batches(directory, ids, grad):
  """(ids file, gradient file) in `directory`, raw little-endian arrays."""
  paths = (os.path.join(directory, "ids.bin"),
           os.path.join(directory, "grad.bin"))
  ids.astype("<i8").tofile(paths[0])
  grad.astype("<f4").tofile(paths[1])
  return paths


def floor_command(binary, paths, rows, warmup, steps, init="-", dump=None):
  """The floor program's command line (bench/floor_loop.cc's usage)."""
  command = [binary, paths[0], paths[1], str(rows), str(BATCH),
             str(IDS_PER_EXAMPLE), str(DIMENSION), repr(LEARNING_RATE),
             repr(INITIAL_ACCUMULATOR), str(warmup), str(steps)]
  if init != "-" or dump is not None:
    command.append(init)
  if dump is not None:
    command.append(dump)
  return command


# --- the engine ----------------------------------------------------------------


class EngineStep:
  """The engine's training step of one table of `rows` rows on the batches
  `ids` ([n, BATCH, 8], cycled) with the fixed gradient `grad`, in its own
  graph: `train_op` runs one step; `table` and `accumulator` are the
  variables it trains; `input_op` takes a step's ids and does nothing
  else."""

  def __init__(self, rows, ids, grad):
    import tensorflow as tf
    import estimator_spec
    from estimator_spec.cluster import session
    from estimator_spec.engine import HostEmbeddingEngine
    import tpu_embedding_columns
    self.graph = tf.Graph()
    self.session_config = session.default_session_config()
    with self.graph.as_default():
      column = tpu_embedding_columns.embedding_column(
          tf.feature_column.categorical_column_with_identity(FEATURE, rows),
          dimension=DIMENSION, combiner="sum")
      spec = estimator_spec.EmbeddingConfigSpec(
          feature_columns=[column],
          optimization_parameters=estimator_spec.AdagradParameters(
              learning_rate=LEARNING_RATE,
              initial_accumulator=INITIAL_ACCUMULATOR))
      engine = HostEmbeddingEngine(
          estimator_spec.EmbeddingConfig(spec, batch_size=BATCH))
      step = tf.compat.v1.train.get_or_create_global_step().read_value()
      features = _sparse_batches(tf, ids)
      # A step of the session with the input alone: its own cost.
      self.input_op = tf.group(features.values)
      result = engine.lookup({FEATURE: features})
      update = engine.apply_gradients(result, {FEATURE: tf.constant(grad)},
                                      step)
      self.train_op = tf.group(update, result.activations[FEATURE])
      (name,) = engine.model.tables
      self.table = engine.table_partitions(name)[0]
      (slot,) = engine.slot_rows(name).values()
      self.accumulator = slot.partitions[0]
      self.init = tf.compat.v1.global_variables_initializer()

  def session(self):
    import tensorflow as tf
    sess = tf.compat.v1.Session(graph=self.graph, config=self.session_config)
    sess.run(self.init)
    return sess


def _sparse_batches(tf, ids):
  """The batches `ids` ([n, BATCH, 8]) as one SparseTensor a step, as
  parsing gives them: each step's ids come from a prefetching tf.data
  iterator; their indices (every example holds 8 ids) are a constant."""
  values = tf.compat.v1.data.make_one_shot_iterator(
      tf.data.Dataset.from_tensor_slices(ids.reshape(len(ids), -1))
      .repeat().prefetch(2)).get_next()
  rows, columns = np.meshgrid(np.arange(BATCH), np.arange(IDS_PER_EXAMPLE),
                              indexing="ij")
  indices = np.stack([rows.ravel(), columns.ravel()], axis=1)
  return tf.SparseTensor(tf.constant(indices, tf.int64), values,
                         [BATCH, IDS_PER_EXAMPLE])


def _time_steps(sess, op, warmup, steps):
  """(median ms per step of `steps` steps after `warmup`, the CPUs this
  process kept busy during them)."""
  for _ in range(warmup):
    sess.run(op)
  times = []
  cpu, wall = time.process_time(), time.perf_counter()
  for _ in range(steps):
    start = time.perf_counter()
    sess.run(op)
    times.append(time.perf_counter() - start)
  cpus = (time.process_time() - cpu) / (time.perf_counter() - wall)
  return float(np.median(times)) * 1e3, cpus


def op_times(sess, step, steps):
  """{op type: microseconds per step}, summed over the ops of `steps`
  steps run with TF's full trace (each op's own compute time)."""
  import tensorflow as tf
  options = tf.compat.v1.RunOptions(
      trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
  totals = collections.Counter()
  for _ in range(steps):
    metadata = tf.compat.v1.RunMetadata()
    sess.run(step.train_op, options=options, run_metadata=metadata)
    for device in metadata.step_stats.dev_stats:
      for node in device.node_stats:
        name = node.node_name.split(":")[0]
        try:
          kind = step.graph.get_operation_by_name(name).type
        except KeyError:
          kind = name
        totals[kind] += node.op_end_rel_micros - node.op_start_rel_micros
  return {k: v / steps for k, v in totals.most_common()}


def engine_child(args):
  """The engine's side of one size: its result dict."""
  os.environ["HOST_EMBEDDING_KERNELS"] = "1"
  from estimator_spec import quiet
  quiet.silence_deprecation_notices()
  ids = np.fromfile(args.ids, "<i8").reshape(-1, BATCH, IDS_PER_EXAMPLE)
  grad = np.fromfile(args.grad, "<f4").reshape(BATCH, DIMENSION)
  step = EngineStep(args.rows, ids, grad)
  with step.session() as sess:
    step_ms, cpus = _time_steps(sess, step.train_op, args.warmup, args.steps)
    input_ms, _ = _time_steps(sess, step.input_op, args.warmup, args.steps)
    ops = op_times(sess, step, args.trace)
  return {"step_ms": step_ms, "cpus": cpus, "input_ms": input_ms,
          "op_us": ops,
          "peak_rss_mb": resource.getrusage(
              resource.RUSAGE_SELF).ru_maxrss / 1024.0}


# --- the parent ------------------------------------------------------------------


def run_size(args, binary, rows, workdir):
  """{side: [result per round]} for one table size, sides alternating."""
  ids, grad = make_batches(rows, args.warmup + args.steps)
  paths = write_batches(workdir, ids, grad)
  commands = {
      "floor": floor_command(binary, paths, rows, args.warmup, args.steps),
      "engine": [sys.executable, "-m", "bench.floor_bench", "--child",
                 "--rows", str(rows), "--ids", paths[0], "--grad", paths[1],
                 "--steps", str(args.steps), "--warmup", str(args.warmup),
                 "--trace", str(args.trace)],
  }
  results = {side: [] for side in SIDES}
  for _ in range(args.rounds):
    for side in SIDES:
      try:
        result = compare.run_measured(commands[side], args.timeout)
      except compare.SideFailed as error:
        result = {"failed": str(error).splitlines()[-1][:300]}
      results[side].append(result)
      shown = {k: v for k, v in result.items() if k != "op_us"}
      print(f"  {scale_bench.rows_label(rows)} {side}: {json.dumps(shown)}",
            flush=True)
  return results


def _median(runs, key):
  """The median of `key` over the rounds `runs`; None if one has none."""
  if not runs or any(key not in r for r in runs):
    return None
  return float(np.median([r[key] for r in runs]))


def print_table(all_results):
  print("\n| rows | floor (ms) | engine (ms) | engine / floor | floor peak "
        "RSS (GB) | engine peak RSS (GB) |")
  print("| --- | --- | --- | --- | --- | --- |")
  for rows, results in all_results.items():
    floor = _median(results["floor"], "step_ms")
    engine = _median(results["engine"], "step_ms")
    cells = [f"{v:.3f}" if v is not None else "failed"
             for v in (floor, engine)]
    ratio = f"{engine / floor:.2f}" if floor and engine else "-"
    rss = [_median(results[s], "peak_rss_mb") for s in SIDES]
    rss_cells = [f"{v / 1024:.2f}" if v is not None else "-" for v in rss]
    print(f"| {scale_bench.rows_label(rows)} | {cells[0]} | {cells[1]} | "
          f"{ratio} | {rss_cells[0]} | {rss_cells[1]} |")
  _print_details(all_results)


def _print_details(all_results):
  print("\nWhat the times are made of (first round unless said): the floor's "
        "phases in ms, forward (distinct ids and activations) / backward "
        "(gradient sums) / update; the engine's CPUs while timed, a session "
        "step of its input alone (ms), its time less that (medians over "
        "rounds), and its ops' own time per step (us, traced steps):")
  busy = 0.0
  for rows, results in all_results.items():
    for line in _detail_lines(scale_bench.rows_label(rows), results):
      print("  " + line)
    for run in results["floor"] + results["engine"]:
      busy = max(busy, run.get("others_cpus") or 0.0)
  print(f"\nIdle check: other work kept at most {busy:.2f} CPUs busy during "
        "a run" + (" -- NOT an idle machine." if busy > compare.BUSY else "."))


def _detail_lines(label, results):
  floor, engine = results["floor"][0], results["engine"][0]
  lines = []
  if "phases_ms" in floor:
    p = floor["phases_ms"]
    lines.append(f"{label:>5} floor: {p['forward']:.3f} / {p['backward']:.3f}"
                 f" / {p['update']:.3f}; {floor['distinct_ids']:.0f} distinct"
                 " ids a step")
  if "op_us" not in engine:
    return lines
  floor_ms = _median(results["floor"], "step_ms")
  less = _median(results["engine"], "step_ms") - _median(results["engine"],
                                                         "input_ms")
  against = f", {less / floor_ms:.2f} x the floor" if floor_ms else ""
  lines.append(f"{label:>5} engine: {engine['cpus']:.2f} CPUs; the input "
               f"alone {engine['input_ms']:.3f}; less that {less:.3f}"
               + against)
  ops = engine["op_us"]
  lines.append(f"{label:>5} engine's ops, {sum(ops.values()):.0f} us in all: "
               + ", ".join(f"{k} {v:.0f}" for k, v in list(ops.items())[:8]))
  return lines


def parse(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rows", nargs="+", default=["1M", "8M", "32M"])
  parser.add_argument("--rounds", type=int, default=1)
  parser.add_argument("--steps", type=int, default=50)
  parser.add_argument("--warmup", type=int, default=10)
  parser.add_argument("--trace", type=int, default=5,
                      help="traced engine steps for its ops' times")
  parser.add_argument("--timeout", type=float, default=1800.0)
  parser.add_argument("--workdir", default=None)
  parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
  parser.add_argument("--ids", help=argparse.SUPPRESS)
  parser.add_argument("--grad", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  for name in ("rounds", "steps"):
    if getattr(args, name) < 1:
      parser.error(f"--{name} must be >= 1; got {getattr(args, name)}")
  if args.warmup < 0 or args.trace < 0:
    parser.error("--warmup and --trace must be >= 0")
  return args


def main(argv=None):
  args = parse(argv)
  if args.child:
    args.rows = scale_bench.parse_rows(args.rows[0])
    print(MARK + json.dumps(engine_child(args)), flush=True)
    return 0
  sizes = [scale_bench.parse_rows(r) for r in args.rows]
  workdir = tempfile.mkdtemp(prefix="floor_bench_", dir=args.workdir)
  try:
    binary = compile_floor(workdir)
    all_results = {}
    for rows in sizes:
      print(f"{scale_bench.rows_label(rows)} rows x {DIMENSION}:", flush=True)
      all_results[rows] = run_size(args, binary, rows, workdir)
    print_table(all_results)
  finally:
    shutil.rmtree(workdir, ignore_errors=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
