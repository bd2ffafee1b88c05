"""Training on a between-graph cluster of local processes (TF_CONFIG,
`train_and_evaluate`, loopback ports), as docs/numerics.md, 'Many machines'
defines it:

* synchronous (the default): W training tasks with B/W examples each train
  exactly like one process with B examples (tables, slots, dense variables),
  for W = 2 (with pipelining and CrossShardOptimizer, and an evaluator task)
  and W = 3 (the dense model trained by Adam, whose non-slot variables the
  chief creates); table partitions live on their ps tasks;
* asynchronous: concurrent tasks updating the same rows lose no update;
* faults: a worker, a ps task or the chief killed (SIGKILL) and restarted;
  a worker that does not come back ends the chief's step with an error
  naming it;
* checkpoints move between one process and clusters with other ps counts;
* lookup statistics (profile_data_directory) decide which ps task holds
  each table partition, every task samples into the same files, and the
  numbers are those of one process without statistics.

Each test starts every process at once (workers that find the model not yet
initialized look again within a second) and waits by polling logs and files,
with time limits. Reference runs are one process (`--single`) started from
the cluster's own step-0 checkpoint, so that both start from the same
values whatever the partitioning.
"""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from estimator_spec.cluster import assignment_file
from estimator_spec.profiling import statistics as st
from estimator_spec.profiling import store
from tests import cluster_programs
from tests.cluster_harness import LocalCluster
from tests.cluster_harness import REPO_ROOT

WAIT = 120
pytestmark = pytest.mark.slow


def _argv(model_dir, steps, batch, mode="sync", out=None, *extra):
  argv = ["--model", "ctr", "--model-dir", model_dir, "--steps", steps,
          "--batch", batch, "--mode", mode]
  if out:
    argv += ["--out", out]
  return argv + [str(e) for e in extra]


def _single(model_dir, steps, batch, out, *extra):
  """The one-process reference run; returns its result."""
  command = [sys.executable, "-m", "tests.cluster_programs", "--single",
             "--model", "ctr",
             "--model-dir", model_dir, "--steps", str(steps), "--batch",
             str(batch), "--out", out] + [str(e) for e in extra]
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=REPO_ROOT)
  env.pop("TF_CONFIG", None)
  done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True,
                        text=True, timeout=WAIT, check=False)
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
  return cluster_programs.read_result(out)


def _assert_same_variables(ours, reference):
  assert sorted(ours) == sorted(reference)
  for name in reference:
    got, want = np.asarray(ours[name]), np.asarray(reference[name])
    if want.dtype.kind == "f":
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6,
                                 err_msg=name)
    else:
      assert got.tolist() == want.tolist(), name


def _placements(log):
  return dict(line.split()[1:3] for line in log.splitlines()
              if line.startswith("PLACEMENT "))


def _run_cluster(tmp_path, workers, argv, ps=2, evaluator=False,
                 while_ps_run=None):
  """Every task's log once the training tasks (and the evaluator) are
  done; with `while_ps_run`, also what it returns, called with the cluster
  before the ps tasks stop."""
  with LocalCluster(tmp_path, chief=1, workers=workers, ps=ps,
                    evaluator=evaluator, timeout=WAIT) as cluster:
    cluster.start_all(lambda task: argv)
    for task in cluster.training_tasks():
      assert cluster.wait(task) == 0, cluster.log_tails(first=task)
    if evaluator:
      assert cluster.wait("evaluator:0") == 0, cluster.log_tails(
          first="evaluator:0")
    logs = {task: cluster.log(task) for task in cluster.tasks}
    if while_ps_run is None:
      return logs
    return logs, while_ps_run(cluster)


