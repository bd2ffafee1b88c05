"""Where a run's tables live: the parameter-server tasks of a cluster
(TF_CONFIG with a `ps` job), else the TPU hosts the RunConfig describes.

The same placement serves the host engine (partitions and their devices)
and the TPU path (the spec is checked against the TPU's topology).

On a cluster each table has one partition per ps task. Which ps task holds
which partition is the ps assignment: partition p on ps p by default; with
lookup statistics (`profile_data_directory`), `balanced_assignment` spreads
the partitions that carry the most lookups over different ps tasks. Every
task of the cluster must use the same assignment, so it is decided once per
model directory (`resolve_ps_assignment`): the chief writes it to
`ASSIGNMENT_FILE` in the model directory before its first step, the
checkpoints record it (`ASSIGNMENT_TENSOR`), and a task that starts later
reads it from there rather than from statistics that have grown since. The
assignment moves partitions between devices only: variable names, values
and checkpoints are those of the default placement.

`Placement` holds these facts for one estimator, derived once from its
RunConfig: the cluster, the topology, the `EmbeddingConfig` of each mode,
the device of each table partition and the ps assignment. The estimator
builds it when it is built and hands it to each step (`host_step`, `sync`,
`profiling`), which read it and derive none of them again.
"""
import json
import math
import os
import time
import warnings

import tensorflow as tf

from estimator_spec import files
from estimator_spec.cluster import tasks as cluster_lib
from estimator_spec.estimator import tpu_context
from estimator_spec.config import embedding_config as config_lib
from estimator_spec.config import modes


class Placement:
  """Where one estimator's tables live (see module docstring), derived
  once from its RunConfig.

  Args:
    spec: the `EmbeddingConfigSpec`, or None.
    run_config: the estimator's RunConfig.
    options: the `cluster.ClusterTraining`.
    train_batch_size: the global training batch, or None.

  Attributes:
    cluster: the run's `cluster.Cluster`, or None (tables in this process).
    task_batch_size: the examples this task reads per training step: on a
      training task of a cluster its share of the global batch
      (`cluster.task_batch_size`), else `train_batch_size`.
    tpu_topology: the `tpu_context.Topology` of the RunConfig's
      `tpu_config` (the TPU the host emulates).
    ps_assignment: {table: [ps task of each partition]} once a training run
      resolved it (`resolve_ps_assignment`), else None: partition p on ps p.
  """

  def __init__(self, spec, run_config, options, train_batch_size):
    self._spec = spec
    self.cluster = cluster_lib.Cluster.from_run_config(run_config)
    self.task_batch_size = train_batch_size
    if self.cluster is not None and self.cluster.trains:
      self.task_batch_size = cluster_lib.task_batch_size(
          self.cluster, options, train_batch_size)
    self.tpu_topology = tpu_context.Topology.from_run_config(run_config)
    self.ps_assignment = None
    self._configs = {}

  @property
  def table_topology(self):
    """(hosts, cores, on_tpu_layout) the tables are laid out for
    (`table_topology`)."""
    return _table_layout(self.cluster, self.tpu_topology)

  def embedding_config(self, mode, batch_sizes):
    """The `EmbeddingConfig` of the spec for `mode` on this placement
    (built once per mode and batch size).

    Args:
      mode: a `tf.estimator.ModeKeys` value.
      batch_sizes: {mode: global batch size or None}; a mode without one
        uses the training batch size.
    """
    hosts, cores, tpu_layout = self.table_topology
    train = modes.TRAIN
    batch = batch_sizes.get(mode) or batch_sizes[train]
    if batch % cores and not (tpu_layout and mode == train):
      # Only the configuration proto splits the batch over cores; the host
      # runs it whole. Parameter-server "cores" and serving batches need
      # not divide it, so the proto's batch is rounded up there.
      batch = cores * math.ceil(batch / cores)
    if (mode, batch) not in self._configs:
      self._configs[(mode, batch)] = config_lib.EmbeddingConfig(
          self._spec, batch_size=batch, num_hosts=hosts, num_cores=cores,
          mode=mode)
    return self._configs[(mode, batch)]

  def ps_of(self, table, partition):
    """The index of the ps task holding partition `partition` of `table` in
    training (by the ps assignment)."""
    return _assigned_ps(self.ps_assignment, table, partition)

  def shard_device_fn(self, mode):
    """(table, partition index) -> device of the `ps` task holding it; None
    when the run has no parameter servers (every partition on the local
    device). Training graphs place partitions by the ps assignment; the
    graphs of other modes keep partition p on ps p."""
    if self.cluster is None:
      return None
    assignment = (self.ps_assignment
                  if mode == modes.TRAIN else None)
    cluster = self.cluster

    def device(table, partition):
      return cluster.ps_device(_assigned_ps(assignment, table, partition))

    return device

  def partitions(self, model):
    """[(table, partition, ps task)] of every partition of `model`'s tables
    on the cluster (one per ps task, fewer for tables smaller than the ps
    count; `EmbeddingModel.shard_layout`), by the ps assignment."""
    num_ps = self.cluster.num_ps
    return [(name, p, self.ps_of(name, p)) for name in model.tables
            for p in range(model.shard_layout(name, num_ps).num_partitions)]

  def resolve_ps_assignment(self, model, model_dir, stats_by_table,
                            wait_secs):
    """Decides the ps assignment of this cluster's training tasks
    (`resolve_ps_assignment`), keeps it and returns it."""
    self.ps_assignment = resolve_ps_assignment(
        model, self.cluster, model_dir, stats_by_table, wait_secs)
    return self.ps_assignment


