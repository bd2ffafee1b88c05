"""Training on a loopback cluster: examples/s and bytes moved per step.

A chief, W - 1 workers and 2 ps tasks on 127.0.0.1 train the same model
through `train_and_evaluate`, for W = 1, 2 and 4 training tasks:

* `sync`:  `estimator_spec.TPUEstimator` (ClusterTraining(), the default):
  global batch `--batch` split over the W tasks, one update per step.
* `async`: the same with ClusterTraining(asynchronous=True), each task
  stepping on `--batch / W` examples of its own.
* `tf`:    TF 2.15's `tf.compat.v1.estimator.tpu.TPUEstimator(use_tpu=
  False)` with TF's own TPU embedding columns, on the same cluster: TF's CPU
  path, classic asynchronous parameter-server training in which the model's
  optimizer trains the tables as ordinary variables (the embedding
  optimizer is ignored), `--batch / W` examples per task step. The
  reference each row's ratio is taken against (same W).

Model: `--tables` features (default 8), each its own table of `--vocab` x
`--dim` (100,000 x 16), 2 ids per example drawn from a skewed distribution
(u^3 * vocab), sum combiner, Adagrad 0.05 on tables (ours: the spec's;
TF: the model's) and an MLP (64, 1) trained by Adagrad.

Every training task trains in the measured window: each one, after its
second step (its first ones build and optimize its graphs), waits until all
of them have made two steps, and only then does the chief start counting.
On both sides a worker waiting for the chief's initialization looks again
every second (TF's `SessionManager` waits 30 s by default, so a worker
of TF's side would join after the few seconds a run takes, and the chief
would train alone). A run in which some task made no step between the
marks is reported as failed.

Per run the chief records, after `--warmup` steps and at the end, the time,
the global step and the loopback interface's transmitted bytes
(/proc/net/dev, `lo`: every byte between the processes of the cluster; run
the bench on an otherwise idle machine). `--warmup` and `--steps` count
steps of each task: a synchronous global step is one step of every task;
in asynchronous training (`async`, `tf`) each task step advances the
global step, so the marks are at W times those numbers and every side
trains the same examples between them. Reported:

* examples/s = examples trained between the two marks / seconds (sync: the
  global batch per global step; otherwise a task step's batch per global
  step, as each task step advances the global step once);
* task steps: the fewest and the most steps a training task made between
  the marks (in a synchronous run each task makes every step);
* bytes per global step, measured, against the lower bound: per task step,
  the distinct rows of each table its batch touches x dim x 4 bytes, there
  and back (rows looked up, row gradients sent), plus the dense model's
  variables there and back (dense bytes) — summed over the W task steps of
  a synchronous step.
* ps peak MB: each ps task's peak RSS (VmHWM) when the training tasks
  are done: the tables' and slots' partitions it holds, TF's runtime
  (about 0.4 GB) and what the steps added (`--vocab` scales the tables);
* cpu us/ex: the CPU time (user + system, /proc) of every process of
  the cluster between the two marks, per example: the work an example
  costs, less sensitive than examples/s to other load on the machine;
* requests per step: the tensors that cross between tasks in the step's
  graph (one RecvTensor request each; `tests/cluster_graph.py` builds the
  chief's and a worker's graph of the same model, tables and ps tasks
  without running it): a training task to the ps tasks / back / between
  ps tasks, per task step (sync: per global step, all tasks).

Usage: .venv/bin/python -m bench.cluster_bench [--tasks 1 2 4]
       [--steps 120] [--warmup 20] [--sides sync async tf]
       [--trace FILE [--trace-steps 5]]   (then: summary --trace FILE.side_W)

`--trace FILE`: the chief traces `--trace-steps` steps after the warmup
(RunOptions FULL_TRACE: every task's ops) into FILE.<side>_<tasks>;
`summary --trace` prints the median step and the busiest ops per task.
"""
import argparse
import json
import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # pylint: disable=g-import-not-at-top

HIDDEN = 64


def _lo_bytes():
  with open("/proc/net/dev") as f:
    for line in f:
      name, _, rest = line.partition(":")
      if name.strip() == "lo":
        return int(rest.split()[8])  # transmitted bytes
  return 0


def _cluster_cpu_seconds(model_dir):
  """CPU seconds (user + system) used so far by every process of the run
  (each task's command line names `model_dir`), read from /proc."""
  ticks = os.sysconf("SC_CLK_TCK")
  total = 0
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{pid}/cmdline", "rb") as f:
        if model_dir.encode() not in f.read():
          continue
      with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
      continue
    total += int(fields[11]) + int(fields[12])  # utime, stime
  return total / ticks


