"""The programs of the cluster tests: one TPUEstimator model trained by
`train_and_evaluate`, whatever the task (TF_CONFIG says which).

    python -m tests.cluster_programs --model {counter,ctr} --model-dir D \
        --steps N --batch B [--mode sync|async] [--step-timeout S] \
        [--out result.json] [--pipelining] [--cross-shard] [--evaluate]

* ps tasks: `train_and_evaluate` starts their server and joins (never
  returns); the chief and the workers train to `--steps` (max_steps); an
  evaluator evaluates each new checkpoint (2 batches) until the last.
* `--single`: the same model in one process without TF_CONFIG
  (`est.train(input_fn, max_steps=N)`), reading the same global batches in
  the same order; `--init-from CKPT_PREFIX` first copies a checkpoint into
  the model dir. This is the reference a cluster of W training tasks of
  batch B/W each is compared with (`--batch` is then the global batch).
* The chief (and a single run) writes `--out`: a JSON object with the final
  global step and every checkpoint variable's values (`read_result`,
  `table_rows`).

The data is generated: global example k has features computed from k alone
(`counter_ids`, `ctr_features`). Global batch s is examples [s*G, (s+1)*G),
G = batch * number of training tasks; input_fn invocation t of
`params['context'].current_input_fn_deployment()` (index 0 of 1 without a
context) reads its slice [s*G + t*batch, s*G + (t+1)*batch). The first
global batch read is the global step of the model dir's latest checkpoint
when input_fn is called (0 without one; `--input-from-zero`: always 0), so
that a run restored from a checkpoint of step c reads batches c, c+1, ...

Lines for the harness to poll (stdout, flushed): `PROGRAM ...` at start,
`PLACEMENT <variable> <device>` once the graph is built, `STEP <task>
global_step=<n>` after every training step, `HOLD`/`RELEASED` around a
`--hold-at-step` pause, `DONE <task> checkpoint_step=<n> ...` at the end
(the step of the model dir's latest checkpoint then).
"""
import argparse
import json
import os
import re
import shutil
import sys
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from estimator_spec import quiet  # pylint: disable=g-import-not-at-top

quiet.silence_deprecation_notices()

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

import estimator_spec as es  # pylint: disable=g-import-not-at-top
import tpu_embedding_columns as tec  # pylint: disable=g-import-not-at-top

fc = tf.feature_column
ModeKeys = es.estimator.ModeKeys

# Evaluation reads examples from here on (never trained on; k * k still
# fits in int64).
EVAL_OFFSET = 1 << 30
# The global steps of an input pipeline: effectively forever.
FOREVER = 1 << 50

COUNTER_VOCAB = 16
CTR_VOCAB_A = 40
CTR_VOCAB_SHARED = 24
CTR_DIM = 4


def say(*parts):
  """One line for the harness, stamped with the wall clock."""
  now = time.time()
  stamp = (time.strftime("%H:%M:%S", time.localtime(now)) +
           f".{int(now * 1000) % 1000:03d}")
  print(*parts, f"at={stamp}", flush=True)


# --- the data: global example k -> features ---------------------------------
# Each formula is written once for NumPy and TF alike (`xp` is np or the
# TF ops below), so that tests can recompute what any run has read.


