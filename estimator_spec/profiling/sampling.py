"""Sampling a training run's lookups (`profile_data_directory`), saving
them, and reading them back at start-up.

* `sampling_period`: the steps between two sampled steps for a
  `profile_sampling_rate` (`DEFAULT_SAMPLING_RATE` when none is given).
* `Profiler` (one per estimator with a profile directory): the directory,
  the sampling rate, and the shard count the statistics are kept for (the
  run's TPU cores, or its parameter-server tasks on a cluster: the shards a
  table's rows are spread over). `load()` reads the statistics that match
  this model's tables; `startup_report` says what they show (`shards`).
* `StatisticsHook`: a training hook that samples one step in every
  `round(1 / rate)` (the first step of each `train()` call included). No
  step fetches anything for it: a TF session builds (and keeps) an
  executor of the whole step graph for each combination of fetches the
  first time it runs it, so a sampled step that fetched more than the
  others would wait for a second one (tens of milliseconds, at every
  `train()` call). Instead every step runs one more op, which keeps
  references to the step's own ids, examples and batch sizes in a staging
  area, in place of the previous step's (`Profiler.sampling`: nothing is
  copied); after a sampled step the hook takes them from there in a small
  run of its own, which the session builds when it is created
  (`after_create_session`), before the first step. They are kept as
  taken and counted into per-table `statistics.TableStatistics`
  (distinct ids and their counts, ids per example) in one NumPy pass when
  the statistics are saved, or when `MAX_PENDING_BYTES` of them wait. A
  step the hook does not sample costs it a modulo and a comparison, and
  the counting never competes with a running step for the CPU or Python's
  GIL (bench/profile_bench.py measures both on a model of short steps).
  The step's ops (and so the numbers) are those of a step without a
  profile directory, and two more: one empties the staging area, the
  other stages the tensors. The counts gathered since the last save
  are added to the directory's files (`store.add_to_file`) at each
  checkpoint interval of the RunConfig (`save_checkpoints_steps` /
  `save_checkpoints_secs`) and when training ends. Every training task of
  a cluster samples its own batches; the files sum them.

The estimator adds what needs its placement (`estimator/profiling.py`).
"""
import time

import numpy as np
import tensorflow as tf

from estimator_spec import files
from estimator_spec.profiling import shards
from estimator_spec.profiling import statistics
from estimator_spec.profiling import store

# A TPU samples about 3% of its inputs; one step in 50 keeps the host's
# cost within 2% of step time (bench/profile_bench.py).
DEFAULT_SAMPLING_RATE = 0.02


def sampling_period(rate, owner="profile_sampling_rate"):
  """The steps between two sampled steps for a sampling rate in (0, 1]:
  round(1 / rate) (rate 1: every step; the default 0.02: every 50th)."""
  if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not (
      0.0 < rate <= 1.0):
    raise ValueError(
        f"{owner} must be a number in (0, 1] (the share of training steps "
        f"whose lookups are sampled); got {rate!r}.")
  return max(1, int(round(1.0 / rate)))


