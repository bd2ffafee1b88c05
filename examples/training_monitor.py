"""What the demo shows while it trains (examples/train_ctr.py).

* `ProgressHook` prints the loss averaged over the last `window` steps
  (one batch's loss is noisy) with the examples per second, and writes
  `global_step/sec`, `examples/sec` and `loss/moving_average` to the
  training events for TensorBoard.
* `with_table_summaries` wraps a model_fn: in training it adds, per
  embedding table, summaries of its learning rate at the step, the share of
  its rows that training has touched so far and the mean L2 norm of those
  rows (`estimator_spec.estimator.step_tables` gives the step's ids and the
  table's rows).
* `EvaluationListener` evaluates each checkpoint as training saves it, so
  one `train` call (one graph) serves every evaluation point.
* `auc`, `log_loss` and `NumericBaseline`: numpy yardsticks for the
  evaluation (the hidden click model's own AUC, and a logistic regression on
  the numeric features).
* `plot_training_curve`: the PNG for people without TensorBoard.
"""
import collections
import time

import numpy as np
import tensorflow as tf

from estimator_spec import estimator as estimator_lib

MOVING_AVERAGE_TAG = "loss/moving_average"
STEPS_PER_SEC_TAG = "global_step/sec"
EXAMPLES_PER_SEC_TAG = "examples/sec"
LEARNING_RATE_PREFIX = "learning_rate/"
ROWS_TOUCHED_PREFIX = "rows_touched/"
EMBEDDING_NORM_PREFIX = "embedding_norm/"
TOUCHED_SCOPE = "demo_monitor/rows_touched"


class ProgressHook(tf.compat.v1.train.SessionRunHook):
  """Every `every` steps: prints the step, the mean loss of the last
  `window` steps and the examples per second since the last report, and
  writes them (with global_step/sec) to `model_dir`'s training events.

  One hook can serve several `train` calls (chunks): the loss window and
  `curve` (the (step, moving average) points printed so far) carry over.
  """

  def __init__(self, batch_size, every, model_dir, window=100):
    if every < 1 or window < 1:
      raise ValueError(f"ProgressHook: every ({every}) and window ({window}) "
                       "must be >= 1.")
    self._batch_size = batch_size
    self._every = every
    self._model_dir = model_dir
    self.window = window
    self._losses = collections.deque(maxlen=window)
    self.curve = []
    self._last = None

  def begin(self):
    self._loss = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.LOSSES)[0]
    self._step = tf.compat.v1.train.get_global_step()
    self._writer = tf.compat.v1.summary.FileWriterCache.get(self._model_dir)
    self._last = None

  def before_run(self, run_context):
    return tf.compat.v1.train.SessionRunArgs((self._step, self._loss))

  def after_run(self, run_context, run_values):
    step, loss = run_values.results
    step += 1  # the global step after this run's update
    now = time.time()
    self._losses.append(float(loss))
    if self._last is None:
      # The first step of a session includes its start-up: rates count from
      # its end.
      self._last = (step, now)
      return
    if step % self._every:
      return
    steps = step - self._last[0]
    steps_per_sec = steps / max(now - self._last[1], 1e-9)
    average = float(np.mean(self._losses))
    self.curve.append((step, average))
    print(f"  step {step:5d}  loss (mean of last {len(self._losses)} steps) "
          f"{average:.4f}  {steps_per_sec * self._batch_size:8.0f} "
          "examples/s", flush=True)
    self._writer.add_summary(tf.compat.v1.Summary(value=[
        tf.compat.v1.Summary.Value(tag=MOVING_AVERAGE_TAG,
                                   simple_value=average),
        tf.compat.v1.Summary.Value(tag=STEPS_PER_SEC_TAG,
                                   simple_value=steps_per_sec),
        tf.compat.v1.Summary.Value(
            tag=EXAMPLES_PER_SEC_TAG,
            simple_value=steps_per_sec * self._batch_size),
    ]), step)
    self._last = (step, now)

  def end(self, session):
    self._writer.flush()

  def exclude(self, seconds):
    """Leaves `seconds` (a pause such as an evaluation, which is no
    training time) out of the current rate."""
    if self._last is not None:
      self._last = (self._last[0], self._last[1] + seconds)


class EvaluationListener(tf.compat.v1.train.CheckpointSaverListener):
  """Calls `evaluate()` after each checkpoint that training saves past
  `start_step` (the checkpoint a session saves when it starts holds no new
  training), once per step, leaving its time out of `progress`'s rate."""

  def __init__(self, evaluate, start_step, progress=None):
    self._evaluate = evaluate
    self._done = start_step
    self._progress = progress

  def after_save(self, session, global_step_value):
    del session
    if global_step_value <= self._done:
      return
    self._done = global_step_value
    started = time.time()
    self._evaluate()
    if self._progress is not None:
      self._progress.exclude(time.time() - started)


