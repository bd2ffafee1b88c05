"""Where a run's tables live: the parameter-server tasks of a cluster
(TF_CONFIG with a `ps` job), else the TPU hosts the RunConfig describes.

The same placement serves the host engine (partitions and their devices)
and the TPU path (the spec is checked against the TPU's topology).

On a cluster each table has one partition per ps task. Which ps task holds
which partition is the ps assignment (`TablePlacement`, plain data):
partition p on ps p by default; with lookup statistics
(`profile_data_directory`), `balanced_assignment` spreads the partitions
that carry the most lookups over different ps tasks. Every task of the
cluster must use the same assignment, so it is decided once per model
directory (`resolve_ps_assignment`) and recorded there and in the
checkpoints (`assignment_file`). The assignment moves partitions between
devices only: variable names, values and checkpoints are those of the
default placement.

`Placement` holds these facts for one estimator, derived once from its
RunConfig: the cluster, the topology, the `TopologyConfig` of each mode,
the device of each table partition and the ps assignment. The estimator
builds it when it is built and hands it to each step (`host_step`, `sync`,
`profiling`), which read it and derive none of them again.
"""
import dataclasses
import math
from typing import Any, Callable, Mapping, Optional, Protocol, Sequence

import numpy as np
import numpy.typing as npt

from estimator_spec.cluster import assignment_file
from estimator_spec.cluster import tasks
from estimator_spec.config import model as model_lib
from estimator_spec.config import topology as config_lib
from estimator_spec.config import modes
from estimator_spec.config import spec as spec_lib

# (table, partition index) -> the device holding the partition.
DeviceFn = Callable[[str, int], str]


class Topology(Protocol):
  """What the placement reads of the TPU a host run emulates (the
  estimator's `tpu_context.Topology`)."""

  @property
  def num_hosts(self) -> int: ...

  @property
  def num_replicas(self) -> int: ...


class LookupStatistics(Protocol):
  """What the ps assignment reads of one table's saved lookup statistics
  (profiling's `statistics.TableStatistics`): the settings they were kept
  for, the sampled lookups, and the lookups of each shard by partition
  strategy."""

  @property
  def settings(self) -> Mapping[str, Any]: ...

  @property
  def lookups(self) -> int: ...

  @property
  def shard_load(self) -> Mapping[str, npt.NDArray[np.int64]]: ...


@dataclasses.dataclass(frozen=True)
class TablePlacement:
  """Which ps task of a cluster holds each table partition: partition p
  of a table on ps task p, unless `assigned` names the table. Plain data:
  printable, compared by value, picklable.

  Attributes:
    num_ps: the cluster's ps tasks.
    assigned: ((table, (ps task of partition 0, of partition 1, ...)),
      ...) in table name order: the tables of a ps assignment.
  """
  num_ps: int
  assigned: tuple[tuple[str, tuple[int, ...]], ...] = ()

  @classmethod
  def of(cls, num_ps: int,
         assignment: Optional[Mapping[str, Sequence[int]]]
         ) -> "TablePlacement":
    """The placement of a ps assignment, {table: [ps task of each
    partition]} (or None: partition p on ps p)."""
    return cls(num_ps, tuple(sorted(
        (name, tuple(ps)) for name, ps in (assignment or {}).items())))

  def assignment(self) -> Optional[assignment_file.Assignment]:
    """The ps assignment, {table: [ps task of each partition]}, or None
    when no table is assigned."""
    return {name: list(ps) for name, ps in self.assigned} or None

  def device_fn(self) -> DeviceFn:
    """(table, partition index) -> device of the ps task holding it."""
    assigned = dict(self.assigned)

    def device(table: str, partition: int) -> str:
      return tasks.ps_device(_ps_of(assigned, table, partition))

    return device

  def partitions(self, model: model_lib.EmbeddingModel
                 ) -> list[tuple[str, int, int]]:
    """[(table, partition, ps task)] of every partition of `model`'s tables
    (one per ps task, fewer for tables smaller than the ps count;
    `EmbeddingModel.shard_layout`)."""
    assigned = dict(self.assigned)
    return [(name, p, _ps_of(assigned, name, p)) for name in model.tables
            for p in range(model.shard_layout(name, self.num_ps)
                           .num_partitions)]