def _assigned_ps(assignment, table, partition):
  """The ps task of a table partition by `assignment` ({table: [ps task of
  each partition]} or None: partition p on ps p)."""
  if assignment and table in assignment:
    return assignment[table][partition]
  return partition


def _table_layout(cluster, topology):
  if cluster is not None:
    return cluster.num_ps, cluster.num_ps, False
  return topology.num_hosts, topology.num_replicas, True


def table_topology(config):
  """(hosts, cores, on_tpu_layout) the tables of a run with RunConfig
  `config` are laid out for.

  Tables are split over the parameter-server tasks of a cluster (one "core"
  per task), or else over the TPU hosts the RunConfig's
  `tpu_config.num_shards` implies (8 cores per host), so that a checkpoint
  of a TPU run, `mod` layout included, reads back as the TPU wrote it.
  Default: one host with one core.
  """
  cluster = cluster_lib.Cluster.from_run_config(config)
  return _table_layout(cluster, None if cluster is not None else
                       tpu_context.Topology.from_run_config(config))


ASSIGNMENT_FILE = "embedding_ps_assignment.json"
ASSIGNMENT_TENSOR = "estimator_spec/ps_assignment"


def balanced_assignment(model, num_ps, stats_by_table):
  """{table: [ps task of partition p]} that spreads lookup load: tables
  with statistics, busiest first, put their partitions, busiest first, on
  the ps tasks with the least load so far (each ps task still gets one
  partition of each table, so memory stays as even as the partitions);
  tables without statistics keep partition p on ps p. Ties go to the lower
  index, so every task computes the same assignment from the same data.

  Args:
    model: the `EmbeddingModel`.
    num_ps: the cluster's ps tasks (one partition per task).
    stats_by_table: {table: statistics kept for `num_ps` shards, or None}.
  """
  strategy = model.partition_strategy
  load = [0] * num_ps
  assignment = {}
  with_stats = []
  for name, table in model.tables.items():
    stats = stats_by_table.get(name)
    partitions = min(table.vocabulary_size, num_ps)
    if stats is None or stats.settings["num_shards"] != num_ps:
      assignment[name] = list(range(partitions))
    else:
      with_stats.append((-int(stats.lookups), name, stats))
  for _, name, stats in sorted(with_stats):
    counts = [int(c) for c in stats.shard_load[strategy]]
    order = sorted(range(len(counts)), key=lambda p: (-counts[p], p))
    free = list(range(num_ps))
    placed = [None] * len(counts)
    for p in order:
      ps = min(free, key=lambda t: (load[t], t))
      free.remove(ps)
      placed[p] = ps
      load[ps] += counts[p]
    assignment[name] = placed
  return assignment


def assignment_report(model, assignment, stats_by_table, num_ps):
  """Lines saying which ps task holds each table's partitions, and each
  ps task's share of the sampled lookups."""
  load = [0] * num_ps
  lines = []
  for name, tasks in assignment.items():
    stats = stats_by_table.get(name)
    for p, ps in enumerate(tasks):
      if stats is not None and stats.settings["num_shards"] == num_ps:
        load[ps] += int(stats.shard_load[model.partition_strategy][p])
    lines.append(f"  {name}: partition -> ps task " + ", ".join(
        f"{p}->{ps}" for p, ps in enumerate(tasks)))
  total = sum(load)
  if total:
    lines.append("  sampled lookups per ps task: " + ", ".join(
        f"ps {ps} {100.0 * n / total:.1f}%" for ps, n in enumerate(load)))
  return "\n".join(lines)


# The largest ps-assignment file read (a model of 1,000 tables on 1,000 ps
# tasks writes about 5 MB).
MAX_ASSIGNMENT_BYTES = 16 * 2**20