def counter_ids(k, xp=np):
  """[n, 2] ids of examples k: k*k % 16 (one of 0, 1, 4, 9: every task hits
  the same few rows) and (3k + k // 4) % 16."""
  k = xp.reshape(k, [-1, 1])
  return xp.concatenate([(k * k) % COUNTER_VOCAB,
                         (3 * k + k // 4) % COUNTER_VOCAB], 1)


def ctr_features(k, xp=np):
  """{'a': [n, 2] ids < 40, 'b': [n, 1] and 'c': [n, 3] ids < 24, 'label':
  [n, 1] float}. The label depends on a's first id (learnable)."""
  k = xp.reshape(k, [-1, 1])
  a = (k * 7 + xp.reshape(xp.arange(2), [1, -1]) * 11) % CTR_VOCAB_A
  b = (k * 5 + 3) % CTR_VOCAB_SHARED
  c = (k * 3 + xp.reshape(xp.arange(3), [1, -1]) * 5) % CTR_VOCAB_SHARED
  label = xp.not_equal(xp.less((k * 7) % CTR_VOCAB_A, 18),
                       xp.equal(k % 5, 0))
  return {"a": a, "b": b, "c": c, "label": label}


class TFOps:
  """The few NumPy names the formulas use, on int64 tensors."""

  @staticmethod
  def reshape(x, shape):
    return tf.reshape(x, shape)

  @staticmethod
  def arange(n):
    return tf.range(n, dtype=tf.int64)

  @staticmethod
  def concatenate(values, axis):
    return tf.concat(values, axis)

  less = staticmethod(tf.less)
  equal = staticmethod(tf.equal)
  not_equal = staticmethod(tf.not_equal)


def examples_of_step(step, index, num_tasks, batch):
  """The global example numbers task `index` of `num_tasks` reads at global
  step `step` (NumPy)."""
  first = step * batch * num_tasks + index * batch
  return np.arange(first, first + batch, dtype=np.int64)


def expected_counter_table(first_step, last_step, global_batch, start=None):
  """The counter table after global steps [first_step, last_step) of
  `global_batch` examples each, from `start` (zeros by default): +1 per
  lookup of an id."""
  table = (np.zeros([COUNTER_VOCAB, 1], np.float64) if start is None
           else np.array(start, np.float64).reshape(COUNTER_VOCAB, 1))
  k = np.arange(first_step * global_batch, last_step * global_batch,
                dtype=np.int64)
  np.add.at(table[:, 0], counter_ids(k).reshape(-1), 1.0)
  return table


def _sparse(ids):
  """A SparseTensor of every entry of the [batch, n] int64 `ids` (id 0
  included, which tf.sparse.from_dense would drop)."""
  positions = tf.where(tf.ones_like(ids, dtype=tf.bool))
  return tf.SparseTensor(positions, tf.reshape(ids, [-1]),
                         tf.shape(ids, out_type=tf.int64))


def _batch_tensors(model, k):
  """(features, labels) of the examples `k` ([batch] int64)."""
  if model == "counter":
    ids = counter_ids(k, TFOps)
    labels = tf.zeros([tf.shape(k)[0], 1], tf.float32)
    return {"id": _sparse(ids)}, labels
  values = ctr_features(k, TFOps)
  labels = tf.cast(values.pop("label"), tf.float32)
  return {name: _sparse(ids) for name, ids in values.items()}, labels


def _deployment(params):
  """(index, number) of this input_fn invocation among all of the global
  batch's readers: the context's, else 0 of 1."""
  context = params.get("context")
  if context is None:
    return 0, 1
  _, index, num, _ = context.current_input_fn_deployment()
  return int(index), int(num)


def _checkpoint_step(model_dir):
  path = tf.train.latest_checkpoint(model_dir)
  if path is None:
    return 0
  return int(tf.train.load_variable(path, "global_step"))


def train_input_fn_for(model, model_dir, from_zero=False):

  def input_fn(params):
    batch = int(params["batch_size"])
    index, num = _deployment(params)
    global_batch = batch * num
    first_step = 0 if from_zero else _checkpoint_step(model_dir)
    say(f"INPUT train batch={batch} slice={index}/{num} "
        f"global_batch={global_batch} first_step={first_step}")

    def at_step(step):
      k = step * global_batch + index * batch + tf.range(batch,
                                                         dtype=tf.int64)
      return _batch_tensors(model, k)

    return tf.data.Dataset.range(first_step, FOREVER).map(at_step)

  return input_fn


def eval_input_fn_for(model):

  def input_fn(params):
    batch = int(params["batch_size"])
    index, num = _deployment(params)

    def at_step(step):
      k = (EVAL_OFFSET + step * batch * num + index * batch +
           tf.range(batch, dtype=tf.int64))
      return _batch_tensors(model, k)

    return tf.data.Dataset.range(0, FOREVER).map(at_step)

  return input_fn


# --- the models ---------------------------------------------------------------


def _row_initializer(scale, salt):
  """Row r, column j: scale * sin(1.3 r + 0.7 j + salt), whatever the
  partitioning (partition_info's offset is the first row of a `div`
  partition), so that every run and layout starts from the same table."""

  def initializer(shape, dtype=tf.float32, partition_info=None):
    start = partition_info.var_offset[0] if partition_info is not None else 0
    rows = tf.range(start, start + shape[0], dtype=tf.float32)[:, None]
    cols = tf.range(shape[1], dtype=tf.float32)[None, :]
    return tf.cast(scale * tf.sin(1.3 * rows + 0.7 * cols + salt), dtype)

  return initializer


def counter_model(args):
  """One [16, 1] table of zeros, SGD with learning rate 1 and loss
  -sum(activations): each lookup of an id adds exactly 1 to its row."""
  column = tec.embedding_column(
      fc.categorical_column_with_identity("id", COUNTER_VOCAB), 1,
      combiner="sum", initializer=tf.compat.v1.zeros_initializer())
  spec = es.EmbeddingConfigSpec(
      feature_columns=[column],
      optimization_parameters=es.StochasticGradientDescentParameters(
          learning_rate=1.0),
      pipeline_execution_with_tensor_core=args.pipelining)

  def model_fn(features, labels, mode, params):
    del labels, params
    activations = tf.compat.v1.feature_column.input_layer(features, [column])
    loss = -tf.reduce_sum(activations)
    train_op = None
    if mode == ModeKeys.TRAIN:
      train_op = _optimizer(tf.compat.v1.train.GradientDescentOptimizer(0.0),
                            args).minimize(
                                loss,
                                global_step=tf.compat.v1.train.get_global_step())
    return es.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)

  return model_fn, spec


def ctr_model(args):
  """Tables 'a' (40 x 4) and 'bc' (24 x 4, shared by features b and c),
  Adagrad 0.1; a dense 8-relu-1 layer with seeded initializers; mean squared
  error of sigmoid(logit) against the label; Adagrad 0.05 for the dense
  layer; eval metrics loss, auc and mean prediction."""
  a = tec.embedding_column(
      fc.categorical_column_with_identity("a", args.vocab_a or CTR_VOCAB_A),
      CTR_DIM,
      combiner="mean", initializer=_row_initializer(0.1, 0.0))
  b, c = tec.shared_embedding_columns(
      [fc.categorical_column_with_identity("b", CTR_VOCAB_SHARED),
       fc.categorical_column_with_identity("c", CTR_VOCAB_SHARED)],
      CTR_DIM, combiner="sqrtn", initializer=_row_initializer(0.1, 0.5),
      shared_embedding_collection_name="bc")
  spec = es.EmbeddingConfigSpec(
      feature_columns=[a, b, c],
      optimization_parameters=es.AdagradParameters(0.1),
      pipeline_execution_with_tensor_core=args.pipelining,
      profile_data_directory=args.profile_dir)

  def model_fn(features, labels, mode, params):
    del params
    net = tf.compat.v1.feature_column.input_layer(features, [a, b, c])
    net = tf.compat.v1.layers.dense(
        net, 8, activation=tf.nn.relu, name="hidden",
        kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=1),
        bias_initializer=tf.compat.v1.zeros_initializer())
    logits = tf.compat.v1.layers.dense(
        net, 1, name="logit",
        kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=2),
        bias_initializer=tf.compat.v1.zeros_initializer())
    probability = tf.sigmoid(logits)
    predictions = {"probability": probability}
    if mode == ModeKeys.PREDICT:
      return es.TPUEstimatorSpec(mode, predictions=predictions)
    loss = tf.compat.v1.losses.mean_squared_error(labels, probability)
    train_op = eval_metrics = None
    if mode == ModeKeys.TRAIN:
      dense = (tf.compat.v1.train.AdamOptimizer(0.01) if args.adam else
               tf.compat.v1.train.AdagradOptimizer(0.05))
      train_op = _optimizer(dense, args).minimize(
                                loss,
                                global_step=tf.compat.v1.train.get_global_step())
    else:
      eval_metrics = (_ctr_metrics, [labels, probability])
    return es.TPUEstimatorSpec(mode, loss=loss, train_op=train_op,
                               eval_metrics=eval_metrics,
                               predictions=predictions)

  return model_fn, spec


