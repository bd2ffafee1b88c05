"""Lookup statistics of a table (`profiling/statistics.py`), the data and
files (`profiling/file_format.py`, `profiling/store.py`) that
`profile_data_directory` keeps: exact where the sketches promise
exactness, within their stated error otherwise, mergeable, and stored in
files named by the settings that give them meaning. Expected values are
computed here directly from the ids (NumPy counting, the div/mod rules
written out), not through the library's routing."""
import base64
import collections
import json
import os
import warnings

import numpy as np
import pytest

import estimator_spec as es
from estimator_spec.profiling import file_format
from estimator_spec.profiling import statistics as st
from estimator_spec.profiling import store

VOCAB, SHARDS = 1000, 3


def _settings(strategy="div", shards=SHARDS, vocab=VOCAB):
  return {"table": "tbl_items", "vocabulary_size": vocab,
          "features": [["items", 0]], "partition_strategy": strategy,
          "num_shards": shards}


def _batches(seed, count=6, batch=64, distinct=VOCAB):
  """[(ids, lengths)]: Zipf-like ids, 0..5 ids per example."""
  rng = np.random.RandomState(seed)
  out = []
  for _ in range(count):
    lengths = rng.randint(0, 6, batch)
    ids = np.minimum(rng.zipf(1.3, lengths.sum()) - 1, distinct - 1)
    out.append((ids.astype(np.int64), lengths))
  return out


def _div_shard(i, vocab=VOCAB, shards=SHARDS):
  # The first vocab % shards shards hold one row more.
  base, extra = divmod(vocab, shards)
  bounds = np.cumsum([base + (1 if s < extra else 0) for s in range(shards)])
  return int(np.searchsorted(bounds, i, side="right"))


def _observed(batches, settings=None, capacity=st.HEAVY_HITTER_CAPACITY):
  stats = st.TableStatistics(settings or _settings(), 1.0, capacity)
  for ids, lengths in batches:
    stats.observe(ids, lengths)
  return stats


def test_counts_at_sampling_rate_one_are_exact():
  batches = _batches(0)
  stats = _observed(batches)
  all_ids = np.concatenate([ids for ids, _ in batches])
  all_lengths = np.concatenate([lengths for _, lengths in batches])
  assert stats.lookups == all_ids.size
  assert stats.examples == all_lengths.size
  assert stats.ids_per_example == dict(collections.Counter(
      all_lengths.tolist()))
  # Fewer distinct ids than the summary's capacity: every count is exact.
  exact = collections.Counter(all_ids.tolist())
  assert len(exact) < st.HEAVY_HITTER_CAPACITY
  assert dict(stats.hottest()) == dict(exact)
  assert stats.hottest(3) == sorted(exact.items(),
                                    key=lambda kv: (-kv[1], kv[0]))[:3]
  div = np.bincount([_div_shard(i) for i in all_ids], minlength=SHARDS)
  mod = np.bincount(all_ids % SHARDS, minlength=SHARDS)
  assert stats.shard_load["div"].tolist() == div.tolist()
  assert stats.shard_load["mod"].tolist() == mod.tolist()
  # Zipf ids crowd the first rows: div puts them all on shard 0.
  assert stats.imbalance("div") > stats.imbalance("mod") >= 1.0


@pytest.mark.parametrize("distinct", [50, 3000, 60000])
def test_distinct_ids_within_the_sketchs_error(distinct):
  ids = np.random.RandomState(distinct).permutation(10**7)[:distinct]
  stats = _observed([(np.repeat(ids, 2), np.full(distinct, 2))],
                    _settings(vocab=10**7))
  # 1.6% standard error: 5% is more than three of them.
  assert abs(stats.distinct_ids() - distinct) <= 0.05 * distinct


