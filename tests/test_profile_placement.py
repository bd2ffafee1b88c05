"""Lookup statistics placing table partitions on a cluster's ps tasks
(`cluster/placement.py`): the balanced assignment, and the one decision
every task of a cluster shares (recorded in the model directory and in
checkpoints, `cluster/assignment_file.py`). The cluster runs themselves
are in test_cluster_training.py.
"""
import json
import os
import threading

import numpy as np
import pytest
import tensorflow as tf

import estimator_spec as es
from estimator_spec.cluster import assignment_file
from estimator_spec.cluster import placement
from estimator_spec.cluster import tasks as cluster_lib
from estimator_spec.profiling import statistics as st

NUM_PS = 3


def _model(strategy="div", vocab=(30, 30, 30, 2)):
  tables = {f"t{i}": es.TableConfig(v, 4) for i, v in enumerate(vocab)}
  features = {f"f{i}": es.FeatureConfig(f"t{i}") for i in range(len(vocab))}
  return es.EmbeddingConfigSpec(
      table_to_config_dict=tables, feature_to_config_dict=features,
      optimization_parameters=es.AdagradParameters(0.1),
      partition_strategy=strategy).model


def _stats(model, table, ids):
  stats = st.TableStatistics(st.table_settings(model, table, NUM_PS), 1.0)
  stats.observe(np.asarray(ids), np.ones(len(ids), np.int64))
  return stats


def _cluster(task_type="chief", task_id=0):
  return cluster_lib.Cluster(task_type, task_id, NUM_PS,
                             (("chief", 0), ("worker", 0)))


def test_hot_partitions_of_different_tables_go_to_different_ps_tasks():
  model = _model()
  # Under div, every table's lookups fall mostly on its first rows
  # (partition 0): partition p on ps p would put them all on ps 0.
  stats = {
      "t0": _stats(model, "t0", [0] * 60 + [15] * 10 + [25] * 5),
      "t1": _stats(model, "t1", [1] * 50 + [12] * 8 + [29] * 4),
      "t2": _stats(model, "t2", [2] * 40 + [11] * 6 + [22] * 3),
      "t3": None,
  }
  assignment = placement.balanced_assignment(model, NUM_PS, stats)
  # Busiest table first; each partition, busiest first, on the ps task
  # with the least load so far. t0 [60, 10, 5] -> ps 0, 1, 2 (60, 10, 5);
  # t1 [50, 8, 4] -> ps 2, 1, 0 (64, 18, 55); t2 [40, 6, 3] -> ps 1, 2, 0.
  assert assignment["t0"] == [0, 1, 2]
  assert assignment["t1"] == [2, 1, 0]
  assert assignment["t2"] == [1, 2, 0]
  hot = {assignment[t][0] for t in ("t0", "t1", "t2")}
  assert hot == {0, 1, 2}
  # Each ps task holds one partition of every table (memory as even as
  # the partitions); a table without statistics keeps p on ps p.
  for table in ("t0", "t1", "t2"):
    assert sorted(assignment[table]) == [0, 1, 2]
  assert assignment["t3"] == [0, 1]
  load = np.zeros(NUM_PS)
  for table in ("t0", "t1", "t2"):
    for p, ps in enumerate(assignment[table]):
      load[ps] += stats[table].shard_load["div"][p]
  identity = sum(s.shard_load["div"] for t, s in stats.items() if s)
  assert load.max() / load.mean() < identity.max() / identity.mean()
  assert load.max() / load.mean() < 1.2


def test_without_statistics_partition_p_stays_on_ps_p():
  model = _model()
  assignment = placement.balanced_assignment(
      model, NUM_PS, {t: None for t in model.tables})
  assert assignment == {"t0": [0, 1, 2], "t1": [0, 1, 2], "t2": [0, 1, 2],
                        "t3": [0, 1]}


def test_statistics_for_another_shard_count_are_not_used():
  model = _model()
  stats = st.TableStatistics(st.table_settings(model, "t0", 2), 1.0)
  stats.observe(np.asarray([29] * 10), np.ones(10, np.int64))
  assignment = placement.balanced_assignment(model, NUM_PS, {"t0": stats})
  assert assignment["t0"] == [0, 1, 2]


