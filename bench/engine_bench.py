"""Embedding-only training step: host engine vs the TensorFlow reference.

Workload (issue "Host embedding engine"): 26 features, each with its own
table of 1,000,000 x 32, global batch 4096, 1-20 ids per example and
feature drawn from a Zipf distribution, Adagrad. Both sides train the SAME
table variables (each side keeps its own Adagrad accumulators):

* engine:    `HostEmbeddingEngine.lookup` + `apply_gradients`;
* reference: per feature `tf.nn.safe_embedding_lookup_sparse` +
             `tf.compat.v1.train.AdagradOptimizer.minimize`.

The loss is sum_f <activation_f, c_f> with fixed random c_f, so both sides
do the same lookups and updates. Steps alternate between the two sides in
one process; the script prints examples/s of each, their ratio, and the
bytes/s the engine moves (rows read and written) against a memory-copy
bandwidth measured in the same run.

Usage: .venv/bin/python -m bench.engine_bench [--vocab N] [--steps N] ...
"""
import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # pylint: disable=g-import-not-at-top

from estimator_spec import quiet  # pylint: disable=g-import-not-at-top

quiet.silence_deprecation_notices()

import tensorflow as tf  # pylint: disable=g-import-not-at-top

import estimator_spec  # pylint: disable=g-import-not-at-top
from estimator_spec.engine import HostEmbeddingEngine  # pylint: disable=g-import-not-at-top


def make_batches(num_batches, num_features, batch, vocab, max_ids, seed):
  """Zipf-distributed ragged ids: {feature: (values, row_lengths)} per batch."""
  rng = np.random.RandomState(seed)
  batches = []
  for _ in range(num_batches):
    features = {}
    for f in range(num_features):
      lengths = rng.randint(1, max_ids + 1, size=batch)
      ids = (rng.zipf(1.2, size=int(lengths.sum())) - 1) % vocab
      # Scatter popular ids over the table, as hashing would.
      ids = (ids * 2654435761) % vocab
      features[f"f{f}"] = (ids.astype(np.int64), lengths.astype(np.int64))
    batches.append(features)
  return batches


def dataset(batches, batch):
  """A repeating tf.data pipeline yielding {feature: SparseTensor}."""
  names = sorted(batches[0])

  def gen():
    while True:
      for b in batches:
        yield {n: b[n] for n in names}

  signature = {
      n: (tf.TensorSpec([None], tf.int64), tf.TensorSpec([batch], tf.int64))
      for n in names
  }

  def to_sparse(features):
    return {
        n: tf.RaggedTensor.from_row_lengths(v, l).to_sparse()
        for n, (v, l) in features.items()
    }

  return tf.data.Dataset.from_generator(
      gen, output_signature=signature).map(to_sparse).prefetch(4)


