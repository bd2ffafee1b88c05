"""`profile_data_directory` while training on one machine: the steps the
estimator samples, the files it writes (at checkpoints and at the end,
accumulated across runs, shared between models), the bad cases (corrupt
file, unwritable directory, bad rate), and numerics that do not change.

Expected statistics are counted here from the input examples themselves
(NumPy; the div/mod rules written out), not through the library."""
import collections
import json
import logging
import os
import warnings

import numpy as np
import pytest
import tensorflow as tf

import estimator_spec as es
from estimator_spec import TPUEstimator
from estimator_spec import TPUEstimatorSpec
from estimator_spec.profiling import file_format
from estimator_spec.profiling import statistics as st
from estimator_spec.profiling import store

v1 = tf.compat.v1
BATCH = 8
SHARDS = 4  # tpu_config.num_shards: the cores the tables are spread over
SEQ_LEN = 3
VOCAB = {"items": 50, "users": 7}

# Eight examples, one batch: ids of each feature per example.
CLICKED = [[3, 4], [40], [], [3, 3, 17], [49], [0, 1], [3], [25, 26, 27]]
HISTORY = [[5, 6, 7, 8], [5], [9, 9], [], [48, 47, 46, 45, 44], [1], [2, 3],
           [49]]
USER = [[0], [1], [2], [3], [4], [5], [6], [0]]


def _sparse(rows):
  indices = [[r, c] for r, ids in enumerate(rows) for c in range(len(ids))]
  values = [i for ids in rows for i in ids]
  width = max(len(ids) for ids in rows)
  return tf.SparseTensor(
      tf.constant(indices, tf.int64, shape=[len(indices), 2]),
      tf.constant(values, tf.int64), [len(rows), width])


def _input_fn(params):
  assert params["batch_size"] == BATCH
  features = {"clicked": _sparse(CLICKED), "history": _sparse(HISTORY),
              "user": _sparse(USER)}
  labels = tf.constant(np.linspace(0, 1, BATCH, dtype=np.float32)[:, None])
  return tf.data.Dataset.from_tensors((features, labels)).repeat()


def _spec(directory, vocab=None, strategy="div"):
  vocab = dict(VOCAB, **(vocab or {}))
  return es.EmbeddingConfigSpec(
      table_to_config_dict={
          "items": es.TableConfig(vocab["items"], 2, combiner="sum"),
          "users": es.TableConfig(vocab["users"], 2, combiner="mean"),
      },
      feature_to_config_dict={
          "clicked": es.FeatureConfig("items"),
          "history": es.FeatureConfig("items", max_sequence_length=SEQ_LEN),
          "user": es.FeatureConfig("users"),
      },
      optimization_parameters=es.AdagradParameters(0.1),
      partition_strategy=strategy,
      profile_data_directory=directory)


def _model_fn(features, labels, mode, params):
  del params
  history = tf.reduce_sum(features["history"], axis=1)
  x = tf.concat([features["clicked"], history, features["user"]], axis=1)
  logits = v1.layers.dense(
      x, 1, name="out", kernel_initializer=v1.constant_initializer(0.3))
  loss = v1.losses.mean_squared_error(labels, logits)
  train_op = v1.train.GradientDescentOptimizer(0.1).minimize(
      loss, v1.train.get_global_step())
  return TPUEstimatorSpec(mode, loss=loss, train_op=train_op)


def _estimator(model_dir, spec, rate=1.0, checkpoint_steps=None):
  config = es.RunConfig(
      model_dir=str(model_dir), save_checkpoints_steps=checkpoint_steps,
      save_checkpoints_secs=None if checkpoint_steps else 600,
      tf_random_seed=7,
      tpu_config=es.TPUConfig(num_shards=SHARDS))
  return TPUEstimator(model_fn=_model_fn, config=config, use_tpu=False,
                      train_batch_size=BATCH, embedding_config_spec=spec,
                      profile_sampling_rate=rate)