def _ids(step, task, tasks, batch, args, xp):
  """[batch, tables * 2] ids of task `task`'s share of global step `step`
  (the same formula in NumPy and TF)."""
  if xp is np:
    rng = np.random.RandomState(step * 1009 + task)
    u = rng.uniform(size=(batch, args.tables * 2))
    return np.floor(u ** 3 * args.vocab).astype(np.int64)
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  u = tf.random.stateless_uniform(
      [batch, args.tables * 2],
      seed=tf.stack([tf.cast(step, tf.int64), tf.cast(task, tf.int64)]))
  return tf.cast(tf.floor(u ** 3 * args.vocab), tf.int64)


# --- the program each task runs ---------------------------------------------


def task_main(args):
  from tests import cluster_programs  # pylint: disable=import-outside-toplevel
  cluster_programs.start_watchdog()
  from estimator_spec import quiet  # pylint: disable=import-outside-toplevel
  quiet.silence_deprecation_notices()
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  import estimator_spec as es  # pylint: disable=import-outside-toplevel
  from estimator_spec.cluster import tasks as cluster_lib
  import tpu_embedding_columns as tec  # pylint: disable=import-outside-toplevel

  tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.WARN)
  config = json.loads(os.environ["TF_CONFIG"])
  tasks = len(config["cluster"].get("chief", [])) + len(
      config["cluster"].get("worker", []))
  keys = [f"f{i}" for i in range(args.tables)]
  categorical = [
      tf.feature_column.categorical_column_with_identity(k, args.vocab)
      for k in keys
  ]
  ours = args.side != "tf"
  if ours:
    columns = [tec.embedding_column(c, args.dim, combiner="sum")
               for c in categorical]
  else:
    columns = [tf.compat.v1.tpu.experimental.embedding_column(
        c, args.dim, combiner="sum") for c in categorical]
  task_batch = args.batch // tasks

  def input_fn(params):
    context = params.get("context")
    index = context.current_input_fn_deployment()[1] if ours else (
        0 if config["task"]["type"] == "chief" else
        config["task"]["index"] + 1)
    batch = params["batch_size"]

    def make(step):
      ids = _ids(step, index, tasks, batch, args, tf)
      features = {}
      for i, k in enumerate(keys):
        features[k] = tf.sparse.from_dense(ids[:, 2 * i:2 * i + 2] + 1)
        features[k] = tf.SparseTensor(features[k].indices,
                                      features[k].values - 1,
                                      features[k].dense_shape)
      labels = tf.cast(tf.reduce_sum(ids, axis=1, keepdims=True) % 2,
                       tf.float32)
      return features, labels

    return tf.data.Dataset.range(1 << 40).map(make).prefetch(2)

  def model_fn(features, labels, mode, params):
    del params
    net = tf.compat.v1.feature_column.input_layer(features, columns)
    net = tf.compat.v1.layers.dense(net, HIDDEN, tf.nn.relu)
    logits = tf.compat.v1.layers.dense(net, 1)
    loss = tf.compat.v1.losses.sigmoid_cross_entropy(labels, logits)
    optimizer = tf.compat.v1.train.AdagradOptimizer(0.05)
    train_op = optimizer.minimize(
        loss, global_step=tf.compat.v1.train.get_global_step())
    return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(mode, loss=loss,
                                                        train_op=train_op)

  run_config = tf.compat.v1.estimator.tpu.RunConfig(
      model_dir=args.model_dir, save_checkpoints_steps=None,
      save_checkpoints_secs=None, save_summary_steps=None,
      log_step_count_steps=None, experimental_max_worker_delay_secs=0)
  if ours:
    spec = es.EmbeddingConfigSpec(
        feature_columns=columns,
        optimization_parameters=es.AdagradParameters(0.05))
    estimator = es.TPUEstimator(
        model_fn=model_fn, config=run_config, use_tpu=False,
        train_batch_size=(args.batch if args.side == "sync" else task_batch),
        embedding_config_spec=spec,
        cluster_training=es.ClusterTraining(
            asynchronous=args.side == "async"))
  else:
    optimization = tf.compat.v1.tpu.experimental.AdagradParameters(0.05)
    spec = tf.compat.v1.estimator.tpu.experimental.EmbeddingConfigSpec(
        feature_columns=columns, optimization_parameters=optimization)
    estimator = tf.compat.v1.estimator.tpu.TPUEstimator(
        model_fn=model_fn, config=run_config, use_tpu=False,
        train_batch_size=task_batch, embedding_config_spec=spec)

  is_chief = config["task"]["type"] == "chief"
  marks, traces = [], []
  window = _window(args, tasks)
  name = f"{config['task']['type']}_{config['task']['index']}"
  hook = _marks_hook(args, is_chief, marks, traces, window, tasks,
                     _Barrier(args.model_dir, name, tasks, args.timeout))

  # Both sides' workers look for the chief's initialization as often as
  # ours do on a cluster (every second; TF's Estimator waits 30 s).
  with cluster_lib.prompt_session_recovery():
    tf.compat.v1.estimator.train_and_evaluate(
        estimator,
        tf.compat.v1.estimator.TrainSpec(input_fn, max_steps=window[1],
                                         hooks=[hook]),
        tf.compat.v1.estimator.EvalSpec(input_fn, steps=1))
  with open(os.path.join(args.model_dir, f"steps_in_window.{name}"),
            "w") as f:
    f.write(str(hook.in_window))
  if is_chief and len(marks) == 2:
    with open(args.out, "w") as f:
      json.dump({"marks": marks}, f)
  if is_chief and traces:
    with open(args.trace, "w") as f:
      json.dump(traces, f)


