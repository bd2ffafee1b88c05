"""Lookup statistics of one table (`profile_data_directory`), as plain data.

A `TableStatistics` accumulates what sampled lookups of one table show, in
bounded memory, and merges with another (another run, another task):

* `lookups` and `examples`: ids looked up and examples seen (sampled);
* distinct ids: a HyperLogLog sketch of 2**12 one-byte registers, relative
  standard error 1.04 / sqrt(4096) = 1.6% (`distinct_ids()`);
* the hottest ids: a Misra-Gries summary of at most `capacity` ids; a
  listed count is at most `lookups / (capacity + 1)` below the true count,
  and every id looked up more often than that is listed (`hottest()`);
* ids per example: how many examples had n ids (n capped at
  `MAX_IDS_PER_EXAMPLE`, larger counts in that last bucket);
* the lookup load each shard would carry under `div` and under `mod` for
  the configured shard count (`sharding.ShardLayout.route`).

The settings that give statistics their meaning (`table_settings`): the
table's name, vocabulary size and features (name, sequence length), the
partition strategy and the shard count. Other settings (dimension,
optimizer, learning rate) do not change which ids are looked up, so a
changed optimizer keeps its statistics. Their JSON form is
`file_format`'s, their files in a directory `store`'s.
"""
import hashlib
import json

import numpy as np

from estimator_spec.config import sharding

HLL_PRECISION = 12              # 2**12 registers
HEAVY_HITTER_CAPACITY = 1024
MAX_IDS_PER_EXAMPLE = 4096
_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def table_settings(model, table_name, num_shards):
  """The settings statistics of table `table_name` are for (see module)."""
  table = model.tables[table_name]
  features = sorted(
      (name, model.features[name].max_sequence_length)
      for name in table.features)
  return {
      "table": table_name,
      "vocabulary_size": int(table.vocabulary_size),
      "features": [list(f) for f in features],
      "partition_strategy": model.partition_strategy,
      "num_shards": int(num_shards),
  }


def settings_key(settings):
  """The hex SHA-256 of the settings' canonical JSON."""
  canonical = json.dumps(settings, sort_keys=True, separators=(",", ":"))
  return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


