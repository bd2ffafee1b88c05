"""The TorchRec peer benchmark's parts that need only numpy and TF
(bench/peers/): the shared workload data, the same-work check, the
estimator sides' description of their work, and how compare.py runs a side.
The TorchRec side itself runs only in .venv-peers (`make bench-peers`,
where compare.py asserts the same-work check before timing); no test here
stands in for it.
"""
import json
import sys
import time

import numpy as np
import pytest

from bench.peers import compare
from bench.peers import workload as peer


@pytest.fixture(scope="module")
def data():
  return peer.make_data()


def test_the_data_is_the_same_for_the_same_seed_and_not_for_another():
  a, labels_a = peer.make_data(2048)
  b, labels_b = peer.make_data(2048)
  c, _ = peer.make_data(2048, seed=1)
  assert list(a) == peer.feature_names() and len(a) == 26
  for name in a:
    np.testing.assert_array_equal(a[name], b[name])
  np.testing.assert_array_equal(labels_a, labels_b)
  assert any(not np.array_equal(a[n], c[n]) for n in a)


def test_each_example_has_one_to_three_ids_in_range_padded_after(data):
  ids, labels = data
  assert labels.shape == (32 * 1024, 1) and labels.dtype == np.float32
  assert set(np.unique(labels)) == {0.0, 1.0}
  assert 0.05 < labels.mean() < 0.95
  for name, array in ids.items():
    assert array.shape == (32 * 1024, 3) and array.dtype == np.int64
    present = array >= 0
    lengths = present.sum(axis=1)
    assert lengths.min() == 1 and lengths.max() == 3, name
    assert 1.95 < lengths.mean() < 2.05, name
    # -1 only after an example's ids.
    np.testing.assert_array_equal(
        present, np.arange(3)[None, :] < lengths[:, None])
    assert array[present].max() < peer.ROWS


def test_ids_are_zipf_skewed(data):
  ids, _ = data
  values = ids["f00"][ids["f00"] >= 0]
  counts = np.sort(np.bincount(values, minlength=peer.ROWS))[::-1]
  # The most frequent row (rank 1) takes a large share; most rows are rare.
  assert counts[0] > 0.1 * values.size
  assert np.count_nonzero(counts) < values.size / 2


def test_jagged_keeps_the_ids_in_example_order():
  ids = np.array([[5, -1, -1], [7, 7, 2], [0, 9, -1]])
  values, lengths = peer.jagged(ids)
  np.testing.assert_array_equal(values, [5, 7, 7, 2, 0, 9])
  np.testing.assert_array_equal(lengths, [1, 3, 2])


def test_the_mlp_parameters_are_counted_layer_by_layer():
  assert peer.mlp_parameters() == (416 * 256 + 256) + (256 * 128 + 128) + (
      128 + 1)
  assert peer.mlp_parameters(3, ()) == 4


def test_batch_work_counts_lookups_and_unique_rows():
  assert peer.batch_work({"b": np.array([3, 3, 4]), "a": np.array([1])}) == {
      "a": [1, 1], "b": [3, 2]}


def test_the_expected_work_follows_the_data(data):
  ids, _ = data
  work = peer.expected_work(ids)
  assert len(work["batches"]) == peer.CHECKED_BATCHES
  first = ids["f03"][:1024]
  assert work["batches"][0]["f03"] == [
      int((first >= 0).sum()), int(np.unique(first[first >= 0]).size)]
  assert work["tables"]["f25"] == [100_000, 16]
  assert work["mlp"] == peer.mlp_parameters()
  line = peer.summary(work)
  assert line.startswith("26 tables 100,000x16, batch 1024, combiner sum")


@pytest.mark.parametrize("key,value", [
    ("tables", {"f00": [100_000, 8]}), ("batch_size", 512),
    ("combiner", "mean"), ("mlp", 1), ("table_optimizer", "rowwise adagrad"),
    ("dense_optimizer", "adam")])
def test_a_difference_in_any_compared_fact_is_named(data, key, value):
  expected = peer.expected_work(data[0])
  assert peer.differences(expected, dict(expected)) == []
  other = dict(expected, **{key: value})
  (line,) = peer.differences(other, expected, names=("torchrec", "workload"))
  assert line.startswith(f"{key}: torchrec ")
  with pytest.raises(compare.SideFailed, match=f"torchrec: {key}"):
    compare.same_work({"ours": expected, "torchrec": other}, expected)


