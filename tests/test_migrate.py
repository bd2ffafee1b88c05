"""`python -m estimator_spec migrate`: the import change made by a program.

* programs written with public TPU code's import habits
  (tests/data/migrate, and a TPUEstimator program using tf.estimator's
  names beside the TPU ones), migrated, then run: train, evaluate, predict,
  export; migrating the result again changes nothing, and the result names
  nothing of tensorflow-estimator (so it runs on current TF too);
* the rewriting: each alias form, names imported one by one, whole-module
  aliases, tf.contrib, tf.estimator and tensorflow_estimator, what is left
  alone and why, a function's own variables, comments and formatting kept
  byte for byte, source encodings and line endings;
* the files: --output, --in-place, links, unparseable files, exit codes.
"""
import ast
import os
import re
import stat
import subprocess
import sys
import textwrap

import hypothesis
from hypothesis import strategies as st
import pytest

from estimator_spec import migrate
from estimator_spec import tf_names

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAMS = os.path.join(REPO, "tests", "data", "migrate")
_ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")


def _migrated(source):
  result = migrate.migrate_source(textwrap.dedent(source).encode())
  assert result.error is None, result.error
  return result.source.decode(), result


_TF_ESTIMATOR_TEXT = re.compile(
    r"\btensorflow_estimator\b|\btensorflow\.python\.estimator\b|"
    r"\btf(\.compat\.v[12])*\.estimator\b|\b_load_global_step")


def _tf_estimator_names(source):
  """What a program's text still names of tensorflow-estimator: by a regex
  over the text, and by the table for every module it imports."""
  found = [m.group(0) for m in _TF_ESTIMATOR_TEXT.finditer(source)]
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      found += [a.name for a in node.names if tf_names.missing_from(a.name)]
    elif isinstance(node, ast.ImportFrom) and node.module:
      found += [f"{node.module}.{a.name}" for a in node.names
                if tf_names.missing_from(f"{node.module}.{a.name}")]
  return found


def _cli(*args):
  return subprocess.run([sys.executable, "-m", "estimator_spec", "migrate",
                         *map(str, args)], cwd=REPO, env=_ENV,
                        capture_output=True, text=True, timeout=300,
                        check=False)


# --- programs as TPU users write them --------------------------------------

_RUNNER = r"""
import runpy, sys
for program, model_dir in zip(sys.argv[1::2], sys.argv[2::2]):
  sys.argv = [program, model_dir]
  runpy.run_path(program, run_name="__main__")
"""


@pytest.mark.slow
def test_programs_migrated_mechanically_train_evaluate_predict_export(
    tmp_path):
  output = tmp_path / "migrated"
  process = _cli(PROGRAMS, "--output", output)
  assert process.returncode == 0, process.stderr
  report = process.stdout.splitlines()
  assert report[-1] == (
      "migrate: 3 Python files, 3 changed (38 changes), 0 names left alone, "
      f"0 refused; written under {output}.")
  assert (output / "README.md").read_text() == open(
      os.path.join(PROGRAMS, "README.md")).read()  # other files copied
  for name in ("docs_style.py", "contrib_style.py", "module_style.py"):
    text = (output / name).read_text()
    assert "tensorflow.contrib" not in text and "contrib_tpu." not in text
    assert "estimator.tpu." not in text
    assert not _tf_estimator_names(text), name
  # Migrating the migrated tree again changes nothing.
  again = migrate.run([str(output)], out=open(os.devnull, "w"))
  assert again == 0
  for name in ("docs_style.py", "contrib_style.py", "module_style.py"):
    result = migrate.migrate_source((output / name).read_bytes())
    assert not result.changes, (name, result.changes)
  args = []
  for name in ("docs_style.py", "contrib_style.py", "module_style.py"):
    args += [str(output / name), str(tmp_path / name[:-3])]
  run = subprocess.run([sys.executable, "-c", _RUNNER, *args], cwd=tmp_path,
                       env=dict(_ENV, PYTHONPATH=REPO), capture_output=True,
                       text=True, timeout=600, check=False)
  assert run.returncode == 0, run.stderr[-3000:]
  results = [line.split() for line in run.stdout.splitlines()
             if line.startswith("RESULT ")]
  assert [r[1] for r in results] == ["step=4", "step=6", "step=4"]
  for result, name in zip(results, ("docs_style", "contrib_style",
                                    "module_style")):
    export = result[-1].split("=", 1)[1]
    assert export.startswith(str(tmp_path / name / "export"))
    assert os.path.isfile(os.path.join(export, "saved_model.pb"))


