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

Files: one JSON file per table (`FORMAT_VERSION`, every field above, the
settings the file is for), named after a hash of those settings
(`file_name`), written atomically with the user's umask and never through
a link (`save`, `estimator_spec.files.write_atomic`). A file is read only
if it is a regular file of at most `MAX_FILE_BYTES` (`files.read_json`),
and every field's type, sign, range and finiteness is checked before the
statistics are built (`TableStatistics.from_json`): `load` returns None,
with a warning naming the file and the reason, for a file that is
unreadable, corrupt, of another format version, or for other settings; it
never raises for the file's content (docs/security.md).

The settings that give statistics their meaning, and so name the file: the
table's name, vocabulary size and features (name, sequence length), the
partition strategy and the shard count. Other settings (dimension,
optimizer, learning rate) do not change which ids are looked up, so a
changed optimizer keeps its statistics.
"""
import base64
import contextlib
import fcntl
import hashlib
import json
import os
import re
import tempfile
import warnings

import numpy as np

from estimator_spec import files
from estimator_spec.config import model as model_lib
from estimator_spec.config import sharding

FORMAT_VERSION = 1
# A TPU samples about 3% of its inputs; one step in 50 keeps the host's
# cost within 2% of step time (bench/profile_bench.py).
DEFAULT_SAMPLING_RATE = 0.02
HLL_PRECISION = 12              # 2**12 registers
HEAVY_HITTER_CAPACITY = 1024
MAX_IDS_PER_EXAMPLE = 4096
_STRATEGIES = ("div", "mod")
# What a statistics file may hold (checked when it is read): the file's
# size, the shard count of its settings (one entry per shard is built
# from it), the heavy-hitter capacity, and any count (so that sums of two
# files stay within int64).
MAX_FILE_BYTES = 16 * 2**20
MAX_SHARDS = 65536
MAX_CAPACITY = 65536
MAX_COUNT = 2**61
MAX_VOCABULARY = 2**62
MAX_NAME_CHARS = 1024
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


def file_name(settings):
  """`<table>-<first 16 hex digits of the settings' hash>.json`."""
  readable = re.sub(r"[^A-Za-z0-9_.-]", "_", settings["table"])[:64]
  return f"{readable}-{settings_key(settings)[:16]}.json"


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
        for s in _STRATEGIES
    }
    self.shard_load = {
        s: np.zeros(self._layouts[s].num_partitions, np.int64)
        for s in _STRATEGIES
    }

  @property
  def heavy(self):
    """{id: count} of the Misra-Gries summary."""
    return dict(zip(self._heavy_ids.tolist(), self._heavy_counts.tolist()))

  # --- observing ---------------------------------------------------------------

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
    self._merge_heavy(unique, counts)
    for strategy in _STRATEGIES:
      partition, _ = self._layouts[strategy].route(unique)
      self.shard_load[strategy] += np.bincount(
          partition, weights=counts,
          minlength=self.shard_load[strategy].size).astype(np.int64)

  def _merge_heavy(self, ids, counts):
    """Adds (distinct `ids`, `counts`) to the Misra-Gries summary."""
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
    self._merge_heavy(other._heavy_ids, other._heavy_counts)
    for n, count in other.ids_per_example.items():
      self.ids_per_example[n] = self.ids_per_example.get(n, 0) + count
    for strategy in _STRATEGIES:
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

  # --- files ------------------------------------------------------------------

  def to_json(self):
    return {
        "format": "estimator_spec.lookup_statistics",
        "version": FORMAT_VERSION,
        "settings": self.settings,
        "key": settings_key(self.settings),
        "sampling_rate": self.sampling_rate,
        "runs": self.runs,
        "lookups": self.lookups,
        "examples": self.examples,
        "hll_precision": HLL_PRECISION,
        "hll_registers": base64.b64encode(self.registers.tobytes()).decode(),
        "heavy_hitters": {
            "capacity": self.capacity,
            "ids": [[int(k), int(c)] for k, c in self.hottest()],
        },
        "ids_per_example": {str(n): c for n, c in
                            sorted(self.ids_per_example.items())},
        "shard_load": {s: self.shard_load[s].tolist() for s in _STRATEGIES},
    }

  @classmethod
  def from_json(cls, data):
    """The statistics a `to_json` dict holds; ValueError (saying which
    field is wrong) if it is not one. Every field is checked before
    anything is built from it."""
    if not isinstance(data, dict) or data.get(
        "format") != "estimator_spec.lookup_statistics":
      raise ValueError("not a lookup statistics file")
    if data.get("version") != FORMAT_VERSION or isinstance(
        data.get("version"), bool):
      raise ValueError(f"format version {_short(data.get('version'))}, "
                       f"expected {FORMAT_VERSION}")
    if _exact_int(data.get("hll_precision")) != HLL_PRECISION:
      raise ValueError(
          f"HyperLogLog precision {_short(data.get('hll_precision'))}")
    settings = check_settings(_field(data, "settings", dict))
    if settings_key(settings) != data.get("key"):
      raise ValueError("the settings do not match the file's key")
    rate = _field(data, "sampling_rate", (int, float))
    if not 0.0 < rate <= 1.0:
      raise ValueError(f"sampling_rate {_short(rate)} is not in (0, 1]")
    heavy_data = _field(data, "heavy_hitters", dict)
    capacity = _count(heavy_data, "capacity", 1, MAX_CAPACITY,
                      "heavy_hitters.capacity")
    runs = _count(data, "runs", 0, MAX_COUNT)
    lookups = _count(data, "lookups", 0, MAX_COUNT)
    examples = _count(data, "examples", 0, MAX_COUNT)
    registers = _registers(_field(data, "hll_registers", str))
    heavy = _heavy(_field(heavy_data, "ids", list, "heavy_hitters.ids"),
                   capacity, settings["vocabulary_size"], lookups)
    per_example = _ids_per_example(
        _field(data, "ids_per_example", dict), examples)
    partitions = min(settings["vocabulary_size"], settings["num_shards"])
    loads = _field(data, "shard_load", dict)
    if sorted(loads) != sorted(_STRATEGIES):
      raise ValueError("shard_load must hold 'div' and 'mod'")
    for strategy in _STRATEGIES:
      load = loads[strategy]
      if not isinstance(load, list) or len(load) != partitions:
        raise ValueError(f"wrong number of {strategy} shards (expected "
                         f"{partitions})")
      if not all(_exact_int(c) is not None and 0 <= c <= MAX_COUNT
                 for c in load):
        raise ValueError(f"shard_load.{strategy} holds a value that is not "
                         f"an integer in [0, {MAX_COUNT}]")
      if sum(load) != lookups:
        raise ValueError(f"shard_load.{strategy} adds up to {sum(load)} "
                         f"lookups, not the file's {lookups}")
    # Everything is checked: only now are the statistics built.
    stats = cls(settings, rate, capacity)
    stats.runs, stats.lookups, stats.examples = runs, lookups, examples
    stats.registers = registers
    stats._heavy_ids = np.asarray([k for k, _ in heavy], np.int64)
    stats._heavy_counts = np.asarray([c for _, c in heavy], np.int64)
    stats.ids_per_example = per_example
    for strategy in _STRATEGIES:
      stats.shard_load[strategy] = np.asarray(loads[strategy], np.int64)
    return stats


def _short(value):
  """`value` for a message, cut to a few characters."""
  text = repr(value)
  return text if len(text) <= 40 else text[:37] + "..."


def _exact_int(value):
  """`value` if it is an int (not a bool), else None."""
  if isinstance(value, int) and not isinstance(value, bool):
    return value
  return None


def _field(data, name, types, label=None):
  """data[name], which must be of `types` (a bool is no number)."""
  label = label or name
  if name not in data:
    raise ValueError(f"{label} is missing")
  value = data[name]
  if isinstance(value, bool) or not isinstance(value, types):
    raise ValueError(f"{label} is {_short(value)}, of the wrong type")
  return value


def _count(data, name, low, high, label=None):
  """data[name], an integer in [low, high]."""
  label = label or name
  value = _field(data, name, int, label)
  if not low <= value <= high:
    raise ValueError(f"{label} is {_short(value)}, not in [{low}, {high}]")
  return value


def check_settings(settings):
  """`settings` (as `table_settings` gives them) checked field by field,
  the shard count bounded (`MAX_SHARDS`) before anything is built for
  each shard; ValueError saying which field is wrong."""
  expected = {"table", "vocabulary_size", "features", "partition_strategy",
              "num_shards"}
  if set(settings) != expected:
    raise ValueError("the settings hold other fields than "
                     f"{sorted(expected)}")
  table = settings["table"]
  if not isinstance(table, str) or not 0 < len(table) <= MAX_NAME_CHARS:
    raise ValueError(f"settings.table is {_short(table)}, not a table name")
  try:
    model_lib.check_table_name(table, "settings.table")
  except ValueError:
    raise ValueError(f"settings.table {_short(table)} is not a table name "
                     f"(the rule: {model_lib.TABLE_NAME_RULE})") from None
  _count(settings, "vocabulary_size", 1, MAX_VOCABULARY,
         "settings.vocabulary_size")
  _count(settings, "num_shards", 1, MAX_SHARDS, "settings.num_shards")
  if settings["partition_strategy"] not in _STRATEGIES:
    raise ValueError("settings.partition_strategy is "
                     f"{_short(settings['partition_strategy'])}, not 'div' "
                     "or 'mod'")
  features = settings["features"]
  # A printable name has no control character and no lone surrogate (the
  # one kind of str that UTF-8 cannot encode).
  if not isinstance(features, list) or not all(
      isinstance(f, list) and len(f) == 2 and isinstance(f[0], str) and
      0 < len(f[0]) <= MAX_NAME_CHARS and f[0].isprintable() and
      _exact_int(f[1]) is not None and 0 <= f[1] <= MAX_COUNT
      for f in features):
    raise ValueError("settings.features is not a list of [feature name, "
                     "sequence length] pairs")
  return dict(settings)


def _registers(text):
  """The HyperLogLog registers a base64 string holds."""
  try:
    raw = base64.b64decode(text.encode("ascii"), validate=True)
  except ValueError:  # not ASCII (UnicodeEncodeError) or not base64
    raise ValueError("hll_registers is not base64 text") from None
  if len(raw) != 2**HLL_PRECISION:
    raise ValueError("wrong number of HyperLogLog registers")
  registers = np.frombuffer(raw, np.uint8).copy()
  if registers.max() > 64 - HLL_PRECISION + 1:
    raise ValueError("a HyperLogLog register is out of range")
  return registers


def _heavy(pairs, capacity, vocabulary, lookups):
  """The heavy hitters' [(id, count)], sorted by id."""
  if len(pairs) > capacity:
    raise ValueError(f"more heavy hitters ({len(pairs)}) than the capacity "
                     f"{capacity}")
  for pair in pairs:
    if not (isinstance(pair, list) and len(pair) == 2 and
            _exact_int(pair[0]) is not None and
            _exact_int(pair[1]) is not None and
            0 <= pair[0] < vocabulary and 0 < pair[1] <= MAX_COUNT):
      raise ValueError(
          f"heavy hitter {_short(pair)} is not [id in [0, {vocabulary}), "
          "count > 0]")
  heavy = sorted((k, c) for k, c in pairs)
  if len({k for k, _ in heavy}) != len(heavy):
    raise ValueError("a heavy hitter is listed twice")
  if sum(c for _, c in heavy) > lookups:
    raise ValueError("the heavy hitters count more lookups than the file")
  return heavy