def test_the_rowwise_side_may_differ_in_its_table_optimizer_only(data):
  expected = peer.expected_work(data[0])
  rowwise = dict(expected, table_optimizer="rowwise adagrad")
  lines = compare.same_work({"torchrec-rowwise": rowwise}, expected)
  assert "torchrec-rowwise same but table optimizer rowwise adagrad" in (
      lines[1])
  with pytest.raises(compare.SideFailed, match="torchrec: table_optimizer"):
    compare.same_work({"torchrec": rowwise}, expected)
  with pytest.raises(compare.SideFailed, match="torchrec-rowwise: mlp"):
    compare.same_work({"torchrec-rowwise": dict(rowwise, mlp=3)}, expected)


def test_another_batch_is_a_difference(data):
  expected = peer.expected_work(data[0])
  shifted = dict(expected, batches=expected["batches"][1:] +
                 expected["batches"][:1])
  assert [l.split(":")[0] for l in peer.differences(shifted, expected)] == [
      "batches"]


def test_facts_beyond_the_compared_ones_are_printed_not_compared(data):
  expected = peer.expected_work(data[0])
  side = dict(expected, version="x 1.0", update_check="fine",
              table_optimizer_detail="fused")
  lines = compare.same_work({"torchrec": side}, expected)
  assert any(l.split()[:4] == ["torchrec", "same:", "tables", "by"] and
             "fused" in l for l in lines)
  assert any("update check: fine" in l for l in lines)
  assert any("version: x 1.0" in l for l in lines)


def test_the_ours_side_describes_the_work_it_built_and_feeds(data):
  from bench.peers import estimator_side  # pylint: disable=g-import-not-at-top
  work = estimator_side.describe("ours")
  assert peer.differences(work, peer.expected_work(data[0]),
                          names=("ours", "workload")) == []
  assert work["apply_ops"] == ["ResourceApplyAdagrad"]
  assert work["table_parameters_in_graph"] == 0
  assert "AdagradParameters" in work["table_optimizer_detail"]


def test_both_estimator_sides_build_the_peer_workload_alike():
  from bench import e2e_bench  # pylint: disable=g-import-not-at-top
  from bench.peers import estimator_side  # pylint: disable=g-import-not-at-top
  for side in e2e_bench.SIDES:
    job = dict(e2e_bench.peer26_job(steps=1, warmup=0), side=side)
    _, spec, _ = e2e_bench.build_parts(job)
    columns = spec.feature_columns
    assert [c.categorical_column.name for c in columns] == peer.feature_names()
    assert {(c.categorical_column.num_buckets, c.dimension, c.combiner)
            for c in columns} == {(100_000, 16, "sum")}
    parameters = spec.optimization_parameters
    assert type(parameters).__name__ == "AdagradParameters"
    assert (parameters.learning_rate, parameters.initial_accumulator) == (
        0.05, 0.1)
    # No clipping: TorchRec's fused Adagrad has none.
    assert parameters.clip_weight_min is None
    assert parameters.clip_weight_max is None
    assert spec.clipping_limit is None
  read = estimator_side.optimizer_of
  ops = ["ResourceApplyAdagrad", "ResourceSparseApplyAdagrad"]
  assert read(ops, sparse=True) == read(ops, sparse=False) == "adagrad"
  assert read(["ResourceApplyAdagrad"], sparse=True) == (
      "other: ResourceApplyAdagrad")
  assert read([], sparse=False) == "none"


def _side(code):
  return [sys.executable, "-c", code]


def test_a_side_s_last_result_line_is_read():
  result = compare.run_side(_side(
      "print('noise'); print('PEER_RESULT {\"a\": 1}'); "
      "print('PEER_RESULT {\"examples_per_s\": 2.5}')"), timeout=60)
  assert result == {"examples_per_s": 2.5}


def test_a_failing_side_stops_with_its_error():
  with pytest.raises(compare.SideFailed, match="exit code 3[\\s\\S]*boom"):
    compare.run_side(_side("import sys; sys.stderr.write('boom\\n'); "
                           "sys.exit(3)"), timeout=60)
  with pytest.raises(compare.SideFailed, match="exit code 0"):
    compare.run_side(_side("print('no result')"), timeout=60)