def _assignment_problem(model, num_ps, assignment):
  """Why `assignment` (decoded JSON) does not place every table of `model`
  on `num_ps` ps tasks, one partition per task; None when it does."""
  if not isinstance(assignment, dict):
    return "it is not a JSON object of {table: [ps task of each partition]}"
  if sorted(assignment) != sorted(model.tables):
    return (f"it names the tables {sorted(assignment)[:8]}, not this model's "
            f"{sorted(model.tables)[:8]}")
  for name, table in model.tables.items():
    tasks = assignment[name]
    partitions = min(table.vocabulary_size, num_ps)
    if not isinstance(tasks, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in tasks):
      return f"table {name!r}: it is not a list of ps task indices"
    if len(tasks) != partitions:
      return (f"table {name!r}: {len(tasks)} partitions, not {partitions} "
              f"(one per ps task of {num_ps})")
    if not all(0 <= t < num_ps for t in tasks):
      return f"table {name!r}: a ps task index is not in [0, {num_ps})"
    if len(set(tasks)) != len(tasks):
      return f"table {name!r}: a ps task holds two partitions"
  return None


def _read_text(path):
  """The bytes of the assignment file `path` (a local path: a regular file
  only, never followed through a link; a URL: through tf.io.gfile), at
  most MAX_ASSIGNMENT_BYTES; raises FileRejected or OSError."""
  if "://" not in path:
    return files.read_bytes(path, MAX_ASSIGNMENT_BYTES)
  size = tf.io.gfile.stat(path).length
  if size > MAX_ASSIGNMENT_BYTES:
    raise files.FileRejected(f"it holds {size:,} bytes, more than the "
                             f"{MAX_ASSIGNMENT_BYTES:,} allowed")
  with tf.io.gfile.GFile(path, "rb") as f:
    return f.read(MAX_ASSIGNMENT_BYTES + 1)


def _recorded_assignment(model_dir, model, num_ps):
  """(the assignment the latest checkpoint, else the model directory's
  file, records for this model and ps count, or None; [(where, why) of
  each record that is not a valid one])."""
  checkpoint = tf.train.latest_checkpoint(model_dir)
  texts = []
  if checkpoint is not None:
    reader = tf.compat.v1.train.NewCheckpointReader(checkpoint)
    if reader.has_tensor(ASSIGNMENT_TENSOR):
      texts.append((f"checkpoint {checkpoint} ({ASSIGNMENT_TENSOR})",
                    lambda: reader.get_tensor(ASSIGNMENT_TENSOR)))
  path = os.path.join(model_dir, ASSIGNMENT_FILE)
  if tf.io.gfile.exists(path) or os.path.lexists(path):
    texts.append((path, lambda: _read_text(path)))
  problems = []
  for where, read in texts:
    try:
      decoded = files.parse_json(read(), max_depth=4)
      problem = _assignment_problem(model, num_ps, decoded)
    except FileNotFoundError:
      continue  # removed since
    except (OSError, ValueError, tf.errors.OpError) as error:
      problem = (error.strerror if isinstance(error, OSError) and
                 error.strerror else getattr(error, "message", None) or
                 str(error))
    if problem is None:
      return decoded, problems
    problems.append((where, problem))
  return None, problems


def _warn(problems, said, then):
  """A warning for each (where, why) in `problems` not yet `said`."""
  for where, why in problems:
    if (where, why) not in said:
      said.add((where, why))
      warnings.warn(f"The ps assignment in {where} is not used: {why}. "
                    f"{then}", RuntimeWarning, stacklevel=3)


def resolve_ps_assignment(model, cluster, model_dir, stats_by_table,
                          wait_secs):
  """The ps assignment every task of this cluster uses (see module).

  The chief takes the one recorded in the model directory (checkpoint,
  then file) or else computes it from `stats_by_table` and writes the
  file; other training tasks wait up to `wait_secs` for a recorded one.
  A record that is unreadable or does not fit this model and ps count
  (docs/security.md) gets a warning naming it and the reason: the chief
  then replaces the file, a worker waits for the chief's.
  """
  said = set()
  recorded, problems = _recorded_assignment(model_dir, model, cluster.num_ps)
  if recorded is not None:
    return recorded
  if cluster.is_chief:
    _warn(problems, said, "The chief writes a new one.")
    assignment = balanced_assignment(model, cluster.num_ps, stats_by_table)
    tf.io.gfile.makedirs(model_dir)
    path = os.path.join(model_dir, ASSIGNMENT_FILE)
    text = json.dumps(assignment, sort_keys=True)
    if "://" in path:
      partial = path + ".partial"
      with tf.io.gfile.GFile(partial, "w") as f:
        f.write(text)
      tf.io.gfile.rename(partial, path, overwrite=True)
    else:
      files.write_atomic(path, text)
    return assignment
  deadline = time.monotonic() + wait_secs
  while time.monotonic() < deadline:
    _warn(problems, said, "This task waits for the chief's.")
    time.sleep(0.5)
    recorded, problems = _recorded_assignment(model_dir, model,
                                              cluster.num_ps)
    if recorded is not None:
      return recorded
  raise RuntimeError(
      f"{cluster.training_task_name(cluster.index)}: waited {wait_secs:.0f} "
      f"s for the chief to record which ps task holds each table partition "
      f"({os.path.join(model_dir, ASSIGNMENT_FILE)}); start the chief with "
      "the same model_dir and profile_data_directory.")