def _ids_per_example(data, examples):
  """{ids: examples} from the file's {"n": count}."""
  result = {}
  for key, count in data.items():
    if not (isinstance(key, str) and re.fullmatch("[0-9]{1,5}", key) and
            int(key) <= MAX_IDS_PER_EXAMPLE):
      raise ValueError(f"ids_per_example has the key {_short(key)}, not an "
                       f"integer in [0, {MAX_IDS_PER_EXAMPLE}]")
    if _exact_int(count) is None or not 0 <= count <= MAX_COUNT:
      raise ValueError(f"ids_per_example[{key}] is {_short(count)}, not a "
                       "count")
    result[int(key)] = count
  if sum(result.values()) != examples:
    raise ValueError(f"ids_per_example adds up to {sum(result.values())} "
                     f"examples, not the file's {examples}")
  return result


def sampling_period(rate, owner="profile_sampling_rate"):
  """The steps between two sampled steps for a sampling rate in (0, 1]:
  round(1 / rate) (rate 1: every step; the default 0.02: every 50th)."""
  if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not (
      0.0 < rate <= 1.0):
    raise ValueError(
        f"{owner} must be a number in (0, 1] (the share of training steps "
        f"whose lookups are sampled); got {rate!r}.")
  return max(1, int(round(1.0 / rate)))