def _ctr_metrics(labels, probability):
  return {
      "auc": tf.compat.v1.metrics.auc(labels, probability),
      "mean": tf.compat.v1.metrics.mean(probability),
  }


def _optimizer(optimizer, args):
  if args.cross_shard:
    return tf.compat.v1.tpu.CrossShardOptimizer(optimizer)
  return optimizer


MODELS = {"counter": counter_model, "ctr": ctr_model}


# --- hooks: progress lines, pacing, a pause -------------------------------------


class ProgressHook(tf.compat.v1.train.SessionRunHook):
  """Prints PLACEMENT lines once and `STEP <task> global_step=<n>` after
  every step; optionally sleeps `delay` seconds after each step, and at the
  first step with global step >= `hold_at` waits (polling) for `hold_file`
  to exist, at most `hold_timeout` seconds."""

  def __init__(self, task, delay=0.0, hold_at=None, hold_file=None,
               hold_timeout=120.0):
    self._task = task
    self._delay = delay
    self._hold_at = hold_at
    self._hold_file = hold_file
    self._hold_timeout = hold_timeout
    self.last_step = None

  def begin(self):
    self._step = tf.compat.v1.train.get_global_step()
    for variable in tf.compat.v1.global_variables():
      say(f"PLACEMENT {variable.op.name} {variable.device or '(local)'}")

  def after_run(self, run_context, run_values):
    # Read after the step (in asynchronous training other tasks' steps
    # count too).
    step = int(run_context.session.run(self._step))
    self.last_step = step
    say(f"STEP {self._task} global_step={step}")
    if self._delay:
      time.sleep(self._delay)
    if self._hold_at is not None and step >= self._hold_at:
      self._hold_at = None
      self._hold()

  def _hold(self):
    say(f"HOLD {self._task} waiting for {self._hold_file}")
    deadline = time.monotonic() + self._hold_timeout
    while not os.path.exists(self._hold_file):
      if time.monotonic() > deadline:
        raise RuntimeError(f"{self._task}: {self._hold_file} did not appear "
                           f"within {self._hold_timeout} s")
      time.sleep(0.05)
    say(f"RELEASED {self._task}")