@pytest.mark.parametrize("workers,batch,extra", [
    (1, 8, ["--pipelining", "--cross-shard", "--save-steps", 3]),
    # A second synchronous run per stack would repeat the first's check.
    pytest.param(2, 6, ["--adam"], marks=pytest.mark.reference_only),
], ids=["W2-pipelining-crossshard-evaluator", "W3-adam"])
def test_synchronous_tasks_train_like_one_process(tmp_path, workers, batch,
                                                  extra):
  model_dir = str(tmp_path / "cluster")
  out = str(tmp_path / "cluster.json")
  steps = 10
  logs = _run_cluster(
      tmp_path, workers,
      _argv(model_dir, steps, batch, "sync", out, *extra),
      evaluator=(workers == 1))
  result = cluster_programs.read_result(out)
  assert result["global_step"] == steps  # one global step per sync step
  # Every training task ran every step, on its share of the batch.
  for task in [f"chief:0"] + [f"worker:{i}" for i in range(workers)]:
    assert f"STEP {task} global_step={steps}" in logs[task]
    assert f"{batch // (workers + 1)} examples per task step" in logs[task]
  # Table partitions and their slots live on their ps tasks.
  placed = _placements(logs["chief:0"])
  for table in ("input_layer/a_embedding/embedding_weights", "bc"):
    for suffix in ("", "/Adagrad"):
      for p in (0, 1):
        assert placed[f"{table}{suffix}/part_{p}"] == f"/job:ps/task:{p}"
  reference = _single(str(tmp_path / "single"), steps, batch,
                      str(tmp_path / "single.json"), "--init-from",
                      os.path.join(model_dir, "model.ckpt-0"), *extra)
  _assert_same_variables(result["variables"], reference["variables"])
  if workers == 1:
    # The evaluator evaluated the final checkpoint.
    assert re.search(rf"Saving dict for global step {steps}:.*auc",
                     logs["evaluator:0"]), logs["evaluator:0"][-3000:]


def _read_on_ps(cluster, variables, most_parts=8):
  """{name: value} of `variables` ({checkpoint name: its value there})
  as the cluster's ps tasks hold them now: each variable, or each of its
  partitions `<name>/part_<i>` (a checkpoint holds a partitioned variable
  whole), read from the one ps task that has it."""
  graph = tf.Graph()
  handles = {}
  with graph.as_default():
    for name, like in variables.items():
      dtype = tf.as_dtype(like.dtype)
      for candidate in [name] + [f"{name}/part_{i}"
                                 for i in range(most_parts)]:
        for task in (t for t in cluster.tasks if t.startswith("ps:")):
          with tf.device("/job:{}/task:{}".format(*task.split(":"))):
            handle = tf.raw_ops.VarHandleOp(
                dtype=dtype, shape=tf.TensorShape(None),
                shared_name=candidate, container="")
            handles[candidate, task] = (
                tf.raw_ops.VarIsInitializedOp(resource=handle),
                tf.raw_ops.ReadVariableOp(resource=handle, dtype=dtype))
  # Only the ps tasks are asked for their devices (the others have
  # stopped), with a bound on every call. Which task holds which name is
  # asked first (a variable that does not exist reads as uninitialized):
  # reading one that does not exist would fail the session's step.
  config = tf.compat.v1.ConfigProto(device_filters=["/job:ps"],
                                    operation_timeout_in_ms=WAIT * 1000)
  with tf.compat.v1.Session(f"grpc://{cluster.address('ps:0')}",
                            graph=graph, config=config) as session:
    held = session.run({key: exists for key, (exists, _)
                        in handles.items()})
    values = session.run({key: handles[key][1]
                          for key, exists in held.items() if exists})
  holders = {}
  for (name, _), value in values.items():
    holders.setdefault(name, []).append(value)
  twice = [name for name, held_by in holders.items() if len(held_by) > 1]
  assert not twice, f"on several ps tasks: {twice}"
  found = {name: held_by[0] for name, held_by in holders.items()}
  for name, like in variables.items():
    parts = sorted(int(n.rsplit("_", 1)[1]) for n in found
                   if n.startswith(name + "/part_"))
    assert (name in found) != bool(parts), (name, sorted(found))
    assert parts == list(range(len(parts))), (name, parts)
    whole = found.get(name, None)
    if whole is None:
      whole = np.concatenate([found[f"{name}/part_{i}"] for i in parts])
    assert whole.shape == like.shape, (name, whole.shape)
  return found


