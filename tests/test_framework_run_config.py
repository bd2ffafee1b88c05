"""The framework's configuration objects (estimator/framework/run_config.py,
tpu_config.py, warm_start.py): `RunConfig` with TF_CONFIG, the TPU
`RunConfig`, `TPUConfig`, `InputPipelineConfig`, `WarmStartSettings`.

The behaviour tests run on both stacks. The `tf215` tests build TF 2.15's
own objects (tensorflow-estimator) from the same arguments and TF_CONFIG
and compare every public property, the session config protos included,
and the kind of error where TF refuses.
"""
import copy
import functools
import json
import os
import pathlib
import threading

import numpy as np
import pytest
import tensorflow as tf

from estimator_spec.cluster import session as session_lib
from estimator_spec.estimator.framework import run_config as run_config_lib
from estimator_spec.estimator.framework import tpu_config as tpu_config_lib
from estimator_spec.estimator.framework import warm_start as warm_start_lib

RunConfig = run_config_lib.RunConfig
TPURunConfig = tpu_config_lib.RunConfig
TPUConfig = tpu_config_lib.TPUConfig
InputPipelineConfig = tpu_config_lib.InputPipelineConfig
WarmStartSettings = warm_start_lib.WarmStartSettings

_CLUSTER = {"chief": ["host0:2222"],
            "worker": ["host1:2222", "host2:2222"],
            "ps": ["host3:2222", "host4:2222"]}
_MASTER_CLUSTER = {"master": ["host0:2222"],
                   "worker": ["host1:2222", "host2:2222"],
                   "ps": ["host3:2222"]}
_FILTERLESS_CLUSTER = dict(_CLUSTER, sidecar=["host9:2222"])


def _task(task_type, index, cluster=None, **extra):
  tf_config = {"cluster": cluster or _CLUSTER,
               "task": {"type": task_type, "index": index}}
  tf_config.update(extra)
  return tf_config


# TF_CONFIGs, by name: the ones TF accepts, then the ones it refuses.
TF_CONFIGS = {
    "unset": None,
    "empty": {},
    "local_worker_task": {"task": {"type": "worker", "index": 0}},
    "local_environment_cloud": {"environment": "cloud"},
    "local_cloud_worker": {"environment": "cloud",
                           "task": {"type": "worker", "index": 0}},
    "local_session_masters": {"session_master": "grpc://m:1",
                              "eval_session_master": "grpc://e:1"},
    "local_service": {"service": {"tpu_worker_job_name": "tpu_worker"}},
    "local_model_dir": {"model_dir": "/tmp/model_dir_of_tf_config"},
    "chief": _task("chief", 0),
    "worker0": _task("worker", 0),
    "worker1": _task("worker", 1),
    "worker1_index_string": _task("worker", "1"),
    "ps0": _task("ps", 0),
    "ps1": _task("ps", 1),
    "evaluator0": _task("evaluator", 0),
    "evaluator7_eval_master": _task("evaluator", 7,
                                    eval_session_master="grpc://e:1"),
    "worker1_rpc_layer": _task("worker", 1, rpc_layer="grpc"),
    "worker1_cloud": _task("worker", 1, environment="cloud"),
    "chief_model_dir": _task("chief", 0,
                             model_dir="/tmp/model_dir_of_tf_config"),
    "worker1_session_master": _task("worker", 1,
                                    session_master="grpc://override:1"),
    "chief_service": _task("chief", 0, service={"name": "platform"}),
    "worker0_evaluator_job": _task(
        "worker", 0, cluster=dict(_CLUSTER, evaluator=["host8:2222"])),
    "sidecar0": _task("sidecar", 0, cluster=_FILTERLESS_CLUSTER),
    "chief_only": _task("chief", 0, cluster={"chief": ["host0:2222"]}),
    "master": _task("master", 0, cluster=_MASTER_CLUSTER),
    "master_worker1": _task("worker", 1, cluster=_MASTER_CLUSTER),
    "master_ps0": _task("ps", 0, cluster=_MASTER_CLUSTER),
    "master_only": _task("master", 0, cluster={"master": ["host0:2222"]}),
    # Refused.
    "worker_only_cluster": _task(
        "worker", 0, cluster={"worker": ["host1:2222", "host2:2222"]}),
    "two_chiefs": _task("chief", 0,
                        cluster=dict(_CLUSTER, chief=["a:1", "b:1"])),
    "chief_and_master": _task(
        "chief", 0, cluster=dict(_CLUSTER, master=["host7:2222"])),
    "master_evaluator": _task("evaluator", 0, cluster=_MASTER_CLUSTER),
    "missing_type": {"cluster": _CLUSTER, "task": {"index": 0}},
    "missing_index": {"cluster": _CLUSTER, "task": {"type": "worker"}},
    "no_task": {"cluster": _CLUSTER},
    "negative_index": _task("worker", -1),
    "negative_evaluator": _task("evaluator", -1),
    "index_out_of_range": _task("worker", 2),
    "unknown_task_type": _task("trainer", 0),
    "local_ps_task": {"task": {"type": "ps", "index": 0}},
    "local_index_1": {"task": {"type": "worker", "index": 1}},
    "service_not_dict": {"service": "platform"},
    "model_dir_empty": {"model_dir": ""},
}


@pytest.fixture(name="set_tf_config")
def fixture_set_tf_config(monkeypatch):
  def set_tf_config(tf_config):
    if tf_config is None:
      monkeypatch.delenv("TF_CONFIG", raising=False)
    else:
      monkeypatch.setenv("TF_CONFIG", json.dumps(tf_config))
  set_tf_config(None)
  return set_tf_config


def _filtered_session_config(filters):
  config = session_lib.default_session_config()
  config.device_filters.extend(filters)
  return config


# --- RunConfig: defaults and arguments --------------------------------------