def test_a_side_past_its_time_is_killed_with_its_children(tmp_path):
  marker = tmp_path / "child.pid"
  code = ("import subprocess, sys, time; "
          "p = subprocess.Popen([sys.executable, '-c', "
          "'import time; time.sleep(60)']); "
          f"open({str(marker)!r}, 'w').write(str(p.pid)); time.sleep(60)")
  start = time.monotonic()
  with pytest.raises(compare.SideFailed, match="stopped after 2 s"):
    compare.run_side(_side(code), timeout=2)
  assert time.monotonic() - start < 30
  child = int(marker.read_text())
  deadline = time.monotonic() + 10
  while time.monotonic() < deadline and _alive(child):
    time.sleep(0.1)
  assert not _alive(child)


def _alive(pid):
  try:
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
      return stat.read().split(")")[-1].split()[0] != "Z"
  except FileNotFoundError:
    return False


def test_the_sides_run_from_the_checkout_with_their_pythons():
  args = compare.argparse.Namespace(
      peers_python="/p/peers", project_python="/p/project", threads=2,
      steps=80, warmup=20)
  assert compare.side_command("torchrec", args) == [
      "/p/peers", "-m", "bench.peers.torchrec_side", "--threads", "2",
      "--table-optimizer", "exact", "--steps", "80", "--warmup", "20"]
  assert compare.side_command("torchrec-rowwise", args, describe=True)[3:] == [
      "--threads", "2", "--table-optimizer", "rowwise", "--describe"]
  assert compare.side_command("tf", args, describe=True) == [
      "/p/project", "-m", "bench.peers.estimator_side", "--side", "tf",
      "--describe"]
  assert compare.side_command("ours-fed", args) == [
      "/p/project", "-m", "bench.peers.estimator_side", "--side", "ours",
      "--fed", "--steps", "80", "--warmup", "20"]
  assert compare.side_command("torchrec-fed", args) == [
      "/p/peers", "-m", "bench.peers.torchrec_side", "--threads", "2",
      "--fed", "--steps", "80", "--warmup", "20"]
  with pytest.raises(ValueError, match="ours-fed is a fed twin"):
    compare.side_command("ours-fed", args, describe=True)
  result = compare.run_side(_side(
      "import json, os; print('PEER_RESULT ' + json.dumps("
      "[os.getcwd(), os.environ['PYTHONPATH'].split(os.pathsep)[0], "
      "os.environ['TF_CPP_MIN_LOG_LEVEL']]))"), timeout=60)
  assert result == [str(compare.REPO), str(compare.REPO), "2"]


def test_the_workload_module_imports_only_numpy():
  code = ("import sys; import bench.peers.workload; "
          "print(sorted(m for m in ('tensorflow', 'torch', 'estimator_spec') "
          "if m in sys.modules))")
  out = compare.subprocess.run(
      [sys.executable, "-c", code], cwd=compare.REPO, capture_output=True,
      text=True, check=True, timeout=60).stdout
  assert json.loads(out.replace("'", '"')) == []


def test_a_run_says_how_busy_other_work_kept_the_machine(monkeypatch):
  # Machine busy 1.0 -> 4.0 CPU s, the side's own 0.5 -> 2.0: other work 1.5
  # CPU s over the run's wall time.
  busy, own = iter([1.0, 4.0]), iter([0.5, 2.0])
  clock = iter([10.0, 13.0])
  monkeypatch.setattr(compare, "machine_busy_s", lambda: next(busy))
  monkeypatch.setattr(compare, "children_cpu_s", lambda: next(own))
  monkeypatch.setattr(compare.time, "monotonic", lambda: next(clock))
  monkeypatch.setattr(compare, "run_side", lambda command, timeout: {})
  assert compare.run_measured(["side"], 60) == {"others_cpus": 0.5}
  # Where /proc/stat cannot be read, the run says nothing about it.
  monkeypatch.setattr(compare, "machine_busy_s", lambda: None)
  monkeypatch.setattr(compare, "children_cpu_s", lambda: 0.0)
  monkeypatch.setattr(compare.time, "monotonic", lambda: 0.0)
  assert compare.run_measured(["side"], 60) == {}


