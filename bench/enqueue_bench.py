"""Infeed preprocessing: ours vs TF 2.15, side by side in one process.

For one host's batch of a DLRM-like spec (26 identity features, sparse ids,
a few weighted and sequence features), both sides build split_inputs + the
per-core enqueue ops in one graph; we time building the graph and running
the producer subgraph (every value fed to the enqueue ops) per batch on
CPU. TF's implementation is the reference (tensorflow_estimator's
split_inputs and tpu_embedding.TPUEmbedding.generate_enqueue_ops).

  .venv/bin/python -m bench.enqueue_bench [--cores 8] [--batch 1024]
"""
import argparse
import os
import time
import types

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
from tensorflow.python.tpu import tpu_embedding as te  # pylint: disable=g-import-not-at-top
from tensorflow_estimator.python.estimator.tpu import _tpu_estimator_embedding as tee  # pylint: disable=g-import-not-at-top

import estimator_spec as es  # pylint: disable=g-import-not-at-top
import tpu_embedding_columns as tec  # pylint: disable=g-import-not-at-top

fc = tf.feature_column


def categoricals():
  cats = []
  for i in range(26):
    name = f"c{i:02d}"
    if i % 9 == 4:
      cats.append(fc.weighted_categorical_column(
          fc.categorical_column_with_identity(name, 10000), name + "_w"))
    elif i % 9 == 7:
      cats.append(fc.sequence_categorical_column_with_identity(name, 10000))
    else:
      cats.append(fc.categorical_column_with_identity(name, 10000))
  return cats


def columns(module):
  out = []
  for cat in categoricals():
    seq = 5 if "Sequence" in type(cat).__name__ else 0
    out.append(module.embedding_column(cat, 16, max_sequence_length=seq))
  return out


def host_batch(batch, seed=0):
  rng = np.random.default_rng(seed)
  values = {}
  for cat in categoricals():
    key = getattr(cat, "key", None) or cat.categorical_column.key
    counts = rng.integers(0, 4, size=batch)
    rows = np.repeat(np.arange(batch), counts)
    cols = np.concatenate([np.arange(c) for c in counts])
    indices = np.stack([rows, cols], axis=1).astype(np.int64)
    ids = rng.integers(0, 10000, size=len(rows)).astype(np.int64)
    values[key] = tf.compat.v1.SparseTensorValue(indices, ids, [batch, 8])
    if "Weighted" in type(cat).__name__:
      values[key + "_w"] = tf.compat.v1.SparseTensorValue(
          indices, rng.uniform(size=len(rows)).astype(np.float32),
          [batch, 8])
  return values


def placeholders(values):
  feeds, tensors = {}, {}
  for key, value in values.items():
    sp = tf.compat.v1.sparse_placeholder(value.values.dtype, [None, 8])
    feeds[sp] = value
    tensors[key] = sp
  return feeds, tensors


def build(side, cores, batch):
  graph = tf.Graph()
  with graph.as_default():
    values = host_batch(batch)
    feeds, features = placeholders(values)
    start = time.perf_counter()
    if side == "ours":
      spec = es.EmbeddingConfigSpec(
          feature_columns=columns(tec),
          optimization_parameters=es.AdagradParameters(0.1))
      config = es.EmbeddingConfig(spec, batch_size=batch, num_cores=cores)
      _, _, per_core = config.split_inputs(features)
      ops = config.generate_enqueue_ops(per_core)
    else:
      t2c, f2c = tee.get_configs_from_feature_columns(
          columns(tf.compat.v1.tpu.experimental))
      emb = te.TPUEmbedding(t2c, f2c, batch, te.TRAINING, master=None,
                            optimization_parameters=te.AdagradParameters(0.1),
                            device_config=te.DeviceConfig(1, cores, "worker"))
      ctx = types.SimpleNamespace(
          embedding_config=types.SimpleNamespace(tpu_embedding=emb),
          batch_size_for_input_fn=batch, tensor_core_embedding_columns=None)
      _, _, per_core = tee.split_inputs(ctx, features, None, cores)
      ops = emb.generate_enqueue_ops(per_core)
    build_seconds = time.perf_counter() - start
    fetches = [list(op.inputs) for op in ops]
  return graph, feeds, fetches, build_seconds


def run(side, cores, batch, steps):
  graph, feeds, fetches, build_seconds = build(side, cores, batch)
  config = tf.compat.v1.ConfigProto()
  config.graph_options.place_pruned_graph = True
  with tf.compat.v1.Session(graph=graph, config=config) as sess:
    for _ in range(5):
      sess.run(fetches, feeds)
    start = time.perf_counter()
    for _ in range(steps):
      sess.run(fetches, feeds)
    per_step = (time.perf_counter() - start) / steps
  return build_seconds, per_step


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--cores", type=int, default=8)
  parser.add_argument("--batch", type=int, default=1024)
  parser.add_argument("--steps", type=int, default=50)
  parser.add_argument("--rounds", type=int, default=2)
  args = parser.parse_args()
  results = {"ours": [], "tf": []}
  for _ in range(args.rounds):
    for side in ("tf", "ours"):
      results[side].append(run(side, args.cores, args.batch, args.steps))
  best = {side: (min(r[0] for r in rs), min(r[1] for r in rs))
          for side, rs in results.items()}
  print(f"host batch {args.batch}, {args.cores} cores, 26 features "
        f"(best of {args.rounds} rounds, {args.steps} batches each)")
  print(f"{'':10s}{'graph build s':>15s}{'ms / batch':>12s}")
  for side in ("tf", "ours"):
    print(f"{side:10s}{best[side][0]:15.3f}{best[side][1] * 1e3:12.2f}")
  print(f"ratio TF/ours: build {best['tf'][0] / best['ours'][0]:.2f}x, "
        f"per batch {best['tf'][1] / best['ours'][1]:.2f}x")


if __name__ == "__main__":
  main()