def test_defaults_without_tf_config(set_tf_config):
  del set_tf_config
  config = RunConfig()
  expected = dict(
      model_dir=None, tf_random_seed=None, save_summary_steps=100,
      save_checkpoints_steps=None, save_checkpoints_secs=600,
      session_config=None, keep_checkpoint_max=5,
      keep_checkpoint_every_n_hours=10000, log_step_count_steps=100,
      train_distribute=None, device_fn=None, protocol=None,
      eval_distribute=None, experimental_distribute=None,
      experimental_max_worker_delay_secs=None,
      session_creation_timeout_secs=7200, checkpoint_save_graph_def=True,
      task_type="worker", task_id=0, master="", evaluation_master="",
      is_chief=True, num_ps_replicas=0, num_worker_replicas=1,
      global_id_in_cluster=0, service=None)
  assert {name: getattr(config, name) for name in expected} == expected
  assert config.cluster_spec == tf.train.ClusterSpec({})
  assert not config.cluster_spec


@pytest.mark.parametrize("steps, secs, expected", [
    ("unset", "unset", (None, 600)),
    (10, "unset", (10, None)),
    ("unset", 30, (None, 30)),
    (None, None, (None, None)),
    (None, "unset", (None, None)),
    ("unset", None, (None, None)),
    (10, None, (10, None)),
    (None, 30, (None, 30)),
])
def test_checkpoint_intervals(set_tf_config, steps, secs, expected):
  del set_tf_config
  kwargs = {}
  if steps != "unset":
    kwargs["save_checkpoints_steps"] = steps
  if secs != "unset":
    kwargs["save_checkpoints_secs"] = secs
  config = RunConfig(**kwargs)
  assert (config.save_checkpoints_steps,
          config.save_checkpoints_secs) == expected


def test_both_checkpoint_intervals_are_refused(set_tf_config):
  del set_tf_config
  with pytest.raises(ValueError, match="save_checkpoints_steps.*cannot both"):
    RunConfig(save_checkpoints_steps=10, save_checkpoints_secs=30)


def test_arguments_are_kept(set_tf_config, tmp_path):
  del set_tf_config
  session_config = tf.compat.v1.ConfigProto(log_device_placement=True)

  def device_fn(op):
    return op.device

  config = RunConfig(
      model_dir=tmp_path, tf_random_seed=3, save_summary_steps=0,
      save_checkpoints_steps=7, session_config=session_config,
      keep_checkpoint_max=0, keep_checkpoint_every_n_hours=0.5,
      log_step_count_steps=9, device_fn=device_fn, protocol="grpc+verbs",
      experimental_max_worker_delay_secs=4,
      session_creation_timeout_secs=11, checkpoint_save_graph_def=False)
  assert config.model_dir == str(tmp_path)
  assert (config.tf_random_seed, config.save_summary_steps,
          config.save_checkpoints_steps, config.save_checkpoints_secs,
          config.keep_checkpoint_max, config.keep_checkpoint_every_n_hours,
          config.log_step_count_steps, config.protocol,
          config.experimental_max_worker_delay_secs,
          config.session_creation_timeout_secs,
          config.checkpoint_save_graph_def) == (
              3, 0, 7, None, 0, 0.5, 9, "grpc+verbs", 4, 11, False)
  assert config.session_config == session_config
  assert config.device_fn is device_fn


def _op_device(op):
  return op.device


class _Placer:

  def __call__(self, op):
    return op.device

  def place(self, op):
    return op.device


# (arguments, the error RunConfig raises, or None when it accepts them)
VALIDATION_CASES = [
    (dict(model_dir=""), ValueError),
    (dict(save_summary_steps=-1), ValueError),
    (dict(save_summary_steps="10"), TypeError),
    (dict(save_summary_steps=0), None),
    (dict(save_summary_steps=None), None),
    (dict(save_checkpoints_steps=-1), ValueError),
    (dict(save_checkpoints_secs=-1), ValueError),
    (dict(save_checkpoints_steps=0), None),
    (dict(session_config="allow_soft_placement: true"), ValueError),
    (dict(keep_checkpoint_max=-1), ValueError),
    (dict(keep_checkpoint_max=None), None),
    (dict(keep_checkpoint_every_n_hours=0), ValueError),
    (dict(log_step_count_steps=0), ValueError),
    (dict(log_step_count_steps=None), None),
    (dict(log_step_count_steps=[1]), TypeError),
    (dict(tf_random_seed=1.5), ValueError),
    (dict(tf_random_seed="1"), ValueError),
    (dict(tf_random_seed=np.int64(1)), ValueError),
    (dict(tf_random_seed=True), None),
    (dict(experimental_max_worker_delay_secs=1.5), ValueError),
    (dict(experimental_max_worker_delay_secs=0), None),
    (dict(session_creation_timeout_secs=0), ValueError),
    (dict(session_creation_timeout_secs=0.5), None),
    (dict(device_fn=3), ValueError),
    (dict(device_fn=lambda x: x), ValueError),
    (dict(device_fn=lambda op, extra: op), ValueError),
    (dict(device_fn=_op_device), None),
    (dict(device_fn=_Placer()), None),
    (dict(device_fn=_Placer().place), None),
    (dict(device_fn=functools.partial(lambda op, extra: op, extra=1)), None),
    (dict(protocol="http"), ValueError),
    (dict(protocol="grpc"), None),
]


@pytest.mark.parametrize("kwargs, error", VALIDATION_CASES)
def test_validation(set_tf_config, kwargs, error):
  del set_tf_config
  if error is None:
    RunConfig(**kwargs)
  else:
    with pytest.raises(error, match="RunConfig: `"):
      RunConfig(**kwargs)


@pytest.mark.parametrize("name", ["train_distribute", "eval_distribute",
                                  "experimental_distribute"])
def test_distribution_arguments_are_refused(set_tf_config, name):
  del set_tf_config
  strategy = tf.distribute.get_strategy()
  with pytest.raises(ValueError, match=f"`{name}`.*TF_CONFIG"):
    RunConfig(**{name: strategy})
  with pytest.raises(ValueError, match=f"`{name}`.*TF_CONFIG"):
    RunConfig().replace(**{name: strategy})
  with pytest.raises(ValueError, match=f"`{name}`"):
    TPURunConfig(**{name: strategy})
  assert getattr(RunConfig().replace(**{name: None}), name) is None
  assert "distribut" in run_config_lib.__doc__


