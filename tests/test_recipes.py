"""The recipes of docs/recipes.md, each run as written there (tiny models).

1. A TPU job's checkpoint (tables in `mod` partitions over the job's hosts,
   no recorded strategy, TF's TPU slot names) evaluated and trained on by
   `estimator_spec.TPUEstimator` on CPU: NumPy predictions from the job's
   row-order tables; one more step moves only the rows looked up and adds
   to the restored Adagrad accumulators.
2. Our checkpoint back to a TPU job: `convert --to-strategy mod
   --to-shards HOSTS` stores every table and slot as the TPU job's
   partitions (`mod` order, checked against NumPy).
3. Our checkpoint into TF's own `TPUEstimator(use_tpu=False)` whose dense
   optimizer (Adam) is not the spec's (Adagrad): TF's restore fails on the
   missing table slots; `convert_for_tf_cpu` writes what TF restores, and
   TF trains on from our tables.
4. Serving the SavedModel of `export_saved_model` with a parsing receiver:
   `saved_model_cli run --input_examples`, the TF Serving REST body
   (`instances` of `{"b64": ...}` and columnar `inputs`) decoded as TF
   Serving does and run through the signature, and a batch of N examples
   equal to N single calls, all equal to `estimator.predict`.
"""
import base64
import json
import os
import re
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # pylint: disable=g-import-not-at-top
import pytest
import tensorflow as tf

import estimator_spec as es
from estimator_spec import __main__ as cli
from estimator_spec.checkpoints import restore as checkpoints
from estimator_spec.checkpoints import tf_cpu
# The recipes' small model, shared with docs/recipes.md's setups.
from tests import recipe_model
from tests.recipe_model import A_TABLE
from tests.recipe_model import adam
from tests.recipe_model import B
from tests.recipe_model import BC_TABLE
from tests.recipe_model import columns
from tests.recipe_model import D
from tests.recipe_model import data
from tests.recipe_model import HOSTS
from tests.recipe_model import input_fn_for
from tests.recipe_model import mod_partitions
from tests.recipe_model import model_fn_for
from tests.recipe_model import our_estimator
from tests.recipe_model import our_spec
from tests.recipe_model import TABLES
from tests.recipe_model import tpu_job_checkpoint
from tests.recipe_model import V

fc = tf.feature_column
v1 = tf.compat.v1
TF_TPU = v1.tpu.experimental
TF_EST_TPU = recipe_model.TF_EST_TPU  # the oracle: TF 2.15 only


def tf_estimator(model_dir, dense_optimizer):
  """TF 2.15's own TPUEstimator on its CPU path, TF's columns."""
  cols = columns("tf")
  spec = TF_EST_TPU.experimental.EmbeddingConfigSpec(
      feature_columns=list(cols),
      optimization_parameters=TF_TPU.AdagradParameters(0.1))
  return TF_EST_TPU.TPUEstimator(
      model_fn=model_fn_for(cols, TF_EST_TPU.TPUEstimatorSpec,
                            dense_optimizer),
      config=TF_EST_TPU.RunConfig(model_dir=str(model_dir)),
      use_tpu=False, train_batch_size=B, eval_batch_size=B,
      predict_batch_size=B, embedding_config_spec=spec)


def values(model_dir):
  reader = tf.train.load_checkpoint(str(model_dir))
  return {name: reader.get_tensor(name)
          for name in reader.get_variable_to_shape_map()}


def predict_all(estimator, features):
  batches = list(estimator.predict(input_fn_for(features, repeat=False),
                                   yield_single_examples=False))
  return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


# ---------------------------------------------------------------------------
# 1. A TPU job's checkpoint on CPU.

def numpy_logits(state, features):
  x = np.concatenate([
      state[A_TABLE][features["a"]].mean(axis=1),
      state[BC_TABLE][features["b"]].sum(axis=1),
      state[BC_TABLE][features["c"]].sum(axis=1)], axis=1)
  return x @ state["out/kernel"] + state["out/bias"], x