def test_the_machine_s_busy_time_and_the_children_s_are_read():
  busy = compare.machine_busy_s()
  assert busy is None or busy > 0
  assert compare.children_cpu_s() >= 0


class _Queue(list):
  put = list.append


def _dense_model_bytes():
  # Weights and biases of 416-256-128-1, each with an Adagrad accumulator,
  # and the int64 global step.
  return peer.mlp_parameters() * 4 * 2 + 8


@pytest.mark.parametrize("fed_gradients", [False, True])
@pytest.mark.parametrize("side", ["ours", "tf"])
def test_the_fed_twin_trains_the_same_dense_model_without_tables(
    side, fed_gradients, tmp_path):
  from bench import e2e_bench  # pylint: disable=g-import-not-at-top
  job = dict(e2e_bench.peer26_job(steps=3, warmup=1), side=side, fed=True,
             fed_gradients=fed_gradients, examples=2 * peer.BATCH)
  _, spec, _ = e2e_bench.build_parts(job)
  assert spec is None
  job["model_dir"] = str(tmp_path)
  result = e2e_bench.run_job(job, _Queue())
  assert result["steps"] == 3 and result["examples_per_s"] > 0
  assert result["state_mb"] * 2**20 == _dense_model_bytes()
  assert sorted(result["trainable"]) == sorted(
      f"{layer}/{part}" for layer in ("hidden_0", "hidden_1", "logit")
      for part in ("kernel", "bias"))
  assert result["base_rss_mb"] > 0


@pytest.mark.filterwarnings("ignore:`tf.layers.dense` is deprecated")
def test_the_fed_twin_with_gradients_differentiates_each_fed_piece():
  """peer26-fed-grad: 26 fed inputs [batch, 16], concatenated, and a train
  op that waits for the loss's gradient with respect to each of them."""
  from bench import e2e_bench
  job = dict(e2e_bench.peer26_job(steps=1, warmup=0), side="ours", fed=True,
             fed_gradients=True, examples=peer.BATCH)
  tf = e2e_bench.tf
  model_fn, _, input_fn = e2e_bench.build_parts(job)
  with tf.Graph().as_default():
    features, labels = tf.compat.v1.data.make_one_shot_iterator(
        input_fn({"batch_size": peer.BATCH})).get_next()
    assert sorted(features) == [f"activation_{name}"
                                for name in peer.feature_names()]
    tf.compat.v1.train.get_or_create_global_step()
    spec = model_fn(features, labels, "train", {})  # ModeKeys.TRAIN
    waited = set()
    pending = [spec.train_op]
    while pending:
      op = pending.pop()
      for dependency in op.control_inputs:
        if dependency not in waited:
          waited.add(dependency)
          pending.append(dependency)
    # The concatenation's gradient: one piece per fed input.
    pieces = [o for op in waited for o in op.outputs
              if o.name.startswith("gradients/concat_grad/")]
    assert len(pieces) == peer.FEATURES
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      values = session.run(pieces + [spec.train_op])[:-1]
    assert all(v.shape == (peer.BATCH, peer.DIM) and np.any(v != 0)
               for v in values)


def test_the_vocab_runs_share_two_tables_and_count_their_slots(tmp_path):
  from bench import e2e_bench  # pylint: disable=g-import-not-at-top
  job = dict(e2e_bench.peer26_job(steps=2, warmup=0), side="ours",
             rows=1000, tables=2, examples=peer.BATCH)
  _, spec, _ = e2e_bench.build_parts(job)
  columns = spec.feature_columns
  assert [c.categorical_column.name for c in columns] == peer.feature_names()
  assert {c.shared_embedding_collection_name for c in columns} == {
      "table_0", "table_1"}
  assert {c.categorical_column.num_buckets for c in columns} == {1000}
  job["model_dir"] = str(tmp_path)
  result = e2e_bench.run_job(job, _Queue())
  # Two tables of 1,000 x 16 and their Adagrad accumulators, beside the
  # dense model.
  tables = 2 * 1000 * peer.DIM * 4 * 2
  assert result["state_mb"] * 2**20 == tables + _dense_model_bytes()
  with pytest.raises(ValueError, match="do not split into 4 equal"):
    e2e_bench.build_parts(dict(job, tables=4))


