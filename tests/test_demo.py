"""The `make demo` example: its input path, yardsticks, table summaries and
an end-to-end run of examples/train_ctr.py (disk use, output, events,
training curve, resume)."""
import argparse
import glob
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import estimator_spec
import tpu_embedding_columns
from estimator_spec.estimator import TPUEstimator
from estimator_spec.estimator import TPUEstimatorSpec
from estimator_spec.estimator import monitoring
from examples import ctr_data
from examples import dlrm
from examples import train_ctr
from examples import training_monitor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _events(directory):
  """{tag: [(step, value)]} of the scalar summaries in `directory`'s
  events files (not its subdirectories)."""
  values = {}
  for path in sorted(glob.glob(os.path.join(directory, "events.out.*"))):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        values.setdefault(value.tag, []).append(
            (event.step, value.simple_value))
  return values


# --- numpy yardsticks ---------------------------------------------------------


def test_auc_counts_every_positive_negative_pair_and_ties_as_half():
  rng = np.random.RandomState(3)
  labels = rng.randint(0, 2, size=300)
  scores = rng.randint(0, 20, size=300) / 4.0  # many ties
  pos, neg = scores[labels == 1], scores[labels == 0]
  pairs = (pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])
  assert training_monitor.auc(labels, scores) == pytest.approx(pairs.mean())
  assert training_monitor.auc([0, 1, 1], [0.1, 0.9, 0.8]) == 1.0
  assert training_monitor.auc([1, 0], [0.1, 0.9]) == 0.0
  with pytest.raises(ValueError, match="both positive and negative"):
    training_monitor.auc([1, 1], [0.2, 0.3])


def test_generate_keeps_its_examples_and_gives_the_hidden_probabilities():
  features, labels = ctr_data.generate(500, 0.01, seed=4)
  again, labels_again, probabilities = ctr_data.generate_with_probabilities(
      500, 0.01, seed=4)
  np.testing.assert_array_equal(labels, labels_again)
  for name, value in features.items():
    np.testing.assert_array_equal(value, again[name])
  assert probabilities.shape == (500,)
  assert np.all((probabilities > 0) & (probabilities < 1))
  # The labels are draws of these probabilities: the hidden model ranks them
  # well above chance, and the numeric baseline is above chance too.
  assert training_monitor.auc(labels, probabilities) > 0.7
  big_x, big_y = ctr_data.generate(20_000, 0.01, seed=5)
  baseline = training_monitor.NumericBaseline(big_x, big_y)
  test_x, test_y = ctr_data.generate(5_000, 0.01, seed=6)
  assert 0.53 < training_monitor.auc(test_y, baseline.predict(test_x)) < 0.7


# --- the generator input_fn -----------------------------------------------------


def _batches(input_fn, params, count):
  with tf.Graph().as_default():
    dataset = input_fn(params)
    next_batch = tf.compat.v1.data.make_one_shot_iterator(
        dataset).get_next()
    result = []
    with tf.compat.v1.Session() as session:
      for _ in range(count):
        try:
          result.append(session.run(next_batch))
        except tf.errors.OutOfRangeError:
          break
      graph_bytes = session.graph.as_graph_def().ByteSize()
  return result, graph_bytes


def test_generator_input_fn_keeps_the_data_out_of_the_graph():
  features, labels = ctr_data.generate(1000, 0.01, seed=0)
  features = {"user_id": features["user_id"],
              "url_domain": features["url_domain"]}
  labels = np.arange(1000, dtype=np.float32).reshape(-1, 1)  # row numbers
  input_fn = dlrm.generator_input_fn_for(features, labels, shuffle=False,
                                         repeat=False)
  batches, graph_bytes = _batches(input_fn, {"batch_size": 300}, 10)
  # Three whole batches in order, the last 100 examples dropped.
  assert [b[1][:, 0].tolist() for b in batches] == [
      list(range(i, i + 300)) for i in (0, 300, 600)]
  ids = batches[1][0]["user_id"]
  assert isinstance(ids, tf.compat.v1.SparseTensorValue)
  np.testing.assert_array_equal(ids.values, features["user_id"][300:600, 0])
  assert batches[0][0]["url_domain"][0, 0] == (  # strings stay dense
      features["url_domain"][0, 0].encode())
  # The constant-array input_fn embeds the data; the generator's graph does
  # not grow with it.
  _, constant_bytes = _batches(dlrm.input_fn_for(features, labels), {
      "batch_size": 300}, 1)
  assert graph_bytes < 20_000 < constant_bytes

  shuffled = dlrm.generator_input_fn_for(features, labels, shuffle=True)
  passes, _ = _batches(shuffled, {"batch_size": 500}, 4)
  first = np.concatenate([b[1][:, 0] for b in passes[:2]])
  second = np.concatenate([b[1][:, 0] for b in passes[2:]])
  # Every example once per pass, in a new order each pass.
  assert sorted(first) == sorted(second) == list(range(1000))
  assert first.tolist() != second.tolist() != list(range(1000))