def test_hottest_ids_in_bounded_memory_keep_every_heavy_id():
  rng = np.random.RandomState(3)
  ids = (rng.zipf(1.2, 200_000) % 50_000).astype(np.int64)
  capacity = 32
  stats = _observed([(part, np.ones(part.size, np.int64))
                     for part in np.array_split(ids, 7)],
                    _settings(vocab=50_000), capacity=capacity)
  assert len(stats.heavy) <= capacity
  bound = ids.size / (capacity + 1)
  exact = collections.Counter(ids.tolist())
  for key, count in exact.items():
    if count > bound:
      assert key in stats.heavy
  for key, count in stats.heavy.items():
    assert exact[key] - bound <= count <= exact[key]


def test_merging_equals_observing_everything():
  first, second = _batches(1), _batches(2)
  merged = _observed(first)
  merged.merge(_observed(second))
  whole = _observed(first + second)
  assert merged.runs == 2
  assert (merged.lookups, merged.examples) == (whole.lookups, whole.examples)
  assert merged.ids_per_example == whole.ids_per_example
  assert np.array_equal(merged.registers, whole.registers)
  assert merged.hottest() == whole.hottest()
  for strategy in ("div", "mod"):
    assert np.array_equal(merged.shard_load[strategy],
                          whole.shard_load[strategy])
  with pytest.raises(ValueError, match="other settings"):
    merged.merge(_observed(first, _settings(shards=4)))


def _model(vocab=100, dimension=4, optimizer=None, strategy="div",
           sequence=0):
  return es.EmbeddingConfigSpec(
      feature_to_config_dict={
          "f": es.FeatureConfig("t"),
          "g": es.FeatureConfig("t", max_sequence_length=sequence)},
      table_to_config_dict={"t": es.TableConfig(vocab, dimension)},
      optimization_parameters=optimizer or es.AdagradParameters(0.1),
      partition_strategy=strategy).model


def test_file_names_follow_the_settings_that_give_statistics_meaning():
  name = store.file_name(st.table_settings(_model(), "t", 2))
  assert name.startswith("t-") and name.endswith(".json")
  changed = [
      st.table_settings(_model(vocab=101), "t", 2),
      st.table_settings(_model(strategy="mod"), "t", 2),
      st.table_settings(_model(sequence=5), "t", 2),
      st.table_settings(_model(), "t", 3),
  ]
  assert len({name} | {store.file_name(s) for s in changed}) == 5
  unrelated = [
      st.table_settings(_model(dimension=8), "t", 2),
      st.table_settings(_model(optimizer=es.AdamParameters(0.5)), "t", 2),
  ]
  assert {store.file_name(s) for s in unrelated} == {name}


def test_files_round_trip_and_two_models_share_a_directory(tmp_path):
  one = _observed(_batches(4))
  other = _observed(_batches(5), {**_settings(), "table": "tbl_other"})
  paths = {store.save(str(tmp_path), one), store.save(str(tmp_path), other)}
  assert len(paths) == 2
  assert sorted(os.listdir(tmp_path)) == sorted(
      os.path.basename(p) for p in paths)  # no temporary file left
  for stats in (one, other):
    back = store.load(str(tmp_path), stats.settings)
    assert file_format.to_json(back) == file_format.to_json(stats)
  # Plain Python reads the format.
  with open(os.path.join(tmp_path, store.file_name(one.settings))) as f:
    data = json.load(f)
  assert data["version"] == file_format.FORMAT_VERSION
  assert data["lookups"] == one.lookups
  assert store.load(str(tmp_path), _settings(shards=7)) is None  # no file


@pytest.mark.parametrize("content", [
    "{not json", json.dumps({"format": "something else"}),
    json.dumps({"format": "estimator_spec.lookup_statistics", "version": 99}),
], ids=["corrupt", "foreign", "future-version"])
def test_a_bad_file_is_ignored_with_a_warning(tmp_path, content):
  settings = _settings()
  path = tmp_path / store.file_name(settings)
  path.write_text(content)
  with pytest.warns(RuntimeWarning, match="is ignored"):
    assert store.load(str(tmp_path), settings) is None
  assert path.read_text() == content  # left as it was