# --- RunConfig: TF_CONFIG ----------------------------------------------------


def _cluster_view(config):
  return (config.task_type, config.task_id, config.master,
          config.evaluation_master, config.is_chief, config.num_ps_replicas,
          config.num_worker_replicas, config.global_id_in_cluster)


@pytest.mark.parametrize("name, view", [
    ("chief", ("chief", 0, "grpc://host0:2222", "", True, 2, 3, 0)),
    ("worker0", ("worker", 0, "grpc://host1:2222", "", False, 2, 3, 1)),
    ("worker1", ("worker", 1, "grpc://host2:2222", "", False, 2, 3, 2)),
    ("worker1_index_string",
     ("worker", 1, "grpc://host2:2222", "", False, 2, 3, 2)),
    ("ps1", ("ps", 1, "grpc://host4:2222", "", False, 2, 3, 4)),
    ("worker1_session_master",
     ("worker", 1, "grpc://override:1", "", False, 2, 3, 2)),
    ("worker1_rpc_layer",
     ("worker", 1, "grpc://host2:2222", "", False, 2, 3, 2)),
    ("evaluator7_eval_master",
     ("evaluator", 7, "", "grpc://e:1", False, 0, 0, None)),
    ("chief_only", ("chief", 0, "", "", True, 0, 1, 0)),
    ("sidecar0", ("sidecar", 0, "grpc://host9:2222", "", False, 2, 3, 1)),
    ("master", ("master", 0, "grpc://host0:2222", "", True, 1, 3, 0)),
    ("master_worker1",
     ("worker", 1, "grpc://host2:2222", "", False, 1, 3, 2)),
    ("master_ps0", ("ps", 0, "grpc://host3:2222", "", False, 1, 3, 3)),
    ("master_only", ("master", 0, "", "", True, 0, 1, 0)),
    ("local_session_masters",
     ("worker", 0, "grpc://m:1", "grpc://e:1", True, 0, 1, 0)),
    ("local_environment_cloud", ("worker", 0, "", "", True, 0, 1, 0)),
])
def test_tf_config_cluster(set_tf_config, name, view):
  set_tf_config(TF_CONFIGS[name])
  config = RunConfig()
  assert _cluster_view(config) == view
  if config.task_type == "evaluator":
    assert config.cluster_spec == tf.train.ClusterSpec({})
  elif "cluster" in TF_CONFIGS[name]:
    assert config.cluster_spec == tf.train.ClusterSpec(
        TF_CONFIGS[name]["cluster"])
  assert config.protocol is None


@pytest.mark.parametrize("name, filters", [
    ("chief", ["/job:ps", "/job:chief"]),
    ("master", ["/job:ps", "/job:master"]),
    ("worker1", ["/job:ps", "/job:worker/task:1"]),
    ("ps0", ["/job:ps", "/job:worker", "/job:chief", "/job:master"]),
    ("evaluator0", None),
    ("sidecar0", None),
    ("empty", None),
])
def test_cluster_session_config(set_tf_config, name, filters):
  set_tf_config(TF_CONFIGS[name])
  expected = None if filters is None else _filtered_session_config(filters)
  assert RunConfig().session_config == expected
  given = tf.compat.v1.ConfigProto(log_device_placement=True)
  assert RunConfig(session_config=given).session_config == given


def test_service_and_model_dir_from_tf_config(set_tf_config, tmp_path):
  set_tf_config(TF_CONFIGS["chief_service"])
  assert RunConfig().service == {"name": "platform"}
  set_tf_config({"model_dir": str(tmp_path)})
  assert RunConfig().model_dir == str(tmp_path)
  assert RunConfig(model_dir=tmp_path).model_dir == str(tmp_path)
  with pytest.raises(ValueError, match="differs from the model_dir"):
    RunConfig(model_dir=str(tmp_path / "other"))


@pytest.mark.parametrize("name, error, words", [
    ("worker_only_cluster", ValueError, "exactly one `chief`"),
    ("two_chiefs", ValueError, "exactly one `chief`"),
    ("chief_and_master", ValueError, "both a `master` and a `chief`"),
    ("master_evaluator", ValueError, "evaluator"),
    ("missing_type", ValueError, "`type` and `index`"),
    ("missing_index", ValueError, "`type` and `index`"),
    ("no_task", ValueError, "`type` and `index`"),
    ("negative_index", ValueError, ">= 0"),
    ("negative_evaluator", ValueError, ">= 0"),
    ("index_out_of_range", ValueError, "out of range"),
    ("unknown_task_type", ValueError, "'trainer' is not a job"),
    ("local_ps_task", ValueError, "must be 'worker'"),
    ("local_index_1", ValueError, "must be 0"),
    ("service_not_dict", TypeError, "`service` must be a dict"),
    ("model_dir_empty", ValueError, "non-empty"),
])
def test_tf_config_refused(set_tf_config, name, error, words):
  set_tf_config(TF_CONFIGS[name])
  with pytest.raises(error, match=words):
    RunConfig()


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", ""])
def test_malformed_tf_config(monkeypatch, text):
  monkeypatch.setenv("TF_CONFIG", text)
  with pytest.raises(ValueError, match="TF_CONFIG"):
    RunConfig()


# --- RunConfig: replace, copies, equality ------------------------------------


def test_replace(set_tf_config, tmp_path):
  set_tf_config(TF_CONFIGS["worker1"])
  config = RunConfig(save_checkpoints_secs=60, tf_random_seed=1)
  replaced = config.replace(save_checkpoints_steps=5, model_dir=tmp_path,
                            tf_random_seed=2)
  assert (replaced.save_checkpoints_steps, replaced.save_checkpoints_secs,
          replaced.model_dir, replaced.tf_random_seed) == (
              5, None, tmp_path, 2)
  assert (config.save_checkpoints_steps, config.save_checkpoints_secs,
          config.model_dir, config.tf_random_seed) == (None, 60, None, 1)
  assert _cluster_view(replaced) == _cluster_view(config)
  assert replaced.cluster_spec == config.cluster_spec
  assert replaced.session_config == config.session_config
  set_tf_config(None)  # replace does not read TF_CONFIG again
  assert _cluster_view(config.replace(protocol="grpc")) == _cluster_view(
      config)
  back = replaced.replace(save_checkpoints_secs=30)
  assert (back.save_checkpoints_steps, back.save_checkpoints_secs) == (
      None, 30)
  neither = replaced.replace(save_checkpoints_steps=None)
  assert (neither.save_checkpoints_steps,
          neither.save_checkpoints_secs) == (None, None)
  assert config.replace(session_config=None).session_config is None


