"""Public TPU embedding programs run unchanged but for their imports.

`tests/tpu_programs.py` holds two programs of the tensorflow/tpu repository
rewritten small (NCF, and the TPU embedding sample with shared columns and
VarLen TFRecords), keeping their habits. Each runs as a script in its own
process (the originals call `tf.disable_v2_behavior()`):

* with our classes and `use_tpu=True`: no TPU here, so the model runs on
  the host emulating `tpu_config.num_shards` cores (8 per host): input_fn
  gets TF's `params['context']` and per-call `batch_size`, model_fn the
  global batch;
* with our classes and `use_tpu=False`: no context, global batch;
* with TF's own classes and `TPUEstimator(use_tpu=False)` (TF's CPU path,
  which trains the tables with the model's optimizer and cannot run
  `CrossShardOptimizer`, so its reference drops that wrapper): that the
  program itself is sound; only what should agree is compared.

Checked: training runs N steps and resumes from the checkpoint in the next
cycle, the loss goes down on learnable generated data, the tables change
exactly in the rows whose ids occurred, evaluate returns the program's
metrics, and the params/context each input_fn and model_fn call sees.
The last test runs a multi-host input_fn (files sharded by the context) on
16 emulated cores (2 hosts) under PER_HOST_V2 and PER_HOST_V1 (the two input
deployments TPU embedding allows).
"""
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import estimator_spec
from tests import tpu_programs as programs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = estimator_spec.estimator.ModeKeys.TRAIN
EVAL = estimator_spec.estimator.ModeKeys.EVAL

# (api, use_tpu) of the three runs of each program.
# The reference run uses TF's own TPUEstimator: TF 2.15 only.
RUNS = [pytest.param("ours", True, id="ours-use_tpu"),
        pytest.param("ours", False, id="ours-cpu"),
        pytest.param("tensorflow_cpu", False, id="tensorflow-cpu-reference",
                     marks=pytest.mark.tf215)]


