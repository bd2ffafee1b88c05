"""What a training run shows with no code of the user's: per-table
summaries at summary steps, progress lines at TF's default verbosity, and
nothing of either when RunConfig turns them off."""
import logging
import os
import re
import sys

import numpy as np
import pytest
import tensorflow as tf

import estimator_spec as es
import tpu_embedding_columns as tec
from estimator_spec.estimator import monitoring
from tests import test_drop_in

fc = tf.feature_column
v1 = tf.compat.v1
BATCH = 4
# One batch, every step: the distinct ids a step touches are known.
IDS_A = np.array([[1, 2], [2, 3], [1, 1], [7, 2]])  # distinct: 1 2 3 7
IDS_B = np.array([[4, 4], [5, 4], [6, 4], [4, 5]])  # distinct: 4 5 6


def _rate(step):
  # 0 from step 6 on: the last step (step value 6) leaves tbl_a as it was.
  step = tf.cast(step, tf.float32)
  return tf.where(step < 6.0, 0.2 / (1.0 + step), 0.0)


def _columns():
  a = tec.embedding_column(fc.categorical_column_with_identity("a", 10), 2,
                           combiner="sum", learning_rate_fn=_rate)
  b = tec.embedding_column(fc.categorical_column_with_identity("b", 10), 2,
                           combiner="sum")
  return [a, b]


def _input_fn(params):
  assert params["batch_size"] == BATCH
  features = {"a": tf.sparse.from_dense(tf.constant(IDS_A + 0)),
              "b": tf.sparse.from_dense(tf.constant(IDS_B + 0))}
  # Ids are never 0 here, so from_dense keeps every one.
  labels = tf.constant([[1.0], [0.0], [1.0], [0.5]])
  return tf.data.Dataset.from_tensors((features, labels)).repeat()


def _model_fn(columns):

  def model_fn(features, labels, mode, params):
    del params
    x = v1.feature_column.input_layer(features, columns)
    logits = v1.layers.dense(x, 1, name="out")
    loss = v1.losses.mean_squared_error(labels, logits)
    train_op = v1.train.GradientDescentOptimizer(0.1).minimize(
        loss, v1.train.get_global_step())
    return es.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)

  return model_fn


def _train(model_dir, steps=6, **config):
  columns = _columns()
  estimator = es.TPUEstimator(
      model_fn=_model_fn(columns),
      config=es.RunConfig(model_dir=model_dir, **config), use_tpu=False,
      train_batch_size=BATCH, embedding_config_spec=es.EmbeddingConfigSpec(
          feature_columns=columns,
          optimization_parameters=es.AdagradParameters(0.1)))
  estimator.train(_input_fn, max_steps=steps)
  return estimator


def _scalars(model_dir):
  """{tag: {step: value}} of model_dir's training events."""
  return {tag: dict(points) for tag, points in
          test_drop_in._training_scalars(model_dir).items()}


def _checkpoint_table(model_dir, step, suffix=""):
  reader = tf.train.load_checkpoint(os.path.join(model_dir,
                                                 f"model.ckpt-{step}"))
  names = [n for n in reader.get_variable_to_shape_map()
           if n.endswith("a_embedding/embedding_weights" + suffix)]
  assert len(names) == 1, sorted(reader.get_variable_to_shape_map())
  return reader.get_tensor(names[0])


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """A run at TF's default verbosity (WARN), its progress lines read from
  stderr."""
  model_dir = str(tmp_path_factory.mktemp("monitored"))
  captured = tmp_path_factory.mktemp("stderr") / "stderr.txt"
  verbosity = v1.logging.get_verbosity()
  v1.logging.set_verbosity(v1.logging.WARN)
  stderr = sys.stderr
  try:
    with open(captured, "w") as sink:
      sys.stderr = sink
      estimator = _train(model_dir, steps=7, save_summary_steps=3,
                         log_step_count_steps=2, save_checkpoints_steps=7)
  finally:
    sys.stderr = stderr
    v1.logging.set_verbosity(verbosity)
  return estimator, _scalars(model_dir), captured.read_text().splitlines()


def test_every_table_has_its_summaries_at_summary_steps(run):
  estimator, scalars, _ = run
  for table in ("tbl_a", "tbl_b"):
    for what in ("learning_rate", "rows_touched", "norm",
                 "accumulator_norm"):
      tag = monitoring.summary_tag(table, what)
      assert tag in scalars, sorted(scalars)
      # Estimator's summary steps: the first, then every 3.
      assert sorted(scalars[tag]) == [1, 4, 7], (tag, scalars[tag])
  rows = scalars[monitoring.summary_tag("tbl_a", "rows_touched")]
  assert set(rows.values()) == {4.0}
  assert set(scalars[monitoring.summary_tag(
      "tbl_b", "rows_touched")].values()) == {3.0}
  # The learning rate of the step that wrote the summary (its step value
  # before the increment): tbl_a's function, tbl_b the optimizer's.
  for step, value in scalars[monitoring.summary_tag(
      "tbl_a", "learning_rate")].items():
    expected = 0.2 / (1.0 + step - 1) if step - 1 < 6 else 0.0
    assert value == pytest.approx(expected, rel=1e-6)
  assert list(scalars[monitoring.summary_tag(
      "tbl_b", "learning_rate")].values()) == [pytest.approx(0.1)] * 3
  # The norms at the last summary step (7) are read during that step, with
  # or without its update. Its learning rate is 0, so the table is the
  # checkpoint's either way; the accumulator only grows, up to the
  # checkpoint's.
  norms = scalars[monitoring.summary_tag("tbl_a", "norm")]
  accumulators = scalars[monitoring.summary_tag("tbl_a", "accumulator_norm")]
  model_dir = estimator.model_dir
  assert norms[7] == pytest.approx(
      np.linalg.norm(_checkpoint_table(model_dir, 7)), rel=1e-5)
  final = np.linalg.norm(_checkpoint_table(model_dir, 7, "/Adagrad"))
  assert accumulators[1] < accumulators[4] < accumulators[7] <= final * (
      1 + 1e-6)
  assert norms[1] != norms[7]