def test_asynchronous_tasks_lose_no_update(tmp_path):
  # Three tasks add +1 to the rows of each id they look up, concurrently,
  # mostly on the same four rows: every addition must be in the table.
  model_dir = str(tmp_path / "cluster")
  out = str(tmp_path / "cluster.json")
  batch = 6
  argv = ["--model", "counter", "--model-dir", model_dir, "--steps", 300,
          "--batch", batch, "--mode", "async", "--out", out]

  def final_state(cluster):
    # The chief's last checkpoint can be written while another task's step
    # is under way (its global step counted, its rows not yet written):
    # the table is read from the ps tasks once every task has stopped.
    result = cluster_programs.read_result(out)
    checkpoint = result["checkpoint"]
    names = [n for n, _ in tf.train.list_variables(checkpoint)
             if n == "global_step" or "id_embedding" in n]
    return result, _read_on_ps(cluster, {
        n: tf.train.load_variable(checkpoint, n) for n in names})

  logs, (result, final) = _run_cluster(tmp_path, 2, argv,
                                       while_ps_run=final_state)
  table = cluster_programs.table_rows(final, "id_embedding")
  global_step = int(final["global_step"])
  steps_run = sum(len(re.findall(r"^STEP ", log, re.MULTILINE))
                  for task, log in logs.items() if not task.startswith("ps"))
  assert global_step >= 300 and result["global_step"] >= 300
  # Two ids per example; each task step adds 2 * batch and counts once in
  # the global step.
  assert table.sum() == 2 * batch * global_step, (
      table.sum(), global_step, steps_run)
  assert steps_run >= global_step - 3  # all three tasks stepped


def _fault_run(tmp_path, victim, restart=True, extra=()):
  model_dir = str(tmp_path / "cluster")
  out = str(tmp_path / "cluster.json")
  steps = 60
  argv = _argv(model_dir, steps, 8, "sync", out, "--step-delay", 0.1,
               "--save-steps", 10, *extra)
  with LocalCluster(tmp_path, chief=1, workers=1, ps=2,
                    timeout=WAIT) as cluster:
    cluster.start_all(lambda task: argv)
    cluster.wait_for_log("chief:0", "global_step=25")
    cluster.kill(victim)
    if not restart:
      return cluster, cluster.wait("chief:0"), None
    cluster.restart(victim)
    for task in cluster.training_tasks():
      assert cluster.wait(task) == 0, cluster.log_tails(first=task)
    logs = {task: cluster.log(task) for task in cluster.tasks}
    first_runs = {task: cluster.log(task, run=0) for task in cluster.tasks}
  result = cluster_programs.read_result(out)
  assert result["global_step"] == steps
  return logs, first_runs, result


def test_a_killed_worker_rejoins_and_training_finishes(tmp_path):
  logs, first_runs, _ = _fault_run(tmp_path, "worker:0")
  assert "STEP worker:0" in first_runs["worker:0"]
  assert "DONE worker:0 checkpoint_step=60" in logs["worker:0"]


@pytest.mark.parametrize("victim", [
    "ps:0",
    # The other ps task fails and recovers the same way.
    pytest.param("ps:1", marks=pytest.mark.reference_only)])
def test_a_killed_ps_task_resumes_from_the_last_checkpoint(tmp_path, victim):
  logs, _, _ = _fault_run(tmp_path, victim)
  # The chief lost the ps task's variables and restored them from its last
  # checkpoint (saved every 10 steps, the kill came after step 25).
  restored = [int(n) for n in re.findall(
      r"Restoring parameters from .*model\.ckpt-(\d+)", logs["chief:0"])]
  assert restored and max(restored) >= 20, logs["chief:0"][-3000:]


def test_a_killed_chief_restarts_from_its_last_checkpoint(tmp_path):
  logs, _, _ = _fault_run(tmp_path, "chief:0")
  restored = [int(n) for n in re.findall(
      r"Restoring parameters from .*model\.ckpt-(\d+)", logs["chief:0"])]
  assert restored and max(restored) >= 20, logs["chief:0"][-3000:]
  assert "DONE worker:0 checkpoint_step=60" in logs["worker:0"]