def _run_program(tmp_path, request, timeout=420):
  """Runs one program in its own process; returns its recorded result.
  Fails the test with the program's traceback if it raised."""
  request_path = tmp_path / "request.json"
  result_path = tmp_path / "result.json"
  request_path.write_text(json.dumps(request))
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  process = subprocess.run(
      [sys.executable, "-m", "tests.tpu_programs", str(request_path),
       str(result_path)],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
  result = (json.loads(result_path.read_text())
            if result_path.exists() else {})
  if process.returncode != 0 or "error" in result:
    error = result.get("error") or {}
    pytest.fail(
        f"{request['program']} ({request['api']}, use_tpu="
        f"{request['settings']['use_tpu']}) failed:\n"
        f"{error.get('traceback') or process.stderr[-6000:]}", pytrace=False)
  return result


# --- checkpoints --------------------------------------------------------------


def _variable(reader, name):
  """The checkpoint variable called `name` or ending in `/name`."""
  names = [n for n in reader.get_variable_to_shape_map()
           if n == name or n.endswith("/" + name)]
  assert len(names) == 1, (name, sorted(reader.get_variable_to_shape_map()))
  return names[0]


def _tables(model_dir, names, step=None):
  """{name: (checkpoint name, table)} at `step` (default: the latest)."""
  path = (os.path.join(model_dir, f"model.ckpt-{step}") if step is not None
          else model_dir)
  reader = tf.train.load_checkpoint(path)
  out = {}
  for name in names:
    full = _variable(reader, name)
    out[name] = (full, reader.get_tensor(full))
  return out, reader


def _changed_rows(before, after):
  return set(np.nonzero(np.any(before != after, axis=1))[0].tolist())


def _assert_table_slots(reader, table, api):
  """Ours: the model's optimizer (handed `tf.trainable_variables()`) made
  no slots for the table (the spec's optimizer trains it). TF's CPU path:
  the model's optimizer trained the table."""
  stored = reader.get_variable_to_shape_map()
  model_slots = [f"{table}/Adam", f"{table}/Adam_1"]
  if api == "ours":
    assert not [s for s in model_slots if s in stored], (
        "the model's optimizer trained an embedding table", table,
        sorted(s for s in stored if s.startswith(table)))
  else:
    assert all(s in stored for s in model_slots), sorted(stored)


def _assert_losses_decrease(steps, window):
  losses = [s["loss"] for s in steps]
  assert all(math.isfinite(x) for x in losses), losses
  first = np.mean(losses[:window])
  last = np.mean(losses[-window:])
  assert last < 0.9 * first, losses


# --- params and context -------------------------------------------------------


def _calls(result, kind, phase):
  return [c for c in result[kind] if c["phase"] == phase]


def _assert_input_fn_calls(calls, use_tpu, batch_size, hosts=1, cores=1,
                           invocations=None, replicas_consumed=None,
                           host_of=lambda index: index):
  """The input_fn calls of one train()/evaluate() call follow TF's rules.

  use_tpu=False: one call, the global batch, no context. use_tpu=True:
  `invocations` calls (default: one per host), each with `batch_size`,
  and a context saying which call it is (indices 0..invocations-1), how
  many replicas it feeds, which host it runs on, and the topology."""
  assert calls, "input_fn was never called"
  for call in calls:
    assert call["use_tpu"] is use_tpu, call
    assert call["batch_size"] == batch_size, call
  if not use_tpu:
    assert [c["context"] for c in calls] == [None], calls
    return
  invocations = hosts if invocations is None else invocations
  if replicas_consumed is None:
    replicas_consumed = cores // hosts
  assert len(calls) == invocations, calls
  indices = []
  for call in calls:
    context = call["context"]
    assert context is not None, ("no params['context'] with use_tpu=True",
                                 call)
    assert isinstance(context["deployment"], list), context
    device, index, total, consumed = context["deployment"]
    assert tf.DeviceSpec.from_string(device).device_type == "CPU", context
    assert (total, consumed) == (invocations, replicas_consumed), context
    assert context["current_host"] == host_of(index), context
    assert context["num_hosts"] == hosts, context
    assert context["num_replicas"] == cores, context
    assert context["num_of_replicas_per_host"] == cores // hosts, context
    indices.append(index)
  assert sorted(indices) == list(range(invocations)), calls


def _assert_model_fn_calls(calls, mode, use_tpu, batch_size, cores,
                           activation_shapes):
  calls = [c for c in calls if c["mode"] == mode]
  assert calls, f"model_fn was never called in {mode}"
  for call in calls:
    assert call["use_tpu"] is use_tpu, call
    assert call["batch_size"] == batch_size, call
    if use_tpu:
      context = call["context"]
      assert context is not None, ("no params['context'] with use_tpu=True",
                                   call)
      # model_fn runs once, as one replica, on the global batch.
      assert (context["num_replicas"], context["num_hosts"]) == (1, 1), (
          context)
    else:
      assert call["context"] is None, call
    if activation_shapes is not None:
      assert call["activations"] == activation_shapes, call


# =============================================================================
# NCF: combiner=None columns on squeezed dense ids, Adam embedding optimizer.
# =============================================================================

NCF_STEPS = 10  # per cycle
NCF_CYCLES = 2
NCF_BATCH = 64
NCF_EVAL_BATCH = 128  # 100 rounded up to (negatives + 1) * shards
NCF_EVAL_STEPS = 2
NCF_SHARDS = 8


@pytest.mark.slow
@pytest.mark.parametrize("api,use_tpu", RUNS)
def test_ncf_program(tmp_path, api, use_tpu):
  data_dir = tmp_path / "data"
  data_dir.mkdir()
  paths, used = programs.ncf_write_data(
      str(data_dir), NCF_CYCLES, NCF_STEPS, NCF_BATCH, NCF_EVAL_BATCH,
      NCF_EVAL_STEPS, NCF_SHARDS)
  model_dir = str(tmp_path / "model")
  settings = dict(
      paths, model_dir=model_dir, use_tpu=use_tpu, batch_size=NCF_BATCH,
      eval_batch_size=100, num_factors=4, layers=[8, 8, 4],
      learning_rate=0.1, adam_sum_inside_sqrt=True,
      # The flag's default (False) in two runs, True in ours on the CPU.
      lazy_adam=(api == "ours" and not use_tpu), iterations_per_loop=5,
      num_tpu_shards=NCF_SHARDS, train_epochs=NCF_CYCLES,
      # Seeded: the loss-decrease check below must not depend on the draw
      # of the unseeded Keras initializers.
      seed=1)
  result = _run_program(tmp_path, {"program": "ncf", "api": api,
                                   "settings": settings})

  # Training ran NCF_STEPS per cycle; the second train() resumed from the
  # first one's checkpoint (global step 2 * NCF_STEPS, not NCF_STEPS).
  assert [c["global_step"] for c in result["cycles"]] == [
      NCF_STEPS * (i + 1) for i in range(NCF_CYCLES)], result["cycles"]
  assert len(result["steps"]) == NCF_STEPS * NCF_CYCLES
  _assert_losses_decrease(result["steps"], window=4)

  # Evaluation returns the program's metrics.
  for cycle in result["cycles"]:
    assert {"accuracy", "auc", "loss", "global_step"} <= set(cycle), cycle
    assert all(math.isfinite(v) for v in cycle.values()), cycle
    assert 0.0 <= cycle["accuracy"] <= 1.0 and 0.0 <= cycle["auc"] <= 1.0
  assert result["cycles"][-1]["auc"] > 0.6, result["cycles"]

  # The tables changed exactly where ids occurred (with a non-zero loss
  # weight somewhere): never-seen users and items kept their initial rows.
  names = ["user_id_embedding/embedding_weights",
           "item_id_embedding/embedding_weights"]
  initial, _ = _tables(model_dir, names, step=0)
  final, reader = _tables(model_dir, names)
  assert reader.get_tensor("global_step") == NCF_STEPS * NCF_CYCLES
  for name, key, rows in (
      (names[0], "user_id", programs.NCF_SIZES["num_users"]),
      (names[1], "item_id", programs.NCF_SIZES["num_items"])):
    assert final[name][1].shape == (rows, 8)
    changed = _changed_rows(initial[name][1], final[name][1])
    occurred = set().union(*[u[key] for u in used])
    weighted = set().union(*[u["valid_" + key] for u in used])
    assert changed <= occurred, sorted(changed - occurred)
    assert weighted <= changed, sorted(weighted - changed)
    _assert_table_slots(reader, final[name][0], api)
    if api == "ours":
      assert reader.has_tensor(final[name][0] + "/Adam/m"), sorted(
          reader.get_variable_to_shape_map())

  # What input_fn and model_fn saw.
  expected_shapes = lambda batch: {"user_id_embedding": [batch, 8],
                                   "item_id_embedding": [batch, 8]}
  for cycle in range(NCF_CYCLES):
    for phase, mode, batch in ((f"train {cycle}", TRAIN, NCF_BATCH),
                               (f"eval {cycle}", EVAL, NCF_EVAL_BATCH)):
      per_call = batch // NCF_SHARDS if use_tpu else batch
      _assert_input_fn_calls(_calls(result, "input_fn", phase), use_tpu,
                             per_call, hosts=1, cores=NCF_SHARDS)
      if api == "ours":
        _assert_model_fn_calls(
            _calls(result, "model_fn", phase), mode, use_tpu, batch,
            NCF_SHARDS, expected_shapes(batch))


# =============================================================================
# The embedding sample: shared combiner=None columns and a 'sum' column on
# VarLen TFRecords, input_fn sharding its files by params['context'].
# =============================================================================

EMB_STEPS = 8  # per cycle: two passes over the training files
EMB_CYCLES = 3
EMB_BATCH = 32
EMB_EVAL_STEPS = 2
EMB_SHARDS = 8
SHARED_TABLE = "feature_1_feature_2_shared_embedding"
TABLE_2 = "feature_3_embedding/embedding_weights"


def _embedding_settings(tmp_path, use_tpu, **overrides):
  data_dir = tmp_path / "data"
  data_dir.mkdir()
  train_pattern, used = programs.embedding_write_data(
      str(data_dir), "train", files=4, per_file=EMB_BATCH, seed=1)
  eval_pattern, _ = programs.embedding_write_data(
      str(data_dir), "eval", files=2, per_file=EMB_BATCH, seed=2)
  settings = dict(
      train_dataset_path=train_pattern, eval_dataset_path=eval_pattern,
      model_dir=str(tmp_path / "model"), use_tpu=use_tpu,
      global_batch_size=EMB_BATCH, eval_global_batch_size=EMB_BATCH,
      train_epochs=EMB_CYCLES, steps_per_epoch=EMB_STEPS,
      num_eval_steps=EMB_EVAL_STEPS, num_shards=EMB_SHARDS,
      input_pipeline="PER_HOST_V2", pipeline_execution=False)
  settings.update(overrides)
  return settings, used


def _assert_embedding_tables(model_dir, used, api, steps):
  initial, _ = _tables(model_dir, [SHARED_TABLE, TABLE_2], step=0)
  final, reader = _tables(model_dir, [SHARED_TABLE, TABLE_2])
  assert reader.get_tensor("global_step") == steps
  for name, key, shape in (
      (SHARED_TABLE, "table_1", (programs.EMBEDDING_SIZES["table_1_rows"],
                                 8)),
      (TABLE_2, "table_2", (programs.EMBEDDING_SIZES["table_2_rows"], 4))):
    assert final[name][1].shape == shape
    changed = _changed_rows(initial[name][1], final[name][1])
    # Every training example was read (whole passes over the files).
    occurred = set().union(*[u[key] for u in used])
    assert changed == occurred, (name, sorted(changed - occurred),
                                 sorted(occurred - changed))
    _assert_table_slots(reader, final[name][0], api)
    if api == "ours":
      assert reader.has_tensor(final[name][0] + "/Adagrad"), sorted(
          reader.get_variable_to_shape_map())


@pytest.mark.slow
@pytest.mark.parametrize("api,use_tpu", RUNS)
def test_embedding_program(tmp_path, api, use_tpu):
  settings, used = _embedding_settings(
      tmp_path, use_tpu,
      # The sample's default (False), and True in ours on the CPU.
      pipeline_execution=(api == "ours" and not use_tpu))
  request = {"program": "embedding", "api": api, "settings": settings,
             # Off the TPU there is no params['context']: the sample's
             # input_fn fails (KeyError) as on TF's CPU path; then its
             # one-line fix runs.
             "expect_missing_context": not use_tpu}
  result = _run_program(tmp_path, request)
  if not use_tpu:
    assert result["notes"]["as_is"] == "KeyError: 'context'", result["notes"]
    assert result["notes"]["as_is_input_fn_calls"] == 1, result["notes"]

  total = EMB_STEPS * EMB_CYCLES
  assert [c["global_step"] for c in result["cycles"]] == [
      EMB_STEPS * (i + 1) for i in range(EMB_CYCLES)], result["cycles"]
  assert len(result["steps"]) == total
  _assert_losses_decrease(result["steps"], window=4)
  eval_losses = [c["loss"] for c in result["cycles"]]
  assert eval_losses[-1] < eval_losses[0], eval_losses
  for cycle in result["cycles"]:
    assert {"recall@1", "recall@5", "loss", "global_step"} <= set(cycle)
    assert 0.0 <= cycle["recall@1"] <= cycle["recall@5"] <= 1.0, cycle

  _assert_embedding_tables(settings["model_dir"], used, api, total)

  shapes = lambda batch: {"feature_1_shared_embedding": [batch, 8],
                          "feature_2_shared_embedding": [batch, 8],
                          "feature_3_embedding": [batch, 4]}
  for cycle in range(EMB_CYCLES):
    for phase, mode in ((f"train {cycle}", TRAIN), (f"eval {cycle}", EVAL)):
      per_call = EMB_BATCH // EMB_SHARDS if use_tpu else EMB_BATCH
      _assert_input_fn_calls(_calls(result, "input_fn", phase), use_tpu,
                             per_call, hosts=1, cores=EMB_SHARDS)
      if api == "ours":
        # Static activations [32, D] in TRAIN although the parsed
        # SparseTensors' dense_shape is dynamic; in EVAL as well, since
        # input_fn batches with drop_remainder=True (static batch: the
        # SparseTensors' shape is [32, None], the label's [32, 1]).
        _assert_model_fn_calls(
            _calls(result, "model_fn", phase), mode, use_tpu, EMB_BATCH,
            EMB_SHARDS, shapes(EMB_BATCH))


# =============================================================================
# A multi-host input_fn on 2 emulated hosts x 8 cores.
# =============================================================================

MH_SHARDS = 16
MH_HOSTS = 2
MH_BATCH = 32  # global
MH_FILES = 16
MH_PER_FILE = 4
MH_STEPS = 4  # two passes over the data in every deployment
MH_IDS_PER_FILE = 3  # file k: table 1 ids [3k, 3k + 3), table 2 [6k, 6k + 6)

# pipeline: (input_fn batch_size, calls, replicas fed per call, host of call)
MH_DEPLOYMENTS = {
    # One call per host, the per-core batch; each host's dataset feeds its 8
    # cores one batch each per step.
    "PER_HOST_V2": (MH_BATCH // MH_SHARDS, MH_HOSTS, 8, lambda i: i),
    # One call per host, the host's batch.
    "PER_HOST_V1": (MH_BATCH // MH_HOSTS, MH_HOSTS, 8, lambda i: i),
}
# PER_SHARD_V1 and BROADCAST: TF's TPUEstimator refuses them with TPU
# embedding, and so does ours (tests/test_conformance_estimator.py:
# test_embedding_refuses_other_input_pipelines); their deployments without
# an embedding spec: test_tpu_context_without_embeddings there.


def _files_of_step(step):
  """The file each example of a step's global batch came from (feature_1
  holds one id per example, from its file's own range)."""
  ids = step["feature_1"]["values"]
  assert len(ids) == MH_BATCH, step
  return [i // MH_IDS_PER_FILE for i in ids]


@pytest.mark.slow
@pytest.mark.parametrize("pipeline", list(MH_DEPLOYMENTS))
def test_multi_host_input_fn_sharding_files_by_context_runs_on_the_host(
    tmp_path, pipeline):
  """An input_fn that shards its files by params['context'] runs unchanged
  with use_tpu=True on the host (16 cores = 2 emulated hosts): it is called
  as TF calls it under `per_host_input_for_training`, with TF's params, and
  every training step's global batch concatenates what each call feeds."""
  data_dir = tmp_path / "data"
  data_dir.mkdir()
  # File k holds only its own ids.
  ranges = [{"table_1": (MH_IDS_PER_FILE * k, MH_IDS_PER_FILE * (k + 1)),
             "table_2": (6 * k, 6 * (k + 1))} for k in range(MH_FILES)]
  pattern, used = programs.embedding_write_data(
      str(data_dir), "part", files=MH_FILES, per_file=MH_PER_FILE, seed=3,
      id_ranges=ranges, label_is_file=True)
  settings = dict(
      train_dataset_path=pattern, eval_dataset_path=pattern,
      model_dir=str(tmp_path / "model"), use_tpu=True,
      global_batch_size=MH_BATCH, eval_global_batch_size=MH_BATCH,
      train_epochs=1, steps_per_epoch=MH_STEPS, num_eval_steps=1,
      num_shards=MH_SHARDS, input_pipeline=pipeline,
      pipeline_execution=False)
  result = _run_program(tmp_path, {"program": "multihost", "api": "ours",
                                   "settings": settings})
  # The host TPUEstimator, not TF's (the program's use_tpu=True names no TPU).
  host_class = estimator_spec.TPUEstimator
  assert result["notes"]["estimator_class"] == (
      f"{host_class.__module__}.{host_class.__name__}"), result["notes"]

  batch_size, calls, consumed, host_of = MH_DEPLOYMENTS[pipeline]
  _assert_input_fn_calls(result["input_fn"], True, batch_size,
                         hosts=MH_HOSTS, cores=MH_SHARDS, invocations=calls,
                         replicas_consumed=consumed, host_of=host_of)
  _assert_model_fn_calls(result["model_fn"], TRAIN, True, MH_BATCH,
                         MH_SHARDS, {"feature_1_shared_embedding": [MH_BATCH,
                                                                     8],
                                     "feature_2_shared_embedding": [MH_BATCH,
                                                                     8],
                                     "feature_3_embedding": [MH_BATCH, 4]})
  for call in result["model_fn"]:
    assert call["context"]["num_hosts"] == 1, call  # one replica, one host

  # The input_fn shards the files (in name order) by its call index: with
  # one call per host, host 0 reads the even files and host 1 the odd ones;
  # with one call per core, call k reads file k.
  assert len(result["steps"]) == MH_STEPS
  seen = set()
  for step in result["steps"]:
    files = _files_of_step(step)
    if calls == MH_HOSTS:
      parity = [f % 2 for f in files]
      assert (parity.count(0), parity.count(1)) == (16, 16), files
    elif calls == MH_SHARDS:
      assert sorted(files) == sorted(list(range(MH_FILES)) * 2), files
    seen |= set(files)
  assert seen == set(range(MH_FILES)), seen

  # Training read every file: exactly the ids of all files moved.
  _assert_embedding_tables(settings["model_dir"], used, "ours", MH_STEPS)
