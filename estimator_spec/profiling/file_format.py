"""The JSON form of lookup statistics (`statistics.TableStatistics`), as a
statistics file holds it (docs/profile.md, 'The statistics files').

`to_json` gives every field, and the settings the counts are for with
their hash (`statistics.settings_key`). `from_json` checks every field's
type, sign, range and finiteness before anything is built from it, and
raises ValueError saying which field is wrong: what a file may hold is
bounded here (docs/security.md).
"""
import base64
import re

import numpy as np

from estimator_spec.config import model as model_lib
from estimator_spec.config import sharding
from estimator_spec.profiling import statistics

FORMAT = "estimator_spec.lookup_statistics"
FORMAT_VERSION = 1
# What a statistics file may hold (checked when it is read): the shard
# count of its settings (one entry per shard is built from it), the
# heavy-hitter capacity, and any count (so that sums of two files stay
# within int64).
MAX_SHARDS = 65536
MAX_CAPACITY = 65536
MAX_COUNT = 2**61
MAX_VOCABULARY = 2**62
MAX_NAME_CHARS = 1024


def to_json(stats):
  """The JSON form of `stats` (a `statistics.TableStatistics`)."""
  return {
      "format": FORMAT,
      "version": FORMAT_VERSION,
      "settings": stats.settings,
      "key": statistics.settings_key(stats.settings),
      "sampling_rate": stats.sampling_rate,
      "runs": stats.runs,
      "lookups": stats.lookups,
      "examples": stats.examples,
      "hll_precision": statistics.HLL_PRECISION,
      "hll_registers": base64.b64encode(stats.registers.tobytes()).decode(),
      "heavy_hitters": {
          "capacity": stats.capacity,
          "ids": [[int(k), int(c)] for k, c in stats.hottest()],
      },
      "ids_per_example": {str(n): c for n, c in
                          sorted(stats.ids_per_example.items())},
      "shard_load": {s: stats.shard_load[s].tolist()
                     for s in sharding.STRATEGIES},
  }


def from_json(data):
  """The `statistics.TableStatistics` a `to_json` dict holds; ValueError
  (saying which field is wrong) if it is not one. Every field is checked
  before anything is built from it."""
  if not isinstance(data, dict) or data.get("format") != FORMAT:
    raise ValueError("not a lookup statistics file")
  if data.get("version") != FORMAT_VERSION or isinstance(
      data.get("version"), bool):
    raise ValueError(f"format version {_short(data.get('version'))}, "
                     f"expected {FORMAT_VERSION}")
  if _exact_int(data.get("hll_precision")) != statistics.HLL_PRECISION:
    raise ValueError(
        f"HyperLogLog precision {_short(data.get('hll_precision'))}")
  settings = check_settings(_field(data, "settings", dict))
  if statistics.settings_key(settings) != data.get("key"):
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
  loads = _shard_loads(
      _field(data, "shard_load", dict),
      min(settings["vocabulary_size"], settings["num_shards"]), lookups)
  # Everything is checked: only now are the statistics built.
  stats = statistics.TableStatistics(settings, rate, capacity)
  stats.runs, stats.lookups, stats.examples = runs, lookups, examples
  stats.registers = registers
  stats.add_heavy_hitters(np.asarray([k for k, _ in heavy], np.int64),
                          np.asarray([c for _, c in heavy], np.int64))
  stats.ids_per_example = per_example
  for strategy in sharding.STRATEGIES:
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
  if settings["partition_strategy"] not in sharding.STRATEGIES:
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


def _shard_loads(loads, partitions, lookups):
  """The file's {strategy: [lookups per shard]}, `partitions` shards each,
  adding up to `lookups`."""
  if sorted(loads) != sorted(sharding.STRATEGIES):
    raise ValueError("shard_load must hold 'div' and 'mod'")
  for strategy in sharding.STRATEGIES:
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
  return loads


def _registers(text):
  """The HyperLogLog registers a base64 string holds."""
  try:
    raw = base64.b64decode(text.encode("ascii"), validate=True)
  except ValueError:  # not ASCII (UnicodeEncodeError) or not base64
    raise ValueError("hll_registers is not base64 text") from None
  if len(raw) != 2**statistics.HLL_PRECISION:
    raise ValueError("wrong number of HyperLogLog registers")
  registers = np.frombuffer(raw, np.uint8).copy()
  if registers.max() > 64 - statistics.HLL_PRECISION + 1:
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
            int(key) <= statistics.MAX_IDS_PER_EXAMPLE):
      raise ValueError(f"ids_per_example has the key {_short(key)}, not an "
                       f"integer in [0, {statistics.MAX_IDS_PER_EXAMPLE}]")
    if _exact_int(count) is None or not 0 <= count <= MAX_COUNT:
      raise ValueError(f"ids_per_example[{key}] is {_short(count)}, not a "
                       "count")
    result[int(key)] = count
  if sum(result.values()) != examples:
    raise ValueError(f"ids_per_example adds up to {sum(result.values())} "
                     f"examples, not the file's {examples}")
  return result