def _ps_of(assigned: Mapping[str, Sequence[int]], table: str,
           partition: int) -> int:
  """The ps task of a table partition by `assigned` ({table: (ps task of
  each partition)}): partition p on ps p for a table it does not name."""
  if table in assigned:
    return assigned[table][partition]
  return partition


class Placement:
  """Where one estimator's tables live (see module docstring), derived
  once from its RunConfig.

  Args:
    spec: the `EmbeddingConfigSpec`, or None.
    cluster: the run's `tasks.Cluster`, or None (tables in this process).
    task_batch_size: the examples this task reads per training step
      (`tasks.task_batch_size`).
    tpu_topology: the TPU the host emulates (the estimator's
      `tpu_context.Topology` of the RunConfig's `tpu_config`).

  Attributes:
    cluster, task_batch_size, tpu_topology: as given.
    tables: the `TablePlacement` of training on the cluster (None without
      one): partition p on ps p until a training run resolves the ps
      assignment (`resolve_ps_assignment`).
  """

  def __init__(self, spec: Optional[spec_lib.EmbeddingConfigSpec],
               cluster: Optional[tasks.Cluster],
               task_batch_size: Optional[int],
               tpu_topology: Topology) -> None:
    self._spec = spec
    self.cluster = cluster
    self.task_batch_size = task_batch_size
    self.tpu_topology = tpu_topology
    self.tables = None if cluster is None else TablePlacement(cluster.num_ps)
    self._configs: dict[tuple[str, int], config_lib.TopologyConfig] = {}

  def __repr__(self) -> str:
    return (f"Placement(cluster={self.cluster!r}, task_batch_size="
            f"{self.task_batch_size!r}, tpu_topology={self.tpu_topology!r}, "
            f"tables={self.tables!r})")

  @property
  def ps_assignment(self) -> Optional[assignment_file.Assignment]:
    """{table: [ps task of each partition]} once a training run resolved
    it (`resolve_ps_assignment`), else None: partition p on ps p."""
    return None if self.tables is None else self.tables.assignment()

  @property
  def table_topology(self) -> tuple[int, int, bool]:
    """(hosts, cores, on_tpu_layout) the tables are laid out for
    (`table_layout`)."""
    return table_layout(self.cluster, self.tpu_topology)

  def embedding_config(self, mode: str,
                       batch_sizes: Mapping[str, Optional[int]]
                       ) -> config_lib.TopologyConfig:
    """The `TopologyConfig` of the spec for `mode` on this placement
    (built once per mode and batch size). Only a run with a spec asks, and
    a spec requires a training batch size (the estimator checks both when
    it is built).

    Args:
      mode: a `tf.estimator.ModeKeys` value.
      batch_sizes: {mode: global batch size or None}; a mode without one
        uses the training batch size.
    """
    hosts, cores, tpu_layout = self.table_topology
    train = modes.TRAIN
    batch = batch_sizes.get(mode) or batch_sizes[train]
    assert self._spec is not None and batch is not None
    if batch % cores and not (tpu_layout and mode == train):
      # Only the configuration proto splits the batch over cores; the host
      # runs it whole. Parameter-server "cores" and serving batches need
      # not divide it, so the proto's batch is rounded up there.
      batch = cores * math.ceil(batch / cores)
    if (mode, batch) not in self._configs:
      self._configs[(mode, batch)] = config_lib.TopologyConfig(
          self._spec, batch_size=batch, num_hosts=hosts, num_cores=cores,
          mode=mode)
    return self._configs[(mode, batch)]

  def shard_device_fn(self, mode: str) -> Optional[DeviceFn]:
    """(table, partition index) -> device of the `ps` task holding it; None
    when the run has no parameter servers (every partition on the local
    device). Training graphs place partitions by the ps assignment; the
    graphs of other modes keep partition p on ps p."""
    if self.cluster is None:
      return None
    if mode == modes.TRAIN:
      assert self.tables is not None  # set with the cluster
      return self.tables.device_fn()
    return TablePlacement(self.cluster.num_ps).device_fn()

  def partitions(self, model: model_lib.EmbeddingModel
                 ) -> list[tuple[str, int, int]]:
    """[(table, partition, ps task)] of every partition of `model`'s tables
    on the cluster, by the ps assignment (`TablePlacement.partitions`)."""
    assert self.tables is not None  # set with the cluster
    return self.tables.partitions(model)

  def resolve_ps_assignment(
      self, model: model_lib.EmbeddingModel, model_dir: str,
      stats_by_table: Mapping[str, Optional[LookupStatistics]],
      wait_secs: float) -> assignment_file.Assignment:
    """Decides the ps assignment of this cluster's training tasks
    (`resolve_ps_assignment`), keeps it and returns it."""
    assert self.cluster is not None  # only a cluster's training resolves it
    assignment = resolve_ps_assignment(model, self.cluster, model_dir,
                                       stats_by_table, wait_secs)
    self.tables = TablePlacement.of(self.cluster.num_ps, assignment)
    return assignment