class Profiler:
  """Lookup statistics of one model's tables (see module docstring).

  Args:
    model: the spec's `EmbeddingModel`.
    directory: `profile_data_directory`.
    sampling_rate: share of training steps sampled, in (0, 1].
    num_shards: the shard count the statistics are kept for.
    writes: whether this task writes statistics (training tasks); the
      directory is then checked now, before any step.
  """

  def __init__(self, model, directory, sampling_rate, num_shards, writes):
    self.model = model
    self.directory = directory
    self.sampling_rate = float(sampling_rate)
    self.period = sampling_period(sampling_rate)
    self.num_shards = int(num_shards)
    if writes:
      store.check_directory(directory)

  def settings(self, table):
    return statistics.table_settings(self.model, table, self.num_shards)

  def load(self):
    """{table: TableStatistics or None}: what the directory holds for
    these tables with these settings."""
    return store.load_for_model(self.directory, self.model,
                                     self.num_shards)

  def startup_report(self, config, saved):
    """Logs the div/mod shard load and memory the saved statistics
    (`saved`, from `load`) show."""
    text = shards.statistics_section(config, saved, self.num_shards)
    if text:
      tf.compat.v1.logging.info("Lookup statistics in %s:\n%s",
                                self.directory, text)
    else:
      tf.compat.v1.logging.info(
          "No lookup statistics in %s for these tables yet; this run samples "
          "one step in %d.", self.directory, self.period)

  def sampling(self, feature_ids, run_config):
    """(op, hook) of a training graph whose lookups read `feature_ids`
    ([engine.inputs.FeatureIds]). The op, for the train op to run on every
    step, keeps the step's own lookup tensors in a staging area in place of
    the previous step's (references: nothing is copied); after a sampled
    step, the `StatisticsHook` takes them from there in a run of its own
    (see module docstring). Made in the caller's device scope."""
    lookups = _lookups(feature_ids)
    with tf.compat.v1.name_scope("lookup_statistics") as scope:
      area = scope + "lookups"  # the staging area's name
      dtypes = [t.dtype for t in _flat(lookups)]
      emptied = tf.raw_ops.StageClear(dtypes=dtypes, shared_name=area)
      with tf.control_dependencies([emptied]):
        keep = tf.raw_ops.Stage(values=_flat(lookups), shared_name=area)
      # The take run stages empty stand-ins behind what the area holds
      # (the next step empties it), so that it never waits on an empty
      # area: it takes the step's lookups, or the stand-ins when no step
      # has run in this session.
      stand_ins = _flat(
          (tf.zeros([0], ids.dtype), tf.zeros([0], example.dtype),
           tf.zeros([], batch.dtype)) for ids, example, batch in lookups)
      with tf.control_dependencies(
          [tf.raw_ops.Stage(values=stand_ins, shared_name=area)]):
        taken = tf.raw_ops.Unstage(dtypes=dtypes, shared_name=area)
      take = _packed([taken[k:k + 3] for k in range(0, len(taken), 3)])
    hook = StatisticsHook(self, [item.table for item in feature_ids], take,
                          run_config.save_checkpoints_steps,
                          run_config.save_checkpoints_secs)
    return keep, hook


def _lookups(feature_ids):
  """[(ids, example of each id, batch size)] of each feature: the step's
  own tensors, in the int32 forms the lookup reads where it made them (an
  int64 form made for the statistics alone would be one more op on every
  step)."""
  lookups = []
  for item in feature_ids:
    flat = item.flat
    lookups.append((
        flat.ids,
        flat.example if flat.example_int32 is None else flat.example_int32,
        flat.batch_size if flat.batch_size_int32 is None else
        flat.batch_size_int32))
  return lookups


def _flat(lookups):
  return [tensor for lookup in lookups for tensor in lookup]


def _packed(lookups):
  """One int64 vector of features' `_lookups`: their id counts, their
  batch sizes, then each feature's ids and examples in turn (`_unpacked`
  reads it)."""
  sizes = [tf.size(ids, out_type=tf.int64) for ids, _, _ in lookups]
  batches = [tf.cast(batch, tf.int64) for _, _, batch in lookups]
  pieces = [tf.cast(piece, tf.int64) for ids, example, _ in lookups
            for piece in (ids, example)]
  return tf.concat([tf.stack(sizes + batches)] + pieces, axis=0)


def _unpacked(packed, tables):
  """{table: [(ids, example of each id, batch size) of each feature]} of
  a sampled step's `_packed` vector (views of it), for features of
  `tables` (the table of each, in order)."""
  n = len(tables)
  counts, batches = packed[:n], packed[n:2 * n]
  pieces = np.split(packed[2 * n:], np.cumsum(np.repeat(counts, 2))[:-1])
  results = {}
  for k, table in enumerate(tables):
    results.setdefault(table, []).append(
        (pieces[2 * k], pieces[2 * k + 1], batches[k]))
  return results


# Sampled steps' results wait, as fetched, until this many bytes of them
# are held (or the statistics are saved): then they are counted at once.
MAX_PENDING_BYTES = 8 * 2**20