def _first_batches(input_fn, batch_size, count):
  """The first `count` batches `input_fn` gives at `batch_size`, and the
  graph that read them."""
  from bench import e2e_bench
  tf = e2e_bench.tf
  with tf.Graph().as_default() as graph:
    dataset = input_fn({"batch_size": batch_size})
    batch = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
    with tf.compat.v1.Session() as session:
      return [session.run(batch) for _ in range(count)], graph


def _assert_same_batches(a, b, names):
  """Batches `a` and `b` ((ids, labels) each) hold the same labels and, for
  exactly the features `names`, the same SparseTensor indices and values."""
  assert len(a) == len(b)
  for (ids_a, labels_a), (ids_b, labels_b) in zip(a, b):
    np.testing.assert_array_equal(labels_a, labels_b)
    assert sorted(ids_a) == sorted(ids_b) == sorted(names)
    for name in names:
      np.testing.assert_array_equal(ids_a[name].indices, ids_b[name].indices)
      np.testing.assert_array_equal(ids_a[name].values, ids_b[name].values)


def test_streamed_input_gives_the_batches_constants_give_without_constants():
  """The `vocab` runs stream their batches (a generator) so that the graph
  holds no copy of the data; the step sees the same batches, cycled."""
  from bench import e2e_bench
  features, labels = peer.make_data(3 * 64, rows=1000)
  batches = {}
  for streamed in (False, True):
    # Four batches of three: the cycle starts again.
    batches[streamed], graph = _first_batches(
        e2e_bench._batched_input_fn(features, labels, streamed=streamed),
        64, 4)
    # The data's bytes in the graph's constants.
    constant_bytes = sum(
        op.get_attr("value").ByteSize() for op in graph.get_operations()
        if op.type == "Const")
    data_bytes = sum(v.nbytes for v in features.values())
    if streamed:
      assert constant_bytes < data_bytes / 10
    else:
      assert constant_bytes > data_bytes
  _assert_same_batches(batches[False], batches[True], peer.feature_names())
  np.testing.assert_array_equal(batches[True][3][1], batches[True][0][1])
  np.testing.assert_array_equal(batches[True][1][1], labels[64:128])
  _, jobs, _, _, _ = e2e_bench.plan(["--workloads", "vocab,peer26"])
  assert {label: job["input"] for label, job, _ in jobs} == {
      "peer26": "batched", "vocab1e5": "streamed", "vocab1e6": "streamed",
      "vocab1e7": "streamed"}


def test_startup_records_input_gives_the_batches_constants_give(tmp_path):
  """The startup runs read by default what a TPU program reads (tf.Examples
  from a TFRecord file, parsed by parse_example); its batches are the ones
  the pre-batched constants give, ids as SparseTensors of the present ids,
  cycled."""
  from bench import e2e_bench
  names = ["t000_f0", "t000_f1", "t001_f0"]
  features, labels = e2e_bench._identity_data(names, 50, 3 * 8, exponent=1.3,
                                              seed=0)
  # One example without an id for one feature, one with two ids.
  padded = np.full((3 * 8, 2), -1, np.int64)
  padded[:, :1] = features["t000_f1"]
  padded[5, 0] = -1
  padded[9, 1] = 7
  features["t000_f1"] = padded
  batches = {}
  for source in e2e_bench.STARTUP_INPUTS:
    job = dict(e2e_bench._startup_job(len(names), source),
               model_dir=str(tmp_path))
    batches[source], _ = _first_batches(
        e2e_bench._input_fn(job, features, labels), 8, 4)
  assert (tmp_path / "input.tfrecord").stat().st_size > 0
  _assert_same_batches(batches["records"], batches["constants"], names)
  for ids, _ in batches["records"]:
    for name in names:
      assert ids[name].dense_shape[0] == 8
  first, second = (batches["records"][i][0]["t000_f1"] for i in (0, 1))
  assert [5, 0] not in first.indices.tolist()
  assert second.values[second.indices.tolist().index([1, 1])] == 7
  np.testing.assert_array_equal(batches["records"][3][1], labels[:8])
  _, jobs, _, _, _ = e2e_bench.plan(
      ["--workloads", "startup", "--startup-features", "20",
       "--startup-input", "records,constants"])
  assert {label: job["input"] for label, job, _ in jobs} == {
      "start20": "records", "start20-constants": "batched"}
  with pytest.raises(SystemExit):
    e2e_bench.plan(["--startup-input", "parquet"])