def test_generator_input_fn_reads_its_shard_and_refuses_too_few_examples():

  class Context:

    def current_input_fn_deployment(self):
      return None, 1, 4, None  # input pipeline 1 of 4

  labels = np.arange(40, dtype=np.float32).reshape(-1, 1)
  features = {"num_0": labels.copy()}
  input_fn = dlrm.generator_input_fn_for(features, labels, shuffle=False,
                                         repeat=False)
  batches, _ = _batches(input_fn, {"batch_size": 5, "context": Context()}, 5)
  assert np.concatenate([b[1][:, 0] for b in batches]).tolist() == list(
      range(1, 40, 4))
  with pytest.raises(ValueError, match="make no batch of 64"):
    input_fn({"batch_size": 64})
  with pytest.raises(ValueError, match="has 3 rows"):
    dlrm.generator_input_fn_for({"num_0": labels[:3]}, labels)


# --- the library's table summaries over partitions ----------------------------

VOCAB = 40
BATCH = 16


def _table_model(tmp_path, strategy, learning_rate_fn):
  column = tpu_embedding_columns.embedding_column(
      tf.feature_column.categorical_column_with_identity("a", VOCAB),
      dimension=3, learning_rate_fn=learning_rate_fn)
  spec = estimator_spec.EmbeddingConfigSpec(
      feature_columns=[column],
      optimization_parameters=estimator_spec.AdagradParameters(
          learning_rate=0.1),
      partition_strategy=strategy)

  def model_fn(features, labels, mode, params):
    del params
    embedded = tf.compat.v1.keras.layers.DenseFeatures([column])(features)
    logits = tf.compat.v1.layers.dense(embedded, 1)
    loss = tf.compat.v1.losses.sigmoid_cross_entropy(labels, logits)
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
        loss, global_step=tf.compat.v1.train.get_global_step())
    return TPUEstimatorSpec(mode=mode, loss=loss, train_op=train_op)

  config = estimator_spec.RunConfig(
      model_dir=str(tmp_path), save_summary_steps=1,
      save_checkpoints_steps=1000,
      tpu_config=estimator_spec.TPUConfig(num_shards=16))
  return TPUEstimator(
      model_fn=model_fn, config=config, use_tpu=False,
      train_batch_size=BATCH, embedding_config_spec=spec), spec


def _id_batches(seed, steps):
  rng = np.random.RandomState(seed)
  return rng.randint(0, VOCAB, size=(steps, BATCH, 2)) * (
      rng.uniform(size=(steps, BATCH, 2)) < 0.3)  # mostly id 0: repeats


def _train(estimator, ids, max_steps):

  def input_fn(params):
    del params
    dataset = tf.data.Dataset.from_tensor_slices(
        ({"a": ids}, np.ones(ids.shape[:2] + (1,), np.float32)))
    return dataset.map(lambda x, y: (dlrm.as_sparse(x), y))

  estimator.train(input_fn, max_steps=max_steps)


@pytest.mark.parametrize("strategy", ["div", "mod"])
def test_learning_rate_rows_touched_and_norms_over_partitions(tmp_path,
                                                              strategy):
  # A schedule that stays at 0 from step 2 on.
  schedule = lambda step: tf.where(step < 2, 0.3 / (1.0 + tf.cast(
      step, tf.float32)), 0.0)
  estimator, _ = _table_model(tmp_path, strategy, schedule)
  ids = _id_batches(seed=8, steps=5)
  _train(estimator, ids, max_steps=5)
  events = _events(str(tmp_path))
  # Summaries at step s are those of the run from step s - 1 to s: its
  # update used the rate at step s - 1.
  rates = dict(events[monitoring.summary_tag("tbl_a", "learning_rate")])
  assert rates[1] == pytest.approx(0.3)
  assert rates[2] == pytest.approx(0.3 / 2.0)
  assert rates[3] == rates[4] == rates[5] == 0.0
  # The rows a step touched: the distinct ids of its batch.
  touched = dict(events[monitoring.summary_tag("tbl_a", "rows_touched")])
  for step in range(1, 6):
    assert touched[step] == len(set(ids[step - 1].reshape(-1).tolist()))
  # The norm after the last step, over both partitions of the table.
  rows = _rows_in_row_order(tmp_path, strategy)
  assert dict(events[monitoring.summary_tag("tbl_a", "norm")])[5] == (
      pytest.approx(np.linalg.norm(rows), rel=1e-5))