# A TPUEstimator program as public TPU code writes one: TF2's
# `import tensorflow.compat.v1 as tf`, tf.estimator's names beside the TPU
# ones, and tensorflow-estimator's private global-step reader.
_TPU_PROGRAM = '''\
"""A TPUEstimator click model, as public TPU code writes one."""
import os
import sys

import numpy as np
import tensorflow.compat.v1 as tf
from tensorflow.python.estimator import estimator

VOCAB, DIM, BATCH = 20, 4, 8


def input_fn(params):
  rng = np.random.RandomState(0)
  ids = rng.randint(0, VOCAB, (64, 1)).astype(np.int64)
  dense = rng.rand(64, 2).astype(np.float32)
  labels = (ids % 2).astype(np.float32)
  dataset = tf.data.Dataset.from_tensor_slices(
      ({"ids": ids, "dense": dense}, labels))
  return dataset.repeat().batch(params["batch_size"], drop_remainder=True)


ids_column = tf.tpu.experimental.embedding_column(
    tf.feature_column.categorical_column_with_identity("ids", VOCAB), DIM)


def model_fn(features, labels, mode, params):
  del params
  net = tf.concat([tf.feature_column.input_layer(features, [ids_column]),
                   features["dense"]], axis=1)
  logits = tf.layers.dense(net, 1)
  probability = tf.sigmoid(logits)
  if mode == tf.estimator.ModeKeys.PREDICT:
    return tf.estimator.tpu.TPUEstimatorSpec(
        mode, predictions={"probability": probability},
        export_outputs={"serving": tf.estimator.export.PredictOutput(
            {"probability": probability})})
  loss = tf.losses.sigmoid_cross_entropy(labels, logits)
  if mode == tf.estimator.ModeKeys.EVAL:
    return tf.estimator.EstimatorSpec(
        mode, loss=loss, eval_metric_ops={"accuracy": tf.metrics.accuracy(
            labels, tf.round(probability))})
  optimizer = tf.tpu.CrossShardOptimizer(tf.train.AdagradOptimizer(0.1))
  train_op = optimizer.minimize(loss, tf.train.get_global_step())
  logging_hook = tf.estimator.LoggingTensorHook({"loss": loss},
                                                every_n_iter=2)
  return tf.estimator.tpu.TPUEstimatorSpec(mode, loss=loss, train_op=train_op,
                                           training_hooks=[logging_hook])


def serving_input_fn():
  features = {"ids": tf.placeholder(tf.int64, [None, 1], name="ids"),
              "dense": tf.placeholder(tf.float32, [None, 2], name="dense")}
  return tf.estimator.export.build_raw_serving_input_receiver_fn(features)()


def export(estimator, model_dir):
  """`estimator` here is the TPUEstimator, not the module."""
  return estimator.export_saved_model(os.path.join(model_dir, "export"),
                                      serving_input_fn)


def main(model_dir):
  config = tf.compat.v1.estimator.tpu.RunConfig(
      model_dir=model_dir, save_checkpoints_steps=2,
      tpu_config=tf.compat.v1.estimator.tpu.TPUConfig(
          iterations_per_loop=2, num_shards=2,
          per_host_input_for_training=(
              tf.compat.v1.estimator.tpu.InputPipelineConfig.PER_HOST_V2)))
  classifier = tf.compat.v1.estimator.tpu.TPUEstimator(
      model_fn=model_fn, config=config, use_tpu=False,
      train_batch_size=BATCH, eval_batch_size=BATCH, predict_batch_size=BATCH,
      embedding_config_spec=tf.estimator.tpu.experimental.EmbeddingConfigSpec(
          feature_columns=[ids_column],
          optimization_parameters=tf.tpu.experimental.AdagradParameters(0.1)))
  current_step = estimator._load_global_step_from_checkpoint_dir(model_dir)
  train_spec = tf.compat.v1.estimator.TrainSpec(input_fn, max_steps=4)
  eval_spec = tf.compat.v1.estimator.EvalSpec(input_fn, steps=1,
                                             throttle_secs=0)
  tf.compat.v1.estimator.train_and_evaluate(classifier, train_spec, eval_spec)
  metrics = classifier.evaluate(input_fn, steps=2)
  prediction = next(classifier.predict(input_fn))
  exported = export(classifier, model_dir)
  if isinstance(exported, bytes):
    exported = exported.decode()
  print(f"RESULT start={current_step} "
        f"step={estimator._load_global_step_from_checkpoint_dir(model_dir)} "
        f"eval_step={metrics['global_step']} "
        f"probability={float(prediction['probability'][0]):.3f} "
        f"export={exported}")


if __name__ == "__main__":
  main(sys.argv[1])
'''


def test_a_tpu_program_migrated_names_nothing_of_tensorflow_estimator():
  assert "tensorflow.python.estimator" in _tf_estimator_names(_TPU_PROGRAM)
  new, result = _migrated(_TPU_PROGRAM)
  assert not result.notes
  assert not _tf_estimator_names(new)
  assert "import estimator_spec.estimator\nimport tpu_embedding_columns\n" \
      in new
  assert "tf.train.LoggingTensorHook({" in new
  assert ("current_step = estimator_spec.estimator."
          "load_global_step_from_checkpoint_dir(model_dir)") in new
  # The function's own `estimator` (the TPUEstimator) is not the module.
  assert "return estimator.export_saved_model(" in new
  assert not migrate.migrate_source(new.encode()).changes


@pytest.mark.slow
def test_a_tpu_program_migrated_trains_evaluates_predicts_exports(tmp_path):
  program = tmp_path / "tpu_program.py"
  program.write_text(_migrated(_TPU_PROGRAM)[0])
  run = subprocess.run([sys.executable, str(program), str(tmp_path / "m")],
                       cwd=tmp_path, env=dict(_ENV, PYTHONPATH=REPO),
                       capture_output=True, text=True, timeout=600,
                       check=False)
  assert run.returncode == 0, run.stderr[-3000:]
  result = dict(field.split("=", 1) for field in
                run.stdout.splitlines()[-1].split()[1:])
  assert (result["start"], result["step"], result["eval_step"]) == (
      "0", "4", "4")
  assert 0 < float(result["probability"]) < 1
  assert os.path.isfile(os.path.join(result["export"], "saved_model.pb"))


# --- the rewriting ----------------------------------------------------------


def test_compat_v1_alias_names_are_rewritten_and_the_rest_kept_byte_for_byte():
  source = """\
  # A model.  tf.estimator.tpu.TPUEstimator in a comment stays.
  import tensorflow.compat.v1 as tf   # keep this comment

  def build(model_fn):
    config = tf.estimator.tpu.RunConfig(  # the run
        model_dir="tf.estimator.tpu.RunConfig",
        tpu_config=tf.estimator.tpu.TPUConfig(
            per_host_input_for_training=tf.estimator.tpu.InputPipelineConfig
            .PER_HOST_V2))
    return tf.estimator.tpu.TPUEstimator(model_fn=model_fn, config=config)
  """
  new, result = _migrated(source)
  assert new == textwrap.dedent("""\
  # A model.  tf.estimator.tpu.TPUEstimator in a comment stays.
  import tensorflow.compat.v1 as tf   # keep this comment
  import estimator_spec

  def build(model_fn):
    config = estimator_spec.RunConfig(  # the run
        model_dir="tf.estimator.tpu.RunConfig",
        tpu_config=estimator_spec.TPUConfig(
            per_host_input_for_training=estimator_spec.InputPipelineConfig
            .PER_HOST_V2))
    return estimator_spec.TPUEstimator(model_fn=model_fn, config=config)
  """)
  assert [(c.line, c.old, c.new) for c in result.changes] == [
      (3, "", "import estimator_spec"),
      (5, "tf.estimator.tpu.RunConfig", "estimator_spec.RunConfig"),
      (7, "tf.estimator.tpu.TPUConfig", "estimator_spec.TPUConfig"),
      (8, "tf.estimator.tpu.InputPipelineConfig",
       "estimator_spec.InputPipelineConfig"),
      (10, "tf.estimator.tpu.TPUEstimator", "estimator_spec.TPUEstimator")]
  assert not result.notes