def _expected(steps, vocab=None, strategy_shards=SHARDS):
  """{table: (lookups, examples, ids_per_example, {strategy: loads},
  Counter of ids)} of `steps` batches, counted from the examples."""
  vocab = dict(VOCAB, **(vocab or {}))
  per_table = {
      "items": [CLICKED, [h[:SEQ_LEN] for h in HISTORY]],
      "users": [USER],
  }
  out = {}
  for table, features in per_table.items():
    ids = [i for rows in features for ex in rows for i in ex] * steps
    lengths = [len(ex) for rows in features for ex in rows] * steps
    base, extra = divmod(vocab[table], strategy_shards)
    bounds = np.cumsum([base + (s < extra) for s in range(strategy_shards)])
    loads = {
        "div": np.bincount(np.searchsorted(bounds, ids, side="right"),
                           minlength=strategy_shards).tolist(),
        "mod": np.bincount(np.asarray(ids) % strategy_shards,
                           minlength=strategy_shards).tolist(),
    }
    out[table] = (len(ids), len(lengths), dict(collections.Counter(lengths)),
                  loads, collections.Counter(ids))
  return out


def _saved(directory, table, vocab=None, strategy="div"):
  spec = _spec(str(directory), vocab, strategy)
  settings = st.table_settings(spec.model, table, SHARDS)
  path = os.path.join(str(directory), store.file_name(settings))
  return store.load(str(directory), settings), path


def _assert_matches(stats, expected, runs=1):
  lookups, examples, per_example, loads, counts = expected
  assert stats.runs == runs
  assert stats.lookups == lookups
  assert stats.examples == examples
  assert stats.ids_per_example == per_example
  assert {s: stats.shard_load[s].tolist() for s in loads} == loads
  # Few distinct ids: the summary holds every id with its exact count.
  assert dict(stats.hottest()) == dict(counts)
  assert abs(stats.distinct_ids() - len(counts)) <= 1


def test_rate_one_samples_every_step_exactly(tmp_path):
  profile = tmp_path / "profile"
  _estimator(tmp_path / "m", _spec(str(profile))).train(_input_fn,
                                                        max_steps=3)
  expected = _expected(3)
  for table in VOCAB:
    stats, _ = _saved(profile, table)
    _assert_matches(stats, expected[table])
    assert stats.settings["num_shards"] == SHARDS


def test_rate_samples_one_step_in_round_inverse_rate(tmp_path):
  profile = tmp_path / "profile"
  # 0.4 -> one step in 2 (round(2.5) = 2): steps 1, 3 and 5 of 5.
  _estimator(tmp_path / "m", _spec(str(profile)), rate=0.4).train(
      _input_fn, max_steps=5)
  stats, _ = _saved(profile, "users")
  _assert_matches(stats, _expected(3)["users"])
  assert stats.sampling_rate == 0.4


def _names(fetches):
  """The names of the tensors and ops in a `Session.run` fetch structure."""
  if isinstance(fetches, dict):
    fetches = list(fetches.values())
  if isinstance(fetches, (list, tuple)):
    return frozenset().union(*map(_names, fetches))
  return frozenset([fetches.name]) if hasattr(fetches, "name") else (
      frozenset())


def _new_after_start(monkeypatch, estimator, **train):
  """The (fetches, feeds) combinations that the `Session.run` calls of
  `estimator.train(_input_fn, **train)` first use after its first step: a
  TF session builds an executor for each combination the first time it
  runs it, at a cost of up to a step's graph optimization."""
  runs, first = [], []

  class FirstStep(v1.train.SessionRunHook):

    def before_run(self, run_context):
      if not first:
        first.append(len(runs))  # the next run is the first step's

  real = v1.Session.run

  def recording(self, fetches, feed_dict=None, *args, **kwargs):
    runs.append((_names(fetches), _names(list(feed_dict or ()))))
    return real(self, fetches, feed_dict, *args, **kwargs)

  with monkeypatch.context() as patch:
    patch.setattr(v1.Session, "run", recording)
    estimator.train(_input_fn, hooks=[FirstStep()], **train)
  start = first[0] + 1
  return set(runs[start:]) - set(runs[:start])


def test_sampling_adds_no_run_combination_after_start_up(tmp_path,
                                                         monkeypatch):
  """A sampled step runs what the other steps run, and the statistics'
  own run (taking a sampled step's lookups) is first made when the session
  is created: after the first step, training with statistics meets no
  more new combinations of fetches than training without (no executor is
  built in the middle of training). The sampling restarts with each
  train() call."""
  profile = tmp_path / "profile"
  new = []
  for name, directory in (("with", str(profile)), ("without", None)):
    estimator = _estimator(tmp_path / name, _spec(directory),
                           rate=0.4 if directory else None)
    new.append([len(_new_after_start(monkeypatch, estimator, max_steps=m))
                for m in (5, 7)])
  assert new[0] == new[1]
  # Steps 1, 3, 5 of the first call, then step 1 of 2 of the second.
  stats, _ = _saved(profile, "users")
  _assert_matches(stats, _expected(4)["users"], runs=2)