# The step deadline is the library's own synchronous step (the same code on
# both stacks), held here on the reference stack.
@pytest.mark.reference_only
def test_a_worker_that_does_not_return_ends_the_step_naming_it(tmp_path):
  cluster, code, _ = _fault_run(
      tmp_path, "worker:0", restart=False,
      extra=["--step-timeout", 8, "--report-after", 2])
  log = cluster.log("chief:0")
  assert code != 0
  assert "has waited" in log and "for gradients from: worker 0" in log, (
      log[-3000:])
  assert "SyncStepTimeoutError" in log and "waiting for: worker 0" in log, (
      log[-3000:])


def test_checkpoints_move_between_one_process_and_other_ps_counts(tmp_path):
  # One process trains 6 steps; a cluster with 3 ps tasks continues that
  # checkpoint to step 12, exactly as the one process continues it.
  first = str(tmp_path / "first")
  _single(first, 6, 8, str(tmp_path / "first.json"))
  start = os.path.join(first, "model.ckpt-6")
  model_dir = str(tmp_path / "cluster")
  cluster_programs.copy_checkpoint(start, model_dir)
  out = str(tmp_path / "cluster.json")
  logs = _run_cluster(tmp_path, 1, _argv(model_dir, 12, 8, "sync", out),
                      ps=3)
  assert "Restoring parameters from" in logs["chief:0"]
  placed = _placements(logs["chief:0"])
  assert {placed[f"bc/part_{p}"] for p in range(3)} == {
      f"/job:ps/task:{p}" for p in range(3)}
  reference = _single(str(tmp_path / "single"), 12, 8,
                      str(tmp_path / "single.json"), "--init-from", start)
  _assert_same_variables(cluster_programs.read_result(out)["variables"],
                         reference["variables"])


def test_the_cluster_example_trains_and_evaluates(tmp_path):
  # The README's command, on chief + worker + 2 ps + evaluator.
  model_dir = str(tmp_path / "model")
  argv = ["--model-dir", model_dir, "--steps", 30, "--batch-size", 256,
          "--train-examples", 8192, "--eval-examples", 2048]
  with LocalCluster(tmp_path, chief=1, workers=1, ps=2, evaluator=True,
                    timeout=WAIT, program="examples.train_ctr_cluster"
                    ) as cluster:
    cluster.start_all(lambda task: argv)
    for task in ("chief:0", "worker:0", "evaluator:0"):
      assert cluster.wait(task) == 0, cluster.log_tails(first=task)
    evaluator = cluster.log("evaluator:0")
  assert re.search(r"Saving dict for global step 30: auc = ", evaluator), (
      evaluator[-3000:])
  assert "128 examples per task step" in cluster.log("worker:0")


def _memory_after_training(tmp_path, vocab):
  """(each ps task's resident MB after training, placements)."""
  model_dir = str(tmp_path / f"model_{vocab}")
  argv = _argv(model_dir, 3, 8, "sync", None, "--vocab-a", vocab)
  with LocalCluster(tmp_path / f"run_{vocab}", chief=1, workers=0, ps=2,
                    timeout=WAIT) as cluster:
    cluster.start_all(lambda task: argv)
    assert cluster.wait("chief:0") == 0, cluster.log_tails(first="chief:0")
    ps = [cluster.memory_mb(f"ps:{i}") for i in range(2)]
    placed = _placements(cluster.log("chief:0"))
  return ps, placed


# Placement and memory do not depend on the stack: the reference stack's run.
@pytest.mark.reference_only
def test_the_tables_take_their_memory_on_the_ps_tasks(tmp_path):
  # Table 'a' with 4,000,000 rows of 4 floats and its Adagrad slot: 128 MB,
  # half on each ps task, which holds it after training.
  small_ps, _ = _memory_after_training(tmp_path, 40)
  big_ps, placed = _memory_after_training(tmp_path, 4_000_000)
  for p in (0, 1):
    assert placed[f"input_layer/a_embedding/embedding_weights/part_{p}"] == (
        f"/job:ps/task:{p}")
    assert big_ps[p] - small_ps[p] >= 0.75 * 64, (small_ps, big_ps)


