"""Training on a between-graph cluster (TF_CONFIG with `ps` tasks).

A TPU pod trains synchronously: every host reads its share of the global
batch, the embedding gradients of all cores are summed per id and the dense
gradients averaged before one update per step. On a cluster of W training
tasks (the chief and the workers) and P parameter-server tasks, the host
TPUEstimator does the same by default (`cluster/sync/` holds the
mechanism); with `ClusterTraining(asynchronous=True)` each task applies its
own steps, as classic parameter-server training does.

`Cluster` holds the facts of the run's cluster that the estimator needs:
which tasks train, this task's index among them, its device, the ps count.
It reads them from the RunConfig, whose Estimator (either stack's) parsed
TF_CONFIG.
"""
import dataclasses
import numbers
from typing import ContextManager, Optional, Protocol

import tensorflow as tf

from estimator_spec.tf_patches import session_recovery

_TRAINING_JOBS = ("chief", "master", "worker")


class RunConfig(Protocol):
  """What the cluster wing reads of a RunConfig (tensorflow-estimator's,
  TF's TPU one or the library's own), which parsed TF_CONFIG: the task's
  type and index are set whenever the cluster spec is not empty, the only
  case in which the wing reads them."""

  @property
  def cluster_spec(self) -> Optional[tf.train.ClusterSpec]: ...

  @property
  def task_type(self) -> str: ...

  @property
  def task_id(self) -> int: ...

  @property
  def session_config(self) -> Optional[tf.compat.v1.ConfigProto]: ...


@dataclasses.dataclass(frozen=True)
class ClusterTraining:
  """How a TPUEstimator trains on a cluster with parameter servers.

  Args:
    asynchronous: False (default): synchronous, as a TPU pod trains. Each
      of the W training tasks (chief and workers) reads `train_batch_size /
      W` examples per step; the embedding gradients of all tasks are summed
      per id and each touched row is updated once; the dense gradients are
      averaged over the tasks; the global step advances by one per step.
      W tasks train exactly like one process with the global batch.
      True: each task trains on batches of `train_batch_size` and applies
      its own updates when its step is done (no waiting for other tasks;
      no update is lost: each table partition is read and written under a
      lock on its ps task).
    step_timeout_secs: synchronous only. A step that has not completed
      after this many seconds (a task died and did not come back) ends
      training with `estimator_spec.errors.SyncStepTimeoutError`, which names the missing tasks.
    report_after_secs: synchronous only. While a step waits longer than this,
      the task logs which tasks have not sent their gradients yet.
  """
  asynchronous: bool = False
  step_timeout_secs: float = 600.0
  report_after_secs: float = 30.0

  def __post_init__(self) -> None:
    if not isinstance(self.asynchronous, bool):
      raise TypeError(
          "ClusterTraining: `asynchronous` must be a bool; got "
          f"{type(self.asynchronous).__name__}: {self.asynchronous!r}.")
    for name in ("step_timeout_secs", "report_after_secs"):
      value: float = getattr(self, name)
      if (isinstance(value, bool) or not isinstance(value, numbers.Real) or
          not value > 0):
        raise ValueError(
            f"ClusterTraining: `{name}` must be a positive number of "
            f"seconds; got {value!r}.")


@dataclasses.dataclass(frozen=True)
class Cluster:
  """The cluster of a RunConfig, as this task sees it."""
  task_type: str
  task_id: int
  num_ps: int
  # ((job, index), ...): chief/master first, workers
  training_tasks: tuple[tuple[str, int], ...]

  @classmethod
  def from_run_config(cls, config: RunConfig) -> Optional["Cluster"]:
    """The run's cluster, or None when the tables live in this process (no
    `ps` job, or a task outside the cluster such as the evaluator)."""
    spec = getattr(config, "cluster_spec", None)
    if not spec or "ps" not in spec.jobs:
      return None
    tasks: list[tuple[str, int]] = []
    for job in _TRAINING_JOBS:
      if job in spec.jobs:
        tasks.extend((job, i) for i in spec.task_indices(job))
    return cls(config.task_type, int(config.task_id or 0),
               spec.num_tasks("ps"), tuple(tasks))

  @property
  def num_training_tasks(self) -> int:
    return len(self.training_tasks)

  @property
  def trains(self) -> bool:
    """Whether this task runs training steps (chief, master or worker)."""
    return (self.task_type, self.task_id) in self.training_tasks

  @property
  def index(self) -> int:
    """This task's index among the training tasks (chief first)."""
    return self.training_tasks.index((self.task_type, self.task_id))

  @property
  def is_chief(self) -> bool:
    return self.index == 0

  @property
  def device(self) -> str:
    """This task's CPU device."""
    return task_device(self.task_type, self.task_id)

  def training_task_name(self, index: int) -> str:
    job, task = self.training_tasks[index]
    return f"{job} {task}"

  def ps_device(self, index: int) -> str:
    return ps_device(index)


def task_device(job: str, index: int) -> str:
  return f"/job:{job}/task:{index}/device:CPU:0"


def ps_device(index: int) -> str:
  """The device of ps task `index`, where the partitions it holds live."""
  return f"/job:ps/task:{index}"


def task_batch_size(cluster: Optional[Cluster], options: ClusterTraining,
                    train_batch_size: Optional[int]) -> Optional[int]:
  """The examples this task reads per training step: on a training task of
  a synchronous cluster its share of the global batch, split over the
  training tasks; else the whole batch (asynchronous: each task steps on
  its own)."""
  if (cluster is None or not cluster.trains or options.asynchronous or
      train_batch_size is None):
    return train_batch_size
  tasks = cluster.num_training_tasks
  if train_batch_size % tasks:
    names = ", ".join(
        cluster.training_task_name(i) for i in range(tasks))
    raise ValueError(
        f"TPUEstimator: train_batch_size={train_batch_size} is the global "
        f"batch of a synchronous step over {tasks} training tasks ({names}) "
        f"and must divide evenly by {tasks}. Use a multiple of {tasks}, or "
        "ClusterTraining(asynchronous=True) for per-task batches.")
  return train_batch_size // tasks


def check_options(options: object) -> ClusterTraining:
  if options is None:
    return ClusterTraining()
  if not isinstance(options, ClusterTraining):
    raise TypeError(
        "TPUEstimator: `cluster_training` must be an estimator_spec."
        f"ClusterTraining; got {type(options).__name__}: {options!r}.")
  return options


def log_cluster(cluster: Cluster, options: ClusterTraining,
                batch: int) -> None:
  tf.compat.v1.logging.info(
      "TPUEstimator on a cluster: %s task %d (training task %d of %d), "
      "tables over %d ps tasks, %s training, %d examples per task step.",
      cluster.task_type, cluster.task_id, cluster.index,
      cluster.num_training_tasks, cluster.num_ps,
      "asynchronous" if options.asynchronous else "synchronous", batch)


# How often a task that waits for another (a worker for the chief to
# initialize or restore the variables) looks again.
RECOVERY_WAIT_SECS = 1


def prompt_session_recovery() -> ContextManager[None]:
  """Inside: a task waiting for the model to be ready (a worker waiting for
  the chief's initialization or restore, after a start or a ps restart)
  looks every `RECOVERY_WAIT_SECS` seconds instead of Estimator's 30
  (`tf_patches.session_recovery`)."""
  return session_recovery.recovery_wait(RECOVERY_WAIT_SECS)