@pytest.mark.parametrize("kwargs, error", [
    (dict(master="grpc://x:1"), ValueError),
    (dict(task_type="chief"), ValueError),
    (dict(tpu_config=None), ValueError),
    (dict(save_checkpoints_steps=5, save_checkpoints_secs=5), ValueError),
    (dict(keep_checkpoint_max=-1), ValueError),
    (dict(save_summary_steps="x"), TypeError),
    (dict(model_dir=""), ValueError),
    (dict(device_fn=lambda: None), ValueError),
])
def test_replace_refuses(set_tf_config, kwargs, error):
  del set_tf_config
  with pytest.raises(error):
    RunConfig().replace(**kwargs)


def test_deepcopy_equality_and_repr(set_tf_config):
  set_tf_config(TF_CONFIGS["worker1"])
  placer = _Placer()
  placer.lock = threading.Lock()  # a bound method over an uncopyable object
  config = RunConfig(model_dir="/tmp/m", device_fn=placer.place,
                     tf_random_seed=5)
  copied = copy.deepcopy(config)
  assert copied == config and hash(copied) == hash(config)
  assert copied is not config
  assert copied.device_fn == config.device_fn
  assert copied.session_config is not config.session_config
  assert copied.session_config == config.session_config
  assert config.replace(tf_random_seed=6) != config
  assert config.replace(tf_random_seed=5) == config
  assert config != RunConfig(model_dir="/tmp/m", tf_random_seed=5)
  assert config != TPURunConfig(model_dir="/tmp/m", tf_random_seed=5)
  assert config != "RunConfig"
  text = repr(config)
  for part in ("RunConfig(", "model_dir='/tmp/m'", "tf_random_seed=5",
               "task_type='worker'", "task_id=1", "master='grpc://host2:2222'",
               'device_filters: "/job:ps"'):
    assert part in text, part
  assert "\n" not in text


def test_task_type_names():
  assert (run_config_lib.TaskType.CHIEF, run_config_lib.TaskType.MASTER,
          run_config_lib.TaskType.WORKER, run_config_lib.TaskType.PS,
          run_config_lib.TaskType.EVALUATOR) == (
              "chief", "master", "worker", "ps", "evaluator")


def test_default_session_config():
  config = session_lib.default_session_config()
  assert config.allow_soft_placement
  assert not config.device_filters
  assert (config.graph_options.rewrite_options.meta_optimizer_iterations ==
          1)  # RewriterConfig.ONE


def test_no_tensorflow_estimator_import():
  for module in (run_config_lib, tpu_config_lib, warm_start_lib):
    source = pathlib.Path(module.__file__).read_text()
    assert "import tensorflow_estimator" not in source
    assert "from tensorflow_estimator" not in source


# --- the TPU RunConfig -------------------------------------------------------


def _resolver(jobs=None, master="grpc://tpu0:8470"):
  spec = tf.train.ClusterSpec(
      {"worker": ["tpu0:8470"]} if jobs is None else jobs)
  return tf.distribute.cluster_resolver.SimpleClusterResolver(
      spec, master=master)


def test_tpu_run_config_defaults(set_tf_config):
  del set_tf_config
  config = TPURunConfig()
  assert config.tpu_config == TPUConfig()
  assert (config.master, config.evaluation_master, config.cluster) == (
      "", "", None)
  assert config.session_config is None
  assert isinstance(config, RunConfig)


def test_tpu_run_config_masters(set_tf_config):
  del set_tf_config
  config = TPURunConfig(master="grpc://tpu:8470")
  assert (config.master, config.evaluation_master) == (
      "grpc://tpu:8470", "grpc://tpu:8470")
  config = TPURunConfig(master="grpc://tpu:8470", evaluation_master="")
  assert (config.master, config.evaluation_master) == ("grpc://tpu:8470", "")
  config = TPURunConfig(evaluation_master="grpc://e:1")
  assert (config.master, config.evaluation_master) == ("", "grpc://e:1")


def test_tpu_run_config_in_a_cluster(set_tf_config):
  set_tf_config(TF_CONFIGS["worker1"])
  config = TPURunConfig()
  assert config.session_config is None  # in-graph: no device filters
  assert (config.master, config.evaluation_master) == (
      "grpc://host2:2222", "grpc://host2:2222")
  set_tf_config(TF_CONFIGS["evaluator7_eval_master"])
  config = TPURunConfig(master="grpc://tpu:1")
  assert (config.master, config.evaluation_master) == (
      "grpc://tpu:1", "grpc://e:1")
  set_tf_config(TF_CONFIGS["evaluator0"])
  assert TPURunConfig(master="grpc://tpu:1").evaluation_master == ""


def test_tpu_run_config_cluster_resolver(set_tf_config):
  del set_tf_config
  resolver = _resolver()
  config = TPURunConfig(cluster=resolver)
  assert config.cluster is resolver
  assert (config.master, config.evaluation_master) == (
      "grpc://tpu0:8470", "grpc://tpu0:8470")
  assert config.cluster_spec == resolver.cluster_spec()
  expected = tf.compat.v1.ConfigProto(allow_soft_placement=True,
                                      isolate_session_state=True)
  expected.cluster_def.CopyFrom(resolver.cluster_spec().as_cluster_def())
  assert config.session_config == expected
  given = tf.compat.v1.ConfigProto(log_device_placement=True)
  config = TPURunConfig(cluster=resolver, session_config=given)
  assert config.session_config.log_device_placement
  assert config.session_config.cluster_def == expected.cluster_def
  assert not given.HasField("cluster_def")  # the caller's proto is kept
  empty = TPURunConfig(cluster=_resolver(jobs={}))
  assert not empty.session_config.HasField("cluster_def")
  assert copy.deepcopy(config).cluster is resolver


