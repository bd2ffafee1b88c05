"""The demo's yardsticks and pictures (examples/train_ctr.py). What it
shows while training (progress lines, per-table summaries) is the
library's own (docs/estimator.md, 'Monitoring').

* `EvaluationListener` evaluates each checkpoint as training saves it, so
  one `train` call (one graph) serves every evaluation point.
* `loss_curve`: the mean losses the progress lines printed, read back from
  the training events.
* `auc`, `log_loss` and `NumericBaseline`: numpy yardsticks for the
  evaluation (the hidden click model's own AUC, and a logistic regression on
  the numeric features).
* `plot_training_curve`: the PNG for people without TensorBoard.
"""
import os

import numpy as np
import tensorflow as tf

MEAN_LOSS_TAG = "loss/mean"  # written by the library's progress hook


class EvaluationListener(tf.compat.v1.train.CheckpointSaverListener):
  """Calls `evaluate()` after each checkpoint that training saves past
  `start_step` (the checkpoint a session saves when it starts holds no new
  training), once per step."""

  def __init__(self, evaluate, start_step):
    self._evaluate = evaluate
    self._done = start_step

  def after_save(self, session, global_step_value):
    del session
    if global_step_value <= self._done:
      return
    self._done = global_step_value
    self._evaluate()


def loss_curve(model_dir):
  """[(step, mean loss)] of the progress lines of the runs in `model_dir`
  (the `loss/mean` scalars of its training events), by step."""
  points = {}
  for name in sorted(os.listdir(model_dir)):
    if not name.startswith("events.out.tfevents."):
      continue
    for event in tf.compat.v1.train.summary_iterator(
        os.path.join(model_dir, name)):
      for value in event.summary.value:
        if value.tag == MEAN_LOSS_TAG and value.HasField("simple_value"):
          points[event.step] = value.simple_value
  return sorted(points.items())


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
