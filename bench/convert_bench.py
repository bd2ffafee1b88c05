"""Time and peak memory of `convert`, `export-mid-level` and a re-laying
restore on a large table.

    .venv/bin/python -m bench.convert_bench --rows 4000000 --dim 32

Writes a checkpoint of one [rows, dim] float32 table and its Adagrad slot,
stored `mod` over 4 partitions (as a 4-host TPU run writes it, the strategy
recorded), then runs, each in a fresh child process: nothing but the
imports (baseline), the conversion to `div` over 3 shards, the export for
TF2's mid-level API, and `LayoutAwareSaver.restore` into the engine's
variables of a `div` run over 3 shards. Prints wall time and peak RSS above
the baseline, in units of one table; the restore's includes its own
variables (the table and the slot: 2 tables).
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile

CHILD = r"""
import os, sys, resource, time, types
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import numpy as np, tensorflow as tf
import estimator_spec as es, tpu_embedding_columns as tec
from estimator_spec import interop
from estimator_spec.checkpoints import convert, restore
from estimator_spec.engine import storage
rows, dim, what, source, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
spec = es.EmbeddingConfigSpec(
    feature_columns=[tec.embedding_column(
        tf.feature_column.categorical_column_with_identity("big", rows), dim)],
    optimization_parameters=es.AdagradParameters(0.1), partition_strategy="mod")
start = time.perf_counter()
if what == "write":
  name = "dense_features/big_embedding/embedding_weights"
  layout = es.ShardLayout(rows, 4, "mod")
  for tensor, seed in ((name, 0), (name + "/Adagrad", 1)):
    full = np.random.RandomState(seed).rand(rows, dim).astype(np.float32)
    stored = np.concatenate(layout.split(full)); del full
    specs = [f"{rows} {dim} {o},{s}:-" for o, s in zip(layout.offsets, layout.sizes)]
    parts = [tf.constant(stored[o:o + s]) for o, s in zip(layout.offsets, layout.sizes)]
    del stored
    tf.raw_ops.SaveV2(prefix=os.path.join(source, f"piece{seed}"), tensor_names=[tensor] * 4,
                      shape_and_slices=specs, tensors=parts)
    del parts
  tf.raw_ops.SaveV2(prefix=os.path.join(source, "piece2"), tensor_names=[restore.LAYOUT_TENSOR],
                    shape_and_slices=[""], tensors=[tf.constant("mod")])
  tf.raw_ops.MergeV2Checkpoints(
      checkpoint_prefixes=[os.path.join(source, f"piece{i}") for i in range(3)],
      destination_prefix=os.path.join(source, "model.ckpt-1"), delete_old_dirs=False)
  tf.compat.v1.train.update_checkpoint_state(source, "model.ckpt-1")
elif what == "convert":
  convert.convert_checkpoint(spec, source, out, to_strategy="div", to_shards=3)
elif what == "export":
  interop.export_mid_level_checkpoint(source, spec, out)
elif what == "restore":
  name = "dense_features/big_embedding/embedding_weights"
  with tf.Graph().as_default():
    zeros = tf.compat.v1.zeros_initializer()
    table = storage.create_table(name, rows, dim, zeros, 3, "div")
    slot = storage.create_table(name + "/Adagrad", rows, dim, zeros, 3, "div")
    engine = types.SimpleNamespace(
        tables={"t": table}, slots={"t": {"accumulator": slot}},
        model=types.SimpleNamespace(partition_strategy="div"))
    saver = restore.LayoutAwareSaver(engine, allow_missing_slots=False,
                                     record_layout=True)
    with tf.compat.v1.Session() as sess:
      start = time.perf_counter()
      saver.restore(sess, tf.train.latest_checkpoint(source))
print(time.perf_counter() - start)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def run(args, what, source, out):
  result = subprocess.run(
      [sys.executable, "-c", CHILD, str(args.rows), str(args.dim), what,
       source, out], capture_output=True, text=True, check=True,
      cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  seconds, rss_kb = result.stdout.split()[-2:]
  return float(seconds), int(rss_kb) / 1024


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--rows", type=int, default=4_000_000)
  parser.add_argument("--dim", type=int, default=32)
  args = parser.parse_args()
  work = tempfile.mkdtemp(prefix="convert_bench_")
  try:
    source = os.path.join(work, "source")
    os.makedirs(source)
    run(args, "write", source, "")
    table_mb = args.rows * args.dim * 4 / 2**20
    _, baseline = run(args, "none", source, "")
    print(f"table {args.rows:,} x {args.dim} float32 = {table_mb:,.0f} MB "
          f"(+ Adagrad slot of the same size); baseline RSS after imports "
          f"{baseline:,.0f} MB")
    for what in ("convert", "export", "restore"):
      out = os.path.join(work, what, "ckpt")
      seconds, rss = run(args, what, source, out)
      extra = rss - baseline
      print(f"{what:8s}: {seconds:6.1f} s, {2 * args.rows / seconds / 1e6:5.2f}"
            f" M rows/s, peak RSS {rss:,.0f} MB = baseline + {extra:,.0f} MB "
            f"= baseline + {extra / table_mb:.2f} tables")
  finally:
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
  main()