def test_tpu_run_config_refuses(set_tf_config):
  del set_tf_config
  with pytest.raises(ValueError, match="`master` or `cluster`"):
    TPURunConfig(master="grpc://x:1", cluster=_resolver())
  with_cluster_def = tf.compat.v1.ConfigProto()
  with_cluster_def.cluster_def.CopyFrom(
      tf.train.ClusterSpec({"worker": ["a:1"]}).as_cluster_def())
  with pytest.raises(ValueError, match="cluster_def"):
    TPURunConfig(cluster=_resolver(), session_config=with_cluster_def)
  with pytest.raises(TypeError):
    TPURunConfig(no_such_argument=1)


def test_tpu_run_config_replace(set_tf_config):
  del set_tf_config
  config = TPURunConfig(master="grpc://tpu:1", cluster=None,
                        tpu_config=TPUConfig(num_shards=8))
  replaced = config.replace(tpu_config=TPUConfig(iterations_per_loop=5),
                            save_summary_steps=3)
  assert type(replaced) is TPURunConfig
  assert replaced.tpu_config.iterations_per_loop == 5
  assert replaced.tpu_config.num_shards is None
  assert (replaced.master, replaced.evaluation_master,
          replaced.save_summary_steps) == ("grpc://tpu:1", "grpc://tpu:1", 3)
  assert config.tpu_config.num_shards == 8
  assert config.replace(model_dir="/tmp/x").tpu_config == config.tpu_config
  for name in ("master", "evaluation_master", "cluster"):
    with pytest.raises(ValueError, match=name):
      config.replace(**{name: None})


# --- TPUConfig ---------------------------------------------------------------


def test_input_pipeline_config_values():
  assert (InputPipelineConfig.PER_SHARD_V1, InputPipelineConfig.PER_HOST_V1,
          InputPipelineConfig.PER_HOST_V2, InputPipelineConfig.BROADCAST,
          InputPipelineConfig.SLICED) == (1, 2, 3, 4, 5)


def test_tpu_config_defaults(set_tf_config):
  del set_tf_config
  config = TPUConfig()
  assert config._asdict() == dict(
      iterations_per_loop=2, num_shards=None, num_cores_per_replica=None,
      per_host_input_for_training=InputPipelineConfig.PER_HOST_V1,
      tpu_job_name=None, initial_infeed_sleep_secs=None,
      input_partition_dims=None,
      eval_training_input_configuration=InputPipelineConfig.PER_HOST_V1,
      experimental_host_call_every_n_steps=1,
      experimental_allow_per_host_v2_parallel_get_next=False,
      experimental_feed_hook=None)
  assert type(TPUConfig(num_shards=8))() == config


def test_tpu_config_is_an_immutable_value(set_tf_config):
  del set_tf_config
  config = TPUConfig(num_shards=8, iterations_per_loop="30s")
  with pytest.raises(AttributeError):
    config.num_shards = 2
  replaced = config._replace(num_shards=16)
  assert (replaced.num_shards, replaced.iterations_per_loop) == (16, "30s")
  assert isinstance(replaced, TPUConfig)
  assert config == TPUConfig(num_shards=8, iterations_per_loop="30s")
  assert copy.deepcopy(config) == config


@pytest.mark.parametrize("given, stored", [
    (True, InputPipelineConfig.PER_HOST_V1),
    (False, InputPipelineConfig.PER_SHARD_V1),
    (InputPipelineConfig.PER_HOST_V2, InputPipelineConfig.PER_HOST_V2),
    (InputPipelineConfig.BROADCAST, InputPipelineConfig.BROADCAST),
])
def test_tpu_config_per_host_input(set_tf_config, given, stored):
  del set_tf_config
  value = TPUConfig(per_host_input_for_training=given)
  assert value.per_host_input_for_training == stored
  assert not isinstance(value.per_host_input_for_training, bool)


def test_tpu_job_name_from_tf_config(set_tf_config):
  set_tf_config(TF_CONFIGS["local_service"])
  assert TPUConfig().tpu_job_name == "tpu_worker"
  assert TPUConfig(tpu_job_name="mine").tpu_job_name == "mine"
  assert TPURunConfig().tpu_config.tpu_job_name == "tpu_worker"
  set_tf_config(TF_CONFIGS["service_not_dict"])
  with pytest.raises(TypeError, match="`service` must be a dict"):
    TPUConfig()
  assert TPUConfig(tpu_job_name="mine").tpu_job_name == "mine"