def check_directory(directory):
  """Raises a clear error for a `profile_data_directory` the host cannot
  use: a URL (statistics files are merged under a file lock, which needs a
  local or mounted file system), or a directory that cannot be created or
  written. Called before any training step."""
  if "://" in directory:
    raise ValueError(
        f"profile_data_directory={directory!r}: the host writes lookup "
        "statistics to local or mounted directories only (files are merged "
        "under a file lock); mount the bucket or give a local directory.")
  check_writable(directory)


def check_writable(directory):
  """Raises a clear error unless `directory` exists (or can be made) and
  takes files; called before any training step."""
  try:
    os.makedirs(directory, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=directory, prefix=".write_test_"):
      pass
  except OSError as error:
    raise ValueError(
        f"profile_data_directory={directory!r} cannot be written "
        f"({error.strerror or error}); lookup statistics are saved there. "
        "Give a writable directory.") from error


def save(directory, stats):
  """Writes `stats` to its file in `directory` atomically (mode 0666 less
  the umask, never through a link: `files.write_atomic`); returns the
  path."""
  path = os.path.join(directory, file_name(stats.settings))
  text = json.dumps(stats.to_json(), allow_nan=False)
  return files.write_atomic(path, text)


LOCK_FILE = ".lock"


@contextlib.contextmanager
def _locked(directory):
  """An exclusive lock on `directory`'s statistics (a `.lock` file), held
  by one process at a time: tasks of a cluster and models sharing the
  directory merge their counts one after another. A `.lock` that is a
  link or not a regular file is refused (FileRejected), never followed."""
  path = os.path.join(directory, LOCK_FILE)
  try:
    handle = files.open_lock(path)
  except files.FileRejected as error:
    raise files.FileRejected(
        f"the lock file {path} is refused: {error}; remove it") from None
  try:
    fcntl.flock(handle, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(handle, fcntl.LOCK_UN)
  finally:
    os.close(handle)


def add_to_file(directory, stats):
  """Adds `stats` to the statistics saved for its settings in `directory`
  (a missing, corrupt or foreign file counts as none, with a warning) and
  writes the sum atomically, under the directory's lock. Returns the path.
  Raises OSError or `files.FileRejected` (a refused lock file) when it
  cannot write."""
  with _locked(directory):
    total = load(directory, stats.settings)
    if total is None:
      total = TableStatistics(stats.settings, stats.sampling_rate,
                              stats.capacity)
      total.runs = 0
    total.merge(stats)
    return save(directory, total)


# What reading a file that is not statistics of this format raises (the
# reader's checks raise ValueError; the others are kept as a last guard).
_UNREADABLE = (OSError, ValueError, KeyError, TypeError, OverflowError,
               RecursionError, IndexError)


def _read(path):
  """The statistics in the file `path` (raises one of `_UNREADABLE`)."""
  return TableStatistics.from_json(files.read_json(path, MAX_FILE_BYTES))


def _reason(error):
  if isinstance(error, OSError):
    return error.strerror or str(error)
  return str(error) or type(error).__name__


def load(directory, settings):
  """The statistics saved in `directory` for `settings`, or None (no file;
  or an unreadable, corrupt, foreign or mismatched one, with a warning
  naming the file and the reason)."""
  path = os.path.join(directory, file_name(settings))
  if not os.path.lexists(path):
    return None
  try:
    stats = _read(path)
    if settings_key(stats.settings) != settings_key(settings):
      raise ValueError("it holds statistics of other settings")
  except FileNotFoundError:
    return None  # removed since
  except _UNREADABLE as error:
    warnings.warn(
        f"Lookup statistics file {path} is ignored: {_reason(error)}. "
        "Training goes on; the file is replaced when statistics are next "
        "saved.", RuntimeWarning, stacklevel=2)
    return None
  return stats


def load_for_model(directory, model, num_shards):
  """{table: the statistics `directory` holds for each table of `model`
  (an `EmbeddingModel`) kept for `num_shards` shards, or None}."""
  return {table: load(directory, table_settings(model, table, num_shards))
          for table in model.tables}


def load_all(directory):
  """Every statistics file in `directory`, as [TableStatistics] ordered by
  table name then file name; files that are not readable statistics are
  skipped with a warning (as `load` does)."""
  found = []
  for name in sorted(os.listdir(directory)):
    if not name.endswith(".json") or name.startswith("."):
      continue
    path = os.path.join(directory, name)
    try:
      stats = _read(path)
      if file_name(stats.settings) != name:
        raise ValueError("its name does not match its settings")
    except FileNotFoundError:
      continue  # removed since
    except _UNREADABLE as error:
      warnings.warn(f"Lookup statistics file {path} is skipped: "
                    f"{_reason(error)}.", RuntimeWarning, stacklevel=2)
      continue
    found.append((stats.settings["table"], name, stats))
  return [stats for _, _, stats in sorted(found, key=lambda f: f[:2])]


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
