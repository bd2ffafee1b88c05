"""The cluster test harness (tests/cluster_harness.py) and programs
(tests/cluster_programs.py) on the library as it is: a between-graph cluster
of local processes (chief, worker, 2 ps, evaluator) trains the `ctr` model
asynchronously through `train_and_evaluate`; a worker killed mid-run and
restarted rejoins; every process ends with the test, pass or fail.

Synchronisation is by polling logs and files with time limits, never by
fixed sleeps. A worker is started once the chief has initialized the
variables (it holds at step 1 until told to go): a worker that finds them
uninitialized waits TF's 30 s before checking again.
"""
import glob
import json
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest

from tests import cluster_harness
from tests import cluster_programs
from tests.cluster_harness import LocalCluster

STEPS = 20
BATCH = 8
# Every wait of these tests is bounded by this (seconds); each test takes
# well under a minute on a 2-core machine.
WAIT = 90


def _argv(model_dir, out=None, *extra):
  argv = ["--model", "ctr", "--model-dir", model_dir, "--steps", STEPS,
          "--batch", BATCH, "--mode", "async"]
  if out:
    argv += ["--out", out]
  return argv + list(extra)


def _start_chief_then_worker(cluster, go_file, chief_argv, worker_argv):
  """Starts the ps tasks, the chief (holding at step 1 until `go_file`
  exists) and the evaluator if any; then the worker once the chief holds
  (the variables are initialized); returns once the worker has run a
  step. The chief holds until the caller creates `go_file`."""
  held = chief_argv + ["--hold-at-step", 1, "--hold-file", go_file]
  cluster.start_all_chief_first(
      lambda task: (worker_argv if task.startswith("worker:") else
                    held if task == "chief:0" else chief_argv),
      chief_ready=lambda: "HOLD chief:0" in cluster.log("chief:0"))
  cluster.wait_for_log("worker:0", "STEP worker:0")


def _go(go_file):
  open(go_file, "w").close()


def _steps_logged(log, task):
  return [int(m) for m in re.findall(
      rf"^STEP {re.escape(task)} global_step=(\d+)", log, re.MULTILINE)]


