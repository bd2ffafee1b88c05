"""bench/step_profile.py: the per-op profile of a training step, on a tiny
workload (2 features of 100 x 4, batch 64; 2 warm-up, 1 timed and 2 traced
steps): every executed op lands in one group, the groups' shares add up to
the step's summed op time, the engine's ops are grouped by the engine call
that built them (ours) or by their names (TF), and the text has the tables.
Nothing here depends on how fast the machine is.
"""
import pytest
import tensorflow as tf

from bench import e2e_bench
from bench import step_profile as sp


def _tiny_job(side):
  return {"workload": "wide26", "side": side, "features": 2, "vocab": 100,
          "dim": 4, "examples": 256, "batch": 64, "optimizer": "adagrad",
          "input": "batched"}


@pytest.fixture(scope="module")
def ours():
  return sp.profile(_tiny_job(e2e_bench.OURS), warmup=2, timed=1, traced=2)


@pytest.fixture(scope="module")
def theirs():
  return sp.profile(_tiny_job(e2e_bench.TF), warmup=2, timed=1, traced=2)


def _types_in(profile, group):
  return {t for (g, t) in profile.by_group_type if g == group}


@pytest.mark.parametrize("side", ["ours", "theirs"])
def test_the_shares_add_up_to_the_summed_op_time(side, request):
  p = request.getfixturevalue(side)
  assert p.steps == 2
  assert sum(p.group_shares().values()) == pytest.approx(1.0)
  summed = sum(us for _, us in p.by_type.values())
  assert sum(us for _, us in p.by_group.values()) == summed
  assert sum(us for _, us in p.by_group_type.values()) == summed
  assert sum(c for c, _ in p.by_type.values()) == p.ops_per_step * p.steps
  assert set(p.by_group) <= set(sp.GROUPS)
  assert p.matched["op"] > 0 and p.untraced_ms is not None
  # Every group's busy wall time fits in the steps' span, and its window
  # in the step.
  assert all(0 <= us <= p.span_us for us in p.group_busy_us.values())
  for group in p.by_group:
    window = p.window_ms(group)
    if window is not None:
      assert 0 <= window[0] <= window[1] <= p.span_us / p.steps / 1e3 + 1e-9


def test_ours_groups_the_engine_ops_by_the_call_that_built_them(ours):
  assert set(sp.GROUPS) <= set(ours.by_group)
  # The distinct ids: the engine's compiled lookup, or Unique where the
  # kernels are off.
  distinct = {"HostEmbeddingLookup", "Unique"} & _types_in(
      ours, sp.EMB_LOOKUP)
  assert distinct
  # The per-id sums: the engine's compiled kernel, or a segment sum where
  # the kernels are off.
  sums = {"HostEmbeddingIdGradients", "UnsortedSegmentSum"} & _types_in(
      ours, sp.EMB_BACKWARD)
  assert sums
  # The rows are written by the engine's compiled Adagrad update, or by
  # scatters where the kernels are off.
  writes = {"HostEmbeddingAdagradRows", "ResourceScatterUpdate"} & _types_in(
      ours, sp.EMB_APPLY)
  assert writes
  # The checks: one compiled op for the inputs and one for the per-id sums
  # (which say whether they are finite), or where the kernels are off,
  # Asserts with the conditions they compute (ids in range, IsFinite).
  checks = _types_in(ours, sp.EMB_CHECKS)
  if "HostEmbeddingIdGradients" in sums:
    finite = {"HostEmbeddingCheckIds", "HostEmbeddingCheckAll"}
  else:
    finite = {"Assert", "Less", "IsFinite"}
  assert finite <= checks
  assert "IteratorGetNext" in _types_in(ours, sp.INPUT)
  assert "ResourceApplyAdagrad" in _types_in(ours, sp.DENSE_OPTIMIZER)
  # Each op type of the engine's phases sits in one group only.
  for op_type in (*distinct, *sums, *writes, *finite, "IteratorGetNext"):
    assert len({g for (g, t) in ours.by_group_type if t == op_type}) == 1


def test_tf_groups_the_feature_columns_ops_by_name(theirs):
  assert {sp.EMB_LOOKUP, sp.EMB_BACKWARD, sp.EMB_APPLY, sp.INPUT,
          sp.DENSE_FORWARD, sp.DENSE_BACKWARD,
          sp.DENSE_OPTIMIZER} <= set(theirs.by_group)
  assert "ResourceSparseApplyAdagrad" in _types_in(theirs, sp.EMB_APPLY)
  assert "ResourceSparseApplyAdagrad" not in _types_in(theirs,
                                                       sp.DENSE_OPTIMIZER)
  assert "ResourceApplyAdagrad" in _types_in(theirs, sp.DENSE_OPTIMIZER)


def test_the_phases_put_the_updates_after_the_lookups(ours):
  """A table's update waits for the step's lookups (through the forward
  and backward passes): the apply phase starts after the lookup phase
  ends, and the text lists the phases in the order they start."""
  lookup, apply = ours.window_ms(sp.EMB_LOOKUP), ours.window_ms(sp.EMB_APPLY)
  assert lookup is not None and apply is not None
  assert apply[0] >= lookup[1]
  text = sp.format_profile(ours)
  lines = text.splitlines()
  first = next(i for i, l in enumerate(lines) if l.startswith("phases:"))
  end = lines.index("", first)
  listed = [l.split("  ")[0] for l in lines[first + 2:end]]
  assert listed.index(sp.EMB_LOOKUP) < listed.index(sp.EMB_APPLY)


