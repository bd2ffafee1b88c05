"""One evaluation pass: its metrics, its stopping rule, its session and the
summaries it leaves (docs/estimator.md, 'Two stacks').

`evaluate` runs the metrics' update ops once per batch, from a checkpoint
(or from initialized variables when there is none), until `steps` batches
or the end of the input, then reads every metric's value once. The values,
the mean loss under `loss` and the checkpoint's `global_step` are returned
and written as scalars to the evaluation directory's events at that global
step, with the checkpoint's path as a text summary, as Estimator writes
them (TensorBoard reads both).
"""
import math
import time

import numpy as np
import tensorflow as tf

from estimator_spec.estimator.framework import model_fn as model_fn_lib

GLOBAL_STEP_KEY = tf.compat.v1.GraphKeys.GLOBAL_STEP
CHECKPOINT_PATH_TAG = "checkpoint_path"


def metric_ops_with_loss(eval_metric_ops, loss):
  """model_fn's metrics plus the mean loss over the batches under `loss`
  (a name model_fn may not use)."""
  if model_fn_lib.LOSS_METRIC_KEY in eval_metric_ops:
    raise ValueError(
        f"eval_metric_ops: the name {model_fn_lib.LOSS_METRIC_KEY!r} is the "
        "mean loss evaluate() reports itself; give model_fn's metric "
        "another name.")
  metrics = dict(eval_metric_ops)
  metrics[model_fn_lib.LOSS_METRIC_KEY] = tf.compat.v1.metrics.mean(loss)
  return metrics


def split_metrics(metrics, global_step):
  """(one op running every update, {name: value tensor}) with the global
  step's value under `global_step`."""
  if GLOBAL_STEP_KEY in metrics:
    raise ValueError(
        f"eval_metric_ops: the name {GLOBAL_STEP_KEY!r} is the step "
        "evaluate() reports itself; give model_fn's metric another name.")
  values = {name: pair[0] for name, pair in metrics.items()}
  updates = [metrics[name][1] for name in sorted(metrics)]
  values[GLOBAL_STEP_KEY] = global_step
  return (tf.group(*updates) if updates else None), values


def eval_step_variable():
  """The graph's count of evaluated batches (a local variable in the
  `eval_step` collection, made when missing)."""
  existing = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.EVAL_STEP)
  if existing:
    return existing[0]
  return tf.compat.v1.get_variable(
      "eval_step", shape=[], dtype=tf.int64,
      initializer=tf.compat.v1.zeros_initializer(), trainable=False,
      collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES,
                   tf.compat.v1.GraphKeys.EVAL_STEP])


class StopAfterBatchesHook(tf.compat.v1.train.SessionRunHook):
  """Counts evaluated batches, logs the progress, and stops after `steps`
  batches (never when `steps` is None: the input's end stops)."""

  def __init__(self, steps, batches_done):
    self._steps = steps
    self._done = batches_done
    self._every = (1 if steps is None or steps < 20 else
                   math.floor(steps / 10.))

  def before_run(self, run_context):
    del run_context
    return tf.compat.v1.train.SessionRunArgs(self._done)

  def after_run(self, run_context, run_values):
    done = run_values.results
    if self._steps is None:
      tf.compat.v1.logging.info("Evaluation [%d]", done)
      return
    if done % self._every == 0 or done == self._steps:
      tf.compat.v1.logging.info("Evaluation [%d/%d]", done, self._steps)
    if done >= self._steps:
      run_context.request_stop()


def counting(update_op):
  """The op one evaluation batch runs: `update_op`, then the count of
  evaluated batches incremented (its new value)."""
  counter = eval_step_variable()
  with tf.control_dependencies([update_op] if update_op is not None else []):
    return tf.compat.v1.assign_add(counter, 1, use_locking=True)


def run(checkpoint_path, master, scaffold, batch_op, values, hooks,
        session_config):
  """Evaluates: `batch_op` (`counting`'s) once per batch until a hook stops
  or the input ends, then reads `values` once. Returns {name: value}."""
  final = tf.compat.v1.train.FinalOpsHook(values)
  tf.compat.v1.logging.info("Starting evaluation at %s",
                            time.strftime("%Y-%m-%dT%H:%M:%S"))
  start = time.time()
  creator = tf.compat.v1.train.ChiefSessionCreator(
      scaffold=scaffold, checkpoint_filename_with_path=checkpoint_path,
      master=master, config=session_config)
  with tf.compat.v1.train.MonitoredSession(
      session_creator=creator, hooks=list(hooks) + [final]) as session:
    while not session.should_stop():
      session.run(batch_op)
  tf.compat.v1.logging.info("Inference Time : %.5fs", time.time() - start)
  tf.compat.v1.logging.info("Finished evaluation at %s",
                            time.strftime("%Y-%m-%d-%H:%M:%S"))
  return final.final_ops_values


def _summary_value(summary, key, value):
  """Adds `value` to `summary` under `key` as Estimator writes each kind of
  metric value; False for a value no summary holds."""
  if isinstance(value, (float, np.floating)):
    summary.value.add(tag=key, simple_value=float(value))
  elif isinstance(value, (int, np.integer)) and not isinstance(value, bool):
    summary.value.add(tag=key, simple_value=int(value))
  elif isinstance(value, bytes):
    try:
      parsed = tf.compat.v1.Summary.FromString(value)
    except Exception:  # pylint: disable=broad-except
      return False
    for index, item in enumerate(parsed.value):
      item.tag = f"{key}/{index}"
    summary.value.extend(parsed.value)
  elif isinstance(value, np.ndarray):
    item = summary.value.add(tag=key, node_name=key)
    item.tensor.CopyFrom(tf.make_tensor_proto(value))
  else:
    return False
  return True


def write_results(output_dir, results, checkpoint_path):
  """Writes the metric values of `results` (at its global step) and the
  evaluated checkpoint's path to the events of `output_dir`."""
  step = int(results[GLOBAL_STEP_KEY])
  tf.compat.v1.logging.info(
      "Saving dict for global step %d: %s", step,
      ", ".join(f"{key} = {value}" for key, value in sorted(results.items())
                if not isinstance(value, bytes)))
  writer = tf.compat.v1.summary.FileWriterCache.get(output_dir)
  summary = tf.compat.v1.Summary()
  for key, value in results.items():
    if value is None or key == GLOBAL_STEP_KEY:
      continue
    if not _summary_value(summary, key, value):
      tf.compat.v1.logging.warning(
          "evaluate: the metric %r is %s, which no summary holds (a number, "
          "an array or a serialized Summary); it is returned but not "
          "written to %s.", key, type(value).__name__, output_dir)
  writer.add_summary(summary, step)
  if checkpoint_path:
    path = tf.compat.v1.Summary()
    path.value.add(tag=CHECKPOINT_PATH_TAG, tensor=tf.make_tensor_proto(
        checkpoint_path, dtype=tf.string))
    writer.add_summary(path, step)
  writer.flush()