def memcpy_bandwidth(num_bytes=1 << 30, repeats=3):
  """Bytes/s of a large numpy copy (read + write counted)."""
  src = np.ones(num_bytes // 4, np.float32)
  dst = np.empty_like(src)
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    np.copyto(dst, src)
    best = min(best, time.perf_counter() - start)
  return 2 * num_bytes / best


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--features", type=int, default=26)
  parser.add_argument("--vocab", type=int, default=1_000_000)
  parser.add_argument("--dim", type=int, default=32)
  parser.add_argument("--batch", type=int, default=4096)
  parser.add_argument("--max-ids", type=int, default=20)
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--warmup", type=int, default=3)
  parser.add_argument("--rounds", type=int, default=2,
                      help="alternating rounds of --steps per side")
  args = parser.parse_args()

  names = [f"f{i}" for i in range(args.features)]
  spec = estimator_spec.EmbeddingConfigSpec(
      feature_to_config_dict={
          n: estimator_spec.FeatureConfig(f"t{n}") for n in names
      },
      table_to_config_dict={
          f"t{n}": estimator_spec.TableConfig(
              args.vocab, args.dim, combiner="mean",
              initializer=tf.compat.v1.random_uniform_initializer(-0.05, 0.05))
          for n in names
      },
      optimization_parameters=estimator_spec.AdagradParameters(0.05))
  config = estimator_spec.EmbeddingConfig(spec, batch_size=args.batch)
  batches = make_batches(8, args.features, args.batch, args.vocab,
                         args.max_ids, seed=0)
  unique_per_step = np.mean([
      sum(len(np.unique(b[n][0])) for n in names) for b in batches
  ])
  rng = np.random.RandomState(1)
  weights = {n: rng.randn(args.dim).astype(np.float32) for n in names}

  graph = tf.Graph()
  with graph.as_default():
    engine = HostEmbeddingEngine(config)
    engine.create_variables()
    step = tf.compat.v1.train.get_or_create_global_step()

    ours_features = tf.compat.v1.data.make_one_shot_iterator(
        dataset(batches, args.batch)).get_next()
    result = engine.lookup(ours_features)
    grads = {n: tf.broadcast_to(weights[n], [args.batch, args.dim])
             for n in names}
    ours_op = engine.apply_gradients(result, grads, step)

    ref_features = tf.compat.v1.data.make_one_shot_iterator(
        dataset(batches, args.batch)).get_next()
    loss = 0.0
    variables = []
    for n in names:
      table = engine.table_rows(f"t{n}").partitions
      variables.extend(table)
      activation = tf.nn.safe_embedding_lookup_sparse(
          table, ref_features[n], None, combiner="mean")
      loss += tf.reduce_sum(activation * weights[n])
    ref_op = tf.compat.v1.train.AdagradOptimizer(
        0.05, initial_accumulator_value=0.1).minimize(loss, var_list=variables)
    init = [tf.compat.v1.global_variables_initializer(),
            tf.compat.v1.local_variables_initializer()]

  session_config = tf.compat.v1.ConfigProto(
      intra_op_parallelism_threads=0, inter_op_parallelism_threads=0)
  with tf.compat.v1.Session(graph=graph, config=session_config) as sess:
    start = time.perf_counter()
    sess.run(init)
    print(f"initialised {args.features} tables of {args.vocab:,} x {args.dim} "
          f"in {time.perf_counter() - start:.1f}s")
    for op in (ours_op, ref_op):
      for _ in range(args.warmup):
        sess.run(op)
    times = {"engine": [], "reference": []}
    for _ in range(args.rounds):
      for label, op in (("engine", ours_op), ("reference", ref_op)):
        start = time.perf_counter()
        for _ in range(args.steps):
          sess.run(op)
        times[label].append((time.perf_counter() - start) / args.steps)

  bandwidth = memcpy_bandwidth()
  per_step = {k: float(np.median(v)) for k, v in times.items()}
  rate = {k: args.batch / v for k, v in per_step.items()}
  # Rows touched per step: each distinct id reads and writes its row and its
  # accumulator (4 row transfers of dim float32).
  moved = unique_per_step * args.dim * 4 * 4
  print(f"features={args.features} vocab={args.vocab:,} dim={args.dim} "
        f"batch={args.batch} ids/example=1..{args.max_ids} "
        f"distinct ids/step={unique_per_step:,.0f}")
  print(f"engine:    {rate['engine']:10,.0f} examples/s "
        f"({per_step['engine'] * 1e3:.1f} ms/step)")
  print(f"reference: {rate['reference']:10,.0f} examples/s "
        f"({per_step['reference'] * 1e3:.1f} ms/step)")
  print(f"ratio engine/reference: {rate['engine'] / rate['reference']:.2f}x")
  print(f"engine row traffic: {moved / per_step['engine'] / 1e9:.2f} GB/s; "
        f"memory copy: {bandwidth / 1e9:.2f} GB/s "
        f"({moved / per_step['engine'] / bandwidth:.1%} of copy bandwidth)")


if __name__ == "__main__":
  main()