# --- results ---------------------------------------------------------------------


def _jsonable(value):
  value = np.asarray(value)
  if value.dtype.kind in "SO":
    return np.vectorize(
        lambda v: v.decode("utf-8", "replace") if isinstance(v, bytes)
        else str(v), otypes=[object])(value).tolist()
  return value.tolist()


def checkpoint_values(checkpoint):
  """{name: value as nested lists (strings decoded)} of every variable of a
  checkpoint."""
  return {
      name: _jsonable(tf.train.load_variable(checkpoint, name))
      for name, _ in tf.train.list_variables(checkpoint)
  }


def write_result(path, model_dir, extra):
  checkpoint = tf.train.latest_checkpoint(model_dir)
  variables = checkpoint_values(checkpoint)
  result = dict(extra)
  result.update({
      "checkpoint": checkpoint,
      "global_step": int(variables["global_step"]),
      "variables": variables,
  })
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  partial = path + ".partial"
  with open(partial, "w") as f:
    json.dump(result, f)
  os.replace(partial, path)  # Readers never see half a file.
  return result


def read_result(path):
  with open(path) as f:
    return json.load(f)


def table_rows(variables, table):
  """The rows of table `table` as an array, from {checkpoint name: value}:
  the variable named `.../<table>` or `.../<table>/embedding_weights`, or
  its partitions `<that name>/part_<i>` concatenated in partition order.
  Slot variables (`<that name>/<slot>...`) are left out."""
  ends = (table, table + "/embedding_weights")
  whole = sorted(n for n in variables if n.endswith(ends))
  if whole:
    return np.array(variables[whole[0]])
  parts = {}
  for name in variables:
    match = re.match(r"^(.*)/part_(\d+)$", name)
    if match and match.group(1).endswith(ends):
      parts.setdefault(match.group(1), {})[int(match.group(2))] = name
  if not parts:
    raise KeyError(f"no table {table!r} in {sorted(variables)}")
  if len(parts) > 1:
    raise KeyError(f"{table!r} names several tables: {sorted(parts)}")
  (names,) = parts.values()
  return np.concatenate([np.array(variables[names[i]])
                         for i in sorted(names)])