@pytest.mark.parametrize("imports, prefix", [
    ("import tensorflow as tf", "tf.compat.v1."),
    ("import tensorflow as tf", "tf."),  # TF 1.x's API
    ("from tensorflow.compat import v1 as tf", "tf."),
    ("import tensorflow.compat.v1", "tensorflow.compat.v1."),
    ("from tensorflow import compat", "compat.v1."),
])
def test_each_alias_of_tensorflow_is_followed(imports, prefix):
  new, _ = _migrated(f"""\
  {imports}
  column = {prefix}tpu.experimental.embedding_column(None, 2)
  spec = {prefix}estimator.tpu.experimental.EmbeddingConfigSpec(
      feature_columns=[column],
      optimization_parameters={prefix}tpu.experimental.AdamParameters(0.1))
  """)
  assert new == textwrap.dedent(f"""\
  {imports}
  import estimator_spec
  import tpu_embedding_columns
  column = tpu_embedding_columns.embedding_column(None, 2)
  spec = estimator_spec.experimental.EmbeddingConfigSpec(
      feature_columns=[column],
      optimization_parameters=tpu_embedding_columns.AdamParameters(0.1))
  """)


def test_names_imported_one_by_one_keep_their_local_names():
  new, _ = _migrated("""\
  from tensorflow.compat.v1.estimator.tpu import RunConfig, TPUEstimator as E
  from tensorflow.python.tpu.feature_column_v2 import embedding_column_v2
  from tensorflow.python.tpu.tpu_embedding import AdagradParameters, \\
      _OptimizationParameters
  from tensorflow.contrib.tpu import CrossShardOptimizer
  E(config=RunConfig()), embedding_column_v2, AdagradParameters
  _OptimizationParameters
  """)
  assert new == textwrap.dedent("""\
  from estimator_spec import RunConfig, TPUEstimator as E
  from tpu_embedding_columns import embedding_column as embedding_column_v2
  from tensorflow.python.tpu.tpu_embedding import _OptimizationParameters
  from tpu_embedding_columns import AdagradParameters
  from tensorflow.compat.v1.tpu import CrossShardOptimizer
  E(config=RunConfig()), embedding_column_v2, AdagradParameters
  _OptimizationParameters
  """)


def test_a_whole_module_alias_becomes_an_alias_of_ours_when_every_use_is():
  new, result = _migrated("""\
  from tensorflow.compat.v1.estimator import tpu as tpu_estimator
  estimator = tpu_estimator.TPUEstimator(
      config=tpu_estimator.RunConfig(),
      embedding_config_spec=tpu_estimator.experimental.EmbeddingConfigSpec())
  """)
  assert new.splitlines()[0] == "import estimator_spec as tpu_estimator"
  assert new.splitlines()[1:] == textwrap.dedent("""\
  estimator = tpu_estimator.TPUEstimator(
      config=tpu_estimator.RunConfig(),
      embedding_config_spec=tpu_estimator.experimental.EmbeddingConfigSpec())
  """).splitlines()
  assert len(result.changes) == 1
  # A use the table does not know keeps TF's module; the others move.
  new, result = _migrated("""\
  from tensorflow.compat.v1.estimator import tpu as tpu_estimator
  tpu_estimator.TPUEstimator, tpu_estimator.SOMETHING_ELSE
  """)
  assert new == textwrap.dedent("""\
  from tensorflow.compat.v1.estimator import tpu as tpu_estimator
  import estimator_spec
  estimator_spec.TPUEstimator, tpu_estimator.SOMETHING_ELSE
  """)
  assert [(n.line, n.name) for n in result.notes] == [
      (1, "tensorflow.compat.v1.estimator.tpu"),
      (2, "tpu_estimator.SOMETHING_ELSE")]
  assert result.notes[0].why.startswith(
      "TF 2.16 and later have no tf.estimator (tensorflow-estimator), and "
      "this file still uses tpu_estimator")


def test_contrib_tpu_moves_and_its_import_goes_when_nothing_is_left():
  new, _ = _migrated("""\
  import tensorflow as tf
  from tensorflow.contrib import tpu as contrib_tpu
  contrib_tpu.CrossShardOptimizer(None)
  contrib_tpu.TPUEstimatorSpec(mode=None)
  tf.contrib.tpu.RunConfig()
  """)
  assert new == textwrap.dedent("""\
  import tensorflow as tf
  import estimator_spec
  tf.compat.v1.tpu.CrossShardOptimizer(None)
  estimator_spec.TPUEstimatorSpec(mode=None)
  estimator_spec.RunConfig()
  """)
  new, result = _migrated("""\
  from tensorflow.contrib import tpu as contrib_tpu
  contrib_tpu.TPUEstimator, contrib_tpu.profiler
  """)
  assert new.splitlines()[0] == (
      "from tensorflow.contrib import tpu as contrib_tpu")
  assert "estimator_spec.TPUEstimator, contrib_tpu.profiler" in new
  reasons = {n.name: n.why for n in result.notes}
  assert "no counterpart" in reasons["contrib_tpu.profiler"]
  assert "TF 2.15 has no tensorflow.contrib" in reasons[
      "tensorflow.contrib.tpu"]


@pytest.mark.parametrize("imports, prefix, train", [
    ("import tensorflow as tf", "tf.", "tf.compat.v1.train."),
    ("import tensorflow as tf", "tf.compat.v1.", "tf.compat.v1.train."),
    ("import tensorflow.compat.v1 as tf", "tf.", "tf.train."),
    ("import tensorflow.compat.v1 as tf", "tf.compat.v1.", "tf.train."),
    ("from tensorflow.compat import v1", "v1.", "v1.train."),
])
def test_tf_estimator_names_are_rewritten_in_each_spelling(imports, prefix,
                                                           train):
  new, result = _migrated(f"""\
  {imports}
  if mode == {prefix}estimator.ModeKeys.TRAIN:
    spec = {prefix}estimator.EstimatorSpec(mode, loss=loss)
  receiver = {prefix}estimator.export.ServingInputReceiver(f, f)
  config = {prefix}estimator.tpu.RunConfig(model_dir=d)
  hook = {prefix}estimator.LoggingTensorHook({{"loss": loss}}, 1)
  vocab = {prefix}estimator.VocabInfo("new.txt", 10, 0, "old.txt")
  """)
  assert new == textwrap.dedent(f"""\
  {imports}
  import estimator_spec.estimator
  if mode == estimator_spec.estimator.ModeKeys.TRAIN:
    spec = estimator_spec.estimator.EstimatorSpec(mode, loss=loss)
  receiver = estimator_spec.estimator.export.ServingInputReceiver(f, f)
  config = estimator_spec.RunConfig(model_dir=d)
  hook = {train}LoggingTensorHook({{"loss": loss}}, 1)
  vocab = {train}VocabInfo("new.txt", 10, 0, "old.txt")
  """)
  assert not result.notes