def _rows_in_row_order(model_dir, strategy):
  """The table of the checkpoint in row order: checkpoints keep a `mod`
  table's rows in partition order (16 cores = 2 hosts: 2 partitions)."""
  reader = tf.train.load_checkpoint(str(model_dir))
  name = next(k for k in reader.get_variable_to_shape_map()
              if k.endswith("embedding_weights"))
  stored = reader.get_tensor(name)
  if strategy == "div":
    return stored
  # mod: partition p holds rows p, p + 2, ... in order.
  order = np.concatenate([np.arange(p, VOCAB, 2) for p in range(2)])
  rows = np.empty_like(stored)
  rows[order] = stored
  return rows


def test_step_tables_outside_a_host_model_fn_is_refused():
  with tf.Graph().as_default():
    with pytest.raises(RuntimeError, match="inside a model_fn"):
      estimator_spec.estimator.step_tables()


# --- the demo end to end --------------------------------------------------------


def _run_demo(model_dir, profile_dir, steps):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT)
  result = subprocess.run(
      [sys.executable, "-m", "examples.train_ctr", "--model-dir",
       str(model_dir), "--profile-dir", str(profile_dir), "--steps",
       str(steps), "--evaluations", "2", "--scale", "0.01",
       "--train-examples", "4000", "--eval-examples", "2048",
       "--loss-window", "10"],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
  assert result.returncode == 0, result.stdout + result.stderr
  return result.stdout + result.stderr  # progress lines are on stderr


@pytest.mark.slow
def test_demo_run_is_small_and_tells_what_it_did(tmp_path):
  from PIL import Image
  model_dir = tmp_path / "model"
  profile_dir = tmp_path / "profile"
  out = _run_demo(model_dir, profile_dir, steps=40)

  sizes = {}
  for root, _, files in os.walk(model_dir):
    for name in files:
      path = os.path.join(root, name)
      sizes[os.path.relpath(path, model_dir)] = os.path.getsize(path)
  assert sum(sizes.values()) < 50e6, sizes
  # What grew with the data set: the graph (now the same at any number of
  # examples) holds no large constant.
  graph_def = tf.compat.v1.GraphDef()
  from google.protobuf import text_format
  text_format.Parse((model_dir / "graph.pbtxt").read_text(), graph_def)
  assert max(n.ByteSize() for n in graph_def.node) < 64_000
  assert sizes["graph.pbtxt"] < 10e6
  assert [s for n, s in sizes.items() if n.endswith(".meta")] and all(
      s < 4e6 for n, s in sizes.items() if n.endswith(".meta"))
  assert len([n for n in sizes if n.endswith(".meta")]) == 1  # kept: 1

  evaluations = {int(l.split(":")[0].split()[-1]): l for l in out.splitlines()
                 if l.strip().startswith("evaluation at step")}
  assert sorted(evaluations) == [20, 40]
  progress = _progress_lines(out)
  assert [p["step"] for p in progress] == [10, 20, 30, 40]
  assert {p["last"] for p in progress} == {40}
  assert {p["mean_of"] for p in progress} == {10}
  assert progress[-1]["eta"] == 0
  # The evaluation at step 20 is named by the line whose steps it paused
  # (20's or 30's), with the rate of the training alone: the dip explained.
  noted = [p for p in progress if p["evaluated"]]
  assert [p["step"] for p in noted if p["step"] < 40] in ([20], [30]), out
  for p in noted:
    assert p["evaluated"] == 1 and p["seconds"] > 0
    assert p["training_rate"] is None or (
        p["training_rate"] >= p["rate"])
  for line in evaluations.values():
    assert "AUC" in line and "ceiling" in line and "baseline" in line
  assert "logistic regression on the 13 numeric features" in out
  assert f"tensorboard --logdir {model_dir}" in out

  png = model_dir / "training_curve.png"
  assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  with Image.open(png) as image:
    assert image.format == "PNG" and image.size[0] >= 400 and (
        image.size[1] >= 300)

  tags = _events(str(model_dir))
  for tag in ("global_step/sec", "examples/sec", "loss",
              monitoring.MEAN_LOSS_TAG):
    assert tag in tags, sorted(tags)
  spec = dlrm.build_spec(0.01)
  for table in spec.model.tables:
    for what in ("learning_rate", "rows_touched", "norm"):
      assert monitoring.summary_tag(table, what) in tags
  # The warm-up schedule of the big tables shows in their learning rate
  # (summaries at step s: the run from step s - 1).
  rates = dict(tags[monitoring.summary_tag("tbl_user_id", "learning_rate")])
  assert rates[1] == pytest.approx(0.05 * 1 / 100, rel=1e-5)
  assert dict(tags[monitoring.summary_tag(
      "tbl_gender", "learning_rate")])[1] == pytest.approx(0.05)
  assert "auc" in _events(str(model_dir / "eval"))

  again = _run_demo(model_dir, profile_dir, steps=40)
  assert "max_steps 40 already reached, nothing to train" in again
  assert "trained from" not in again
  more = _run_demo(model_dir, profile_dir, steps=60)
  assert "Resuming from step 40" in more and "to max_steps 60" in more
  assert "trained from step 40 to 60" in more
  assert [(p["step"], p["last"]) for p in _progress_lines(more)] == [
      (50, 60), (60, 60)]


_PROGRESS = re.compile(
    r"TPUEstimator: step (?P<step>\d+)/(?P<last>\d+), loss (?P<loss>\S+) "
    r"\(mean of (?P<mean_of>\d+) steps\), (?P<rate>\d+) examples/s"
    r"(?: \((?:an|(?P<count>\d+)) evaluations? ran: (?P<seconds>[\d.]+) s"
    r"(?:; (?P<training_rate>\d+) examples/s training)?\))?"
    r", ETA (?:(?P<h>\d+)h)?(?:(?P<m>\d+)m)?(?:(?P<s>\d+)s)?")


def _progress_lines(out):
  """The demo's progress lines, each parsed: step, last (the step training
  ends at), mean_of, rate (examples/s), evaluated (how many evaluations
  ran in its steps), seconds (their time), training_rate (or None), eta
  (seconds)."""
  lines = [l for l in out.splitlines() if l.startswith("TPUEstimator: step")]
  return [_parsed_progress(line) for line in lines]


def _parsed_progress(line):
  match = _PROGRESS.fullmatch(line)
  assert match, line
  number = {name: int(value or 0) for name, value in match.groupdict().items()
            if name not in ("loss", "seconds")}
  evaluated = match.group("seconds") is not None
  return {
      "step": number["step"], "last": number["last"],
      "mean_of": number["mean_of"], "rate": number["rate"],
      "loss": float(match.group("loss")),
      "evaluated": (number["count"] or 1) if evaluated else 0,
      "seconds": float(match.group("seconds") or 0),
      "training_rate": number["training_rate"] or None,
      "eta": number["h"] * 3600 + number["m"] * 60 + number["s"]}


def test_every_option_of_the_demo_has_help():
  parser = train_ctr.argument_parser()
  options = [a for a in parser._actions
             if a.dest != "help"]
  assert len(options) >= 11
  for action in options:
    assert action.help and action.help != argparse.SUPPRESS, (
        action.option_strings)
  text = parser.format_help()
  for action in options:
    assert action.option_strings[0] in text


def _disk_use(directory):
  return sum(os.path.getsize(os.path.join(root, name))
             for root, _, files in os.walk(directory) for name in files)


# The full-size demo (1,500 steps) once per suite, on the reference stack;
# the small run of test_demo_run_is_small_and_tells_what_it_did runs the
# same program on both.
@pytest.mark.reference_only
@pytest.mark.slow
def test_make_demo_at_its_defaults_stays_under_50_mb(tmp_path):
  """What `make demo` runs (`python -m examples.train_ctr`, every setting at
  its default), into a temporary model and profile directory."""
  model_dir = tmp_path / "model"
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT)
  result = subprocess.run(
      [sys.executable, "-m", "examples.train_ctr", "--model-dir",
       str(model_dir), "--profile-dir", str(tmp_path / "profile")],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
  assert result.returncode == 0, result.stdout + result.stderr
  used = _disk_use(model_dir)
  assert used < 50e6, used
  # The run says how much it wrote, and that is what is there.
  assert f"({used / 1e6:.1f} MB in all)" in result.stdout, result.stdout
  assert "trained from step 0 to 1500" in result.stdout