# --- main -------------------------------------------------------------------------


def _task_name():
  config = json.loads(os.environ.get("TF_CONFIG") or "{}")
  task = config.get("task") or {}
  if not task:
    return "single"
  return f"{task.get('type')}:{task.get('index', 0)}"


def copy_checkpoint(prefix, model_dir):
  """Copies the checkpoint files of `prefix` into model_dir and points its
  `checkpoint` state file at them."""
  os.makedirs(model_dir, exist_ok=True)
  directory, base = os.path.split(prefix)
  copied = 0
  for name in os.listdir(directory or "."):
    if name.startswith(base + "."):
      shutil.copy(os.path.join(directory, name), os.path.join(model_dir, name))
      copied += 1
  if not copied:
    raise FileNotFoundError(f"no checkpoint files {prefix}.*")
  tf.compat.v1.train.update_checkpoint_state(
      model_dir, os.path.join(model_dir, base))


def start_watchdog():
  """When started by the harness (CLUSTER_HARNESS_PARENT = its pid): exits
  this process once the harness is gone (a test run killed from outside
  leaves no ps task joining forever) or after CLUSTER_HARNESS_MAX_SECONDS."""
  parent = os.environ.get("CLUSTER_HARNESS_PARENT")
  if not parent:
    return
  parent = int(parent)
  deadline = time.monotonic() + float(
      os.environ.get("CLUSTER_HARNESS_MAX_SECONDS", "900"))

  def watch():
    while True:
      try:
        os.kill(parent, 0)
        alive = os.getppid() == parent
      except ProcessLookupError:
        alive = False
      if not alive or time.monotonic() > deadline:
        say(f"WATCHDOG exiting: {'harness gone' if not alive else 'too long'}")
        os._exit(3)
      time.sleep(1.0)

  threading.Thread(target=watch, name="harness-watchdog", daemon=True).start()


def cluster_training_kwargs(args):
  """The library's cluster-mode argument, when it has one and --mode asks."""
  if args.mode is None or not hasattr(es, "ClusterTraining"):
    return {}
  kwargs = {"asynchronous": args.mode == "async"}
  if args.step_timeout is not None:
    kwargs["step_timeout_secs"] = args.step_timeout
  if args.report_after is not None:
    kwargs["report_after_secs"] = args.report_after
  return {"cluster_training": es.ClusterTraining(**kwargs)}


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--model", choices=sorted(MODELS), required=True)
  parser.add_argument("--model-dir", required=True)
  parser.add_argument("--steps", type=int, required=True,
                      help="max_steps (global step to reach)")
  parser.add_argument("--batch", type=int, required=True,
                      help="train_batch_size (and eval_batch_size)")
  parser.add_argument("--mode", choices=["sync", "async"], default=None,
                      help="ClusterTraining(asynchronous=...) when the "
                      "library has it; default: no cluster_training argument")
  parser.add_argument("--step-timeout", type=float, default=None)
  parser.add_argument("--report-after", type=float, default=None)
  parser.add_argument("--out", default=None,
                      help="result JSON, written by the chief / --single run")
  parser.add_argument("--pipelining", action="store_true")
  parser.add_argument("--vocab-a", type=int, default=None,
                      help="ctr: rows of table 'a' (the data uses the first "
                      f"{CTR_VOCAB_A})")
  parser.add_argument("--adam", action="store_true",
                      help="ctr: Adam (non-slot beta powers) for the dense "
                      "model instead of Adagrad")
  parser.add_argument("--cross-shard", action="store_true",
                      help="wrap the dense optimizer in CrossShardOptimizer")
  parser.add_argument("--evaluate", action="store_true",
                      help="--single: evaluate after training (the metrics "
                      "go into --out)")
  parser.add_argument("--single", action="store_true",
                      help="one process, no TF_CONFIG: est.train only")
  parser.add_argument("--init-from", default=None,
                      help="--single: checkpoint prefix to start from")
  parser.add_argument("--input-from-zero", action="store_true",
                      help="read from global batch 0 even when restored")
  parser.add_argument("--save-steps", type=int, default=5,
                      help="save_checkpoints_steps")
  parser.add_argument("--step-delay", type=float, default=0.0,
                      help="seconds to sleep after each training step")
  parser.add_argument("--hold-at-step", type=int, default=None)
  parser.add_argument("--profile-dir", default=None,
                      help="profile_data_directory of the ctr model's spec")
  parser.add_argument("--sampling-rate", type=float, default=None,
                      help="profile_sampling_rate (with --profile-dir)")
  parser.add_argument("--hold-file", default=None)
  parser.add_argument("--hold-timeout", type=float, default=120.0)
  args = parser.parse_args(argv)
  if (args.hold_at_step is None) != (args.hold_file is None):
    parser.error("--hold-at-step and --hold-file go together")
  if args.init_from and not args.single:
    parser.error("--init-from is for --single runs")
  return args