def _window(args, tasks):
  """(first, last) global step of the measured window: `--warmup` and
  `--steps` steps of each task (W times that in asynchronous training,
  where every task step is a global step)."""
  per_task = 1 if args.side == "sync" else tasks
  return args.warmup * per_task, args.steps * per_task


class _Barrier:
  """Every training task of the run waits in `wait()` until all `tasks` of
  them have called it (a file per task in `<model_dir>/started`), for at
  most `timeout` seconds."""

  def __init__(self, model_dir, name, tasks, timeout):
    self._dir = os.path.join(model_dir, "started")
    self._name, self._tasks, self._timeout = name, tasks, timeout

  def wait(self):
    from tests.cluster_harness import poll
    os.makedirs(self._dir, exist_ok=True)
    with open(os.path.join(self._dir, self._name), "w"):
      pass
    poll(lambda: len(os.listdir(self._dir)) >= self._tasks, self._timeout,
         f"the other training tasks' first steps ({self._name})",
         lambda: f" (arrived: {os.listdir(self._dir)})", interval=0.01)


# A task's steps before the barrier: the first ones build and optimize the
# step's graphs.
_STEPS_BEFORE_BARRIER = 2


def _marks_hook(args, is_chief, marks, traces, window, tasks, barrier):
  """The hook that appends to `marks` (time, global step, loopback bytes)
  on the chief, at the `window`'s first and last global step; waits at
  `barrier` after the task's `_STEPS_BEFORE_BARRIER` steps, before which
  no mark is taken; counts the task's own steps in the window
  (`in_window`); with `--trace`, on the chief, the traces of
  `--trace-steps` steps after the first mark to `traces` (`_step_ops`)."""
  import tensorflow as tf
  margin = 0 if args.side == "sync" else 4 * tasks

  class Marks(tf.estimator.SessionRunHook):

    def begin(self):
      self._step = tf.compat.v1.train.get_global_step()
      self._tracing = False
      self._own_steps = 0
      self.in_window = 0

    def before_run(self, run_context):
      del run_context
      self._tracing = bool(args.trace and is_chief and marks and
                           len(traces) < args.trace_steps)
      # The global step rides along with the step's own run (read at its
      # start): a run of its own per step would add a round trip to ps 0
      # to every task step, which a synchronous step waits for.
      return tf.estimator.SessionRunArgs(
          fetches=self._step, options=(tf.compat.v1.RunOptions(
              trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
                                       if self._tracing else None))

    def after_run(self, run_context, run_values):
      if self._tracing:
        traces.append(_step_ops(run_values.run_metadata.step_stats))
      self._own_steps += 1
      if self._own_steps == _STEPS_BEFORE_BARRIER:
        barrier.wait()
      if self._own_steps < _STEPS_BEFORE_BARRIER:
        return
      # The step after this run: exactly one more than read at its start
      # in synchronous training; asynchronously the other tasks' steps
      # that ended meanwhile (about W - 1 of them) come on top, so near a
      # mark the chief reads it.
      step = int(run_values.results) + 1
      boundary = window[0] if not marks else window[1]
      if is_chief and len(marks) < 2 and step + margin >= boundary:
        step = run_context.session.run(self._step)
      if window[0] < step <= window[1]:
        self.in_window += 1
      if not is_chief:
        return
      if not marks and step >= window[0]:
        marks.append((time.time(), int(step), _lo_bytes(),
                      _cluster_cpu_seconds(args.model_dir)))
      if step >= window[1] and len(marks) == 1:
        marks.append((time.time(), int(step), _lo_bytes(),
                      _cluster_cpu_seconds(args.model_dir)))

  return Marks()


def _step_ops(step_stats):
  """One traced step (RunOptions FULL_TRACE on the chief, `--trace`):
  {"wall_us": first start to last end over every device of the cluster,
  "ops": [[device, op name, op type, start us, duration us]]}."""
  ops = []
  for dev in step_stats.dev_stats:
    for node in dev.node_stats:
      kind = node.timeline_label.split("(")[0].split("=")[-1].strip()
      ops.append([dev.device, node.node_name, kind, node.all_start_micros,
                  node.all_end_rel_micros])
  start = min((op[3] for op in ops), default=0)
  end = max((op[3] + op[4] for op in ops), default=0)
  for op in ops:
    op[3] -= start
  return {"wall_us": end - start, "ops": ops}


def summarize_trace(path, top=25):
  """Prints a `--trace` file: the median traced step's wall time and, per
  device, the ops taking the most time (summed over the traced steps)."""
  traces = json.load(open(path))
  walls = sorted(t["wall_us"] for t in traces)
  print(f"{len(traces)} traced steps, wall us median {walls[len(walls) // 2]}"
        f" (min {walls[0]}, max {walls[-1]})")
  totals = {}
  for trace in traces:
    for dev, name, _, _, duration in trace["ops"]:
      key = (dev.split("/device:")[0], name)
      totals[key] = totals.get(key, 0) + duration / len(traces)
  per_device = {}
  for (dev, _), duration in totals.items():
    per_device[dev] = per_device.get(dev, 0) + duration
  for dev, duration in sorted(per_device.items()):
    print(f"{dev}: {duration:.0f} us of ops per step")
  for (dev, name), duration in sorted(totals.items(),
                                      key=lambda kv: -kv[1])[:top]:
    print(f"{duration:>9.0f} {dev.split('/')[1]:>10} {name}")


# --- the driver ----------------------------------------------------------------


def lower_bound(args, tasks):
  """Bytes per global step: distinct rows there and back, dense there and
  back (averaged over a few steps of the data)."""
  task_batch = args.batch // tasks
  steps_per_global = tasks if args_side_sync(args) else 1
  rows = []
  for step in range(5):
    total = 0
    for task in range(steps_per_global):
      ids = _ids(step, task, tasks, task_batch, args, np)
      for i in range(args.tables):
        total += len(np.unique(ids[:, 2 * i:2 * i + 2]))
    rows.append(total)
  embedding = float(np.mean(rows)) * args.dim * 4 * 2
  dense_params = (args.tables * args.dim * HIDDEN + HIDDEN) + HIDDEN + 1
  dense = dense_params * 4 * 2 * steps_per_global
  return embedding, dense


def _requests(side, tasks, args):
  """(out, in, between ps) tensors crossing tasks per step (see module)."""
  # Loaded when counted. It builds graphs with TF's deprecated names, in
  # this process: their notices are kept out of the table.
  from estimator_spec import quiet
  from tests import cluster_graph
  quiet.silence_deprecation_notices()
  return cluster_graph.requests_per_step(side, tasks, args.tables)


def args_side_sync(args):
  return args.side == "sync"


def run_side(args, side, tasks, workdir):
  from tests.cluster_harness import LocalCluster  # pylint: disable=import-outside-toplevel
  out = os.path.join(workdir, f"{side}_{tasks}.json")
  model_dir = os.path.join(workdir, f"model_{side}_{tasks}")
  argv = ["task", "--side", side, "--model-dir", model_dir, "--out", out,
          "--steps", args.steps, "--warmup", args.warmup, "--batch",
          args.batch, "--tables", args.tables, "--vocab", args.vocab,
          "--dim", args.dim] + (
              ["--trace", f"{args.trace}.{side}_{tasks}",
               "--trace-steps", args.trace_steps]
              if args.trace else [])
  with LocalCluster(os.path.join(workdir, f"{side}_{tasks}"), chief=1,
                    workers=tasks - 1, ps=2, timeout=args.timeout,
                    program="bench.cluster_bench") as cluster:
    cluster.start_all(lambda task: argv)
    training = ["chief:0"] + [f"worker:{i}" for i in range(tasks - 1)]
    codes = [cluster.wait(task) for task in training]
    # The ps tasks' peak RSS, read while they still serve.
    ps_peak_mb = [cluster.memory_mb(f"ps:{i}", "VmHWM") for i in range(2)]
    if any(codes) or not os.path.exists(out):
      print(cluster.log_tails(first="chief:0"), file=sys.stderr)
      return None
  in_window = []
  for task in training:
    with open(os.path.join(model_dir, "steps_in_window." +
                           task.replace(":", "_"))) as f:
      in_window.append(int(f.read()))
  if min(in_window) == 0:
    print(f"{side} at {tasks} tasks: a task made no step between the marks "
          f"(steps per task {in_window})", file=sys.stderr)
    return None
  (t0, s0, b0, c0), (t1, s1, b1, c1) = json.load(open(out))["marks"]
  task_batch = args.batch // tasks
  per_step = args.batch if side == "sync" else task_batch
  return {"examples_per_s": (s1 - s0) * per_step / (t1 - t0),
          "bytes_per_step": (b1 - b0) / max(1, s1 - s0),
          "cpu_us_per_example": (c1 - c0) * 1e6 / ((s1 - s0) * per_step),
          "task_steps": (min(in_window), max(in_window)),
          "ps_peak_mb": ps_peak_mb}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("mode", nargs="?", default="bench",
                      choices=["bench", "task", "summary"])
  parser.add_argument("--side", default="sync")
  parser.add_argument("--sides", nargs="+", default=["sync", "async", "tf"])
  parser.add_argument("--tasks", nargs="+", type=int, default=[1, 2, 4])
  parser.add_argument("--steps", type=int, default=120)
  parser.add_argument("--warmup", type=int, default=20)
  parser.add_argument("--batch", type=int, default=512)
  parser.add_argument("--tables", type=int, default=8)
  parser.add_argument("--vocab", type=int, default=100_000)
  parser.add_argument("--dim", type=int, default=16)
  parser.add_argument("--timeout", type=float, default=600)
  parser.add_argument("--model-dir")
  parser.add_argument("--out")
  parser.add_argument("--trace", help="(one side and task count) a file "
                      "for the chief's traces of steps after the warmup")
  parser.add_argument("--trace-steps", type=int, default=5)
  args = parser.parse_args()
  if args.mode == "task":
    return task_main(args)
  if args.mode == "summary":
    return summarize_trace(args.trace)
  print(f"cluster bench: 2 ps, {args.tables} tables of {args.vocab} x "
        f"{args.dim}, global batch {args.batch}, steps {args.warmup}.."
        f"{args.steps}")
  print(f"{'tasks':>5} {'side':>6} {'examples/s':>11} {'vs tf':>6} "
        f"{'KB/step':>9} {'bound KB':>9} {'(emb+dense)':>14} {'ratio':>6} "
        f"{'requests out/in/ps-ps':>22} {'cpu us/ex':>9} "
        f"{'task steps':>10} {'ps peak MB':>12}")
  with tempfile.TemporaryDirectory() as workdir:
    for tasks in args.tasks:
      results = {}
      for side in args.sides:
        results[side] = run_side(args, side, tasks, workdir)
      for side in args.sides:
        result = results[side]
        if result is None:
          print(f"{tasks:>5} {side:>6} failed")
          continue
        args.side = side
        embedding, dense = lower_bound(args, tasks)
        bound = embedding + dense
        tf_result = results.get("tf")
        ratio = (result["examples_per_s"] / tf_result["examples_per_s"]
                 if tf_result else float("nan"))
        print(f"{tasks:>5} {side:>6} {result['examples_per_s']:>11.0f} "
              f"{ratio:>6.2f} {result['bytes_per_step'] / 1024:>9.1f} "
              f"{bound / 1024:>9.1f} "
              f"{f'{embedding / 1024:.0f}+{dense / 1024:.0f}':>14} "
              f"{result['bytes_per_step'] / bound:>6.2f} "
              f"{'/'.join(map(str, _requests(side, tasks, args))):>22} "
              f"{result['cpu_us_per_example']:>9.1f} "
              f"{'%d-%d' % result['task_steps']:>10} "
              f"{'/'.join('%.0f' % m for m in result['ps_peak_mb']):>12}",
              flush=True)


if __name__ == "__main__":
  main()