def with_table_summaries(model_fn, model):
  """`model_fn` whose training graph also summarizes each table of
  `model` (an `EmbeddingModel`: `spec.model`):

  * `learning_rate/<table>`: the table's learning rate at the step (its
    `learning_rate_fn` or its optimizer's constant).
  * `rows_touched/<table>`: the share of the table's rows that some
    training step has looked up (and so updated) so far. A boolean
    variable per table (`demo_monitor/rows_touched/<table>`, saved in the
    checkpoints, so a resumed run counts on) is set at the step's ids.
  * `embedding_norm/<table>`: the mean L2 norm of those touched rows (0
    before any).

  Summaries are written with the estimator's others (every
  `save_summary_steps`).
  """

  def wrapped(features, labels, mode, params):
    spec = model_fn(features, labels, mode, params)
    if mode != tf.estimator.ModeKeys.TRAIN:
      return spec
    step = tf.compat.v1.train.get_global_step()
    updates = []
    for name, table in estimator_lib.step_tables().items():
      with tf.compat.v1.variable_scope(TOUCHED_SCOPE, reuse=False):
        touched = tf.compat.v1.get_variable(
            name, shape=[table.vocabulary_size], dtype=tf.bool,
            initializer=tf.compat.v1.zeros_initializer(), trainable=False,
            use_resource=True)
      update = touched.scatter_update(tf.IndexedSlices(
          tf.ones_like(table.ids, dtype=tf.bool), table.ids)).op
      updates.append(update)
      # Setting a row again is harmless, so the summary can read the mask
      # after this step's update whether or not it runs with the train op.
      with tf.control_dependencies([update]):
        mask = tf.cast(touched.read_value(), tf.float32)
      count = tf.reduce_sum(mask)
      norms = tf.norm(table.read_rows(), axis=1)
      rate = model.learning_rate(name)
      value = (tf.cast(rate.fn(step), tf.float32) if rate.fn is not None
               else tf.constant(rate.constant, tf.float32))
      tf.compat.v1.summary.scalar(LEARNING_RATE_PREFIX + name, value)
      tf.compat.v1.summary.scalar(ROWS_TOUCHED_PREFIX + name,
                                  count / table.vocabulary_size)
      tf.compat.v1.summary.scalar(
          EMBEDDING_NORM_PREFIX + name,
          tf.reduce_sum(norms * mask) / tf.maximum(count, 1.0))
    return spec._replace(train_op=tf.group(spec.train_op, *updates))

  return wrapped


def auc(labels, scores):
  """Area under the ROC curve of `scores` for binary `labels` (ties count
  one half): the probability that a random positive outranks a random
  negative (Mann-Whitney U over the scores' average ranks)."""
  labels = np.asarray(labels).reshape(-1) > 0.5
  scores = np.asarray(scores, dtype=np.float64).reshape(-1)
  positives = int(labels.sum())
  negatives = len(labels) - positives
  if positives == 0 or negatives == 0:
    raise ValueError("auc: needs both positive and negative labels.")
  _, inverse, counts = np.unique(scores, return_inverse=True,
                                 return_counts=True)
  # Average 1-based rank of each distinct score.
  ends = np.cumsum(counts)
  average_rank = ends - (counts - 1) / 2.0
  rank_sum = average_rank[inverse][labels].sum()
  return float((rank_sum - positives * (positives + 1) / 2.0) /
               (positives * negatives))


def log_loss(labels, probabilities, eps=1e-7):
  """Mean binary cross-entropy of `probabilities` for `labels`."""
  labels = np.asarray(labels, dtype=np.float64).reshape(-1)
  p = np.clip(np.asarray(probabilities, np.float64).reshape(-1), eps, 1 - eps)
  return float(-np.mean(labels * np.log(p) + (1 - labels) * np.log(1 - p)))


class NumericBaseline:
  """Logistic regression on the numeric features `num_*` alone (Newton's
  method, a small L2 penalty): what a model that ignores every id reaches."""

  def __init__(self, features, labels, iterations=20, l2=1e-4):
    x = self._design(features)
    y = np.asarray(labels, np.float64).reshape(-1)
    weights = np.zeros(x.shape[1])
    for _ in range(iterations):
      p = 1 / (1 + np.exp(-x @ weights))
      gradient = x.T @ (p - y) / len(y) + l2 * weights
      hessian = (x.T * (p * (1 - p))) @ x / len(y) + l2 * np.eye(len(weights))
      weights -= np.linalg.solve(hessian, gradient)
    self.weights = weights

  @staticmethod
  def _design(features):
    names = sorted((k for k in features if k.startswith("num_")),
                   key=lambda k: int(k.split("_")[1]))
    if not names:
      raise ValueError("NumericBaseline: no num_* features.")
    columns = [np.asarray(features[k], np.float64).reshape(-1) for k in names]
    return np.stack(columns + [np.ones_like(columns[0])], axis=1)

  def predict(self, features):
    return 1 / (1 + np.exp(-self._design(features) @ self.weights))


def plot_training_curve(path, curve, evaluations, ceiling, baseline,
                        window):
  """Writes a PNG: the loss moving average over the steps (`curve`:
  [(step, loss)]) and the evaluation AUC at each evaluation
  (`evaluations`: [(step, auc)]) with the hidden model's AUC (`ceiling`)
  and the baseline's as horizontal lines."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot  # pylint: disable=g-import-not-at-top
  figure, (top, bottom) = pyplot.subplots(2, 1, figsize=(7, 6), sharex=True)
  if curve:
    steps, losses = zip(*curve)
    top.plot(steps, losses, color="tab:blue")
  top.set_ylabel(f"training loss\n(mean of last {window} steps)")
  top.grid(alpha=0.3)
  if evaluations:
    steps, aucs = zip(*evaluations)
    bottom.plot(steps, aucs, "o-", color="tab:green", label="model")
  bottom.axhline(ceiling, color="tab:red", linestyle="--",
                 label=f"hidden click model (ceiling) {ceiling:.3f}")
  bottom.axhline(baseline, color="tab:gray", linestyle=":",
                 label=f"numeric-feature baseline {baseline:.3f}")
  bottom.set_xlabel("step")
  bottom.set_ylabel("evaluation AUC")
  bottom.legend(loc="lower right", fontsize="small")
  bottom.grid(alpha=0.3)
  figure.suptitle("DLRM-style CTR demo")
  figure.tight_layout()
  figure.savefig(path, dpi=100)
  pyplot.close(figure)
  return path