def test_saved_with_each_checkpoint_and_accumulated_across_runs(tmp_path):
  profile = tmp_path / "profile"
  seen = {}

  class Peek(v1.train.SessionRunHook):
    """Reads the file after the third step (saved after the second)."""

    def __init__(self):
      self.runs = 0

    def after_run(self, run_context, run_values):
      self.runs += 1
      if self.runs == 3:
        seen["after 3"], _ = _saved(profile, "items")

  estimator = _estimator(tmp_path / "m", _spec(str(profile)),
                         checkpoint_steps=2)
  estimator.train(_input_fn, max_steps=5, hooks=[Peek()])
  _assert_matches(seen["after 3"], _expected(2)["items"])
  stats, _ = _saved(profile, "items")
  _assert_matches(stats, _expected(5)["items"])
  # A second train() call (another run) adds to the same file.
  estimator.train(_input_fn, max_steps=7)
  stats, _ = _saved(profile, "items")
  _assert_matches(stats, _expected(7)["items"], runs=2)
  assert sorted(f for f in os.listdir(profile) if f.endswith(".json")) == (
      sorted(os.path.basename(_saved(profile, t)[1]) for t in VOCAB))


def test_two_models_share_a_directory(tmp_path):
  profile = tmp_path / "profile"
  # Model B's "items" table has another vocabulary: its own file. Its
  # "users" table is the same as model A's: they share that file.
  _estimator(tmp_path / "a", _spec(str(profile))).train(_input_fn,
                                                        max_steps=2)
  other = {"items": 60}
  _estimator(tmp_path / "b", _spec(str(profile), other)).train(
      _input_fn, max_steps=3)
  items_a, path_a = _saved(profile, "items")
  items_b, path_b = _saved(profile, "items", other)
  assert path_a != path_b
  _assert_matches(items_a, _expected(2)["items"])
  _assert_matches(items_b, _expected(3, other)["items"])
  users, _ = _saved(profile, "users")
  _assert_matches(users, _expected(5)["users"], runs=2)
  # And a changed strategy is another file again.
  assert _saved(profile, "items", strategy="mod") == (
      None, _saved(profile, "items", strategy="mod")[1])


def test_a_corrupt_file_is_replaced_with_a_warning(tmp_path):
  profile = tmp_path / "profile"
  profile.mkdir()
  _, path = _saved(profile, "items")
  with open(path, "w") as f:
    f.write('{"format": "something else"')
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    _estimator(tmp_path / "m", _spec(str(profile))).train(_input_fn,
                                                          max_steps=2)
  assert any(path in str(w.message) and "ignored" in str(w.message)
             for w in caught)
  stats, _ = _saved(profile, "items")
  _assert_matches(stats, _expected(2)["items"])
  assert json.load(open(path))["version"] == file_format.FORMAT_VERSION


@pytest.mark.parametrize("where", ["under_a_file", "url"])
def test_an_unusable_directory_fails_at_construction(tmp_path, where):
  blocker = tmp_path / "file"
  blocker.write_text("x")
  directory = (str(blocker / "profile") if where == "under_a_file" else
               "gs://bucket/profile")
  with pytest.raises(ValueError, match="profile_data_directory"):
    _estimator(tmp_path / "m", _spec(directory))
  assert not os.path.exists(tmp_path / "m")


@pytest.mark.parametrize("rate", [0, 1.5, -0.1, True, "0.1"])
def test_bad_sampling_rates_are_refused(tmp_path, rate):
  with pytest.raises(ValueError, match="profile_sampling_rate"):
    _estimator(tmp_path / "m", _spec(str(tmp_path / "p")), rate=rate)


def test_a_rate_without_a_directory_is_refused(tmp_path):
  with pytest.raises(ValueError, match="no profile_data_directory"):
    _estimator(tmp_path / "m", _spec(None), rate=0.5)


def test_statistics_do_not_change_training(tmp_path):
  results = []
  for name, directory in (("with", str(tmp_path / "p")), ("without", None)):
    estimator = _estimator(tmp_path / name, _spec(directory),
                           rate=1.0 if directory else None)
    estimator.train(_input_fn, max_steps=4)
    results.append({n: estimator.get_variable_value(n)
                    for n in estimator.get_variable_names()})
  with_stats, without = results
  assert sorted(with_stats) == sorted(without)
  for name in without:
    np.testing.assert_array_equal(with_stats[name], without[name], name)