@pytest.mark.parametrize("num_shards", [16, None])
def test_tpu_job_checkpoint_evaluates_and_trains_on_cpu(tmp_path, num_shards):
  model_dir = tmp_path / "tpu_job"
  job = tpu_job_checkpoint(model_dir)
  features, labels = data(n=16)
  # The recipe: the job's spec (partition_strategy='mod'), its topology
  # (num_shards=16) or none, use_tpu=False, the job's model_dir.
  estimator = our_estimator(model_dir, adam, num_shards=num_shards,
                            strategy="mod", batch=16)
  logits, x = numpy_logits(job, features)
  predicted = predict_all(estimator, features)
  np.testing.assert_allclose(predicted["x"], x, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(predicted["logits"], logits, rtol=1e-5,
                             atol=1e-6)
  loss = estimator.evaluate(input_fn_for(features, labels, repeat=False))
  np.testing.assert_allclose(loss["loss"], np.mean((logits - labels)**2),
                             rtol=1e-5)

  estimator.train(input_fn_for(features, labels), max_steps=101)
  after = values(model_dir)
  assert int(after["global_step"]) == 101
  layout_after = num_shards // 8 if num_shards else 1
  for table, ids in ((A_TABLE, features["a"]),
                     (BC_TABLE, np.concatenate([features["b"],
                                                features["c"]]))):
    accumulator = after[table + "/Adagrad"]
    rows = es.ShardLayout(V, layout_after, "mod")
    accumulator = rows.join(np.split(accumulator, rows.offsets[1:]))
    looked_up = np.zeros(V, bool)
    looked_up[np.unique(ids)] = True
    # Adagrad adds g^2 to the job's accumulators of the rows looked up.
    grew = np.any(accumulator > job[table + "/Adagrad"], axis=1)
    np.testing.assert_array_equal(grew[~looked_up], False, err_msg=table)
    assert grew[looked_up].any(), table
    np.testing.assert_array_equal(accumulator[~looked_up],
                                  job[table + "/Adagrad"][~looked_up])


# ---------------------------------------------------------------------------
# 2. Back to the TPU job.


def tpu_job_spec():
  """`python -m estimator_spec convert tests.test_recipes:tpu_job_spec`."""
  return our_spec(columns("ours"), strategy="mod")


def test_our_checkpoint_converts_to_the_tpu_jobs_layout(tmp_path):
  features, labels = data()
  ours_dir = tmp_path / "ours"
  ours = our_estimator(ours_dir, adam, strategy="mod")  # one partition
  ours.train(input_fn_for(features, labels), max_steps=2)
  mine = values(ours_dir)
  output = tmp_path / "for_tpu" / "model.ckpt-2"
  assert cli.main(["convert", "tests.test_recipes:tpu_job_spec",
                   "--model-dir", str(ours_dir), "--output", str(output),
                   "--to-strategy", "mod", "--to-shards", str(HOSTS)]) == 0
  converted = values(output.parent)
  stored = checkpoints.stored_partitions(str(output))
  for table in TABLES:
    for name in (table, table + "/Adagrad"):
      assert stored[name] == HOSTS, name
      np.testing.assert_array_equal(
          converted[name], np.concatenate(mod_partitions(mine[name])),
          err_msg=name)
  for name in mine:
    if not name.startswith(TABLES) and name != checkpoints.LAYOUT_TENSOR:
      np.testing.assert_array_equal(converted[name], mine[name], err_msg=name)
  # A run laid out as the TPU job (2 hosts) predicts what ours did.
  job = our_estimator(output.parent, adam, num_shards=16, strategy="mod",
                      batch=16)
  np.testing.assert_allclose(predict_all(job, features)["logits"],
                             predict_all(ours, features)["logits"],
                             rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------------------
# 3. Keep training in TF's TPUEstimator(use_tpu=False).


def test_tf_cpu_path_cannot_restore_our_checkpoint_as_is(tmp_path):
  features, labels = data()
  ours = our_estimator(tmp_path, adam)
  ours.train(input_fn_for(features, labels), max_steps=2)
  names = set(values(tmp_path))
  assert f"{A_TABLE}/Adagrad" in names  # the spec's slot
  assert f"{A_TABLE}/Adam" not in names  # what TF's Adam wants
  with pytest.raises(tf.errors.NotFoundError,
                     match=r"embedding_weights/Adam.* not found|"
                     r"shared_embedding/Adam.* not found"):
    tf_estimator(tmp_path, adam).train(input_fn_for(features, labels),
                                       max_steps=4)


def test_converted_checkpoint_trains_on_in_tf_cpu_path(tmp_path,
                                                      monkeypatch):
  features, labels = data()
  ours_dir, tf_dir = tmp_path / "ours", tmp_path / "tf"
  ours = our_estimator(ours_dir, adam)
  ours.train(input_fn_for(features, labels), max_steps=3)
  expected = predict_all(ours, features)

  # The recipe (recording which variables of TF's graph are initialized).
  estimator = tf_estimator(tf_dir, adam)
  initialized = []
  with monkeypatch.context() as patch:
    initializer = tf.compat.v1.variables_initializer
    patch.setattr(tf.compat.v1, "variables_initializer", lambda variables: (
        initialized.extend(v.op.name for v in variables),
        initializer(variables))[1])
    written = tf_cpu.convert_for_tf_cpu(
        estimator, input_fn_for(features, labels), str(ours_dir),
        batch_size=B)
  # What the checkpoint holds is restored, never initialized first: the
  # graph holds the tables once.
  assert set(written.copied) & set(initialized) == set()
  assert set(written.initialized) <= set(initialized)

  theirs, mine = values(tf_dir), values(ours_dir)
  assert written.prefix == str(tf_dir / "model.ckpt-3")
  for table in TABLES:
    np.testing.assert_array_equal(theirs[table], mine[table])
    for slot in ("Adam", "Adam_1"):  # the dense optimizer's table slots
      np.testing.assert_array_equal(theirs[f"{table}/{slot}"], 0)
      assert f"{table}/{slot}" in written.initialized
    assert f"{table}/Adagrad" in written.left_out
    assert f"{table}/Adagrad" not in theirs
  for name in ("out/kernel", "out/bias", "out/kernel/Adam", "beta1_power",
               "beta2_power", "global_step"):
    np.testing.assert_array_equal(theirs[name], mine[name], err_msg=name)
    assert name in written.copied
  assert checkpoints.LAYOUT_TENSOR in written.left_out

  # TF's CPU path restores it: same predictions as ours, then trains on.
  np.testing.assert_allclose(predict_all(estimator, features)["logits"],
                             expected["logits"], rtol=1e-6, atol=1e-6)
  losses = []

  class Loss(tf.compat.v1.train.SessionRunHook):

    def before_run(self, run_context):
      return tf.compat.v1.train.SessionRunArgs(
          tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.LOSSES)[0])

    def after_run(self, run_context, run_values):
      losses.append(run_values.results)

  estimator.train(input_fn_for(features, labels), max_steps=5, hooks=[Loss()])
  after = values(tf_dir)
  assert int(after["global_step"]) == 5
  assert len(losses) == 2 and np.isfinite(losses).all()
  for table in TABLES:  # TF's Adam moved the tables and filled its slots
    assert not np.array_equal(after[table], mine[table]), table
    assert np.any(after[f"{table}/Adam"] != 0), table


def test_mod_tables_need_the_spec_and_come_in_row_order(tmp_path):
  features, labels = data(n=16)
  ours_dir = tmp_path / "ours"
  # 16 cores = 2 hosts: tables stored in 2 `mod` partitions.
  ours = our_estimator(ours_dir, adam, num_shards=16, strategy="mod",
                       batch=16)
  ours.train(input_fn_for(features, labels), max_steps=1)
  assert checkpoints.stored_partitions(str(ours_dir))[A_TABLE] == 2
  expected = predict_all(ours, features)

  estimator = tf_estimator(tmp_path / "tf", adam)
  with pytest.raises(ValueError, match="pass `spec=`"):
    tf_cpu.convert_for_tf_cpu(estimator, input_fn_for(features, labels),
                              str(ours_dir), batch_size=B)
  assert not (tmp_path / "tf").exists()  # nothing written
  tf_cpu.convert_for_tf_cpu(estimator, input_fn_for(features, labels),
                            str(ours_dir), batch_size=B,
                            spec=our_spec(columns("ours"), strategy="mod"))
  stored = values(ours_dir)[A_TABLE]
  layout = es.ShardLayout(V, 2, "mod")
  rows = layout.join(np.split(stored, layout.offsets[1:]))
  np.testing.assert_array_equal(values(tmp_path / "tf")[A_TABLE], rows)
  np.testing.assert_allclose(predict_all(estimator, features)["logits"],
                             expected["logits"], rtol=1e-6, atol=1e-6)


def test_conversion_refusals(tmp_path):
  features, labels = data()
  ours_dir = tmp_path / "ours"
  our_estimator(ours_dir, adam).train(input_fn_for(features, labels),
                                      max_steps=1)
  with pytest.raises(TypeError, match="pass the TF estimator"):
    tf_cpu.convert_for_tf_cpu(our_estimator(tmp_path / "x", adam),
                              input_fn_for(features, labels), str(ours_dir))
  # Another model: a table of another vocabulary size.
  with pytest.raises(ValueError, match=re.escape(A_TABLE) + ".*same model"):
    wrong = V + 1

    def other_columns(api):
      del api
      ident = fc.categorical_column_with_identity
      a = TF_TPU.embedding_column(ident("a", wrong), D, combiner="mean")
      b, c = TF_TPU.shared_embedding_columns([ident("b", V), ident("c", V)],
                                             D, combiner="sum")
      return a, b, c

    cols = other_columns("tf")
    estimator = TF_EST_TPU.TPUEstimator(
        model_fn=model_fn_for(cols, TF_EST_TPU.TPUEstimatorSpec, adam),
        config=TF_EST_TPU.RunConfig(model_dir=str(tmp_path / "tf")),
        use_tpu=False, train_batch_size=B,
        embedding_config_spec=TF_EST_TPU.experimental.EmbeddingConfigSpec(
            feature_columns=list(cols),
            optimization_parameters=TF_TPU.AdagradParameters(0.1)))
    tf_cpu.convert_for_tf_cpu(estimator, input_fn_for(features, labels),
                              str(ours_dir), batch_size=B)
  assert not (tmp_path / "tf").exists()
  # An existing checkpoint in model_dir is kept unless overwrite=True.
  with pytest.raises(ValueError, match="holds the checkpoint to convert"):
    tf_cpu.convert_for_tf_cpu(tf_estimator(ours_dir, adam),
                              input_fn_for(features, labels), str(ours_dir),
                              batch_size=B)
  estimator = tf_estimator(tmp_path / "tf", adam)
  tf_cpu.convert_for_tf_cpu(estimator, input_fn_for(features, labels),
                            str(ours_dir), batch_size=B)
  with pytest.raises(FileExistsError, match="overwrite=True"):
    tf_cpu.convert_for_tf_cpu(estimator, input_fn_for(features, labels),
                              str(ours_dir), batch_size=B)


# ---------------------------------------------------------------------------
# 4. Serving the export.

SAVED_MODEL_CLI = os.path.join(os.path.dirname(sys.executable),
                               "saved_model_cli")


def example_bytes(features, i):
  """Example i of `features` as a serialized tf.Example (recipe 4)."""
  return tf.train.Example(features=tf.train.Features(feature={
      key: tf.train.Feature(int64_list=tf.train.Int64List(
          value=[int(v) for v in values[i]]))
      for key, values in features.items()
  })).SerializeToString()


def rest_body(serialized, columnar=False):
  """The JSON a TF Serving REST client posts to /v1/models/NAME:predict
  (recipe 4): binary strings go as {"b64": ...}."""
  encoded = [{"b64": base64.b64encode(s).decode("ascii")} for s in serialized]
  if columnar:
    return json.dumps({"signature_name": "serving_default",
                       "inputs": {"examples": encoded}})
  return json.dumps({"signature_name": "serving_default",
                     "instances": encoded})


def serve_rest(export_dir, body):
  """What TF Serving does with `body`: decode the b64 strings, run the
  signature, answer row-wise ("predictions") or columnar ("outputs")."""
  request = json.loads(body)
  signature_name = request.get("signature_name", "serving_default")
  if "instances" in request:
    examples = request["instances"]
  else:
    inputs = request["inputs"]
    examples = inputs["examples"] if isinstance(inputs, dict) else inputs
  serialized = [base64.b64decode(e["b64"]) for e in examples]
  loaded = tf.saved_model.load(export_dir, tags=["serve"])
  outputs = loaded.signatures[signature_name](
      examples=tf.constant(serialized))
  outputs = {k: v.numpy().tolist() for k, v in outputs.items()}
  if "instances" in request:
    return json.dumps({"predictions": [
        {k: outputs[k][i] for k in outputs} for i in range(len(serialized))
    ]})
  return json.dumps({"outputs": outputs})


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("export")
  features, labels = data(seed=5)
  estimator = our_estimator(tmp / "model", adam)
  estimator.train(input_fn_for(features, labels), max_steps=3)
  # The recipe: a parsing receiver over the columns' parse spec.
  parse_spec = v1.feature_column.make_parse_example_spec(list(
      columns("ours")))
  serving_input_fn = es.estimator.export.build_parsing_serving_input_receiver_fn(
      parse_spec)
  export_dir = estimator.export_saved_model(str(tmp / "export"),
                                            serving_input_fn).decode()
  serve_features, _ = data(n=6, seed=6)
  batches = list(estimator.predict(input_fn_for(serve_features, repeat=False),
                                   yield_single_examples=False))
  predicted = {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
  return export_dir, serve_features, predicted, tmp


def test_saved_model_cli_run_with_input_examples(exported):
  export_dir, features, predicted, tmp = exported
  examples = json.dumps([{k: [int(v) for v in features[k][i]]
                          for k in ("a", "b", "c")} for i in range(2)])
  outdir = tmp / "cli_out"
  result = subprocess.run(
      [SAVED_MODEL_CLI, "run", "--dir", export_dir, "--tag_set", "serve",
       "--signature_def", "serving_default",
       "--input_examples", f"examples={examples}", "--outdir", str(outdir)],
      capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-2000:]
  for key in ("logits", "x"):
    np.testing.assert_allclose(np.load(outdir / f"{key}.npy"),
                               predicted[key][:2], rtol=1e-6, atol=1e-6,
                               err_msg=key)
  # Without --outdir the values are printed after "Result for output key".
  result = subprocess.run(
      [SAVED_MODEL_CLI, "run", "--dir", export_dir, "--tag_set", "serve",
       "--signature_def", "serving_default",
       "--input_examples", f"examples={examples}"],
      capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-2000:]
  printed = re.search(r"Result for output key logits:\s*(\[\[.*?\]\])",
                      result.stdout, re.S).group(1)
  logits = np.array([float(v) for v in re.findall(r"[-+0-9.e]+", printed)])
  np.testing.assert_allclose(logits, predicted["logits"][:2, 0], rtol=1e-5,
                             atol=1e-6)


@pytest.mark.parametrize("columnar", [False, True])
def test_tf_serving_rest_body(exported, columnar):
  export_dir, features, predicted, _ = exported
  serialized = [example_bytes(features, i) for i in range(len(features["a"]))]
  answer = json.loads(serve_rest(export_dir, rest_body(serialized, columnar)))
  if columnar:
    logits = np.array(answer["outputs"]["logits"])
  else:
    assert len(answer["predictions"]) == len(serialized)
    logits = np.array([p["logits"] for p in answer["predictions"]])
  np.testing.assert_allclose(logits, predicted["logits"], rtol=1e-6,
                             atol=1e-6)


def test_a_batch_gives_what_single_examples_give(exported):
  export_dir, features, predicted, _ = exported
  serialized = [example_bytes(features, i) for i in range(len(features["a"]))]
  serving = tf.saved_model.load(export_dir).signatures["serving_default"]
  batch = serving(examples=tf.constant(serialized))
  assert batch["logits"].shape == (len(serialized), 1)
  singles = [serving(examples=tf.constant([s])) for s in serialized]
  # The lookups agree exactly; the head's matmul may round the last bit
  # differently for another batch shape.
  np.testing.assert_array_equal(
      np.concatenate([s["x"].numpy() for s in singles]), batch["x"].numpy())
  for key in ("logits", "x"):
    np.testing.assert_allclose(
        np.concatenate([s[key].numpy() for s in singles]),
        batch[key].numpy(), rtol=1e-6, atol=1e-7, err_msg=key)
    np.testing.assert_allclose(batch[key].numpy(), predicted[key], rtol=1e-6,
                               atol=1e-6, err_msg=key)