class TableStatistics:
  """Sampled lookup statistics of one table (see module docstring)."""

  def __init__(self, settings, sampling_rate,
               capacity=HEAVY_HITTER_CAPACITY):
    self.settings = dict(settings)
    self.sampling_rate = float(sampling_rate)
    self.capacity = int(capacity)
    self.runs = 1
    self.lookups = 0
    self.examples = 0
    self.registers = np.zeros(2**HLL_PRECISION, np.uint8)
    # Misra-Gries summary: ids (ascending) and their counts.
    self._heavy_ids = np.zeros(0, np.int64)
    self._heavy_counts = np.zeros(0, np.int64)
    self.ids_per_example = {}  # n -> examples
    self._layouts = {
        s: sharding.ShardLayout(self.settings["vocabulary_size"],
                                self.settings["num_shards"], s)
        for s in sharding.STRATEGIES
    }
    self.shard_load = {
        s: np.zeros(self._layouts[s].num_partitions, np.int64)
        for s in sharding.STRATEGIES
    }

  @property
  def heavy(self):
    """{id: count} of the Misra-Gries summary."""
    return dict(zip(self._heavy_ids.tolist(), self._heavy_counts.tolist()))

  # --- observing --------------------------------------------------------------

  def observe(self, ids, lengths):
    """Adds one sampled batch: `ids` (int, every id of the batch for this
    table, all its features), `lengths` (ids per example, per feature)."""
    ids = np.asarray(ids, np.int64).reshape(-1)
    unique, counts = np.unique(ids, return_counts=True)
    self.observe_counts(unique, counts, lengths)

  def observe_counts(self, unique, counts, lengths):
    """`observe` with the batch's ids given as distinct ids (`unique`, any
    order) and how often each was looked up (`counts`)."""
    unique = np.asarray(unique, np.int64).reshape(-1)
    counts = np.asarray(counts, np.int64).reshape(-1)
    lengths = np.asarray(lengths, np.int64).reshape(-1)
    total = int(counts.sum())
    vocabulary = self.settings["vocabulary_size"]
    if unique.size and (unique.min() < 0 or unique.max() >= vocabulary):
      raise ValueError(
          f"TableStatistics.observe: table {self.settings['table']!r} has "
          f"{vocabulary} rows; got ids in [{unique.min()}, {unique.max()}].")
    if int(lengths.sum()) != total or unique.size != counts.size:
      raise ValueError(
          f"TableStatistics.observe: lengths add up to {int(lengths.sum())} "
          f"ids; got {total} ids.")
    self.lookups += total
    self.examples += int(lengths.size)
    histogram = np.bincount(np.minimum(lengths, MAX_IDS_PER_EXAMPLE))
    for n in np.flatnonzero(histogram).tolist():
      self.ids_per_example[n] = (
          self.ids_per_example.get(n, 0) + int(histogram[n]))
    if not unique.size:
      return
    # Every per-id summary works on the distinct ids and their counts.
    index, rank = _hll_index_and_rank(unique)
    np.maximum.at(self.registers, index, rank)
    self.add_heavy_hitters(unique, counts)
    for strategy in sharding.STRATEGIES:
      partition, _ = self._layouts[strategy].route(unique)
      self.shard_load[strategy] += np.bincount(
          partition, weights=counts,
          minlength=self.shard_load[strategy].size).astype(np.int64)

  def add_heavy_hitters(self, ids, counts):
    """Adds (distinct `ids`, `counts`) to the Misra-Gries summary; into an
    empty one, at most `capacity` of them (as a file holds them) are kept
    as they are."""
    keys = np.concatenate([self._heavy_ids, ids])
    values = np.concatenate([self._heavy_counts, counts]).astype(np.int64)
    unique, inverse = np.unique(keys, return_inverse=True)
    summed = np.zeros(unique.size, np.int64)
    np.add.at(summed, inverse, values)
    if unique.size > self.capacity:
      # The mergeable Misra-Gries step: subtract the (capacity+1)-th
      # largest count from every count; keep the positive ones.
      k = unique.size - self.capacity - 1
      cut = np.partition(summed, k)[k]
      keep = summed > cut
      unique, summed = unique[keep], summed[keep] - cut
    self._heavy_ids, self._heavy_counts = unique, summed

  def merge(self, other):
    """Adds `other`'s statistics (same settings) to these."""
    if settings_key(other.settings) != settings_key(self.settings):
      raise ValueError(
          "TableStatistics.merge: statistics of other settings "
          f"({other.settings}) cannot be added to these ({self.settings}).")
    self.runs += other.runs
    self.lookups += other.lookups
    self.examples += other.examples
    np.maximum(self.registers, other.registers, out=self.registers)
    self.add_heavy_hitters(other._heavy_ids, other._heavy_counts)
    for n, count in other.ids_per_example.items():
      self.ids_per_example[n] = self.ids_per_example.get(n, 0) + count
    for strategy in sharding.STRATEGIES:
      self.shard_load[strategy] += other.shard_load[strategy]

  # --- reading ----------------------------------------------------------------

  def distinct_ids(self):
    """Estimated distinct ids sampled (HyperLogLog; 1.6% standard error)."""
    m = self.registers.size
    alpha = 0.7213 / (1 + 1.079 / m)
    estimate = alpha * m * m / np.sum(np.power(2.0, -self.registers.astype(
        np.float64)))
    zeros = int(np.count_nonzero(self.registers == 0))
    if estimate <= 2.5 * m and zeros:
      estimate = m * np.log(m / zeros)  # linear counting for small sets
    return float(estimate)

  def hottest(self, k=None):
    """[(id, count)] by decreasing count (ties by id), at most `k`."""
    order = np.lexsort((self._heavy_ids, -self._heavy_counts))
    if k is not None:
      order = order[:k]
    return list(zip(self._heavy_ids[order].tolist(),
                    self._heavy_counts[order].tolist()))

  def imbalance(self, strategy):
    """Largest shard load over the mean load (1.0: balanced)."""
    load = self.shard_load[strategy]
    mean = load.mean() if load.size else 0.0
    return float(load.max() / mean) if mean else 1.0


def _hll_index_and_rank(ids):
  """(register index, rank) of each id: a 64-bit mix (SplitMix64) of the
  id; the first HLL_PRECISION bits pick the register, the rank is 1 + the
  leading zeros of the rest."""
  with np.errstate(over="ignore"):
    z = ids.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
  index = (z >> np.uint64(64 - HLL_PRECISION)).astype(np.int64)
  rest = (z << np.uint64(HLL_PRECISION)) & _MASK64
  limit = 64 - HLL_PRECISION
  # Leading zeros of the 64-bit `rest` from its top 53 bits, which a float64
  # holds exactly: frexp gives their bit length. When they are all zero,
  # `rest` has at least 53 > limit leading zeros.
  top = (rest >> np.uint64(11)).astype(np.float64)
  _, length = np.frexp(top)
  zeros = np.where(top > 0, 53 - length, limit)
  rank = np.minimum(zeros, limit) + 1
  return index, rank.astype(np.uint8)