def _peak_rss_mb():
  with open("/proc/self/status") as status:
    for line in status:
      if line.startswith("VmHWM:"):
        return int(line.split()[1]) / 1024
  return None


def main(argv=None):
  args = parse_args(argv)
  start_watchdog()
  tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO)
  if args.single:
    os.environ.pop("TF_CONFIG", None)
  task = _task_name()
  extra = cluster_training_kwargs(args)
  say(f"PROGRAM task={task} pid={os.getpid()} model={args.model} "
      f"steps={args.steps} batch={args.batch} mode={args.mode} "
      f"cluster_training={'yes' if extra else 'no'} "
      f"library_has_ClusterTraining={hasattr(es, 'ClusterTraining')}")
  if args.init_from:
    copy_checkpoint(args.init_from, args.model_dir)

  model_fn, spec = MODELS[args.model](args)
  config = es.RunConfig(
      model_dir=args.model_dir,
      save_checkpoints_steps=args.save_steps,
      keep_checkpoint_max=1000,
      log_step_count_steps=1000,
      experimental_max_worker_delay_secs=0)
  estimator = es.TPUEstimator(
      model_fn=model_fn, config=config, use_tpu=False,
      train_batch_size=args.batch, eval_batch_size=args.batch,
      embedding_config_spec=spec, profile_sampling_rate=args.sampling_rate,
      **extra)
  progress = ProgressHook(task, delay=args.step_delay,
                          hold_at=args.hold_at_step, hold_file=args.hold_file,
                          hold_timeout=args.hold_timeout)
  train_input_fn = train_input_fn_for(args.model, args.model_dir,
                                      args.input_from_zero)
  start = time.time()
  metrics = None
  if args.single:
    estimator.train(train_input_fn, max_steps=args.steps, hooks=[progress])
    if args.evaluate:
      metrics = estimator.evaluate(eval_input_fn_for(args.model), steps=2)
  else:
    es.estimator.train_and_evaluate(
        estimator,
        es.estimator.TrainSpec(train_input_fn, max_steps=args.steps,
                                         hooks=[progress]),
        es.estimator.EvalSpec(eval_input_fn_for(args.model),
                                        steps=2, throttle_secs=1,
                                        start_delay_secs=0))
  seconds = time.time() - start
  final = _checkpoint_step(args.model_dir)
  say(f"DONE {task} checkpoint_step={final} last_step_seen="
      f"{progress.last_step} seconds={seconds:.1f}")
  if args.out and task in ("single", "chief:0"):
    write_result(args.out, args.model_dir, {
        "task": task, "model": args.model, "steps": args.steps,
        "batch": args.batch, "mode": args.mode,
        "cluster_training": bool(extra), "train_seconds": seconds,
        "peak_rss_mb": _peak_rss_mb(),
        "metrics": ({k: float(v) for k, v in metrics.items()}
                    if metrics else None),
    })
    say(f"WROTE {args.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
