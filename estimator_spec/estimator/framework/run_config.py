"""`RunConfig`: how an Estimator runs (checkpoints, summaries, logging,
session), and where in a cluster this process sits.

The counterpart of `tf.estimator.RunConfig` (tensorflow-estimator 2.15),
with the same arguments, defaults, validation and properties:

* Checkpoints are saved every 600 seconds unless an interval is given:
  `save_checkpoints_steps` or `save_checkpoints_secs`, at most one of
  them; both None turns checkpoints off.
* The cluster comes from the `TF_CONFIG` environment variable, a JSON
  object read when the config is built:
  - `cluster`: {job: [addresses]}, `cluster_spec`. With a cluster, `task`
    must say this process's `type` and `index`. The training cluster has
    one `chief` (or, in the older layout, one `master` and no chief), any
    number of `worker` and `ps` tasks. An `evaluator` task stands outside
    it: its `cluster_spec` is empty and it counts no replicas.
  - without `cluster`, this process is alone: task `worker` 0, the chief.
  - `session_master` and `eval_session_master` override the session
    targets; `model_dir` sets the model directory (it must agree with the
    argument); `service` is a dict for the platform that set TF_CONFIG.
    Other keys (`rpc_layer`, `environment`) are not read, as TF reads them
    only with a distribution strategy.
* In a cluster, a config without a session config gets TF's default one
  with device filters, so that each task talks only to the tasks it needs:
  the chief (or master) and each worker to the ps tasks and itself, a ps
  task to every training task (none for an evaluator);
  `cluster/session.py` holds the filters and the default.
* `replace(**kwargs)` returns a copy with some constructor arguments
  changed and checked again; the cluster is not read again.

Distribution strategies. tf.estimator's RunConfig also took
`train_distribute`, `eval_distribute` and `experimental_distribute`:
`tf.distribute` strategies the Estimator then replicated model_fn with.
This framework's run loop runs no strategy, so these must stay None: a
config that names one is refused rather than silently trained without it.
A TPUEstimator program needs none: on one machine the emulated TPU's cores
are `tpu_config.num_shards`; on several, describe the cluster in TF_CONFIG
(a chief, workers and ps tasks), run the same program on each task, and
this library's cluster training trains it, synchronously as a TPU pod does
unless asked otherwise (`estimator_spec.ClusterTraining`, docs/cluster.md).
"""
import copy
import json
import os

from google.protobuf import text_format
import tensorflow as tf

from estimator_spec.cluster import session as session_lib
from estimator_spec.estimator import calling

TF_CONFIG = "TF_CONFIG"
_GRPC = "grpc://"
_PROTOCOLS = (None, "grpc", "grpc+verbs")
_DISTRIBUTION_ARGS = ("train_distribute", "eval_distribute",
                      "experimental_distribute")

# The constructor arguments `replace` may change (tf.estimator's list).
REPLACEABLE = (
    "model_dir", "tf_random_seed", "save_summary_steps",
    "save_checkpoints_steps", "save_checkpoints_secs", "session_config",
    "keep_checkpoint_max", "keep_checkpoint_every_n_hours",
    "log_step_count_steps", "train_distribute", "device_fn", "protocol",
    "eval_distribute", "experimental_distribute",
    "experimental_max_worker_delay_secs", "session_creation_timeout_secs",
    "checkpoint_save_graph_def")


class TaskType:
  """The job names of TF_CONFIG's cluster that RunConfig knows."""
  MASTER = "master"
  PS = "ps"
  WORKER = "worker"
  CHIEF = "chief"
  EVALUATOR = "evaluator"


class _Unset:
  """The default of the two checkpoint intervals: the argument was not
  given (the other one decides, else 600 seconds)."""

  def __repr__(self):
    return "<default>"


_UNSET = _Unset()


def read_tf_config():
  """The TF_CONFIG environment variable as a dict ({} when unset)."""
  text = os.environ.get(TF_CONFIG, "{}")
  try:
    tf_config = json.loads(text)
  except ValueError as error:
    raise ValueError(
        f"The {TF_CONFIG} environment variable is not valid JSON ({error}): "
        f"{text!r}. Set it to a JSON object such as "
        '{"cluster": {...}, "task": {"type": "worker", "index": 0}}, or '
        "unset it.") from error
  if not isinstance(tf_config, dict):
    raise ValueError(
        f"The {TF_CONFIG} environment variable must hold a JSON object; got "
        f"{text!r}.")
  return tf_config