def test_progress_lines_at_the_default_verbosity(run):
  _, scalars, messages = run
  lines = [m for m in messages if m.startswith("TPUEstimator: step ")]
  # log_step_count_steps=2: a line at every even step, out of max_steps; the
  # rate counts from the end of the first step, the loss is the mean since
  # the last line.
  pattern = re.compile(r"TPUEstimator: step (\d+)/7, loss (\S+) \(mean of "
                       r"(\d+) steps\), (\d+) examples/s, ETA (\S+)")
  matches = [pattern.fullmatch(line) for line in lines]
  assert all(matches), lines
  assert [int(m.group(1)) for m in matches] == [2, 4, 6]
  assert [int(m.group(3)) for m in matches] == [2, 2, 2]
  assert all(np.isfinite(float(m.group(2))) and int(m.group(4)) > 0
             for m in matches)
  assert all(re.fullmatch(r"(\d+h)?(\d+m)?\d+s|\d+h\d+m", m.group(5))
             for m in matches)
  means = scalars[monitoring.MEAN_LOSS_TAG]
  assert sorted(means) == [2, 4, 6]
  assert means[6] == pytest.approx(float(matches[-1].group(2)), rel=1e-5)
  assert monitoring.MEAN_LOSS_TAG in scalars
  assert monitoring.EXAMPLES_PER_SEC_TAG in scalars


class _Clock:
  """`time.time()` for monitoring: the given times, one per call."""

  def __init__(self, times):
    self._times = iter(times)

  def time(self):
    return next(self._times)


def _hook_lines(monkeypatch, caplog, times, first_step=0, **kwargs):
  """The progress lines of a ProgressHook (batch 4, every 2 steps, loss
  0.5) over len(times) steps from global step `first_step`, step k ending
  at times[k]."""
  monkeypatch.setattr(monitoring, "time", _Clock(times))
  with tf.Graph().as_default():
    global_step = v1.get_variable(
        "global_step", [], tf.int64, trainable=False,
        initializer=v1.constant_initializer(first_step),
        collections=[v1.GraphKeys.GLOBAL_VARIABLES,
                     v1.GraphKeys.GLOBAL_STEP])
    train_op = global_step.assign_add(1)
    hook = monitoring.ProgressHook(4, 2, loss=tf.constant(0.5), **kwargs)
    with caplog.at_level(logging.INFO, logger="tensorflow"), (
        v1.train.MonitoredSession(hooks=[hook])) as session:
      for _ in times:
        session.run(train_op)
  return [r.getMessage() for r in caplog.records
          if r.getMessage().startswith("TPUEstimator: step ")]


def test_progress_lines_show_the_last_step_an_eta_and_the_evaluations(
    monkeypatch, caplog):
  # Steps 11-16 of `steps=6` from step 10; an evaluation of 2 s ran between
  # steps 13 and 14.
  lines = _hook_lines(monkeypatch, caplog, [100, 101, 102, 105, 106, 107],
                      first_step=10, steps=6, evaluations=[(104.5, 2.0)])
  assert lines == [
      # 1 step in 1 s; 4 steps left at 1 s a step.
      "TPUEstimator: step 12/16, loss 0.5 (mean of 2 steps), 4 examples/s, "
      "ETA 4s",
      # 2 steps in 4 s, 2 s of them evaluating; 2 steps left at 5/3 s.
      "TPUEstimator: step 14/16, loss 0.5 (mean of 2 steps), 2 examples/s "
      "(an evaluation ran: 2.0 s; 4 examples/s training), ETA 3s",
      "TPUEstimator: step 16/16, loss 0.5 (mean of 2 steps), 4 examples/s, "
      "ETA 0s",
  ]


def test_progress_lines_without_a_last_step_have_no_eta(monkeypatch,
                                                        caplog):
  lines = _hook_lines(monkeypatch, caplog, [100, 101, 102, 103.5],
                      evaluations=[(102.5, 0.25), (103, 0.25)])
  assert lines == [
      "TPUEstimator: step 2, loss 0.5 (mean of 2 steps), 4 examples/s",
      "TPUEstimator: step 4, loss 0.5 (mean of 2 steps), 3 examples/s "
      "(2 evaluations ran: 0.5 s; 4 examples/s training)",
  ]


def test_at_info_verbosity_the_lines_go_to_tfs_log(tmp_path, caplog):
  with caplog.at_level(logging.INFO, logger="tensorflow"):
    _train(str(tmp_path), steps=5, log_step_count_steps=2)
  lines = [r for r in caplog.records
           if r.getMessage().startswith("TPUEstimator: step ")]
  assert lines and all(r.levelno == logging.INFO for r in lines)


def test_runconfig_turns_both_off(tmp_path, capfd, caplog):
  with caplog.at_level(logging.INFO, logger="tensorflow"):
    _train(str(tmp_path), steps=3, save_summary_steps=0,
           log_step_count_steps=None)
  assert not [r for r in caplog.records
              if r.getMessage().startswith("TPUEstimator: step ")]
  assert "TPUEstimator: step " not in capfd.readouterr().err
  scalars = _scalars(str(tmp_path))
  assert not [t for t in scalars if t.startswith("embedding/")]
