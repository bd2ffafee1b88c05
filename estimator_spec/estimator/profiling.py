"""`profile_data_directory` on the host: sampling lookups while training,
saving them, and reading them back at start-up.

* `Profiler` (one per estimator with a profile directory): the directory,
  the sampling rate, and the shard count the statistics are kept for (the
  run's TPU cores, or its parameter-server tasks on a cluster: the shards a
  table's rows are spread over). `load()` reads the statistics that match
  this model's tables; `startup_report` says what they show.
* `StatisticsHook`: a training hook that samples one step in every
  `round(1 / rate)` (the first step of each `train()` call included). A
  sampled step also runs a few ops the hook adds after the whole step is
  built (each table's distinct ids, their counts, the ids per example);
  their results are added to per-table `statistics.TableStatistics` on a
  thread of the hook while the next step runs. The other steps run exactly
  as without a profile directory, and the step's own ops (and so the
  numbers) are the same with and without one. The counts
  gathered since the last save are added to the directory's files
  (`statistics.add_to_file`) at each checkpoint interval of the RunConfig
  (`save_checkpoints_steps` / `save_checkpoints_secs`) and when training
  ends. Every training task of a cluster samples its own batches; the files
  sum them.
"""
import queue as queue_lib
import threading
import time

import numpy as np
import tensorflow as tf

from estimator_spec import files
from estimator_spec.config import report
from estimator_spec.engine import statistics
from estimator_spec.estimator import placement