def service_of(tf_config):
  """TF_CONFIG's `service`: a dict, or None."""
  service = tf_config.get("service")
  if service is not None and not isinstance(service, dict):
    raise TypeError(
        f"{TF_CONFIG}: `service` must be a dict (a JSON object) when set; "
        f"got {type(service).__name__}: {service!r}.")
  return service


# --- the cluster, from TF_CONFIG -------------------------------------------


def _cluster_facts(tf_config):
  """{property: value} of this process's place in TF_CONFIG's cluster:
  cluster_spec, task_type, task_id, master, evaluation_master, is_chief,
  num_ps_replicas, num_worker_replicas, global_id_in_cluster, service."""
  service = service_of(tf_config)
  cluster_spec = tf.train.ClusterSpec(tf_config.get("cluster", {}))
  task = tf_config.get("task", {})
  if not isinstance(task, dict):
    raise ValueError(
        f"{TF_CONFIG}: `task` must be a JSON object with `type` and "
        f"`index`; got {task!r}.")
  if not cluster_spec:
    facts = _local_facts(tf_config, task)
  elif TaskType.MASTER in cluster_spec.jobs:
    facts = _master_cluster_facts(tf_config, cluster_spec, task)
  else:
    facts = _chief_cluster_facts(tf_config, cluster_spec, task)
  facts["service"] = service
  return facts


def _local_facts(tf_config, task):
  """A process alone (no cluster): worker 0, the chief."""
  task_type = task.get("type", TaskType.WORKER)
  task_id = int(task.get("index", 0))
  if task_type != TaskType.WORKER:
    raise ValueError(
        f"{TF_CONFIG} has no `cluster`, so its task type must be 'worker' "
        f"(or unset); got {task_type!r}. Add the cluster, or drop the task.")
  if task_id != 0:
    raise ValueError(
        f"{TF_CONFIG} has no `cluster`, so its task index must be 0 (or "
        f"unset); got {task_id}. Add the cluster, or drop the task.")
  return dict(
      cluster_spec=tf.train.ClusterSpec({}), task_type=task_type,
      task_id=task_id, global_id_in_cluster=0,
      master=tf_config.get("session_master", ""),
      evaluation_master=tf_config.get("eval_session_master", ""),
      is_chief=True, num_ps_replicas=0, num_worker_replicas=1)


def _chief_cluster_facts(tf_config, cluster_spec, task):
  """A cluster with one `chief`, or an evaluator beside it."""
  task_type, task_id = _checked_task(cluster_spec, task, TaskType.CHIEF)
  facts = dict(
      task_type=task_type, task_id=task_id,
      evaluation_master=_evaluation_master(task_type, tf_config),
      is_chief=task_type == TaskType.CHIEF)
  if task_type == TaskType.EVALUATOR:
    facts.update(cluster_spec=tf.train.ClusterSpec({}), master="",
                 num_ps_replicas=0, num_worker_replicas=0,
                 global_id_in_cluster=None)
    return facts
  facts.update(
      cluster_spec=cluster_spec,
      master=_session_master(cluster_spec, task_type, task_id, tf_config),
      num_ps_replicas=_num_tasks(cluster_spec, TaskType.PS),
      num_worker_replicas=_num_workers(cluster_spec, TaskType.CHIEF),
      global_id_in_cluster=_global_id(cluster_spec, task_type, task_id,
                                      TaskType.CHIEF))
  return facts


def _master_cluster_facts(tf_config, cluster_spec, task):
  """The older layout: one `master` (the chief), workers, ps tasks."""
  if TaskType.CHIEF in cluster_spec.jobs:
    raise ValueError(
        f"{TF_CONFIG}: the cluster has both a `master` and a `chief` job "
        f"({cluster_spec.as_dict()}); one of them is the chief: keep "
        "`chief` (or `master`, the older name) only.")
  task_type, task_id = _checked_task(cluster_spec, task, TaskType.MASTER)
  if task_type == TaskType.EVALUATOR:
    raise ValueError(
        f"{TF_CONFIG}: an `evaluator` task needs a cluster with a `chief`; "
        "this one has a `master` job. Rename the cluster's `master` job to "
        "`chief`.")
  return dict(
      cluster_spec=cluster_spec, task_type=task_type, task_id=task_id,
      global_id_in_cluster=_global_id(cluster_spec, task_type, task_id,
                                      TaskType.MASTER),
      master=_session_master(cluster_spec, task_type, task_id, tf_config),
      evaluation_master=_evaluation_master(task_type, tf_config),
      num_ps_replicas=_num_tasks(cluster_spec, TaskType.PS),
      num_worker_replicas=_num_workers(cluster_spec, TaskType.MASTER),
      is_chief=task_type == TaskType.MASTER)