def _peer_training(tmp_path, label):
  """Two steps of the peer26 estimator (26 features, DenseFeatures, tables
  of 1,000 rows) with the compiled kernels: every variable's value after
  them, and the graph."""
  from bench import e2e_bench
  tf = e2e_bench.tf
  job = dict(e2e_bench.peer26_job(steps=2, warmup=0), side="ours", rows=1000,
             examples=2 * peer.BATCH, tf_random_seed=3,
             model_dir=str(tmp_path / label))
  estimator, input_fn = e2e_bench.build_estimator(job)
  # The tables' initializers follow the graph's seed (tf_random_seed); the
  # dense layers' (Keras's, unseeded) follow Python's random module.
  tf.keras.utils.set_random_seed(3)
  seen = {}

  class Capture(tf.compat.v1.train.SessionRunHook):

    def begin(self):
      seen["graph"] = tf.compat.v1.get_default_graph()
      seen["variables"] = tf.compat.v1.global_variables()

    def end(self, session):
      seen["values"] = dict(zip(
          [v.op.name for v in seen["variables"]],
          session.run(seen["variables"])))

  estimator.train(input_fn, max_steps=2, hooks=[Capture()])
  return seen["values"], seen["graph"]


@pytest.mark.filterwarnings("ignore:`tf.layers.dense` is deprecated")
# Keras draws its unseeded initializers' seeds with random.randint(1, 1e9).
@pytest.mark.filterwarnings("ignore:non-integer arguments to randrange")
def test_the_peer_model_trains_alike_with_the_split_read_in_place(
    monkeypatch, tmp_path):
  """The estimator path (TPUEstimator, DenseFeatures of 26 columns): the
  compiled per-id sums read the concatenation's gradient in place, and two
  steps give every variable the same bits as when they read the split's
  pieces."""
  from estimator_spec.engine import backward
  from estimator_spec.engine import kernels
  monkeypatch.setenv(kernels.ENV, "1")
  in_place, graph = _peer_training(tmp_path, "in_place")
  monkeypatch.setattr(backward, "_split_window", lambda grad, dimension: None)
  pieces, split_graph = _peer_training(tmp_path, "pieces")
  assert sorted(in_place) == sorted(pieces)
  tables = [name for name in in_place if "embedding_weights" in name]
  assert len(tables) == 2 * peer.FEATURES  # tables and their accumulators
  for name in in_place:
    np.testing.assert_array_equal(in_place[name], pieces[name], err_msg=name)
  assert not np.array_equal(in_place[tables[0]], np.zeros_like(
      in_place[tables[0]]))

  def sums_inputs(graph):
    ops = [op for op in graph.get_operations()
           if op.type == "HostEmbeddingIdGradients"]
    assert len(ops) == peer.FEATURES
    return [(op.get_attr("offsets"), [t.shape.as_list()[-1]
                                      for t in op.inputs[:op.get_attr("F")]])
            for op in ops]

  wide = peer.FEATURES * peer.DIM
  read = sums_inputs(graph)
  assert all(len(offsets) == 1 and widths == [wide]
             for offsets, widths in read)
  assert sorted(offsets[0] for offsets, _ in read) == [
      peer.DIM * i for i in range(peer.FEATURES)]
  assert all(offsets == [] and widths == [peer.DIM]
             for offsets, widths in sums_inputs(split_graph))