def test_tf_estimator_names_imported_one_by_one_keep_their_local_names():
  new, result = _migrated("""\
  from tensorflow.compat.v1.estimator import ModeKeys, EstimatorSpec as Spec
  from tensorflow.estimator import LoggingTensorHook, DNNClassifier
  from tensorflow_estimator.python.estimator.export.export import (
      ServingInputReceiver)
  from tensorflow.python.estimator.estimator import (
      _load_global_step_from_checkpoint_dir as load_step)
  from tensorflow_estimator.python.estimator.estimator import EstimatorV2
  ModeKeys, Spec, LoggingTensorHook, DNNClassifier, ServingInputReceiver
  load_step, EstimatorV2
  """)
  assert new == textwrap.dedent("""\
  from estimator_spec.estimator import ModeKeys, EstimatorSpec as Spec
  from tensorflow.estimator import DNNClassifier
  from tensorflow.compat.v1.train import LoggingTensorHook
  from estimator_spec.estimator.export import ServingInputReceiver
  from estimator_spec.estimator import LOAD_STEP as load_step
  from estimator_spec.estimator import Estimator as EstimatorV2
  ModeKeys, Spec, LoggingTensorHook, DNNClassifier, ServingInputReceiver
  load_step, EstimatorV2
  """).replace("LOAD_STEP", "load_global_step_from_checkpoint_dir")
  assert [(n.line, n.name) for n in result.notes] == [
      (2, "tensorflow.estimator.DNNClassifier")]
  assert "write a model_fn" in result.notes[0].why


def test_tf_estimator_module_aliases_become_ours_when_every_use_is():
  new, result = _migrated("""\
  from tensorflow import estimator as tf_estimator
  from tensorflow.python.estimator.export import export as export_lib
  from tensorflow_estimator.python.estimator import model_fn as model_fn_lib
  import tensorflow_estimator as tfe
  tf_estimator.ModeKeys.EVAL, tf_estimator.export.PredictOutput
  export_lib.ServingInputReceiver, model_fn_lib.EstimatorSpec
  tfe.estimator.ModeKeys, tfe.estimator.RunConfig
  """)
  assert new == textwrap.dedent("""\
  import estimator_spec.estimator as tf_estimator
  import estimator_spec.estimator.export as export_lib
  import estimator_spec.estimator as model_fn_lib
  import estimator_spec as tfe
  tf_estimator.ModeKeys.EVAL, tf_estimator.export.PredictOutput
  export_lib.ServingInputReceiver, model_fn_lib.EstimatorSpec
  tfe.estimator.ModeKeys, tfe.estimator.RunConfig
  """)
  assert len(result.changes) == 4 and not result.notes


def test_tf_estimator_module_aliases_otherwise_move_use_by_use():
  # Ours lacks `tpu` under estimator_spec.estimator, and the hook moves to
  # TF's tf.compat.v1.train: each use moves, and the import goes.
  new, result = _migrated("""\
  from tensorflow import estimator as tf_estimator
  import tensorflow_estimator as tfe
  tf_estimator.ModeKeys, tf_estimator.tpu.TPUEstimator
  tf_estimator.SessionRunHook, tfe.estimator.ModeKeys
  tfe.estimator.LatestExporter("latest", serving_input_fn)
  """)
  assert new == textwrap.dedent("""\
  import tensorflow_estimator as tfe
  import estimator_spec.estimator
  import tensorflow
  estimator_spec.estimator.ModeKeys, estimator_spec.TPUEstimator
  tensorflow.compat.v1.train.SessionRunHook, estimator_spec.estimator.ModeKeys
  tfe.estimator.LatestExporter("latest", serving_input_fn)
  """)
  # A name without a counterpart keeps its import, reported as such.
  assert [(n.line, n.name) for n in result.notes] == [
      (2, "tensorflow_estimator"), (5, "tfe.estimator.LatestExporter")]
  assert result.notes[0].why.startswith("TF 2.16 and later have no "
                                        "tf.estimator")
  assert "EvalSpec(exporters=...)" in result.notes[1].why


def test_tf_estimator_names_without_a_counterpart_say_what_to_do():
  source = textwrap.dedent("""\
  import tensorflow as tf
  tf.estimator.DNNClassifier(hidden_units=[2])
  tf.estimator.BinaryClassHead()
  tf.estimator.LatestExporter("latest", serving_input_fn)
  tf.estimator.export.EvalOutput(loss)
  tf.estimator.experimental.stop_if_no_decrease_hook(e, "loss", 10)
  tf.compat.v1.estimator.inputs.numpy_input_fn(x)
  tf.estimator.NotAName
  tf.estimator
  """)
  new, result = _migrated(source)
  assert new == source
  notes = [(n.line, n.why) for n in result.notes]
  for (line, why), words in zip(notes, [
      "write a model_fn", "write a model_fn", "export_saved_model",
      "serving graphs only", "request_stop()", "from_tensor_slices",
      "not in the table", "only some of its names"]):
    assert words in why, (line, why)
  assert [line for line, _ in notes] == list(range(2, 10))