def _checked_task(cluster_spec, task, chief_job):
  """(type, index) of TF_CONFIG's task, checked against the cluster, which
  must have exactly one `chief_job` task."""
  chief_tasks = (cluster_spec.num_tasks(chief_job)
                 if chief_job in cluster_spec.jobs else 0)
  if chief_tasks != 1:
    raise ValueError(
        f"{TF_CONFIG}: a cluster needs exactly one `{chief_job}` task; got "
        f"{chief_tasks} in {cluster_spec.as_dict()}.")
  task_type = task.get("type")
  task_id = task.get("index")
  if not task_type or task_id is None:
    raise ValueError(
        f"{TF_CONFIG} has a `cluster`, so its `task` must give this "
        f"process's `type` and `index`; got {task!r}.")
  task_id = int(task_id)
  if task_id < 0:
    raise ValueError(
        f"{TF_CONFIG}: the task index must be >= 0; got {task_id}.")
  if task_type == TaskType.EVALUATOR:
    return task_type, task_id
  if task_type not in cluster_spec.jobs:
    raise ValueError(
        f"{TF_CONFIG}: task type {task_type!r} is not a job of the cluster "
        f"{cluster_spec.as_dict()}.")
  if task_id >= cluster_spec.num_tasks(task_type):
    raise ValueError(
        f"{TF_CONFIG}: task index {task_id} is out of range for job "
        f"{task_type!r} of the cluster {cluster_spec.as_dict()}.")
  return task_type, task_id


def _session_master(cluster_spec, task_type, task_id, tf_config):
  """TF_CONFIG's `session_master`, else '' for a one-task cluster (an
  in-process session), else this task's gRPC address."""
  if "session_master" in tf_config:
    return tf_config["session_master"]
  jobs = cluster_spec.jobs
  if len(jobs) == 1 and cluster_spec.num_tasks(jobs[0]) == 1:
    return ""
  return _GRPC + cluster_spec.job_tasks(task_type)[task_id]


def _evaluation_master(task_type, tf_config):
  if task_type == TaskType.EVALUATOR:
    return tf_config.get("eval_session_master", "")
  return ""


def _num_tasks(cluster_spec, job):
  return len(cluster_spec.as_dict().get(job, []))


def _num_workers(cluster_spec, chief_job):
  """The training replicas: the workers and the chief (or master)."""
  return (_num_tasks(cluster_spec, TaskType.WORKER) +
          _num_tasks(cluster_spec, chief_job))


def _global_id(cluster_spec, task_type, task_id, chief_job):
  """This task's index among all tasks of the cluster: the chief first,
  then the other jobs in name order, the ps tasks last."""
  order = [chief_job] + [
      job for job in sorted(cluster_spec.jobs)
      if job not in (chief_job, TaskType.PS)]
  if TaskType.PS in cluster_spec.jobs:
    order.append(TaskType.PS)
  first = 0
  for job in order:
    if job == task_type:
      return first + task_id
    first += cluster_spec.num_tasks(job)
  raise ValueError(f"Task type {task_type!r} is not a job of the cluster "
                   f"{cluster_spec.as_dict()}.")


# --- arguments ---------------------------------------------------------------


def _checkpoint_intervals(steps, secs):
  """(save_checkpoints_steps, save_checkpoints_secs) from the arguments:
  600 seconds when neither is given, the other None when one is."""
  if steps is _UNSET and secs is _UNSET:
    return None, 600
  if secs is _UNSET:
    return steps, None
  if steps is _UNSET:
    return None, secs
  if steps is not None and secs is not None:
    raise ValueError(
        "RunConfig: `save_checkpoints_steps` and `save_checkpoints_secs` "
        f"cannot both be set (got {steps!r} and {secs!r}); give one "
        "interval, or None for both to save no checkpoints.")
  return steps, secs


def _refuse_distribution(arguments):
  for name in _DISTRIBUTION_ARGS:
    value = arguments.get(name)
    if value is not None:
      raise ValueError(
          f"RunConfig: `{name}` ({type(value).__name__}) is not supported: "
          "this Estimator framework runs no tf.distribute strategy. Leave "
          "it None. A TPUEstimator program spreads over several machines "
          "with this library's own cluster training: describe the cluster "
          "in TF_CONFIG and run the program on each task (see estimator_"
          "spec.estimator.framework.run_config and docs/cluster.md).")