def _ctr_spec(profile_dir):
  args = cluster_programs.parse_args(
      ["--model", "ctr", "--model-dir", "unused", "--steps", "1", "--batch",
       "1", "--profile-dir", profile_dir])
  return cluster_programs.ctr_model(args)[1]


# The library's own placement by statistics: the reference stack's run.
@pytest.mark.reference_only
def test_statistics_place_partitions_and_leave_training_unchanged(tmp_path):
  # Saved statistics (2 shards) where partition 0 of both tables carries
  # most lookups: table 'a' (busier) keeps p -> ps p, table 'bc' puts its
  # partition 0 on ps 1. The run records the assignment, samples every
  # step (rate 1) of both training tasks into the same files, and trains
  # exactly like one process without statistics.
  profile = str(tmp_path / "profile")
  os.makedirs(profile)
  model = _ctr_spec(profile).model
  (a, bc) = sorted(model.tables, key=lambda t: -model.tables[t].vocabulary_size)
  seeded = {}
  for table, hot, cold in ((a, 100, 10), (bc, 80, 5)):
    stats = st.TableStatistics(st.table_settings(model, table, 2), 1.0)
    ids = [0] * hot + [model.tables[table].vocabulary_size - 1] * cold
    stats.observe(np.asarray(ids), np.ones(len(ids), np.int64))
    store.save(profile, stats)
    seeded[table] = stats
  model_dir = str(tmp_path / "cluster")
  out = str(tmp_path / "cluster.json")
  steps, batch = 6, 8
  logs = _run_cluster(tmp_path, 1, _argv(
      model_dir, steps, batch, "sync", out, "--profile-dir", profile,
      "--sampling-rate", 1))
  placed = _placements(logs["chief:0"])
  expected = {"input_layer/a_embedding/embedding_weights": [0, 1],
              "bc": [1, 0]}
  for variable, tasks in expected.items():
    for suffix in ("", "/Adagrad"):
      for p, ps in enumerate(tasks):
        assert placed[f"{variable}{suffix}/part_{p}"] == f"/job:ps/task:{ps}"
  assert _placements(logs["worker:0"]) == placed
  assert "Table partitions on the ps tasks" in logs["chief:0"]
  with open(os.path.join(model_dir, assignment_file.ASSIGNMENT_FILE)) as f:
    assert json.load(f) == {a: [0, 1], bc: [1, 0]}
  result = cluster_programs.read_result(out)
  text = result["variables"][assignment_file.ASSIGNMENT_TENSOR]
  assert json.loads(text) == {a: [0, 1], bc: [1, 0]}

  single_profile = str(tmp_path / "single_profile")
  reference = _single(str(tmp_path / "single"), steps, batch,
                      str(tmp_path / "single.json"), "--init-from",
                      os.path.join(model_dir, "model.ckpt-0"),
                      "--profile-dir", single_profile, "--sampling-rate", 1)
  recorded = dict(result["variables"])
  del recorded[assignment_file.ASSIGNMENT_TENSOR]
  _assert_same_variables(recorded, reference["variables"])

  # Both tasks' samples add up to what one process sampled of the same
  # global batches (the one process keeps them for 1 shard).
  for table in (a, bc):
    cluster_stats = store.load(profile, st.table_settings(model, table, 2))
    single_stats = store.load(single_profile,
                           st.table_settings(model, table, 1))
    assert cluster_stats.runs == seeded[table].runs + 2
    assert single_stats.runs == 1
    assert (cluster_stats.lookups - seeded[table].lookups ==
            single_stats.lookups > 0)
    assert (cluster_stats.examples - seeded[table].examples ==
            single_stats.examples == steps * batch *
            len(model.tables[table].features))
    seeded_counts = dict(seeded[table].hottest())
    assert {i: c - seeded_counts.get(i, 0)
            for i, c in cluster_stats.hottest()
            if c - seeded_counts.get(i, 0)} == dict(single_stats.hottest())