# (TPUConfig arguments, the error, or None when accepted)
TPU_CONFIG_CASES = [
    (dict(iterations_per_loop=100), None),
    (dict(iterations_per_loop="10s"), None),
    (dict(iterations_per_loop="5m"), None),
    (dict(iterations_per_loop="2h"), None),
    (dict(iterations_per_loop=np.int64(4)), None),
    (dict(iterations_per_loop=0), ValueError),
    (dict(iterations_per_loop=-1), ValueError),
    (dict(iterations_per_loop="0s"), ValueError),
    (dict(iterations_per_loop="10d"), ValueError),
    (dict(iterations_per_loop=1.5), ValueError),
    (dict(iterations_per_loop=None), ValueError),
    (dict(num_shards=8), None),
    (dict(num_shards=np.int32(4)), None),
    (dict(num_shards=0), ValueError),
    (dict(num_shards=-2), ValueError),
    (dict(num_shards=1.5), TypeError),
    (dict(num_shards="8"), TypeError),
    (dict(num_cores_per_replica=8), None),
    (dict(num_cores_per_replica=128), None),
    (dict(num_cores_per_replica=3), ValueError),
    (dict(num_cores_per_replica=256), ValueError),
    (dict(input_partition_dims=[[1, 2, 2, 1], None], num_cores_per_replica=4,
          per_host_input_for_training=InputPipelineConfig.PER_HOST_V2), None),
    (dict(input_partition_dims=[[1, 2]], num_cores_per_replica=2,
          per_host_input_for_training=InputPipelineConfig.PER_HOST_V2), None),
    (dict(input_partition_dims=[[1, 2]],
          per_host_input_for_training=InputPipelineConfig.PER_HOST_V2),
     ValueError),
    (dict(input_partition_dims=[[1, 2]], num_cores_per_replica=2),
     ValueError),
    (dict(input_partition_dims=[[1, 2]], num_cores_per_replica=2,
          per_host_input_for_training=True), ValueError),
    (dict(input_partition_dims=[], num_cores_per_replica=2,
          per_host_input_for_training=InputPipelineConfig.PER_HOST_V2),
     ValueError),
    (dict(input_partition_dims=[[1], [1], [1]], num_cores_per_replica=2,
          per_host_input_for_training=InputPipelineConfig.PER_HOST_V2),
     ValueError),
    (dict(eval_training_input_configuration=InputPipelineConfig.SLICED),
     None),
    (dict(eval_training_input_configuration=InputPipelineConfig.PER_HOST_V2),
     ValueError),
    (dict(eval_training_input_configuration=1), ValueError),
    (dict(initial_infeed_sleep_secs=5), None),
    (dict(initial_infeed_sleep_secs=0), None),
    (dict(initial_infeed_sleep_secs=-1), ValueError),
    (dict(initial_infeed_sleep_secs=1.5), TypeError),
    (dict(tpu_job_name="tpu_worker"), None),
    (dict(experimental_host_call_every_n_steps=10,
          experimental_allow_per_host_v2_parallel_get_next=True,
          experimental_feed_hook=tf.compat.v1.train.SessionRunHook), None),
]


@pytest.mark.parametrize("kwargs, error", TPU_CONFIG_CASES)
def test_tpu_config_validation(set_tf_config, kwargs, error):
  del set_tf_config
  if error is None:
    config = TPUConfig(**kwargs)
    for name, value in kwargs.items():
      if name != "per_host_input_for_training":
        assert getattr(config, name) is value
  else:
    with pytest.raises(error, match="TPUConfig: `"):
      TPUConfig(**kwargs)


# --- WarmStartSettings -------------------------------------------------------


def _save_checkpoint(directory, value):
  with tf.Graph().as_default():
    tf.compat.v1.get_variable("w", initializer=tf.constant(value))
    saver = tf.compat.v1.train.Saver()
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      return saver.save(session, os.path.join(directory, "model.ckpt"))


def _save_saved_model(directory, value):
  with tf.Graph().as_default():
    w = tf.compat.v1.get_variable("w", initializer=tf.constant(value))
    x = tf.compat.v1.placeholder(tf.float32, [2], name="x")
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      tf.compat.v1.saved_model.simple_save(session, directory, {"x": x},
                                           {"y": x * w})
  return directory


def _warm_started(settings):
  """The value of a new variable `w` after warm-starting with
  `settings`, as the run loop applies them."""
  with tf.Graph().as_default():
    w = tf.compat.v1.get_variable("w", initializer=tf.zeros([2]))
    tf.compat.v1.train.warm_start(*settings)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      return session.run(w).tolist()


def test_warm_start_settings_fields():
  settings = WarmStartSettings("/tmp/ckpt")
  assert settings == ("/tmp/ckpt", ".*", {}, {})
  assert settings._fields == (
      "ckpt_to_initialize_from", "vars_to_warm_start",
      "var_name_to_vocab_info", "var_name_to_prev_var_name")
  vocab = warm_start_lib.VocabInfo("new.txt", 10, 1, "old.txt")
  settings = WarmStartSettings("/tmp/ckpt", ["w"], {"w": vocab}, {"w": "v"})
  assert (settings.vars_to_warm_start, settings.var_name_to_vocab_info,
          settings.var_name_to_prev_var_name) == (
              ["w"], {"w": vocab}, {"w": "v"})
  assert warm_start_lib.VocabInfo is tf.compat.v1.train.VocabInfo
  for missing in ("", None):
    with pytest.raises(ValueError, match="ckpt_to_initialize_from"):
      WarmStartSettings(missing)


def test_warm_start_from_checkpoint(tmp_path):
  prefix = _save_checkpoint(str(tmp_path), [1.0, 2.0])
  assert warm_start_lib.warm_start_settings(None) is None
  for given in (str(tmp_path), tmp_path, prefix):
    settings = warm_start_lib.warm_start_settings(given)
    assert settings == WarmStartSettings(os.fspath(given))
    assert _warm_started(settings) == [1.0, 2.0]
  settings = WarmStartSettings(prefix, vars_to_warm_start="nothing")
  assert warm_start_lib.warm_start_settings(settings) is settings
  assert _warm_started(settings) == [0.0, 0.0]
  settings = WarmStartSettings(prefix, vars_to_warm_start="v",
                               var_name_to_prev_var_name={"v": "w"})
  with tf.Graph().as_default():
    v = tf.compat.v1.get_variable("v", initializer=tf.zeros([2]))
    tf.compat.v1.train.warm_start(*settings)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      assert session.run(v).tolist() == [1.0, 2.0]


def test_warm_start_from_saved_model(tmp_path):
  export_dir = _save_saved_model(str(tmp_path / "export"), [3.0, 4.0])
  variables = os.path.join(export_dir, "variables", "variables")
  for given in (export_dir, pathlib.Path(export_dir), export_dir.encode()):
    settings = warm_start_lib.warm_start_settings(given)
    assert settings == WarmStartSettings(variables)
    assert _warm_started(settings) == [3.0, 4.0]


@pytest.mark.parametrize("given", [3, ["/tmp/ckpt"], {"ckpt": "/tmp"}])
def test_warm_start_from_refuses(given):
  with pytest.raises(TypeError, match="warm_start_from"):
    warm_start_lib.warm_start_settings(given)
  with pytest.raises(ValueError):  # what tf.estimator raised
    warm_start_lib.warm_start_settings(given)


# --- the oracle: TF 2.15's own objects ---------------------------------------


def _public_properties(cls):
  return sorted(name for name in dir(cls) if not name.startswith("_") and
                isinstance(getattr(cls, name), property))