def _model_dir(tf_config, model_dir):
  """The model directory: the argument (a PathLike as a str), or
  TF_CONFIG's `model_dir`; both set must agree."""
  if isinstance(model_dir, os.PathLike):
    model_dir = tf.compat.as_str_any(os.fspath(model_dir))
  if isinstance(model_dir, str) and not model_dir:
    raise ValueError("RunConfig: `model_dir` must be a non-empty path or "
                     "None (for the Estimator's default); got ''.")
  from_env = tf_config.get("model_dir")
  if isinstance(from_env, str) and not from_env:
    raise ValueError(f"{TF_CONFIG}: `model_dir` must be a non-empty path "
                     "when given; got ''.")
  if not from_env:
    return model_dir
  if model_dir and model_dir != from_env:
    raise ValueError(
        f"RunConfig: `model_dir` ({model_dir!r}) differs from the model_dir "
        f"of {TF_CONFIG} ({from_env!r}); set it in one place, or to the "
        "same path in both.")
  tf.compat.v1.logging.info("Using model_dir from %s: %s", TF_CONFIG,
                            from_env)
  return model_dir or from_env


def _compare(name, value, holds, requirement):
  """Raises unless `holds(value)`: TypeError when `value` cannot be
  compared with a number, ValueError when it breaks `requirement`."""
  try:
    good = holds(value)
  except TypeError as error:
    raise TypeError(f"RunConfig: `{name}` must be a number {requirement}; "
                    f"got {type(value).__name__}: {value!r}.") from error
  if not good:
    raise ValueError(
        f"RunConfig: `{name}` must be {requirement}; got {value!r}.")


_BOUNDS = (
    ("save_summary_steps", lambda v: v >= 0, ">= 0 (0: no summaries)"),
    ("save_checkpoints_steps", lambda v: v >= 0, ">= 0"),
    ("save_checkpoints_secs", lambda v: v >= 0, ">= 0"),
    ("keep_checkpoint_max", lambda v: v >= 0, ">= 0 (0: keep all)"),
    ("keep_checkpoint_every_n_hours", lambda v: v > 0, "> 0"),
    ("log_step_count_steps", lambda v: v > 0, "> 0"),
    ("session_creation_timeout_secs", lambda v: v > 0, "> 0"),
)


def _validate(config):
  """Checks the arguments a config holds (None passes every check)."""
  if config.model_dir is not None and not config.model_dir:
    raise ValueError(f"RunConfig: `model_dir` must be a non-empty path or "
                     f"None; got {config.model_dir!r}.")
  for name, holds, requirement in _BOUNDS:
    value = getattr(config, name)
    if value is not None:
      _compare(name, value, holds, requirement)
  _validate_types(config)


def _validate_types(config):
  """The arguments checked by kind (ValueError, as tf.estimator raises)."""
  for name, kind in (("tf_random_seed", int),
                     ("experimental_max_worker_delay_secs", int),
                     ("session_config", tf.compat.v1.ConfigProto)):
    value = getattr(config, name)
    if value is not None and not isinstance(value, kind):
      raise ValueError(
          f"RunConfig: `{name}` must be {kind.__name__} or None; got "
          f"{type(value).__name__}: {value!r}.")
  device_fn = config.device_fn
  if device_fn is not None and not (
      callable(device_fn) and list(calling.fn_args(device_fn)) == ["op"]):
    raise ValueError(
        "RunConfig: `device_fn` must be a callable taking exactly one "
        f"argument named `op` (it returns the op's device); got {device_fn!r}.")
  if config.protocol not in _PROTOCOLS:
    raise ValueError(
        "RunConfig: `protocol` must be 'grpc', 'grpc+verbs' or None (gRPC); "
        f"got {config.protocol!r}.")


def _field(name, doc):
  """A read-only property returning attribute `_<name>`."""
  return property(lambda self: getattr(self, "_" + name), doc=doc)