def _count(stats_by_table, pending):
  """Adds the fetched steps `pending` ([{table: [(ids, example of each id,
  batch size) of each feature]}]) to `stats_by_table`, each table's in one
  pass over all of them: its distinct ids and their counts, and the ids
  per example of each feature. (What a step's ids add does not depend on
  how steps are grouped, save the order Misra-Gries sees them in: its
  bound holds either way.)"""
  for table, stats in stats_by_table.items():
    ids, lengths = [], []
    for results in pending:
      for feature_ids, example, batch in results.get(table, ()):
        ids.append(feature_ids)
        lengths.append(
            np.bincount(example, minlength=int(batch))[:int(batch)])
    if not lengths:
      continue
    unique, counts = np.unique(np.concatenate(ids), return_counts=True)
    stats.observe_counts(unique, counts, np.concatenate(lengths))


class StatisticsHook(tf.compat.v1.train.SessionRunHook):
  """Takes the sampled steps' lookups and saves their counts (see module
  docstring). `take`: the packed lookups of the last step, taken out of
  the staging area they were kept in (`Profiler.sampling`)."""

  def __init__(self, profiler, tables, take, every_steps=None,
               every_secs=None):
    self._profiler = profiler
    self._tables = list(tables)
    self._take = take
    self._every_steps = every_steps
    self._every_secs = every_secs
    self._period = profiler.period
    self._runs = 0
    self._sampled = False
    self._first_save = True
    self._delta = None
    self._pending = []
    self._pending_bytes = 0
    self._since_save = 0
    self._saved_at = time.monotonic()

  def begin(self):
    self._runs = 0
    self._first_save = True
    self._new_delta()
    self._pending, self._pending_bytes = [], 0

  def after_create_session(self, session, coord):
    """Takes once (stand-ins, before any step), so that the session builds
    the executor of that small run (its first run of these fetches) now,
    before the first step, not after the first sampled one."""
    del coord
    session.run(self._take)

  def _new_delta(self, tables=None):
    """Fresh counts for `tables` (default: every table)."""
    if tables is None:
      self._delta = {}
      tables = list(dict.fromkeys(self._tables))
    for table in tables:
      stats = statistics.TableStatistics(self._profiler.settings(table),
                                         self._profiler.sampling_rate)
      stats.runs = 1 if self._first_save else 0
      self._delta[table] = stats

  def before_run(self, run_context):
    del run_context
    self._sampled = self._runs % self._period == 0
    self._runs += 1

  def after_run(self, run_context, run_values):
    del run_values
    if self._sampled:
      packed = run_context.session.run(self._take)
      self._pending.append(_unpacked(packed, self._tables))
      self._pending_bytes += packed.nbytes
      if self._pending_bytes >= MAX_PENDING_BYTES:
        self._count_pending()
    self._since_save += 1
    if ((self._every_steps and self._since_save >= self._every_steps) or
        (self._every_secs and
         time.monotonic() - self._saved_at >= self._every_secs)):
      self.save()

  def _count_pending(self):
    pending, self._pending, self._pending_bytes = self._pending, [], 0
    _count(self._delta, pending)

  def end(self, session):
    del session
    self.save()

  def save(self):
    """Adds what was sampled since the last save to the directory's files
    (a run's first save writes every table's file, so that the run is
    counted even when it sampled nothing). A file that cannot be written
    now (a full disk, a removed directory) gets a warning and its counts
    are kept for the next save: statistics never stop training."""
    self._count_pending()
    saved = []
    for table, stats in self._delta.items():
      if not (stats.runs or stats.examples):
        continue
      try:
        store.add_to_file(self._profiler.directory, stats)
        saved.append(table)
      except (OSError, files.FileRejected) as error:
        tf.compat.v1.logging.warning(
            "Lookup statistics of table %r not saved to %s (%s); they are "
            "kept for the next save.", table, self._profiler.directory,
            error)
    self._first_save = False
    self._new_delta(saved)
    self._since_save = 0
    self._saved_at = time.monotonic()