def _assert_same_config(ours, theirs):
  names = _public_properties(type(theirs))
  assert "cluster_spec" in names and "session_config" in names
  for name in names:
    if name == "cluster":
      _assert_same_resolver(ours.cluster, theirs.cluster)
    else:
      assert getattr(ours, name) == getattr(theirs, name), name


def _assert_same_resolver(ours, theirs):
  """The same resolver, or (after `replace`, which TF deep-copies it
  through and ours shares) one of the same class, cluster and master."""
  if ours is theirs:
    return
  assert type(ours) is type(theirs)
  assert ours.cluster_spec() == theirs.cluster_spec()
  assert ours.master() == theirs.master()


def _outcome(make, errors=(ValueError, TypeError)):
  try:
    return make(), None
  except errors as error:
    return None, error


def _kind(error):
  return TypeError if isinstance(error, TypeError) else ValueError


def _assert_same_outcome(make_ours, make_theirs, compare=_assert_same_config):
  # TF reads a TF_CONFIG `service` that is not a dict with an
  # AttributeError in TPUConfig; ours refuses it as RunConfig does, with a
  # TypeError.
  theirs, their_error = _outcome(make_theirs,
                                 (ValueError, TypeError, AttributeError))
  ours, our_error = _outcome(make_ours)
  if their_error is not None:
    assert our_error is not None, (
        f"TF raised {their_error!r}; ours accepted: {ours!r}")
    if isinstance(their_error, AttributeError):
      assert isinstance(our_error, TypeError), our_error
    else:
      assert _kind(our_error) is _kind(their_error), (our_error, their_error)
    return None, None
  assert our_error is None, f"TF accepted; ours raised {our_error!r}"
  compare(ours, theirs)
  return ours, theirs


def _tf_tpu():
  return tf.compat.v1.estimator.tpu


# Constructor arguments, as functions of the TPU module (ours or TF's):
# protos and TPUConfigs are made anew for each side.
RUN_CONFIG_ARGS = [
    lambda tpu: {},
    lambda tpu: {"model_dir": "/tmp/model_dir_of_tf_config"},
    lambda tpu: {"model_dir": pathlib.Path("/tmp/another_model_dir")},
    lambda tpu: {"session_config": tf.compat.v1.ConfigProto(
        log_device_placement=True)},
    lambda tpu: {"save_checkpoints_steps": 50, "tf_random_seed": 7,
                 "protocol": "grpc", "keep_checkpoint_max": 0},
    lambda tpu: {"save_checkpoints_steps": None,
                 "save_checkpoints_secs": None, "log_step_count_steps": None,
                 "device_fn": _op_device},
]
TPU_RUN_CONFIG_ARGS = RUN_CONFIG_ARGS + [
    lambda tpu: {"master": "grpc://tpu:8470"},
    lambda tpu: {"evaluation_master": "grpc://eval:1"},
    lambda tpu: {"master": "", "evaluation_master": "grpc://eval:1"},
    lambda tpu: {"master": "grpc://tpu:8470", "evaluation_master": ""},
    lambda tpu: {"tpu_config": tpu.TPUConfig(num_shards=8,
                                             iterations_per_loop=10)},
    lambda tpu: {"cluster": _SHARED_RESOLVER},
    lambda tpu: {"cluster": _SHARED_RESOLVER,
                 "session_config": tf.compat.v1.ConfigProto(
                     log_device_placement=True)},
    lambda tpu: {"cluster": _EMPTY_RESOLVER},
    lambda tpu: {"cluster": _SHARED_RESOLVER, "master": "grpc://x:1"},
    lambda tpu: {"cluster": _SHARED_RESOLVER,
                 "session_config": _with_cluster_def()},
]
_SHARED_RESOLVER = _resolver(jobs={"worker": ["t0:8470", "t1:8470"]})
_EMPTY_RESOLVER = _resolver(jobs={}, master="")


def _with_cluster_def():
  config = tf.compat.v1.ConfigProto()
  config.cluster_def.CopyFrom(
      tf.train.ClusterSpec({"worker": ["a:1"]}).as_cluster_def())
  return config


@pytest.mark.tf215
@pytest.mark.parametrize("name", sorted(TF_CONFIGS))
def test_oracle_run_config(set_tf_config, name):
  set_tf_config(TF_CONFIGS[name])
  for arguments in RUN_CONFIG_ARGS:
    _assert_same_outcome(lambda: RunConfig(**arguments(tpu_config_lib)),
                         lambda: tf.compat.v1.estimator.RunConfig(
                             **arguments(_tf_tpu())))


@pytest.mark.tf215
@pytest.mark.parametrize("name", sorted(TF_CONFIGS))
def test_oracle_tpu_run_config(set_tf_config, name):
  set_tf_config(TF_CONFIGS[name])
  for arguments in TPU_RUN_CONFIG_ARGS:
    _assert_same_outcome(
        lambda: TPURunConfig(**arguments(tpu_config_lib)),
        lambda: _tf_tpu().RunConfig(**arguments(_tf_tpu())))


@pytest.mark.tf215
@pytest.mark.parametrize("kwargs, error", VALIDATION_CASES + [
    (dict(save_checkpoints_steps=1, save_checkpoints_secs=1), ValueError),
    (dict(save_checkpoints_steps=None, save_checkpoints_secs=0), None),
])
def test_oracle_validation(set_tf_config, kwargs, error):
  del set_tf_config
  ours, _ = _assert_same_outcome(
      lambda: RunConfig(**kwargs),
      lambda: tf.compat.v1.estimator.RunConfig(**kwargs))
  assert (ours is None) == (error is not None)