def table_layout(cluster: Optional[tasks.Cluster],
                 topology: Topology) -> tuple[int, int, bool]:
  """(hosts, cores, on_tpu_layout) the tables of a run are laid out for.

  Tables are split over the parameter-server tasks of a `cluster` (one
  "core" per task), or else over the hosts of the TPU `topology` (a
  `tpu_context.Topology`: the RunConfig's `tpu_config.num_shards` cores, 8
  per host), so that a checkpoint of a TPU run, `mod` layout included,
  reads back as the TPU wrote it. Default: one host with one core.
  """
  if cluster is not None:
    return cluster.num_ps, cluster.num_ps, False
  return topology.num_hosts, topology.num_replicas, True


def resolve_ps_assignment(
    model: model_lib.EmbeddingModel, cluster: tasks.Cluster, model_dir: str,
    stats_by_table: Mapping[str, Optional[LookupStatistics]],
    wait_secs: float) -> assignment_file.Assignment:
  """The ps assignment every task of this cluster uses: the one recorded
  for the model directory, else the chief's `balanced_assignment` of
  `stats_by_table`, which it records there (`assignment_file.resolve`: a
  worker waits up to `wait_secs` for it)."""
  return assignment_file.resolve(
      model, cluster, model_dir, wait_secs,
      lambda: balanced_assignment(model, cluster.num_ps, stats_by_table))


def balanced_assignment(
    model: model_lib.EmbeddingModel, num_ps: int,
    stats_by_table: Mapping[str, Optional[LookupStatistics]]
) -> assignment_file.Assignment:
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
  assignment: assignment_file.Assignment = {}
  with_stats: list[tuple[int, str, LookupStatistics]] = []
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
    placed = [0] * len(counts)  # every entry is set: `order` has them all
    for p in order:
      ps = min(free, key=lambda t: (load[t], t))
      free.remove(ps)
      placed[p] = ps
      load[ps] += counts[p]
    assignment[name] = placed
  return assignment


def assignment_report(
    model: model_lib.EmbeddingModel,
    assignment: Mapping[str, Sequence[int]],
    stats_by_table: Mapping[str, Optional[LookupStatistics]],
    num_ps: int) -> str:
  """Lines saying which ps task holds each table's partitions, and each
  ps task's share of the sampled lookups."""
  load = [0] * num_ps
  lines = []
  for name, owners in assignment.items():
    stats = stats_by_table.get(name)
    for p, ps in enumerate(owners):
      if stats is not None and stats.settings["num_shards"] == num_ps:
        load[ps] += int(stats.shard_load[model.partition_strategy][p])
    lines.append(f"  {name}: partition -> ps task " + ", ".join(
        f"{p}->{ps}" for p, ps in enumerate(owners)))
  total = sum(load)
  if total:
    lines.append("  sampled lookups per ps task: " + ", ".join(
        f"ps {ps} {100.0 * n / total:.1f}%" for ps, n in enumerate(load)))
  return "\n".join(lines)