def test_a_file_of_other_settings_under_this_name_is_ignored(tmp_path):
  stats = _observed(_batches(6))
  store.save(str(tmp_path), stats)
  wanted = _settings(shards=5)
  os.rename(tmp_path / store.file_name(stats.settings),
            tmp_path / store.file_name(wanted))
  with pytest.warns(RuntimeWarning, match="other settings"):
    assert store.load(str(tmp_path), wanted) is None


def test_an_unwritable_directory_is_a_clear_error(tmp_path):
  blocker = tmp_path / "a_file"
  blocker.write_text("")
  with pytest.raises(ValueError, match="cannot be written"):
    store.check_writable(str(blocker / "profiles"))
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    store.check_writable(str(tmp_path / "new" / "profiles"))  # made
  assert (tmp_path / "new" / "profiles").is_dir()


def test_ids_outside_the_table_or_lengths_that_disagree_are_refused():
  stats = _observed(_batches(7))
  before = file_format.to_json(stats)
  with pytest.raises(ValueError, match="has 1000 rows"):
    stats.observe([3, 1000], [2])
  with pytest.raises(ValueError, match="lengths add up to 3"):
    stats.observe([3, 4], [1, 2])
  assert file_format.to_json(stats) == before  # nothing counted


def test_load_all_reads_every_table_and_skips_bad_files(tmp_path):
  first = _observed(_batches(3))
  other = dict(_settings("mod"), table="tbl_users")
  second = _observed(_batches(4), other)
  store.save(str(tmp_path), second)
  store.save(str(tmp_path), first)
  (tmp_path / "junk.json").write_text("{not json")
  renamed = tmp_path / "tbl_items-0000000000000000.json"
  renamed.write_text(json.dumps(file_format.to_json(first)))
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    loaded = store.load_all(str(tmp_path))
  assert [s.settings["table"] for s in loaded] == ["tbl_items", "tbl_users"]
  assert file_format.to_json(loaded[0]) == file_format.to_json(first)
  assert file_format.to_json(loaded[1]) == file_format.to_json(second)
  skipped = sorted(str(w.message).split()[3] for w in caught)
  assert skipped == [str(tmp_path / "junk.json"), str(renamed)]


def test_saved_files_are_readable_by_others_as_the_umask_allows(tmp_path):
  old = os.umask(0o022)
  try:
    path = store.save(str(tmp_path), _observed(_batches(5)))
  finally:
    os.umask(old)
  assert os.stat(path).st_mode & 0o777 == 0o644


# --- the reader's checks, one field wrong per case ---------------------------
# Each case breaks one field of a valid file (the key follows changed
# settings) and expects the message of the one check written for it: with
# that check removed, the file is accepted or another check refuses it with
# another message, and the case fails. Where a sum ties a field to others,
# a case moves a count from one entry to another, so that the sum still
# holds and only the broken check can refuse the file.

M = file_format.MAX_COUNT


def _file(change=None, **fields):
  """A valid statistics file's JSON, `fields` ({dotted path: value}; a list
  index is a number) set, then `change(data)` applied; the key recomputed
  unless a case sets it."""
  data = file_format.to_json(_observed(_batches(0)))
  for dotted, value in fields.items():
    where = data
    *parents, last = dotted.split(".")
    for key in parents:
      where = where[int(key) if isinstance(where, list) else key]
    if value is _MISSING:
      del where[last]
    else:
      where[int(last) if isinstance(where, list) else last] = value
  if change is not None:
    data = change(data) or data
  if "key" not in fields and isinstance(data, dict):
    data["key"] = st.settings_key(data["settings"])
  return data


_MISSING = object()
_COUNTS = [  # (field, low, high): every integer the reader bounds
    ("runs", 0, M), ("lookups", 0, M), ("examples", 0, M),
    ("heavy_hitters.capacity", 1, file_format.MAX_CAPACITY),
    ("settings.vocabulary_size", 1, file_format.MAX_VOCABULARY),
    ("settings.num_shards", 1, file_format.MAX_SHARDS),
]