def test_start_of_training_reports_the_saved_statistics(tmp_path, caplog):
  profile = tmp_path / "profile"
  estimator = _estimator(tmp_path / "m", _spec(str(profile)))
  with caplog.at_level(logging.INFO, logger="tensorflow"):
    estimator.train(_input_fn, max_steps=1)
  messages = "\n".join(r.getMessage() for r in caplog.records)
  assert "No lookup statistics in" in messages
  caplog.clear()
  with caplog.at_level(logging.INFO, logger="tensorflow"):
    estimator.train(_input_fn, max_steps=2)
  (message,) = [r.getMessage() for r in caplog.records
                if r.getMessage().startswith("Lookup statistics in")]
  expected = _expected(1)["items"]
  loads = expected[3]
  div = max(loads["div"]) / np.mean(loads["div"])
  mod = max(loads["mod"]) / np.mean(loads["mod"])
  (row,) = [line for line in message.splitlines()
            if line.split()[:1] == ["items"]]
  assert row.split()[1:] == ["1", str(expected[0]), str(len(expected[4])),
                             f"{div:.2f}", f"{mod:.2f}"]
  assert "div (configured): busiest shard" in message


def test_a_failed_save_warns_and_keeps_the_counts(tmp_path, caplog):
  profile = tmp_path / "profile"

  class Block(v1.train.SessionRunHook):
    """Puts a file where the directory is during steps 2-3."""

    def __init__(self):
      self.runs = 0

    def after_run(self, run_context, run_values):
      self.runs += 1
      if self.runs == 1:
        os.rename(profile, tmp_path / "moved")
        profile.write_text("not a directory")
      elif self.runs == 3:
        os.remove(profile)
        os.rename(tmp_path / "moved", profile)

  estimator = _estimator(tmp_path / "m", _spec(str(profile)),
                         checkpoint_steps=2)
  # The save after step 2 fails; the one after step 4 writes every step.
  with caplog.at_level(logging.WARNING, logger="tensorflow"):
    estimator.train(_input_fn, max_steps=5, hooks=[Block()])
  assert any("not saved to" in r.getMessage() for r in caplog.records)
  stats, _ = _saved(profile, "items")
  _assert_matches(stats, _expected(5)["items"])


def test_hostile_files_neither_stop_nor_hang_training(tmp_path, caplog):
  """A FIFO under one table's file name, settings of 10^7 shards under the
  other's, and a `.lock` link: training neither hangs nor stops, warns
  about each, writes nothing through the link, keeps the counts of the
  save the link refused, and replaces the bad files."""
  profile = tmp_path / "profile"
  profile.mkdir()
  _, items = _saved(profile, "items")
  os.mkfifo(items)
  settings = st.table_settings(_spec(str(profile)).model, "users", SHARDS)
  _, users = _saved(profile, "users")
  with open(users, "w") as f:
    json.dump({"format": "estimator_spec.lookup_statistics", "version": 1,
               "hll_precision": 12,
               "settings": dict(settings, num_shards=10**7)}, f)
  (profile / ".lock").symlink_to(tmp_path / "outside")

  class Unlink(v1.train.SessionRunHook):
    """Removes the `.lock` link at the second step (the first step's save
    failed on it)."""

    def __init__(self):
      self.runs = 0

    def after_run(self, run_context, run_values):
      self.runs += 1
      if self.runs == 2:
        os.remove(profile / ".lock")

  estimator = _estimator(tmp_path / "m", _spec(str(profile)),
                         checkpoint_steps=1)
  with warnings.catch_warnings(record=True) as caught, caplog.at_level(
      logging.WARNING, logger="tensorflow"):
    warnings.simplefilter("always")
    estimator.train(_input_fn, max_steps=3, hooks=[Unlink()])
  messages = [str(w.message) for w in caught]
  assert any(items in m and "it is a FIFO" in m for m in messages)
  assert any(users in m and "num_shards is 10000000" in m for m in messages)
  assert not (tmp_path / "outside").exists()
  assert any("lock file" in r.getMessage() and "symbolic link" in
             r.getMessage() for r in caplog.records)
  for table in ("items", "users"):
    stats, _ = _saved(profile, table)
    _assert_matches(stats, _expected(3)[table])
