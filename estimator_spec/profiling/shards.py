"""What saved lookup statistics say about a config's shards, as text: the
start-up report of a training run with `profile_data_directory` and the
part of `describe --profile-dir` on them (docs/profile.md).

Per table: the sampled lookups and the busiest shard's load over the mean
(imbalance) under `div` and under `mod`; per shard, for all those tables
together: the share of their sampled lookups and the memory of their rows
and slots under each strategy (shard i of every table lives on the same
core or ps task). Memory is the config model's (`config.report`).
"""
from typing import Any, Mapping, Optional

import numpy as np
import numpy.typing as npt

from estimator_spec.config import topology
from estimator_spec.config import report
from estimator_spec.config import sharding

_Config = topology.TopologyConfig
_PerShard = dict[str, npt.NDArray[np.float64]]  # strategy -> shard -> value


def statistics_section(config: _Config, stats_by_table: Mapping[str, Any],
                       num_shards: int, unit: str = "shard") -> str:
  """What the statistics say about `config`'s tables on `num_shards`
  shards (see module docstring); "" when no table has statistics.

  Args:
    config: the `EmbeddingConfig`.
    stats_by_table: {table: statistics (`statistics.TableStatistics`) or
      None}.
    num_shards: the shard count the statistics were kept for.
    unit: what a shard is, as the section names it ("core shard" where
      the report also shows the hosts' shards).
  """
  found = {t: s for t, s in stats_by_table.items() if s is not None}
  if not found:
    return ""
  configured = config.model.partition_strategy
  load, memory = _per_shard(config, found, num_shards)
  return (_tables_text(found, num_shards, unit, configured) +
          _shards_text(load, memory, num_shards, unit) +
          _busiest_text(load, configured))


def describe_section(config: _Config, stats_by_table: Mapping[str, Any],
                     num_shards: Optional[int] = None) -> str:
  """`describe`'s part on saved lookup statistics (`stats_by_table`, kept
  for `config.num_cores` shards: per TPU core, where the TPU looks the
  rows up), headed by what they are not per: the tables' shards that
  `describe` shows for `num_shards` (`report.shard_unit`). "" when no
  table has statistics."""
  section = statistics_section(config, stats_by_table, config.num_cores,
                               unit="core shard")
  if not section:
    return ""
  return (f"\nLookup statistics (sampled while training), kept per TPU "
          f"core, not per {report.shard_unit(config, num_shards)}:\n" +
          section)


def _tables_text(found: Mapping[str, Any], num_shards: int, unit: str,
                 configured: str) -> str:
  """One row per table: runs, lookups, distinct ids, div/mod imbalance."""
  tw = max([5] + [len(name) for name in found])
  lines = [f"  {num_shards} {unit}(s); tables use '{configured}'.\n",
           f"  {'table':<{tw}} {'runs':>5} {'lookups':>12} {'distinct':>10}"
           f" {'div max/mean':>13} {'mod max/mean':>13}\n"]
  for name, stats in found.items():
    lines.append(f"  {name:<{tw}} {stats.runs:>5} {stats.lookups:>12,} "
                 f"{stats.distinct_ids():>10,.0f} "
                 f"{stats.imbalance('div'):>13.2f} "
                 f"{stats.imbalance('mod'):>13.2f}\n")
  return "".join(lines)


def _per_shard(config: _Config, found: Mapping[str, Any],
               num_shards: int) -> tuple[_PerShard, _PerShard]:
  """(sampled lookups, bytes of rows and slots) of shard i of all the
  tables in `found` together, under each strategy."""
  load = {s: np.zeros(num_shards) for s in sharding.STRATEGIES}
  memory = {s: np.zeros(num_shards) for s in sharding.STRATEGIES}
  for name, stats in found.items():
    table = config.model.tables[name]
    for strategy in sharding.STRATEGIES:
      counts = stats.shard_load[strategy]
      load[strategy][:counts.size] += counts
      sizes = report.partition_bytes(config, name, sharding.ShardLayout(
          table.vocabulary_size, num_shards, strategy))
      memory[strategy][:len(sizes)] += sizes
  return load, memory


def _shards_text(load: _PerShard, memory: _PerShard, num_shards: int,
                 unit: str) -> str:
  """One row per shard: its share of the lookups and its memory, under
  `div` and under `mod`."""
  lines = [f"  Per {unit}, the tables above together (share of their "
           "sampled lookups; memory of tables and slots):\n",
           f"  {'shard':>5} {'div load':>9} {'div memory':>12} "
           f"{'mod load':>9} {'mod memory':>12}\n"]
  share = {s: 100.0 * load[s] / max(load[s].sum(), 1)
           for s in sharding.STRATEGIES}
  for shard in range(num_shards):
    lines.append(f"  {shard:>5} {share['div'][shard]:>8.1f}% "
                 f"{report.mib(memory['div'][shard]):>12} "
                 f"{share['mod'][shard]:>8.1f}% "
                 f"{report.mib(memory['mod'][shard]):>12}\n")
  return "".join(lines)


def _busiest_text(load: _PerShard, configured: str) -> str:
  """The busiest shard's load over the mean, per strategy."""
  lines = []
  for strategy in sharding.STRATEGIES:
    mean = load[strategy].mean()
    worst = load[strategy].max() / mean if mean else 1.0
    note = " (configured)" if strategy == configured else ""
    lines.append(f"  {strategy}{note}: busiest shard {worst:.2f}x the mean "
                 "load\n")
  return "".join(lines)