def test_a_functions_own_variable_hides_the_import_of_its_name():
  new, result = _migrated("""\
  from tensorflow.python.estimator import estimator

  def train(estimator, steps):
    return estimator.train(steps)

  def run(model_dir):
    estimator = make(model_dir)
    return estimator.evaluate(), [estimator for estimator in (1, 2)]

  def step(model_dir):
    return estimator._load_global_step_from_checkpoint_dir(model_dir)
  """)
  assert new == textwrap.dedent("""\
  import estimator_spec.estimator

  def train(estimator, steps):
    return estimator.train(steps)

  def run(model_dir):
    estimator = make(model_dir)
    return estimator.evaluate(), [estimator for estimator in (1, 2)]

  def step(model_dir):
    return estimator_spec.estimator.LOAD_STEP(model_dir)
  """).replace("LOAD_STEP", "load_global_step_from_checkpoint_dir")
  assert not result.notes


def test_names_without_a_counterpart_are_left_alone_with_the_reason():
  new, result = _migrated("""\
  import tensorflow as tf
  tf.tpu.experimental.initialize_tpu_system(resolver)
  table = tf.tpu.experimental.embedding.TableConfig(10, 2)
  embedding = tf.tpu.experimental.embedding.TPUEmbedding({}, None)
  tf.compat.v1.tpu.experimental.NotAName
  """)
  assert "tf.tpu.experimental.initialize_tpu_system(resolver)" in new
  assert "tf.tpu.experimental.embedding.TableConfig(10, 2)" in new
  assert "estimator_spec.HostTPUEmbedding({}, None)" in new
  notes = {n.name: n.why for n in result.notes}
  assert notes["tf.tpu.experimental.initialize_tpu_system"].startswith(
      "needs a TPU: a TPU system call")
  assert notes["tf.tpu.experimental.embedding.TableConfig"].startswith(
      "kept: TF's own configuration object")
  assert "not in the table" in notes["tf.compat.v1.tpu.experimental.NotAName"]


def test_a_module_passed_as_a_value_becomes_ours_only_if_ours_has_it_all():
  new, result = _migrated("""\
  import tensorflow.compat.v1 as tf
  from tensorflow.compat.v1.estimator import tpu as tpu_estimator
  from tensorflow.compat.v1 import estimator as tf_estimator
  use(tpu_estimator, tf_estimator)
  tpu_estimator.TPUEstimator, tf_estimator.ModeKeys
  tf.train.AdamOptimizer(0.1)
  numpy.tpu.experimental.embedding_column
  """)
  assert new == textwrap.dedent("""\
  import tensorflow.compat.v1 as tf
  import estimator_spec as tpu_estimator
  from tensorflow.compat.v1 import estimator as tf_estimator
  import estimator_spec.estimator
  use(tpu_estimator, tf_estimator)
  tpu_estimator.TPUEstimator, estimator_spec.estimator.ModeKeys
  tf.train.AdamOptimizer(0.1)
  numpy.tpu.experimental.embedding_column
  """)
  # tf.estimator has names with no counterpart (DNNClassifier, ...): the
  # module itself stays TF's, which TF 2.16 and later lack.
  assert [(n.line, n.name) for n in result.notes] == [
      (3, "tensorflow.compat.v1.estimator")]
  assert "the module as a value" in result.notes[0].why


def test_a_name_bound_to_two_modules_is_left_with_a_note():
  new, result = _migrated("""\
  import tensorflow as tf
  if old:
    import tensorflow.compat.v1 as tf
  tf.estimator.tpu.RunConfig()
  """)
  assert "tf.estimator.tpu.RunConfig()" in new
  assert "more than one module" in result.notes[0].why


def test_the_sole_import_of_a_block_becomes_pass():
  new, _ = _migrated("""\
  try:
    from tensorflow.contrib import tpu as contrib_tpu
  except ImportError:
    contrib_tpu = None
  x = contrib_tpu.RunConfig()
  """)
  assert new == textwrap.dedent("""\
  import estimator_spec
  try:
    pass
  except ImportError:
    contrib_tpu = None
  x = estimator_spec.RunConfig()
  """)
  new, _ = _migrated("""\
  def f():
    from tensorflow.contrib import tpu as contrib_tpu  # TF 1.15
    return contrib_tpu.RunConfig()
  if True:
    from tensorflow.contrib import tpu as contrib_tpu
  """)
  assert new == textwrap.dedent("""\
  import estimator_spec
  def f():
    return estimator_spec.RunConfig()
  if True:
    pass
  """)


@pytest.mark.parametrize("encoding, newline, bom", [
    ("utf-8", "\r\n", False), ("latin-1", "\n", False),
    ("utf-8", "\n", True)])
def test_encodings_and_line_endings_are_kept(encoding, newline, bom):
  lines = ([f"# -*- coding: {encoding} -*-"] if encoding != "utf-8" else
           []) + ["import tensorflow as tf", "# Größe: naïve café",
                  "s = 'é'; tf.estimator.tpu.RunConfig()"]
  data = newline.join(lines + [""]).encode(encoding)
  if bom:
    data = b"\xef\xbb\xbf" + data
  result = migrate.migrate_source(data)
  expected = lines[:-1] + ["import estimator_spec",
                           "s = 'é'; estimator_spec.RunConfig()"]
  # The new import goes after the last import, before the comment.
  expected = (lines[:-2] + ["import estimator_spec", lines[-2],
                            "s = 'é'; estimator_spec.RunConfig()"])
  want = newline.join(expected + [""]).encode(encoding)
  assert result.source == (b"\xef\xbb\xbf" + want if bom else want)


@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(st.binary(max_size=300))
def test_random_bytes_give_a_result_or_a_refusal_never_an_exception(data):
  result = migrate.migrate_source(data)
  assert (result.error is None) != (result.source is None)


@hypothesis.settings(max_examples=40, deadline=None)
@hypothesis.given(st.lists(st.sampled_from([
    "import tensorflow as tf", "import tensorflow.compat.v1 as tf",
    "from tensorflow.contrib import tpu as contrib_tpu",
    "from tensorflow.compat.v1.estimator import tpu as tpu_estimator",
    "x = tf.estimator.tpu.RunConfig()", "y = contrib_tpu.TPUEstimator",
    "z = tpu_estimator.TPUEstimatorSpec", "def f():\n  return tf.tpu",
    "w = tf.compat.v1.tpu.experimental.embedding_column  # note",
    "if a:\n  import tensorflow as tf",
    "from tensorflow import estimator as tf_estimator",
    "import tensorflow_estimator as tfe", "v = tf.estimator.ModeKeys.TRAIN",
    "u = tf_estimator.export.PredictOutput", "t = tfe.estimator.DNNClassifier",
    "from tensorflow.python.estimator import estimator",
    "s = estimator._load_global_step_from_checkpoint_dir(d)",
    "def g(estimator):\n  return estimator.train"]), max_size=8))