def test_the_chief_records_the_assignment_and_workers_read_it(tmp_path):
  model = _model()
  hot = {"t1": _stats(model, "t1", [1] * 9 + [29])}
  worker_got = {}

  def worker():
    worker_got["assignment"] = placement.resolve_ps_assignment(
        model, _cluster("worker", 0), str(tmp_path), {}, wait_secs=30)

  thread = threading.Thread(target=worker)
  thread.start()  # waits for the chief's record
  chief = placement.resolve_ps_assignment(model, _cluster(), str(tmp_path),
                                          hot, wait_secs=30)
  thread.join(timeout=30)
  assert worker_got["assignment"] == chief
  with open(tmp_path / assignment_file.ASSIGNMENT_FILE) as f:
    assert json.load(f) == chief
  # Statistics that grew since do not move partitions of this model dir.
  later = {"t1": _stats(model, "t1", [29] * 50)}
  assert placement.resolve_ps_assignment(model, _cluster(), str(tmp_path),
                                         later, wait_secs=1) == chief


def test_a_record_for_other_tables_or_ps_counts_is_replaced(tmp_path):
  model = _model()
  (tmp_path / assignment_file.ASSIGNMENT_FILE).write_text(json.dumps(
      {"t0": [0, 1], "t1": [0, 1], "t2": [0, 1], "t3": [0, 1]}))
  with pytest.warns(RuntimeWarning, match="2 partitions, not 3 .* The chief "
                    "writes a new one"):
    got = placement.resolve_ps_assignment(model, _cluster(), str(tmp_path),
                                          {}, wait_secs=1)
  assert got == placement.balanced_assignment(model, NUM_PS, {})
  with open(tmp_path / assignment_file.ASSIGNMENT_FILE) as f:
    assert json.load(f) == got


def test_the_chief_refuses_a_decided_assignment_no_task_could_use(tmp_path):
  """A rule's result is checked as a record is: all partitions of a table
  on one ps task would make every worker refuse it and time out."""
  model = _model()
  one_task = {name: [0] * min(t.vocabulary_size, NUM_PS)
              for name, t in model.tables.items()}
  with pytest.raises(ValueError, match="not one the training tasks can use"):
    assignment_file.resolve(model, _cluster(), str(tmp_path), 1,
                            lambda: one_task)
  assert not (tmp_path / assignment_file.ASSIGNMENT_FILE).exists()
  good = placement.balanced_assignment(model, NUM_PS, {})
  assert assignment_file.resolve(model, _cluster(), str(tmp_path), 1,
                                 lambda: good) == good


def test_a_worker_without_a_chief_gives_up_naming_the_file(tmp_path):
  with pytest.raises(RuntimeError,
                     match="worker 0: waited 1 s for the chief.*"
                     + assignment_file.ASSIGNMENT_FILE):
    placement.resolve_ps_assignment(_model(), _cluster("worker", 0),
                                    str(tmp_path), {}, wait_secs=1)


def test_a_checkpoint_record_comes_before_the_file(tmp_path):
  model = _model()
  recorded = {"t0": [2, 1, 0], "t1": [1, 2, 0], "t2": [0, 2, 1],
              "t3": [1, 0]}
  with tf.Graph().as_default():
    variable = tf.compat.v1.Variable(json.dumps(recorded),
                                     name=assignment_file.ASSIGNMENT_TENSOR)
    saver = tf.compat.v1.train.Saver([variable])
    with tf.compat.v1.Session() as session:
      session.run(variable.initializer)
      saver.save(session, os.path.join(str(tmp_path), "model.ckpt"),
                 global_step=3)
  (tmp_path / assignment_file.ASSIGNMENT_FILE).write_text(json.dumps(
      placement.balanced_assignment(model, NUM_PS, {})))
  for task in (_cluster(), _cluster("worker", 0)):
    assert placement.resolve_ps_assignment(model, task, str(tmp_path), {},
                                           wait_secs=1) == recorded