class RunConfig:
  """How an Estimator runs, and this process's place in the cluster.

  The arguments are tf.estimator.RunConfig's (see the module docstring for
  TF_CONFIG and the distribution strategies). Each is a read-only property
  of the same name.

  Args:
    model_dir: where checkpoints and summaries go (a str or PathLike); None
      lets the Estimator choose (TF_CONFIG's `model_dir`, if any, applies).
    tf_random_seed: the graph-level random seed (an int), or None.
    save_summary_steps: summaries every this many steps (0: none).
    save_checkpoints_steps: a checkpoint every this many steps.
    save_checkpoints_secs: a checkpoint every this many seconds; 600 when
      neither interval is given; at most one of the two may be set, and
      both None saves no checkpoints.
    session_config: a `tf.compat.v1.ConfigProto`, or None.
    keep_checkpoint_max: how many recent checkpoints to keep (0 or None:
      all).
    keep_checkpoint_every_n_hours: also keep one checkpoint per this many
      hours.
    log_step_count_steps: the loss, the step and steps/sec logged every this
      many steps.
    train_distribute: must be None (no strategies here).
    device_fn: `device_fn(op)` returning the op's device, replacing the
      Estimator's default placement; or None.
    protocol: the server protocol, 'grpc' or 'grpc+verbs'; None is gRPC.
    eval_distribute: must be None.
    experimental_distribute: must be None.
    experimental_max_worker_delay_secs: an int cap on the delay before a
      worker starts training, or None.
    session_creation_timeout_secs: how long a task waits for its session.
    checkpoint_save_graph_def: whether checkpoints also write the graph.
  """

  _REPLACEABLE = REPLACEABLE

  def __init__(self, model_dir=None, tf_random_seed=None,
               save_summary_steps=100, save_checkpoints_steps=_UNSET,
               save_checkpoints_secs=_UNSET, session_config=None,
               keep_checkpoint_max=5, keep_checkpoint_every_n_hours=10000,
               log_step_count_steps=100, train_distribute=None,
               device_fn=None, protocol=None, eval_distribute=None,
               experimental_distribute=None,
               experimental_max_worker_delay_secs=None,
               session_creation_timeout_secs=7200,
               checkpoint_save_graph_def=True):
    steps, secs = _checkpoint_intervals(save_checkpoints_steps,
                                        save_checkpoints_secs)
    _refuse_distribution(dict(
        train_distribute=train_distribute, eval_distribute=eval_distribute,
        experimental_distribute=experimental_distribute))
    tf_config = read_tf_config()
    if tf_config:
      tf.compat.v1.logging.info("%s: %s", TF_CONFIG, tf_config)
    arguments = dict(
        model_dir=_model_dir(tf_config, model_dir),
        tf_random_seed=tf_random_seed, save_summary_steps=save_summary_steps,
        save_checkpoints_steps=steps, save_checkpoints_secs=secs,
        session_config=session_config,
        keep_checkpoint_max=keep_checkpoint_max,
        keep_checkpoint_every_n_hours=keep_checkpoint_every_n_hours,
        log_step_count_steps=log_step_count_steps,
        train_distribute=None, device_fn=device_fn, protocol=protocol,
        eval_distribute=None, experimental_distribute=None,
        experimental_max_worker_delay_secs=(
            experimental_max_worker_delay_secs),
        session_creation_timeout_secs=session_creation_timeout_secs,
        checkpoint_save_graph_def=checkpoint_save_graph_def)
    self._set(arguments)
    _validate(self)
    self._set(_cluster_facts(tf_config))
    if self._session_config is None and self._cluster_spec:
      self._session_config = self._cluster_session_config()

  def _set(self, values):
    for name, value in values.items():
      setattr(self, "_" + name, value)

  def _cluster_session_config(self):
    """The session config of a task of a between-graph cluster that was
    given none: TF's default, with this task's device filters (None for a
    task without filters)."""
    return session_lib.task_session_config(self._task_type, self._task_id)

  model_dir = _field("model_dir", "Where checkpoints and summaries go.")
  tf_random_seed = _field("tf_random_seed", "The graph-level random seed.")
  save_summary_steps = _field("save_summary_steps",
                              "Summaries every this many steps.")
  save_checkpoints_steps = _field("save_checkpoints_steps",
                                  "A checkpoint every this many steps.")
  save_checkpoints_secs = _field("save_checkpoints_secs",
                                 "A checkpoint every this many seconds.")
  session_config = _field("session_config", "The session's ConfigProto.")
  keep_checkpoint_max = _field("keep_checkpoint_max",
                               "How many recent checkpoints are kept.")
  keep_checkpoint_every_n_hours = _field(
      "keep_checkpoint_every_n_hours", "One checkpoint kept per this many "
      "hours.")
  log_step_count_steps = _field("log_step_count_steps",
                                "Progress logged every this many steps.")
  train_distribute = _field("train_distribute", "Always None here.")
  device_fn = _field("device_fn", "`device_fn(op)`, or None for the "
                     "Estimator's default placement.")
  protocol = _field("protocol", "The server protocol (None: gRPC).")
  eval_distribute = _field("eval_distribute", "Always None here.")
  experimental_distribute = _field("experimental_distribute",
                                   "Always None here.")
  experimental_max_worker_delay_secs = _field(
      "experimental_max_worker_delay_secs",
      "The cap on a worker's start delay, or None.")
  session_creation_timeout_secs = _field(
      "session_creation_timeout_secs", "How long a task waits for its "
      "session.")
  checkpoint_save_graph_def = _field(
      "checkpoint_save_graph_def", "Whether checkpoints write the graph.")
  cluster_spec = _field("cluster_spec", "TF_CONFIG's cluster, a "
                        "tf.train.ClusterSpec (empty when alone and for an "
                        "evaluator).")
  task_type = _field("task_type", "This task's job ('worker' when alone).")
  task_id = _field("task_id", "This task's index in its job.")
  master = _field("master", "The training session's target ('': "
                  "in-process).")
  evaluation_master = _field("evaluation_master",
                             "The evaluation session's target.")
  is_chief = _field("is_chief", "Whether this task is the chief (or "
                    "master, or alone).")
  num_ps_replicas = _field("num_ps_replicas", "The cluster's ps tasks.")
  num_worker_replicas = _field("num_worker_replicas",
                               "The training tasks: workers and the chief.")
  global_id_in_cluster = _field(
      "global_id_in_cluster", "This task's index among all the cluster's "
      "tasks: the chief 0, the other jobs by name, ps last (None for an "
      "evaluator).")
  service = _field("service", "TF_CONFIG's `service` dict, or None.")

  def replace(self, **kwargs):
    """A copy of this config with some constructor arguments changed.

    The names of `REPLACEABLE` may change (and `tpu_config` for the TPU
    RunConfig); the copy is checked as a new config is. Giving one
    checkpoint interval (not None) clears the other; giving both, at most
    one may be set. The cluster (TF_CONFIG) is kept as it was read.

    Raises:
      ValueError: for an argument `replace` cannot change, or a value the
        constructor would refuse (TypeError for a non-number where a
        number belongs).
    """
    unknown = sorted(set(kwargs) - set(self._REPLACEABLE))
    if unknown:
      raise ValueError(
          f"{type(self).__name__}.replace cannot change {unknown}; it "
          f"changes only {list(self._REPLACEABLE)}.")
    _refuse_distribution(kwargs)
    new = copy.deepcopy(self)
    new._set(kwargs)
    _settle_replaced_intervals(new, kwargs)
    _validate(new)
    return new

  # Callables and cluster handles a copy shares rather than copies.
  _SHARED = ("_device_fn",)

  def __deepcopy__(self, memo):
    new = type(self).__new__(type(self))
    memo[id(self)] = new
    for name, value in vars(self).items():
      if name not in self._SHARED:
        value = copy.deepcopy(value, memo)
      setattr(new, name, value)
    return new

  def __eq__(self, other):
    if type(other) is not type(self):
      return NotImplemented
    return vars(self) == vars(other)

  def __hash__(self):
    return hash((type(self), self._model_dir, self._task_type,
                 self._task_id))

  def __repr__(self):
    shown = ", ".join(f"{name[1:]}={_shown(value)}"
                      for name, value in vars(self).items())
    return f"{type(self).__name__}({shown})"


def _settle_replaced_intervals(config, replaced):
  """After `replace`: one interval given (not None) clears the other; both
  given may not both be set."""
  steps = config.save_checkpoints_steps
  secs = config.save_checkpoints_secs
  if "save_checkpoints_steps" in replaced and (
      "save_checkpoints_secs" in replaced):
    _checkpoint_intervals(steps, secs)
  elif "save_checkpoints_steps" in replaced and steps is not None:
    config._save_checkpoints_secs = None
  elif "save_checkpoints_secs" in replaced and secs is not None:
    config._save_checkpoints_steps = None


def _shown(value):
  """`value` for `RunConfig.__repr__`: a proto on one line."""
  if isinstance(value, tf.compat.v1.ConfigProto):
    return (f"ConfigProto<"
            f"{text_format.MessageToString(value, as_one_line=True)}>")
  return repr(value)