def test_random_programs_migrate_to_python_and_again_to_themselves(lines):
  data = "\n".join(lines).encode() + b"\n"
  result = migrate.migrate_source(data)
  assert result.error is None
  again = migrate.migrate_source(result.source)
  assert again.error is None and again.source == result.source


# --- files and the command line ------------------------------------------


def test_in_place_rewrites_changed_files_only_keeping_their_mode(tmp_path):
  changed = tmp_path / "model.py"
  changed.write_text("import tensorflow as tf\ntf.estimator.tpu.RunConfig\n")
  os.chmod(changed, 0o750)
  untouched = tmp_path / "other.py"
  untouched.write_text("import os\n")
  before = os.stat(untouched).st_mtime_ns
  (tmp_path / "link.py").symlink_to(changed)
  lines = []
  code = migrate.run([str(tmp_path)], in_place=True,
                     out=_Lines(lines))
  assert code == 0
  assert changed.read_text() == (
      "import tensorflow as tf\nimport estimator_spec\n"
      "estimator_spec.RunConfig\n")
  assert stat.S_IMODE(os.stat(changed).st_mode) == 0o750
  assert os.stat(untouched).st_mtime_ns == before
  assert (tmp_path / "link.py").is_symlink()
  assert f"{tmp_path / 'link.py'}: skipped: a symbolic link: not followed" \
      in lines
  assert not [p for p in os.listdir(tmp_path) if p.startswith(".migrate")]


class _Lines:
  def __init__(self, lines):
    self.lines = lines

  def write(self, text):
    self.lines.extend(line for line in text.splitlines() if line)


def test_unparseable_files_are_refused_one_line_each_the_rest_migrated(
    tmp_path):
  source = tmp_path / "src"
  source.mkdir()
  (source / "good.py").write_text("import tensorflow as tf\n"
                                  "tf.estimator.tpu.RunConfig\n")
  (source / "bad.py").write_text("def f(:\n  pass\n")
  (source / "nul.py").write_bytes(b"x = 1\x00\n")
  output = tmp_path / "out"
  process = _cli(source, "--output", output)
  assert process.returncode == 2
  lines = process.stdout.splitlines()
  assert (f"{source / 'bad.py'}: refused: cannot parse it as Python "
          "(invalid syntax at line 1)") in lines
  assert any(line.startswith(f"{source / 'nul.py'}: refused: cannot parse")
             for line in lines)
  assert "estimator_spec.RunConfig" in (output / "good.py").read_text()
  assert not (output / "bad.py").exists()
  assert lines[-1].startswith("migrate: 3 Python files, 1 changed (2 changes)")


def test_usage_errors_exit_2_in_one_line_and_write_nothing(tmp_path):
  (tmp_path / "a.py").write_text("import tensorflow as tf\n")
  for args, message in [
      ([tmp_path / "missing"], "does not exist"),
      ([tmp_path, "--output", tmp_path / "inside"], "lies inside"),
  ]:
    process = _cli(*args)
    assert process.returncode == 2
    assert process.stderr.count("\n") == 1 and message in process.stderr
  assert sorted(os.listdir(tmp_path)) == ["a.py"]
  process = _cli(tmp_path / "a.py", "--output", tmp_path / "o", "--in-place")
  assert process.returncode == 2 and "not allowed with" in process.stderr
  # An existing output file is replaced only with --force.
  (tmp_path / "o").mkdir()
  (tmp_path / "o" / "a.py").write_text("mine\n")
  process = _cli(tmp_path / "a.py", "--output", tmp_path / "o")
  assert process.returncode == 2 and "--force" in process.stdout
  assert (tmp_path / "o" / "a.py").read_text() == "mine\n"
  process = _cli(tmp_path / "a.py", "--output", tmp_path / "o", "--force")
  assert process.returncode == 0
  assert (tmp_path / "o" / "a.py").read_text() == "import tensorflow as tf\n"


# --- TF 1.x code, tf.flags, TPU-only calls -----------------------------------


def test_tf1_only_names_are_listed_with_their_first_lines():
  _, result = _migrated("""\
  import tensorflow as tf
  tf.logging.info("a")
  if tf.gfile.Exists("b"):
    tf.logging.warn("c")
  optimizer = tf.train.AdamOptimizer(0.1)
  step = tf.train.get_or_create_global_step()
  net = tf.contrib.layers.fully_connected(x, 2)
  sess = tf.Session()
  tf.compat.v1.logging.info("kept")
  tf.io.gfile.exists("kept")
  """)
  assert result.tf1 == {"tf.logging": 2, "tf.gfile": 3,
                        "tf.train.AdamOptimizer": 5,
                        "tf.train.get_or_create_global_step": 6,
                        "tf.contrib.layers": 7, "tf.Session": 8}
  assert not result.changes and not result.notes


@pytest.mark.parametrize("imports", [
    "import tensorflow.compat.v1 as tf",
    "from tensorflow.compat import v1 as tf",
])
def test_tf1_names_through_compat_v1_are_tf2_code(imports):
  _, result = _migrated(f"""\
  {imports}
  tf.logging.info("a")
  tf.train.AdamOptimizer(0.1)
  flags = tf.flags
  """)
  assert result.tf1 == {} and not result.changes


def test_tf_flags_move_to_compat_v1_in_uses_and_imports():
  new, result = _migrated("""\
  import tensorflow as tf
  from tensorflow import flags as tf_flags
  from tensorflow import app
  flags = tf.flags
  FLAGS = tf.app.flags.FLAGS
  tf.flags.DEFINE_string("tpu", None, "The TPU.")
  app.flags.DEFINE_bool("use_tpu", False, "On a TPU.")
  """)
  assert new == textwrap.dedent("""\
  import tensorflow as tf
  from tensorflow.compat.v1 import flags as tf_flags
  flags = tf.compat.v1.flags
  FLAGS = tf.compat.v1.flags.FLAGS
  tf.compat.v1.flags.DEFINE_string("tpu", None, "The TPU.")
  tf.compat.v1.flags.DEFINE_bool("use_tpu", False, "On a TPU.")
  """)
  # `from tensorflow import app`, TF 1.x's, went with its last use.
  assert result.tf1 == {}
  again = migrate.migrate_source(new.encode())
  assert not again.changes
  # Used otherwise (tf.app.run), it stays: tf_upgrade_v2's work.
  _, result = _migrated("""\
  from tensorflow import app
  app.flags.DEFINE_bool("use_tpu", False, "On a TPU.")
  app.run(main)
  """)
  assert result.tf1 == {"tf.app": 3}
  assert {note.name: note.why for note in result.notes} == {
      "tensorflow.app": "TF 2 has no tf.app (TF 1.x's), and this file still "
                        "uses app (names with no counterpart here, or the "
                        "module as a value)"}