REPLACEMENTS = [
    lambda tpu: {"save_checkpoints_steps": 5},
    lambda tpu: {"save_checkpoints_secs": 5},
    lambda tpu: {"save_checkpoints_steps": None},
    lambda tpu: {"save_checkpoints_secs": None},
    lambda tpu: {"save_checkpoints_steps": 5, "save_checkpoints_secs": None},
    lambda tpu: {"save_checkpoints_steps": None,
                 "save_checkpoints_secs": None},
    lambda tpu: {"save_checkpoints_steps": 5, "save_checkpoints_secs": 5},
    lambda tpu: {"model_dir": "/tmp/replaced"},
    lambda tpu: {"model_dir": ""},
    lambda tpu: {"session_config": None},
    lambda tpu: {"session_config": tf.compat.v1.ConfigProto(
        inter_op_parallelism_threads=2)},
    lambda tpu: {"keep_checkpoint_max": -1},
    lambda tpu: {"log_step_count_steps": 0},
    lambda tpu: {"tf_random_seed": 1.5},
    lambda tpu: {"save_summary_steps": "x"},
    lambda tpu: {"device_fn": _op_device, "protocol": "grpc+verbs"},
    lambda tpu: {"protocol": "http"},
    lambda tpu: {"experimental_max_worker_delay_secs": 3,
                 "session_creation_timeout_secs": 10,
                 "checkpoint_save_graph_def": False},
    lambda tpu: {"master": "grpc://x:1"},
    lambda tpu: {"evaluation_master": "grpc://x:1"},
    lambda tpu: {"train_distribute": None, "eval_distribute": None},
]
TPU_REPLACEMENTS = REPLACEMENTS + [
    lambda tpu: {"tpu_config": tpu.TPUConfig(num_shards=4)},
    lambda tpu: {"tpu_config": None},
    lambda tpu: {"tpu_config": tpu.TPUConfig(iterations_per_loop="1h"),
                 "save_checkpoints_steps": 100},
    lambda tpu: {"cluster": None},
]


@pytest.mark.tf215
@pytest.mark.parametrize("name", ["unset", "worker1", "evaluator0", "ps0",
                                  "master", "local_session_masters"])
def test_oracle_replace(set_tf_config, name):
  set_tf_config(TF_CONFIGS[name])
  ours = RunConfig(save_checkpoints_steps=20, tf_random_seed=1)
  theirs = tf.compat.v1.estimator.RunConfig(save_checkpoints_steps=20,
                                            tf_random_seed=1)
  for replacement in REPLACEMENTS:
    _assert_same_outcome(lambda: ours.replace(**replacement(tpu_config_lib)),
                         lambda: theirs.replace(**replacement(_tf_tpu())))
  _assert_same_config(ours, theirs)  # neither changed


@pytest.mark.tf215
@pytest.mark.parametrize("name", ["unset", "worker1", "evaluator0"])
def test_oracle_tpu_replace(set_tf_config, name):
  set_tf_config(TF_CONFIGS[name])
  for arguments in TPU_RUN_CONFIG_ARGS[:-2]:
    ours = TPURunConfig(**arguments(tpu_config_lib))
    theirs = _tf_tpu().RunConfig(**arguments(_tf_tpu()))
    for replacement in TPU_REPLACEMENTS:
      _assert_same_outcome(
          lambda: ours.replace(**replacement(tpu_config_lib)),
          lambda: theirs.replace(**replacement(_tf_tpu())))


def _assert_same_tuple(ours, theirs):
  assert tuple(ours) == tuple(theirs)
  assert ours._fields == theirs._fields


@pytest.mark.tf215
@pytest.mark.parametrize("kwargs, error", TPU_CONFIG_CASES + [
    ({}, None),
    (dict(per_host_input_for_training=False), None),
    (dict(per_host_input_for_training=InputPipelineConfig.BROADCAST), None),
    (dict(tpu_job_name=""), None),
])
@pytest.mark.parametrize("tf_config", ["unset", "local_service"])
def test_oracle_tpu_config(set_tf_config, kwargs, error, tf_config):
  set_tf_config(TF_CONFIGS[tf_config])
  ours, _ = _assert_same_outcome(lambda: TPUConfig(**kwargs),
                                 lambda: _tf_tpu().TPUConfig(**kwargs),
                                 compare=_assert_same_tuple)
  assert (ours is None) == (error is not None)
  if ours is not None:
    _assert_same_tuple(ours._replace(num_shards=2, tpu_job_name="x"),
                       _tf_tpu().TPUConfig(**kwargs)._replace(
                           num_shards=2, tpu_job_name="x"))


@pytest.mark.tf215
def test_oracle_input_pipeline_config():
  theirs = _tf_tpu().InputPipelineConfig
  names = [name for name in vars(theirs) if name.isupper()]
  assert len(names) == 5
  for name in names:
    assert getattr(InputPipelineConfig, name) == getattr(theirs, name)


@pytest.mark.tf215
@pytest.mark.parametrize("args", [
    ("/tmp/ckpt",),
    (b"/tmp/ckpt", None),
    ("/tmp/ckpt", ["a", "b"], None, {"a": "old_a"}),
    ("/tmp/ckpt", "dense/.*", {"w": tf.compat.v1.train.VocabInfo(
        "new.txt", 10, 1, "old.txt")}),
    ("",),
    (None, ".*"),
])
def test_oracle_warm_start_settings(args):
  _assert_same_outcome(lambda: WarmStartSettings(*args),
                       lambda: tf.compat.v1.estimator.WarmStartSettings(*args),
                       compare=_assert_same_tuple)


@pytest.mark.tf215
def test_oracle_warm_start_from(tmp_path):
  from tensorflow_estimator.python.estimator import estimator as tf_estimator
  prefix = _save_checkpoint(str(tmp_path), [1.0, 2.0])
  export_dir = _save_saved_model(str(tmp_path / "export"), [3.0, 4.0])

  theirs_of = tf_estimator._get_default_warm_start_settings
  for given in (None, str(tmp_path), prefix, prefix.encode(), export_dir,
                export_dir.encode(), str(tmp_path / "missing")):
    ours = warm_start_lib.warm_start_settings(given)
    theirs = theirs_of(given)
    assert (ours is None) == (theirs is None)
    if ours is not None:
      _assert_same_tuple(ours, theirs)
  for given in (3, [prefix]):
    with pytest.raises(ValueError) as their_error:
      theirs_of(given)
    with pytest.raises(type(their_error.value)):
      warm_start_lib.warm_start_settings(given)