class Profiler:
  """Lookup statistics of one estimator's tables (see module docstring).

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
    self.period = statistics.sampling_period(sampling_rate)
    self.num_shards = int(num_shards)
    if writes:
      statistics.check_directory(directory)

  def settings(self, table):
    return statistics.table_settings(self.model, table, self.num_shards)

  def load(self):
    """{table: TableStatistics or None}: what the directory holds for
    these tables with these settings."""
    return statistics.load_for_model(self.directory, self.model,
                                     self.num_shards)

  def startup_report(self, config, saved):
    """Logs the div/mod shard load and memory the saved statistics
    (`saved`, from `load`) show."""
    text = report.statistics_section(config, saved, self.num_shards)
    if text:
      tf.compat.v1.logging.info("Lookup statistics in %s:\n%s",
                                self.directory, text)
    else:
      tf.compat.v1.logging.info(
          "No lookup statistics in %s for these tables yet; this run samples "
          "one step in %d.", self.directory, self.period)

  def ps_assignment(self, cluster, model_dir, wait_secs, stats):
    """Which ps task holds each table partition on `cluster`: recorded in
    `model_dir`, or balanced by the saved statistics (`stats`, from `load`;
    `placement.resolve_ps_assignment`); logged."""
    assignment = placement.resolve_ps_assignment(
        self.model, cluster, model_dir, stats, wait_secs)
    tf.compat.v1.logging.info(
        "Table partitions on the ps tasks:\n%s",
        placement.assignment_report(self.model, assignment, stats,
                                    cluster.num_ps))
    return assignment

  def hook(self, feature_ids, run_config):
    """The `StatisticsHook` of a training graph whose lookups read
    `feature_ids` ([engine.inputs.FeatureIds])."""
    inputs = {}
    for item in feature_ids:
      inputs.setdefault(item.table, []).append(
          (item.flat.ids, item.flat.example, item.flat.batch_size))
    return StatisticsHook(self, inputs, run_config.save_checkpoints_steps,
                          run_config.save_checkpoints_secs)


class _Observer:
  """Adds fetched batches to statistics on a thread of its own; `wait()`
  returns once every batch handed over so far is counted (and raises what
  the thread raised).

  The thread starts on a batch only when `go()` says the training thread
  is about to run a step: TF runs the step without Python's GIL, so the
  counting (Python and NumPy, which hold the GIL) overlaps the step
  instead of delaying the hooks between steps."""

  def __init__(self):
    self._queue = queue_lib.Queue(maxsize=4)  # a full queue blocks the step
    self._go = threading.Event()
    self._draining = False
    self._error = None
    self._thread = threading.Thread(target=self._run, daemon=True,
                                    name="lookup_statistics")
    self._thread.start()

  def _run(self):
    while True:
      item = self._queue.get()
      try:
        if item is None:
          return
        if self._error is None:
          if not self._draining:
            self._go.wait()
            self._go.clear()
          stats, results = item
          _observe(stats, results)
      except Exception as error:  # pylint: disable=broad-except
        self._error = error  # raised on the training thread by wait()
      finally:
        self._queue.task_done()

  def add(self, stats, results):
    self._check()
    self._queue.put((stats, results))

  def go(self):
    """The training thread is about to run a step."""
    self._go.set()

  def wait(self):
    self._draining = True
    self._go.set()
    self._queue.join()
    self._draining = False
    self._check()

  def stop(self):
    self._draining = True
    self._go.set()
    self._queue.put(None)
    self._thread.join()
    self._check()

  def _check(self):
    if self._error is not None:
      raise self._error


def _observe(stats_by_table, results):
  """Adds one fetched step ({table: (distinct ids, counts, lengths)})."""
  for table, (unique, counts, lengths) in results.items():
    # Lets the training thread take the GIL between tables, rather than
    # after Python's switch interval (5 ms).
    time.sleep(0)
    stats_by_table[table].observe_counts(unique, counts, lengths)


def _summaries(inputs):
  """{table: (distinct ids, their counts, ids per example of each
  feature)} of a step, as ops: built in the hook's `begin`, after every op
  of the step, and run only with a sampled step."""
  summaries = {}
  with tf.name_scope("lookup_statistics"):
    for table, features in inputs.items():
      ids = tf.concat([f[0] for f in features], axis=0)
      unique, _, counts = tf.unique_with_counts(ids, out_idx=tf.int64)
      lengths = tf.concat([
          tf.math.bincount(tf.cast(example, tf.int32),
                           minlength=tf.cast(batch, tf.int32),
                           maxlength=tf.cast(batch, tf.int32),
                           dtype=tf.int64)
          for _, example, batch in features], axis=0)
      summaries[table] = (unique, counts, lengths)
  return summaries


class StatisticsHook(tf.compat.v1.train.SessionRunHook):
  """Samples a step's lookups and saves them (see module docstring)."""

  def __init__(self, profiler, inputs, every_steps=None, every_secs=None):
    self._profiler = profiler
    self._inputs = inputs
    self._every_steps = every_steps
    self._every_secs = every_secs
    self._runs = 0
    self._sampled = False
    self._first_save = True
    self._delta = None
    self._since_save = 0
    self._saved_at = time.monotonic()
    self._observer = None
    self._fetches = None

  def begin(self):
    self._runs = 0
    self._first_save = True
    self._new_delta()
    self._fetches = _summaries(self._inputs)

  def after_create_session(self, session, coord):
    del session, coord
    if self._observer is None:  # (a recovered session keeps it)
      self._observer = _Observer()

  def _new_delta(self, tables=None):
    """Fresh counts for `tables` (default: every table)."""
    if tables is None:
      self._delta = {}
      tables = list(self._inputs)
    for table in tables:
      stats = statistics.TableStatistics(self._profiler.settings(table),
                                         self._profiler.sampling_rate)
      stats.runs = 1 if self._first_save else 0
      self._delta[table] = stats

  def before_run(self, run_context):
    del run_context
    if self._observer is not None:
      self._observer.go()
    self._sampled = self._runs % self._profiler.period == 0
    self._runs += 1
    if not self._sampled:
      return None
    return tf.compat.v1.train.SessionRunArgs(self._fetches)

  def after_run(self, run_context, run_values):
    del run_context
    if self._sampled:
      self._observer.add(self._delta, run_values.results)
    self._since_save += 1
    if ((self._every_steps and self._since_save >= self._every_steps) or
        (self._every_secs and
         time.monotonic() - self._saved_at >= self._every_secs)):
      self.save()

  def end(self, session):
    del session
    try:
      self.save()
    finally:
      self._observer.stop()
      self._observer = None

  def save(self):
    """Adds what was sampled since the last save to the directory's files
    (a run's first save writes every table's file, so that the run is
    counted even when it sampled nothing). A file that cannot be written
    now (a full disk, a removed directory) gets a warning and its counts
    are kept for the next save: statistics never stop training."""
    self._observer.wait()
    saved = []
    for table, stats in self._delta.items():
      if not (stats.runs or stats.examples):
        continue
      try:
        statistics.add_to_file(self._profiler.directory, stats)
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