def _eval_summaries(model_dir):
  """[(step, {tag: value})] of the evaluator's events files."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  found = []
  for path in glob.glob(os.path.join(model_dir, "eval", "events.out.*")):
    for event in tf.compat.v1.train.summary_iterator(path):
      values = {v.tag: v.simple_value for v in event.summary.value
                if v.HasField("simple_value")}
      if values:
        found.append((event.step, values))
  return found


@pytest.mark.slow
def test_async_ctr_cluster_trains_serves_and_evaluates(tmp_path):
  model_dir = str(tmp_path / "model")
  out = str(tmp_path / "result.json")
  go = str(tmp_path / "go")
  with LocalCluster(tmp_path, chief=1, workers=1, ps=2, evaluator=True,
                    task_env={"ps": cluster_harness.PS_SERVING_LOG_ENV},
                    timeout=WAIT) as cluster:
    argv = _argv(model_dir, out)
    _start_chief_then_worker(cluster, go, argv, argv)
    _go(go)

    assert cluster.wait("chief:0") == 0, cluster.log_tails("chief:0")
    assert cluster.wait("worker:0") == 0, cluster.log_tails("worker:0")
    assert cluster.wait("evaluator:0") == 0, cluster.log_tails("evaluator:0")
    # ps tasks serve until killed.
    assert cluster.running("ps:0") and cluster.running("ps:1")

    result = cluster_programs.read_result(out)
    assert result["task"] == "chief:0"
    assert result["global_step"] >= STEPS
    variables = result["variables"]
    for table in ("a_embedding", "bc"):
      rows = cluster_programs.table_rows(variables, table)
      assert rows.shape == ((40, 4) if table != "bc" else (24, 4))
      assert np.all(np.isfinite(rows))
    assert "hidden/kernel" in variables and "logit/bias" in variables

    # Both training tasks trained; the tables' partitions live on the two ps
    # tasks, and each ps task sent tensors to both.
    chief_log, worker_log = cluster.log("chief:0"), cluster.log("worker:0")
    assert "STEP chief:0" in chief_log and "STEP worker:0" in worker_log
    placed = {line.split()[2] for line in chief_log.splitlines()
              if line.startswith("PLACEMENT bc/part_")}
    assert placed == {"/job:ps/task:0", "/job:ps/task:1"}, chief_log[-3000:]
    for index in (0, 1):
      served = cluster_harness.ps_served(cluster.log(f"ps:{index}"))
      assert served.get("chief") and served.get("worker"), (
          index, served, cluster_harness.tail(cluster.log(f"ps:{index}")))

    # The evaluator evaluated the final checkpoint.
    summaries = _eval_summaries(model_dir)
    assert summaries, os.listdir(model_dir)
    step, values = max(summaries, key=lambda s: s[0])
    assert step >= STEPS
    assert {"loss", "auc", "mean"} <= set(values), values
  for task in cluster.tasks:
    assert not cluster.running(task)


@pytest.mark.slow
def test_worker_killed_mid_run_restarts_and_training_finishes(tmp_path):
  model_dir = str(tmp_path / "model")
  out = str(tmp_path / "result.json")
  go = str(tmp_path / "go")
  with LocalCluster(tmp_path, chief=1, workers=1, ps=2,
                    timeout=WAIT) as cluster:
    argv = _argv(model_dir, out)
    # The worker's steps are paced and the chief holds at step 1: the
    # worker is killed after its first step, far from the last.
    worker_argv = argv + ["--step-delay", 0.2]
    _start_chief_then_worker(cluster, go, argv, worker_argv)
    cluster.kill("worker:0")
    killed_log = cluster.log("worker:0")
    assert "DONE" not in killed_log
    assert max(_steps_logged(killed_log, "worker:0")) < STEPS, killed_log
    cluster.restart("worker:0")
    assert cluster.log_path("worker:0").endswith("worker_0.1.log")
    # The restarted worker rejoins (the variables on the ps tasks are kept)
    # and trains before the chief goes on.
    cluster.wait_for_log("worker:0", "STEP worker:0")
    assert cluster.running("chief:0")
    _go(go)

    assert cluster.wait("chief:0") == 0, cluster.log_tails("chief:0")
    assert cluster.wait("worker:0") == 0, cluster.log_tails("worker:0")
    result = cluster_programs.read_result(out)
    assert result["global_step"] >= STEPS
    assert "DONE worker:0" in cluster.log("worker:0")
    assert cluster.running("ps:0") and cluster.running("ps:1")
  for task in cluster.tasks:
    assert not cluster.running(task)


# --- the single-process reference ------------------------------------------------


def _run_single(argv, timeout=WAIT):
  """Runs `python -m tests.cluster_programs --single *argv` (no TF_CONFIG);
  returns its output."""
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
             PYTHONPATH=cluster_harness.REPO_ROOT)
  env.pop("TF_CONFIG", None)
  done = subprocess.run(
      [sys.executable, "-m", cluster_harness.PROGRAM, "--single"] +
      [str(a) for a in argv], cwd=cluster_harness.REPO_ROOT, env=env,
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout,
      check=False)
  output = done.stdout.decode("utf-8", "replace")
  assert done.returncode == 0, cluster_harness.tail(output)
  return output


@pytest.mark.slow
def test_single_counter_run_counts_every_lookup_and_resumes_from_a_copy(
    tmp_path):
  """The reference a cluster is compared with: each lookup adds 1 to its
  row; a run started from a copied checkpoint of step c reads global batches
  c, c+1, ... (so 4 + 4 steps equal 8 steps)."""
  first = str(tmp_path / "first")
  _run_single(["--model", "counter", "--model-dir", first, "--steps", 4,
               "--batch", BATCH, "--out", tmp_path / "first.json"])
  result = cluster_programs.read_result(str(tmp_path / "first.json"))
  assert result["global_step"] == 4
  np.testing.assert_array_equal(
      cluster_programs.table_rows(result["variables"], "id_embedding"),
      cluster_programs.expected_counter_table(0, 4, BATCH))

  output = _run_single([
      "--model", "counter", "--model-dir", tmp_path / "second", "--steps", 8,
      "--batch", BATCH, "--init-from", os.path.join(first, "model.ckpt-4"),
      "--out", tmp_path / "second.json"])
  assert "first_step=4" in output
  result = cluster_programs.read_result(str(tmp_path / "second.json"))
  assert result["global_step"] == 8
  np.testing.assert_array_equal(
      cluster_programs.table_rows(result["variables"], "id_embedding"),
      cluster_programs.expected_counter_table(0, 8, BATCH))
  assert len(_steps_logged(output, "single")) == 4


# --- the harness itself ------------------------------------------------------------


@pytest.mark.slow
def test_leaving_the_cluster_kills_its_processes_even_on_failure(tmp_path):
  with pytest.raises(RuntimeError, match="the test failed"):
    with LocalCluster(tmp_path, chief=1, workers=0, ps=1,
                      timeout=WAIT) as cluster:
      proc = cluster.start("ps:0", ["--model", "counter", "--model-dir",
                                    tmp_path / "model", "--steps", 1,
                                    "--batch", BATCH])
      assert os.getpgid(proc.pid) == proc.pid  # its own process group
      cluster.wait_for_log("ps:0", "Start Tensorflow server")
      assert cluster.running("ps:0")  # a ps task serves until killed
      raise RuntimeError("the test failed")
  assert proc.returncode == -signal.SIGKILL
  with pytest.raises(ProcessLookupError):
    os.kill(proc.pid, 0)


@pytest.mark.slow
def test_a_task_left_running_ends_by_itself_after_max_seconds(tmp_path):
  with LocalCluster(tmp_path, chief=1, workers=0, ps=1, timeout=WAIT,
                    max_seconds=2) as cluster:
    cluster.start("ps:0", ["--model", "counter", "--model-dir",
                           tmp_path / "model", "--steps", 1, "--batch",
                           BATCH])
    assert cluster.wait("ps:0") == 3
    assert "WATCHDOG exiting: too long" in cluster.log("ps:0")


def test_tf_config_ports_and_log_names(tmp_path):
  cluster = LocalCluster(tmp_path, chief=1, workers=2, ps=2, evaluator=True)
  assert cluster.tasks == ["ps:0", "ps:1", "chief:0", "worker:0", "worker:1",
                           "evaluator:0"]
  assert cluster.training_tasks() == ["chief:0", "worker:0", "worker:1"]
  addresses = [a for job in cluster.cluster.values() for a in job]
  assert len(set(addresses)) == 5
  assert all(a.startswith("127.0.0.1:") for a in addresses)
  assert sorted(cluster.cluster) == ["chief", "ps", "worker"]
  config = cluster.tf_config("evaluator:0")
  assert "evaluator" not in config["cluster"]  # as Estimator wants
  assert config["task"] == {"type": "evaluator", "index": 0}
  assert cluster.tf_config("worker:1")["task"] == {"type": "worker",
                                                   "index": 1}
  json.dumps(cluster.tf_config("ps:1"))
  with pytest.raises(KeyError):
    cluster.tf_config("worker:2")
  assert cluster.log_path("worker:1", run=0).endswith("logs/worker_1.log")
  assert cluster.log_path("worker:1", run=2).endswith("logs/worker_1.2.log")


def test_start_all_starts_the_ps_tasks_first(tmp_path):
  started = []

  class Recording(LocalCluster):

    def start(self, task, argv):
      started.append((task, argv))

  Recording(tmp_path, workers=1, ps=2).start_all(lambda task: [task])
  assert [t for t, _ in started] == ["ps:0", "ps:1", "chief:0", "worker:0"]
  assert all(argv == [task] for task, argv in started)


def test_ps_served_reads_the_rendezvous_lines():
  log = "\n".join([
      "I tensorflow/core/distributed_runtime/rpc/grpc_server_lib.cc:457] "
      "Started server with target: grpc://127.0.0.1:1",
      "I base_rendezvous_mgr.cc:162] BaseRemoteRendezvous Send 0x1 "
      "/job:ps/replica:0/task:0/device:CPU:0;1f;/job:chief/replica:0/task:0/"
      "device:CPU:0;edge_1_read;0:0",
      "I base_rendezvous_mgr.cc:162] BaseRemoteRendezvous Send 0x1 "
      "/job:ps/replica:0/task:0/device:CPU:0;1f;/job:worker/replica:0/task:1"
      "/device:CPU:0;edge_2_read;0:0",
      "I base_rendezvous_mgr.cc:162] BaseRemoteRendezvous Send 0x1 "
      "/job:ps/replica:0/task:0/device:CPU:0;1f;/job:chief/replica:0/task:0/"
      "device:CPU:0;edge_3_read;0:0",
  ])
  assert cluster_harness.ps_served(log) == {"chief": 2, "worker": 1}


def test_poll_times_out_with_the_reason():
  with pytest.raises(cluster_harness.ClusterTimeout, match="never.*tail"):
    cluster_harness.poll(lambda: False, 0.1, "never", lambda: " tail")


# --- the programs' data --------------------------------------------------------------


def test_task_slices_tile_the_global_batches():
  """Task t of n reads [s*G + t*b, s*G + (t+1)*b): the slices of all tasks
  are global batch s, whatever the split."""
  for tasks, batch in ((1, 12), (2, 6), (3, 4)):
    for step in (0, 1, 5):
      read = np.concatenate([
          cluster_programs.examples_of_step(step, t, tasks, batch)
          for t in range(tasks)
      ])
      np.testing.assert_array_equal(read, np.arange(step * 12,
                                                    (step + 1) * 12))


def test_the_features_are_the_same_in_numpy_and_tensorflow():
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  k = np.arange(0, 50, dtype=np.int64)
  tf_ops = cluster_programs.TFOps
  with tf.Graph().as_default():
    tensors = cluster_programs.ctr_features(tf.constant(k), tf_ops)
    tensors["counter"] = cluster_programs.counter_ids(tf.constant(k), tf_ops)
    with tf.compat.v1.Session() as session:
      got = session.run(tensors)
  numpy = cluster_programs.ctr_features(k)
  numpy["counter"] = cluster_programs.counter_ids(k)
  for name, values in numpy.items():
    np.testing.assert_array_equal(got[name], values, name)
  assert 0 < numpy["label"].mean() < 1
  ids = cluster_programs.counter_ids(k)
  assert ids.max() < cluster_programs.COUNTER_VOCAB
  # Rows are shared by many examples (tasks collide on them), unevenly.
  counts = cluster_programs.expected_counter_table(0, 5, 10)
  assert counts.sum() == 2 * 50 and len(set(counts.ravel())) > 2


def test_table_rows_joins_partitions_and_leaves_slots_out():
  variables = {
      "t/part_1": [[3.0], [4.0]],
      "t/part_0": [[1.0], [2.0]],
      "t/Adagrad/part_0": [[9.0]],
      "t/Adagrad/part_1": [[9.0]],
      "global_step": 3,
  }
  np.testing.assert_array_equal(
      cluster_programs.table_rows(variables, "t"), [[1.0], [2.0], [3.0],
                                                    [4.0]])
  whole = {"input_layer/id_embedding/embedding_weights": [[1.0]],
           "input_layer/id_embedding/embedding_weights/Adagrad": [[2.0]]}
  np.testing.assert_array_equal(
      cluster_programs.table_rows(whole, "id_embedding"), [[1.0]])


def test_the_cluster_mode_argument_only_when_the_library_has_it(monkeypatch):
  parse = cluster_programs.parse_args
  base = ["--model", "counter", "--model-dir", "d", "--steps", "1", "--batch",
          "8"]
  if not hasattr(cluster_programs.es, "ClusterTraining"):
    assert cluster_programs.cluster_training_kwargs(parse(base + ["--mode", "sync"])) == {}

  class ClusterTraining:

    def __init__(self, **kwargs):
      self.kwargs = kwargs

  monkeypatch.setattr(cluster_programs.es, "ClusterTraining", ClusterTraining,
                      raising=False)
  extra = cluster_programs.cluster_training_kwargs(
      parse(base + ["--mode", "sync", "--step-timeout", "7"]))
  assert extra["cluster_training"].kwargs == {"asynchronous": False,
                                              "step_timeout_secs": 7.0}
  extra = cluster_programs.cluster_training_kwargs(parse(base + ["--mode", "async"]))
  assert extra["cluster_training"].kwargs == {"asynchronous": True}
  assert cluster_programs.cluster_training_kwargs(parse(base)) == {}
