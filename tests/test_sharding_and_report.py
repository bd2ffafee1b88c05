"""Shard layouts (div/mod) against TF's partitioner and the NumPy twin; the
describe report and the command line."""
import subprocess
import sys

import hypothesis
from hypothesis import strategies as st
import numpy as np
import pytest
import tensorflow as tf

import estimator_spec
from estimator_spec.config import report
from estimator_spec.config import sharding
from examples import dlrm
from tests import numpy_twin


@hypothesis.given(
    vocab=st.integers(1, 300), shards=st.integers(1, 12),
    strategy=st.sampled_from(["div", "mod"]))
@hypothesis.settings(max_examples=150)
def test_layout_matches_numpy_twin_and_round_trips(vocab, shards, strategy):
  layout = sharding.ShardLayout(vocab, shards, strategy)
  twin = numpy_twin.shard_layout(vocab, min(vocab, shards), strategy)
  assert [list(layout.row_ids(i)) for i in range(layout.num_partitions)] == [
      list(x) for x in twin
  ]
  ids = np.arange(vocab)
  partition, local = layout.locate(ids)
  for i in range(layout.num_partitions):
    assert list(ids[partition == i][np.argsort(local[partition == i])]) == list(
        layout.row_ids(i))
  table = np.random.RandomState(0).rand(vocab, 3)
  np.testing.assert_array_equal(layout.join(layout.split(table)), table)


@hypothesis.given(
    vocab=st.integers(1, 300), shards=st.integers(1, 12),
    strategy=st.sampled_from(["div", "mod"]), data=st.data())
@hypothesis.settings(max_examples=100)
def test_a_range_of_a_partition_is_that_range_of_its_row_ids(
    vocab, shards, strategy, data):
  layout = sharding.ShardLayout(vocab, shards, strategy)
  partition = data.draw(st.integers(0, layout.num_partitions - 1))
  size = layout.sizes[partition]
  start = data.draw(st.integers(0, size))
  stop = data.draw(st.integers(start, size))
  twin = numpy_twin.shard_layout(vocab, layout.num_partitions, strategy)
  assert list(layout.row_ids(partition, start, stop)) == list(
      twin[partition][start:stop])


@pytest.mark.parametrize("vocab,shards", [(10, 3), (7, 7), (100, 8), (5, 1)])
def test_div_layout_equals_tf_partitioned_variable(vocab, shards):
  with tf.Graph().as_default():
    variable = tf.compat.v1.get_variable(
        "t", shape=(vocab, 2),
        partitioner=tf.compat.v1.fixed_size_partitioner(shards))
    tf_sizes = [int(v.shape[0]) for v in variable]
  assert list(sharding.ShardLayout(vocab, shards, "div").sizes) == tf_sizes


def test_mod_layout_places_row_r_in_shard_r_mod_n():
  layout = sharding.ShardLayout(10, 3, "mod")
  partition, local = layout.locate([0, 1, 2, 3, 9])
  assert list(partition) == [0, 1, 2, 0, 0]
  assert list(local) == [0, 0, 0, 1, 3]
  assert layout.sizes == (4, 3, 3)


def test_small_table_gets_one_partition_per_row():
  layout = sharding.ShardLayout(3, 8, "div")
  assert layout.num_partitions == 3 and layout.sizes == (1, 1, 1)


def test_join_refuses_wrong_partition_count():
  layout = sharding.ShardLayout(10, 3, "div")
  with pytest.raises(ValueError, match="expected 3 partitions"):
    layout.join([np.zeros((10, 1))])


def _small_config(mode=estimator_spec.TRAIN, strategy="div"):
  spec = dlrm.build_spec(scale=0.001, partition_strategy=strategy)
  return estimator_spec.EmbeddingConfig(
      spec, batch_size=64, num_hosts=4, num_cores=8, mode=mode)


def test_shard_bytes_count_table_and_slots():
  config = _small_config()
  sizes = report.shard_bytes(config)
  table = config.model.tables["tbl_user_id"]
  # Adagrad keeps one accumulator slot: 2 copies of every row.
  expected = [rows * table.dimension * 4 * 2
              for rows in config.shard_layouts()["tbl_user_id"].sizes]
  assert sizes["tbl_user_id"] == expected
  inference = report.shard_bytes(_small_config(mode=estimator_spec.EVAL))
  assert inference["tbl_user_id"] == [b // 2 for b in expected]


def test_describe_lists_every_table_feature_and_shard_total():
  config = _small_config(strategy="mod")
  text = report.describe(config, include_proto=True)
  for name in config.model.tables:
    assert name in text
  for name in config.model.features:
    assert name in text
  total = sum(sum(v) for v in report.shard_bytes(config).values())
  assert f"total:   {total / 2**20:,.1f} MiB" in text
  assert "sharding_strategy: MOD" in text
  assert "clicked_items" in text and "[8, 20]" in text


def test_cli_describe_runs_and_prints_proto():
  result = subprocess.run(
      [sys.executable, "-m", "estimator_spec", "describe",
       "examples.dlrm:build_spec", "--num-hosts", "2", "--cores-per-host",
       "2", "--batch-size", "8", "--proto"],
      capture_output=True, text=True, check=False, timeout=300)
  assert result.returncode == 0, result.stderr
  assert "num_tensor_cores: 4" in result.stdout
  assert "tbl_items" in result.stdout


def test_cli_refuses_bad_target():
  result = subprocess.run(
      [sys.executable, "-m", "estimator_spec", "describe", "examples.dlrm"],
      capture_output=True, text=True, check=False, timeout=300)
  assert result.returncode != 0
  assert "MODULE:FUNCTION" in result.stderr
