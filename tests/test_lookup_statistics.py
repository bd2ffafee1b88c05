"""Lookup statistics of a table (`engine/statistics.py`), the data and files
that `profile_data_directory` keeps: exact where the sketches promise
exactness, within their stated error otherwise, mergeable, and stored in
files named by the settings that give them meaning. Expected values are
computed here directly from the ids (NumPy counting, the div/mod rules
written out), not through the library's routing."""
import collections
import json
import os
import warnings

import numpy as np
import pytest

import estimator_spec as es
from estimator_spec.engine import statistics as st

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
  name = st.file_name(st.table_settings(_model(), "t", 2))
  assert name.startswith("t-") and name.endswith(".json")
  changed = [
      st.table_settings(_model(vocab=101), "t", 2),
      st.table_settings(_model(strategy="mod"), "t", 2),
      st.table_settings(_model(sequence=5), "t", 2),
      st.table_settings(_model(), "t", 3),
  ]
  assert len({name} | {st.file_name(s) for s in changed}) == 5
  unrelated = [
      st.table_settings(_model(dimension=8), "t", 2),
      st.table_settings(_model(optimizer=es.AdamParameters(0.5)), "t", 2),
  ]
  assert {st.file_name(s) for s in unrelated} == {name}


def test_files_round_trip_and_two_models_share_a_directory(tmp_path):
  one = _observed(_batches(4))
  other = _observed(_batches(5), {**_settings(), "table": "tbl_other"})
  paths = {st.save(str(tmp_path), one), st.save(str(tmp_path), other)}
  assert len(paths) == 2
  assert sorted(os.listdir(tmp_path)) == sorted(
      os.path.basename(p) for p in paths)  # no temporary file left
  for stats in (one, other):
    back = st.load(str(tmp_path), stats.settings)
    assert back.to_json() == stats.to_json()
  # Plain Python reads the format.
  with open(os.path.join(tmp_path, st.file_name(one.settings))) as f:
    data = json.load(f)
  assert data["version"] == st.FORMAT_VERSION
  assert data["lookups"] == one.lookups
  assert st.load(str(tmp_path), _settings(shards=7)) is None  # no file


@pytest.mark.parametrize("content", [
    "{not json", json.dumps({"format": "something else"}),
    json.dumps({"format": "estimator_spec.lookup_statistics", "version": 99}),
], ids=["corrupt", "foreign", "future-version"])
def test_a_bad_file_is_ignored_with_a_warning(tmp_path, content):
  settings = _settings()
  path = tmp_path / st.file_name(settings)
  path.write_text(content)
  with pytest.warns(RuntimeWarning, match="is ignored"):
    assert st.load(str(tmp_path), settings) is None
  assert path.read_text() == content  # left as it was


def test_a_file_of_other_settings_under_this_name_is_ignored(tmp_path):
  stats = _observed(_batches(6))
  st.save(str(tmp_path), stats)
  wanted = _settings(shards=5)
  os.rename(tmp_path / st.file_name(stats.settings),
            tmp_path / st.file_name(wanted))
  with pytest.warns(RuntimeWarning, match="other settings"):
    assert st.load(str(tmp_path), wanted) is None


def test_an_unwritable_directory_is_a_clear_error(tmp_path):
  blocker = tmp_path / "a_file"
  blocker.write_text("")
  with pytest.raises(ValueError, match="cannot be written"):
    st.check_writable(str(blocker / "profiles"))
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    st.check_writable(str(tmp_path / "new" / "profiles"))  # made
  assert (tmp_path / "new" / "profiles").is_dir()


def test_ids_outside_the_table_or_lengths_that_disagree_are_refused():
  stats = _observed(_batches(7))
  before = stats.to_json()
  with pytest.raises(ValueError, match="has 1000 rows"):
    stats.observe([3, 1000], [2])
  with pytest.raises(ValueError, match="lengths add up to 3"):
    stats.observe([3, 4], [1, 2])
  assert stats.to_json() == before  # nothing counted


def test_load_all_reads_every_table_and_skips_bad_files(tmp_path):
  first = _observed(_batches(3))
  other = dict(_settings("mod"), table="tbl_users")
  second = _observed(_batches(4), other)
  st.save(str(tmp_path), second)
  st.save(str(tmp_path), first)
  (tmp_path / "junk.json").write_text("{not json")
  renamed = tmp_path / "tbl_items-0000000000000000.json"
  renamed.write_text(json.dumps(first.to_json()))
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    loaded = st.load_all(str(tmp_path))
  assert [s.settings["table"] for s in loaded] == ["tbl_items", "tbl_users"]
  assert loaded[0].to_json() == first.to_json()
  assert loaded[1].to_json() == second.to_json()
  skipped = sorted(str(w.message).split()[3] for w in caught)
  assert skipped == [str(tmp_path / "junk.json"), str(renamed)]


def test_saved_files_are_readable_by_others_as_the_umask_allows(tmp_path):
  old = os.umask(0o022)
  try:
    path = st.save(str(tmp_path), _observed(_batches(5)))
  finally:
    os.umask(old)
  assert os.stat(path).st_mode & 0o777 == 0o644