def _count_cases():
  cases = {}
  for field, low, high in _COUNTS:
    for value in (low - 1, high + 1):
      cases[f"{field}={value}"] = (
          {field: value}, f"{field} is {value}, not in [{low}, {high}]")
    for value in (True, 1.0, "1"):
      cases[f"{field}={value!r}"] = (
          {field: value}, f"{field} is {value!r}, of the wrong type")
    if not field.startswith("settings."):
      cases[f"{field}-missing"] = ({field: _MISSING}, f"{field} is missing")
  return cases


def _move(field, index, value):
  """A change setting entry `index` of the list or dict at `field` to
  `value` and adding the difference to the last entry: their sum stays."""
  def change(data):
    where = data
    for key in field.split("."):
      where = where[key]
    keys = list(range(len(where))) if isinstance(where, list) else sorted(
        where, key=int)
    this, other = keys[index], keys[index - 1]
    where[other] += where[this] - int(value)
    where[this] = value
  return change


def _first(where, value):
  """Sets the first entry of a list or dict (by number) to `value`."""
  where[0 if isinstance(where, list) else min(where, key=int)] = value


def _rename(key):
  """A change renaming the first key of `ids_per_example` to `key`."""
  def change(data):
    counts = data["ids_per_example"]
    counts[key] = counts.pop(min(counts, key=int))
  return change


def _heavy_count(data, index, more):
  data["heavy_hitters"]["ids"][index][1] += more


def _set_pair(index, position, value):
  def change(data):
    data["heavy_hitters"]["ids"][index][position] = value
  return change


_HEAVY = "is not [id in [0, 1000), count > 0]"
_FEATURES = ("settings.features is not a list of [feature name, sequence "
             "length] pairs")