def test_the_text_has_the_summary_the_groups_and_the_op_types(ours):
  text = sp.format_profile(ours, top=5)
  assert "wide26 / ours: 2 traced steps" in text
  assert "ops per step:" in text and "untraced" in text
  lines = text.splitlines()
  for group in sp.GROUPS:
    assert any(line.startswith(group + "  ") for line in lines), group
  assert "(all)" in text and "100.0%" in text
  assert "top 5 op types" in text


def _matmuls_per_step(profile, group):
  return sum(count for (g, t), (count, _) in profile.by_group_type.items()
             if g == group and "MatMul" in t) / profile.steps


def test_the_fed_twin_has_no_embedding_op_and_one_product_fewer():
  """`--fed` profiles the peer model with its activations as an input: no
  op of the embedding runs, and its backward pass has no product for the
  activations' gradient (the model with tables has one more)."""
  args, jobs = sp.parse(["--fed"])
  assert args.fed and [job["fed"] for job in jobs] == [True]
  small = dict(examples=2 * 1024)
  fed = sp.profile(dict(jobs[0], **small), warmup=1, timed=1, traced=2)
  full = sp.profile(dict(sp.parse([])[1][0], **small), warmup=1, timed=1,
                    traced=2)
  embedding = {sp.EMB_PARSE, sp.EMB_LOOKUP, sp.EMB_BACKWARD, sp.EMB_APPLY,
               sp.EMB_CHECKS}
  assert not embedding & set(fed.by_group)
  assert embedding <= set(full.by_group)
  assert _matmuls_per_step(full, sp.DENSE_BACKWARD) == (
      _matmuls_per_step(fed, sp.DENSE_BACKWARD) + 1)
  with pytest.raises(SystemExit):
    sp.parse(["--fed", "--rows", "1000"])


def test_a_node_grappler_rewrote_is_grouped_with_its_op():
  graph = tf.Graph()
  with graph.as_default():
    x = tf.constant([1.0, 2.0], name="x")
    tf.multiply(x, x, name="mul_3")
    with tf.name_scope("gradients/layer"):
      tf.identity(x, name="grad")
  index = sp.OpIndex(graph, e2e_bench.OURS)
  assert index.resolve("ArithmeticOptimizer/ReplaceMulWithSquare_mul_3",
                       "ReplaceMulWithSquare_mul_3 = Square(x)") == (
                           "ReplaceMulWithSquare_mul_3", "Square",
                           sp.DENSE_FORWARD, "rewritten")
  assert index.resolve("gradients/layer/grad/ConstantFolding/c",
                       "c = Const()")[2:] == (sp.DENSE_BACKWARD, "rewritten")
  assert index.resolve("unknown", "")[1:] == ("?", sp.DENSE_FORWARD, "name")


def test_ops_are_grouped_by_name_when_untagged():
  assert sp.group_of("IteratorGetNext", "IteratorGetNext",
                     e2e_bench.OURS) == sp.INPUT
  assert sp.group_of("gradients/hidden_0/MatMul_grad/MatMul", "MatMul",
                     e2e_bench.OURS) == sp.DENSE_BACKWARD
  assert sp.group_of(
      "gradients/dense_features/f00_embedding/f00_embedding_weights/x",
      "SparseSegmentSumGrad", e2e_bench.TF) == sp.EMB_BACKWARD
  assert sp.group_of("Adagrad/update_hidden_0/kernel/ResourceApplyAdagrad",
                     "ResourceApplyAdagrad", e2e_bench.TF) == (
                         sp.DENSE_OPTIMIZER)
  assert sp.group_of("anything", "Assert", e2e_bench.TF) == sp.EMB_CHECKS
  assert sp.group_of("mul_3", "Mul", e2e_bench.OURS,
                     tag=sp.EMB_APPLY) == sp.EMB_APPLY


def test_ops_that_only_feed_checks_are_checks():
  graph = tf.Graph()
  with graph.as_default():
    ids = tf.constant([1, 5], tf.int64, name="ids")
    in_range = tf.less(ids, 10, name="in_range")
    largest = tf.reduce_max(ids, name="largest")
    check = tf.raw_ops.Assert(condition=tf.reduce_all(in_range, name="all"),
                              data=[largest], name="check")
    with tf.control_dependencies([check]):
      checked = tf.identity(ids, name="checked")
    tf.gather(tf.zeros([10]), checked, name="lookup")
  names = sp.check_only_ops(graph.get_operations())
  assert {"in_range", "largest", "all", "check"} <= names
  assert not {"ids", "checked", "lookup"} & names
  index = sp.OpIndex(graph, e2e_bench.OURS)
  assert index.resolve("in_range", "")[2] == sp.EMB_CHECKS
  assert index.resolve("lookup", "")[2] == sp.DENSE_FORWARD