def test_tpu_only_calls_are_reported_with_what_a_host_run_does():
  new, result = _migrated("""\
  import tensorflow as tf
  from tensorflow.contrib import tpu as contrib_tpu
  resolver = tf.distribute.cluster_resolver.TPUClusterResolver("my-tpu")
  old = tf.contrib.cluster_resolver.TPUClusterResolver("my-tpu")
  strategy = tf.distribute.TPUStrategy(resolver)
  strategy = tf.distribute.experimental.TPUStrategy(resolver)
  contrib_tpu.rewrite(fn)
  tf.compat.v1.tpu.shard(fn)
  tf.compat.v1.tpu.initialize_system()
  tf.tpu.experimental.initialize_tpu_system(resolver)
  contrib_tpu.outside_compilation(fn)
  """)
  # What moves where TF keeps it moves; the rest stays.
  assert "tf.compat.v1.tpu.rewrite(fn)" in new
  assert "tf.compat.v1.tpu.outside_compilation(fn)" in new
  assert "from tensorflow.contrib" not in new
  assert new.count(
      "tf.distribute.cluster_resolver.TPUClusterResolver(") == 1
  # TF 1.x's contrib resolver moves where TF 2 keeps it.
  assert ('old = tf.compat.v1.distribute.cluster_resolver.'
          'TPUClusterResolver("my-tpu")') in new
  for kept in ("tf.distribute.TPUStrategy(",
               "tf.distribute.experimental.TPUStrategy(",
               "tf.compat.v1.tpu.shard(fn)"):
    assert kept in new, kept
  notes = {note.name: note.why for note in result.notes}
  for name in ("tf.distribute.cluster_resolver.TPUClusterResolver",
               "tf.contrib.cluster_resolver.TPUClusterResolver"):
    assert notes[name].startswith("needs a TPU: finds a Cloud TPU")
    assert "give RunConfig no `cluster` or `master`" in notes[name]
  for name in ("tf.distribute.TPUStrategy",
               "tf.distribute.experimental.TPUStrategy"):
    assert notes[name].startswith("needs a TPU: a TPU distribution strategy")
  for name in ("contrib_tpu.rewrite", "tf.compat.v1.tpu.shard"):
    assert notes[name].startswith("needs a TPU: compiles a computation")
  for name in ("tf.compat.v1.tpu.initialize_system",
               "tf.tpu.experimental.initialize_tpu_system"):
    assert notes[name].startswith("needs a TPU: a TPU system call")
  assert not any("outside_compilation" in name for name in notes)
  assert len(notes) == 8


# TF 1.15's `tf.contrib.tpu` and the other TF 1.x spellings the table's
# aliases carry, each with what a program using it becomes (written here
# from TF 1.15's API, apart from the table: a row dropped from the table
# fails its case).
_TF1_SPELLINGS = [
    ("tf.contrib.tpu.TPUEstimator", "estimator_spec.TPUEstimator"),
    ("tf.contrib.tpu.TPUEstimatorSpec", "estimator_spec.TPUEstimatorSpec"),
    ("tf.contrib.tpu.RunConfig", "estimator_spec.RunConfig"),
    ("tf.contrib.tpu.TPUConfig", "estimator_spec.TPUConfig"),
    ("tf.contrib.tpu.InputPipelineConfig",
     "estimator_spec.InputPipelineConfig"),
    ("tf.contrib.tpu.CrossShardOptimizer",
     "tf.compat.v1.tpu.CrossShardOptimizer"),
    ("tf.contrib.tpu.bfloat16_scope", "tf.compat.v1.tpu.bfloat16_scope"),
    ("tf.contrib.tpu.core", "tf.compat.v1.tpu.core"),
    ("tf.contrib.tpu.cross_replica_sum",
     "tf.compat.v1.tpu.cross_replica_sum"),
    ("tf.contrib.tpu.outside_compilation",
     "tf.compat.v1.tpu.outside_compilation"),
    ("tf.contrib.tpu.rewrite", "tf.compat.v1.tpu.rewrite"),
    ("tf.contrib.tpu.replicate", "tf.compat.v1.tpu.replicate"),
    ("tf.contrib.tpu.shard", "tf.compat.v1.tpu.shard"),
    ("tf.contrib.tpu.batch_parallel", "tf.compat.v1.tpu.batch_parallel"),
    ("tf.contrib.tpu.initialize_system",
     "tf.compat.v1.tpu.initialize_system"),
    ("tf.contrib.tpu.shutdown_system", "tf.compat.v1.tpu.shutdown_system"),
    ("tf.contrib.cluster_resolver.TPUClusterResolver",
     "tf.compat.v1.distribute.cluster_resolver.TPUClusterResolver"),
    ("tf.contrib.distribute.TPUStrategy",
     "tf.compat.v1.distribute.experimental.TPUStrategy"),
    ("tf.estimator.tpu.TPUEstimator", "estimator_spec.TPUEstimator"),
    ("tf.estimator.tpu.experimental.EmbeddingConfigSpec",
     "estimator_spec.experimental.EmbeddingConfigSpec"),
    ("tf.tpu.experimental.embedding_column",
     "tpu_embedding_columns.embedding_column"),
]


@pytest.mark.parametrize("spelling,expected", _TF1_SPELLINGS,
                         ids=[s for s, _ in _TF1_SPELLINGS])
def test_each_tf1_spelling_becomes_its_counterpart(spelling, expected):
  new, result = _migrated(f"""\
  import tensorflow as tf
  value = {spelling}
  """)
  assert f"value = {expected}\n" in new
  assert result.tf1 == {}  # the table knows it: not left for tf_upgrade_v2