def test_each_side_with_tables_is_costed_against_its_fed_twin():
  # Examples/s at batch 1024: 1024 / rate seconds per step.
  rate = {"ours": 1024 / 0.008, "ours-fed": 1024 / 0.005,
          "torchrec": 1024 / 0.02, "torchrec-rowwise": 1024 / 0.01,
          "torchrec-fed": 1024 / 0.0064, "tf": 1024 / 0.02}
  costs = {side: (full, twin, fed)
           for side, full, twin, fed in compare.embedding_costs(rate)}
  assert sorted(costs) == ["ours", "torchrec", "torchrec-rowwise"]
  assert costs["ours"] == (pytest.approx(8.0), "ours-fed",
                           pytest.approx(5.0))
  assert costs["torchrec-rowwise"] == (pytest.approx(10.0), "torchrec-fed",
                                       pytest.approx(6.4))
  assert costs["torchrec"][1:] == ("torchrec-fed", pytest.approx(6.4))
  # Without its twin, a side has no cost.
  del rate["torchrec-fed"]
  assert [c[0] for c in compare.embedding_costs(rate)] == ["ours"]


def test_a_fed_twin_must_train_the_workload_s_mlp(data):
  expected = peer.expected_work(data[0])
  compare.check_twin("ours-fed", {"mlp": expected["mlp"]}, expected)
  compare.check_twin("ours", {}, expected)  # not a twin: described instead
  with pytest.raises(compare.SideFailed,
                     match="torchrec-fed: its MLP has 7 parameters"):
    compare.check_twin("torchrec-fed", {"mlp": 7}, expected)
  with pytest.raises(compare.SideFailed, match="ours-fed: its MLP has None"):
    compare.check_twin("ours-fed", {}, expected)


def test_the_fed_activations_are_the_concatenated_embeddings_shape():
  activations = peer.fed_activations(2048, seed=1)
  assert activations.shape == (2048, peer.FEATURES * peer.DIM)
  assert activations.dtype == np.float32
  np.testing.assert_array_equal(activations, peer.fed_activations(2048, 1))
  assert not np.array_equal(activations, peer.fed_activations(2048, 2))
  assert 0.04 < float(activations.std()) < 0.06


def test_the_ours_fed_twin_reports_the_workload_s_mlp():
  from bench.peers import estimator_side
  result = estimator_side.timed("ours", steps=2, warmup=1, fed=True)
  assert result["mlp"] == peer.mlp_parameters()
  assert result["examples_per_s"] > 0


def test_the_summary_prints_the_embedding_cost_and_memory(capsys):
  from bench import e2e_bench  # pylint: disable=g-import-not-at-top
  run = lambda ms: {"median_step_ms": ms}
  e2e_bench.print_embedding_cost({
      "peer26": {"ours": [run(10.0), run(12.0), run(11.0)],
                 "tf": [run(24.0)]},
      "peer26-fed": {"ours": [run(4.0), run(4.4), run(4.2)],
                     "tf": [run(4.0)]},
      "peer26-fed-grad": {"ours": [run(5.0), run(5.2), run(5.1)],
                          "tf": [run(5.0)]}})
  memory = {"state_mb": 2000.0, "max_rss_mb": 3000.0, "base_rss_mb": 600.0}
  small = {"state_mb": 20.0, "max_rss_mb": 900.0, "base_rss_mb": 600.0}
  e2e_bench.print_memory(
      [("vocab1e5", {"tables": 2}, 1), ("vocab1e7", {"tables": 2}, 1),
       ("peer26", {}, 1)],
      {"vocab1e5": {"ours": [small], "tf": [small]},
       "vocab1e7": {"ours": [memory], "tf": [{"stopped": "peak RSS"}]}})
  out = capsys.readouterr().out
  assert "ours  11.00 ms -   4.20 ms =   6.80 ms =   162% of the fed" in out
  assert "tf    24.00 ms -   4.00 ms =  20.00 ms =   500%" in out
  # Of the 6.80 ms: 5.10 - 4.20 for the activations' dense work, 11 - 5.10
  # for lookup and update (shares of the fed step, 4.20 ms).
  assert ("ours dense work for the activations   0.90 ms (  21%); lookup "
          "and update   5.90 ms ( 140%)") in out
  assert ("vocab1e7  ours variables     2,000  peak     3,000   1.50x   "
          "1.20x above 600 MB") in out
  assert "vocab1e7  tf   stopped: peak RSS" in out
  # (3,000 - 900) / (2,000 - 20)
  assert ("ours vocab1e5 -> vocab1e7: peak RSS grew 2,100 MB for 1,980 MB "
          "more variables: 1.06x") in out
  assert "tf   vocab1e5" not in out
  assert "peer26 " not in out.split("Memory")[1]