_SHARD_VALUE = f"holds a value that is not an integer in [0, {M}]"
_CASES = {
    **_count_cases(),
    "not-a-dict": (lambda d: [d], "not a lookup statistics file"),
    "format": ({"format": "other"}, "not a lookup statistics file"),
    "version=2": ({"version": 2}, "format version 2, expected 1"),
    "version=True": ({"version": True}, "format version True, expected 1"),
    "hll_precision=11": ({"hll_precision": 11}, "HyperLogLog precision 11"),
    "key": ({"key": "0" * 64}, "the settings do not match the file's key"),
    "settings-extra": ({"settings.color": "red"},
                       "the settings hold other fields than"),
    "settings-missing": ({"settings.table": _MISSING},
                         "the settings hold other fields than"),
    "table-empty": ({"settings.table": ""},
                    "settings.table is '', not a table name"),
    "table-long": ({"settings.table": "t" * (file_format.MAX_NAME_CHARS + 1)},
                   "not a table name"),
    "table-number": ({"settings.table": 7},
                     "settings.table is 7, not a table name"),
    "table-rule": ({"settings.table": "a b"},
                   "settings.table 'a b' is not a table name (the rule:"),
    "strategy": ({"settings.partition_strategy": "rows"},
                 "settings.partition_strategy is 'rows', not 'div' or 'mod'"),
    "features-dict": ({"settings.features": {"items": 0}}, _FEATURES),
    "features-number": ({"settings.features": 5}, _FEATURES),
    "feature-dict": ({"settings.features.0": {"name": "items", "length": 0}},
                     _FEATURES),
    "feature-str": ({"settings.features.0": "items"}, _FEATURES),
    "feature-three": ({"settings.features.0": ["items", 0, 0]}, _FEATURES),
    "feature-name-number": ({"settings.features.0.0": 5}, _FEATURES),
    "feature-name-empty": ({"settings.features.0.0": ""}, _FEATURES),
    "feature-name-long": (
        {"settings.features.0.0": "f" * (file_format.MAX_NAME_CHARS + 1)},
        _FEATURES),
    "feature-name-newline": ({"settings.features.0.0": "a\n"}, _FEATURES),
    "feature-name-surrogate": ({"settings.features.0.0": "a\ud800"},
                               _FEATURES),
    "feature-length=-1": ({"settings.features.0.1": -1}, _FEATURES),
    f"feature-length={M + 1}": ({"settings.features.0.1": M + 1}, _FEATURES),
    "feature-length=True": ({"settings.features.0.1": True}, _FEATURES),
    "feature-length=1.0": ({"settings.features.0.1": 1.0}, _FEATURES),
    "rate=0": ({"sampling_rate": 0}, "sampling_rate 0 is not in (0, 1]"),
    "rate=-0.5": ({"sampling_rate": -0.5},
                  "sampling_rate -0.5 is not in (0, 1]"),
    "rate=1.5": ({"sampling_rate": 1.5}, "sampling_rate 1.5 is not in (0, 1]"),
    "rate=True": ({"sampling_rate": True},
                  "sampling_rate is True, of the wrong type"),
    "rate-text": ({"sampling_rate": "0.5"},
                  "sampling_rate is '0.5', of the wrong type"),
    "registers-number": ({"hll_registers": 5},
                         "hll_registers is 5, of the wrong type"),
    "registers-not-base64": ({"hll_registers": "not base64!"},
                             "hll_registers is not base64 text"),
    # A character a lenient decoder would skip: refused all the same.
    "registers-stray-character": (
        {"hll_registers": "!" + base64.b64encode(bytes(4096)).decode()},
        "hll_registers is not base64 text"),
    "registers-not-ascii": ({"hll_registers": "\u00e9" * 8},
                            "hll_registers is not base64 text"),
    "registers-short": (
        {"hll_registers": base64.b64encode(bytes(4095)).decode()},
        "wrong number of HyperLogLog registers"),
    "register=54": (
        {"hll_registers": base64.b64encode(bytes([54]) * 4096).decode()},
        "a HyperLogLog register is out of range"),
    "heavy-not-a-dict": ({"heavy_hitters": []},
                         "heavy_hitters is [], of the wrong type"),
    "heavy-ids-dict": ({"heavy_hitters.ids": {}},
                       "heavy_hitters.ids is {}, of the wrong type"),
    "heavy-over-capacity": ({"heavy_hitters.capacity": 1},
                            "than the capacity 1"),
    "heavy-pair-str": ({"heavy_hitters.ids.0": "7"}, _HEAVY),
    "heavy-pair-dict": ({"heavy_hitters.ids.0": {"id": 7, "count": 1}},
                        _HEAVY),
    "heavy-pair-short": ({"heavy_hitters.ids.0": [7]}, _HEAVY),
    "heavy-id=-1": (_set_pair(0, 0, -1), _HEAVY),
    "heavy-id=vocabulary": (_set_pair(0, 0, 1000), _HEAVY),
    "heavy-id=True": (_set_pair(-1, 0, True), _HEAVY),
    "heavy-id=1.0": (_set_pair(-1, 0, 1.0), _HEAVY),
    "heavy-count=0": (_set_pair(0, 1, 0), _HEAVY),
    "heavy-count=-1": (_set_pair(0, 1, -1), _HEAVY),
    f"heavy-count={M + 1}": (_set_pair(0, 1, M + 1), _HEAVY),
    "heavy-count=True": (_set_pair(-1, 1, True), _HEAVY),
    "heavy-count=1.0": (_set_pair(-1, 1, 1.0), _HEAVY),
    "heavy-twice": (lambda d: d["heavy_hitters"]["ids"][1].__setitem__(
        0, d["heavy_hitters"]["ids"][0][0]), "a heavy hitter is listed twice"),
    "heavy-sum": (lambda d: _heavy_count(d, 0, 1),
                  "the heavy hitters count more lookups than the file"),
    "per-example-list": ({"ids_per_example": []},
                         "ids_per_example is [], of the wrong type"),
    "per-example-key=-1": (_rename("-1"), "ids_per_example has the key "
                           "'-1', not an integer in [0, 4096]"),
    "per-example-key=4097": (_rename("4097"), "ids_per_example has the key "
                             "'4097', not an integer in [0, 4096]"),
    "per-example-key=123456": (_rename("123456"), "ids_per_example has the "
                               "key '123456', not an integer"),
    "per-example-key-number": (_rename(0), "ids_per_example has the key 0, "
                               "not an integer"),
    "per-example-key=x": (_rename("x"), "ids_per_example has the key 'x', "
                          "not an integer"),
    "per-example-count=-1": (_move("ids_per_example", 0, -1),
                             "] is -1, not a count"),
    f"per-example-count={M + 1}": (
        lambda d: _first(d["ids_per_example"], M + 1),
        f"] is {M + 1}, not a count"),
    "per-example-count=True": (_move("ids_per_example", 0, True),
                               "] is True, not a count"),
    "per-example-count=1.0": (_move("ids_per_example", 0, 1.0),
                              "] is 1.0, not a count"),
    "per-example-sum": (
        lambda d: d.update(examples=d["examples"] + 1),
        "ids_per_example adds up to"),
    "shard-load-list": ({"shard_load": []},
                        "shard_load is [], of the wrong type"),
    "shard-load-no-mod": ({"shard_load.mod": _MISSING},
                          "shard_load must hold 'div' and 'mod'"),
    "shard-load-extra": ({"shard_load.rows": [0, 0, 0]},
                         "shard_load must hold 'div' and 'mod'"),
}
for _strategy in ("div", "mod"):
  _CASES.update({
      f"{_strategy}-dict": ({f"shard_load.{_strategy}": {}},
                            f"wrong number of {_strategy} shards"),
      f"{_strategy}-text": ({f"shard_load.{_strategy}": "123"},
                            f"wrong number of {_strategy} shards"),
      f"{_strategy}-four": (
          lambda d, s=_strategy: d["shard_load"][s].append(0),
          f"wrong number of {_strategy} shards (expected 3)"),
      f"{_strategy}=-1": (_move(f"shard_load.{_strategy}", 0, -1),
                          f"shard_load.{_strategy} {_SHARD_VALUE}"),
      f"{_strategy}={M + 1}": (
          lambda d, s=_strategy: _first(d["shard_load"][s], M + 1),
          f"shard_load.{_strategy} {_SHARD_VALUE}"),
      f"{_strategy}=True": (_move(f"shard_load.{_strategy}", 0, True),
                            f"shard_load.{_strategy} {_SHARD_VALUE}"),
      f"{_strategy}=1.0": (_move(f"shard_load.{_strategy}", 0, 1.0),
                           f"shard_load.{_strategy} {_SHARD_VALUE}"),
      f"{_strategy}-sum": (
          lambda d, s=_strategy: d["shard_load"][s].__setitem__(
              0, d["shard_load"][s][0] + 1),
          f"shard_load.{_strategy} adds up to"),
  })


@pytest.mark.parametrize("case", sorted(_CASES))
def test_each_check_of_the_reader_refuses_its_one_wrong_field(case):
  fields, words = _CASES[case]
  data = _file(fields) if callable(fields) else _file(**fields)
  with pytest.raises(ValueError) as raised:
    file_format.from_json(data)
  assert words in str(raised.value)


def test_the_readers_bounds_are_inclusive():
  # The other side of each bound above: its last allowed value is read.
  data = _file(runs=M, sampling_rate=1.0, **{
      "heavy_hitters.capacity": file_format.MAX_CAPACITY,
      "settings.num_shards": 3})
  stats = file_format.from_json(data)
  assert (stats.runs, stats.sampling_rate, stats.capacity) == (
      M, 1.0, file_format.MAX_CAPACITY)
  assert file_format.from_json(_file(runs=0)).runs == 0
  top = base64.b64encode(bytes([64 - st.HLL_PRECISION + 1]) * 4096).decode()
  assert file_format.from_json(_file(hll_registers=top)).registers.max(
  ) == 64 - st.HLL_PRECISION + 1