def test_the_report_has_a_line_per_tf1_file_and_counts_them(tmp_path):
  (tmp_path / "old.py").write_text(
      "import tensorflow as tf\ntf.logging.info('x')\nsess = tf.Session()\n")
  (tmp_path / "new.py").write_text(
      "import tensorflow.compat.v1 as tf\ntf.logging.info('x')\n")
  process = _cli(tmp_path)
  assert process.returncode == 0, process.stderr
  lines = process.stdout.splitlines()
  assert lines[0] == (
      f"{tmp_path / 'old.py'}: TF 1.x code (tf.logging (line 2), tf.Session "
      "(line 3) exist only in TF 1.x): run TF's `tf_upgrade_v2 --intree DIR "
      "--outtree NEW_DIR` (`--infile`/`--outfile` for one file; TF installs "
      "it) first, then migrate its output (docs/migration.md, 'TF 1.x "
      "code').")
  assert lines[-1] == (
      "migrate: 2 Python files, 0 changed (0 changes), 0 names left alone, "
      "0 refused, 1 need TF's tf_upgrade_v2 first (TF 1.x code); nothing "
      "written (give --output DIR or --in-place).")


def _tf_upgrade_v2():
  tool = os.path.join(os.path.dirname(sys.executable), "tf_upgrade_v2")
  return [tool] if os.path.exists(tool) else [
      sys.executable, "-m", "tensorflow.tools.compatibility.tf_upgrade_v2_main"]


@pytest.mark.slow
def test_tf115_trainers_run_after_tf_upgrade_v2_then_migrate(tmp_path):
  """docs/migration.md's order, on two TF 1.15 TPU trainers in public TPU
  code's two habits (tests/data/tf115): migrate names what TF 1.x code
  needs; TF's tf_upgrade_v2 then migrate give programs that train,
  evaluate (and predict) and export, with the flags a TPU launch script
  passes."""
  source = os.path.join(REPO, "tests", "data", "tf115")
  report = _cli(source)
  line, = [line for line in report.stdout.splitlines()
           if line.startswith(os.path.join(source, "trainer.py") + ": ")]
  # Its first six TF 1.x names, by line, and how many more.
  assert line.split(": ", 1)[1].startswith(
      "TF 1.x code (tf.python_io (line 33), tf.VarLenFeature (line 49), "
      "tf.FixedLenFeature (line 52), tf.contrib.data (line 60), "
      "tf.parse_single_example (line 61), tf.feature_column.input_layer "
      "(line 83) and 10 more exist only in TF 1.x): run TF's "
      "`tf_upgrade_v2")
  upgraded, migrated = tmp_path / "upgraded", tmp_path / "migrated"
  upgrade = subprocess.run(
      _tf_upgrade_v2() + ["--intree", source, "--outtree", str(upgraded),
                          "--reportfile", str(tmp_path / "upgrade.txt")],
      env=_ENV, capture_output=True, text=True, timeout=300, check=False)
  assert upgrade.returncode == 0, upgrade.stderr[-2000:]
  # What tf_upgrade_v2 leaves as an error is what migrate takes.
  errors = [line for line in (tmp_path / "upgrade.txt").read_text()
            .splitlines() if "ERROR" in line]
  assert errors and all("tf.flags" in line for line in errors), errors
  process = _cli(upgraded, "--output", migrated)
  assert process.returncode == 0, process.stderr
  assert "TF 1.x code" not in process.stdout
  assert "trainer.py:14: tf.flags → tf.compat.v1.flags" in process.stdout
  assert ("left alone: tf.distribute.cluster_resolver.TPUClusterResolver: "
          "needs a TPU") in process.stdout
  # The other habit (tf.contrib modules under aliases, tf.app.flags): the
  # contrib resolver moves where TF 2 keeps it, the contrib imports go.
  assert ("trainer_contrib.py:12: from tensorflow.contrib import "
          "cluster_resolver as contrib_cluster_resolver → (removed)"
          ) in process.stdout
  for name in ("trainer.py", "trainer_contrib.py"):
    text = (migrated / name).read_text()
    assert not _tf_estimator_names(text), name
    code = text.split('"""', 2)[2]  # after the module's docstring
    assert "contrib" not in code, name
  for name, args, step in (
      ("trainer.py", [f"--data_dir={tmp_path / 'data'}", "--use_tpu=false",
                      "--tpu="], "step=6"),
      ("trainer_contrib.py", ["--use_tpu=false"], "step=4")):
    model_dir = tmp_path / name[:-3]
    run = subprocess.run(
        [sys.executable, str(migrated / name), f"--model_dir={model_dir}",
         *args], cwd=tmp_path, env=dict(_ENV, PYTHONPATH=REPO),
        capture_output=True, text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    result = [line.split() for line in run.stdout.splitlines()
              if line.startswith("RESULT ")]
    assert len(result) == 1 and result[0][1] == step, run.stdout
    export = result[0][-1].split("=", 1)[1]
    assert export.startswith(str(model_dir / "export"))
    assert os.path.isfile(os.path.join(export, "saved_model.pb"))


def test_files_that_are_not_regular_or_too_large_are_refused_unread(
    tmp_path):
  tree = tmp_path / "tree"
  tree.mkdir()
  os.mkfifo(tree / "pipe.py")
  with open(tree / "huge.py", "wb") as handle:
    handle.truncate(migrate.MAX_FILE_BYTES + 1)
  (tree / "fine.py").write_text("import tensorflow as tf\n"
                                "tf.estimator.tpu.RunConfig()\n")
  process = _cli(tree, "--output", tmp_path / "out")
  assert process.returncode == 2, process.stderr
  lines = process.stdout.splitlines()
  assert (f"{tree / 'pipe.py'}: refused: cannot read it (it is a FIFO, not "
          "a regular file)") in lines
  assert (f"{tree / 'huge.py'}: refused: cannot read it (it holds "
          f"{migrate.MAX_FILE_BYTES + 1:,} bytes, more than the "
          f"{migrate.MAX_FILE_BYTES:,} allowed)") in lines
  assert (tmp_path / "out" / "fine.py").read_text().endswith(
      "estimator_spec.RunConfig()\n")
  assert sorted(os.listdir(tmp_path / "out")) == ["fine.py"]
