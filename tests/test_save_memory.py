"""A training checkpoint's save reads the tables without copying them
(docs/performance.md, 'Table size'): the rows the engine's kernels update
are never in copy-on-read mode, and those TF's sparse ops update (every
optimizer but Adagrad and SGD) are taken out of it before the save reads
them. Measured in a child process: the growth of its peak RSS during the
final save, against the bytes of the tables and slots; and the checkpoint
holds the values the variables had."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = """
import json, os, sys
import numpy as np
import tensorflow as tf
import estimator_spec as es
import tpu_embedding_columns as tec

ROWS, DIM = 500_000, 32
optimizer = sys.argv[1]
model_dir = sys.argv[2]
column = tec.embedding_column(
    tf.feature_column.categorical_column_with_identity("ids", ROWS), DIM,
    combiner="sum")
params = (es.AdamParameters(0.01) if optimizer == "adam" else
          es.AdagradParameters(0.05))
spec = es.EmbeddingConfigSpec(feature_columns=[column],
                              optimization_parameters=params)

def model_fn(features, labels, mode, params):
  x = tf.compat.v1.keras.layers.DenseFeatures([column])(features)
  logits = tf.compat.v1.layers.dense(x, 1)
  loss = tf.compat.v1.losses.sigmoid_cross_entropy(labels, logits)
  train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
      loss, global_step=tf.compat.v1.train.get_global_step())
  return es.TPUEstimatorSpec(mode=mode, loss=loss, train_op=train_op)

def input_fn(params):
  ids = np.random.RandomState(0).randint(0, ROWS, size=(64, 4))
  features = {"ids": tf.sparse.from_dense(tf.constant(ids + 1, tf.int64))}
  features["ids"] = tf.SparseTensor(features["ids"].indices,
                                    features["ids"].values - 1,
                                    features["ids"].dense_shape)
  labels = tf.ones([64, 1])
  return tf.data.Dataset.from_tensors((features, labels)).repeat()

def status(field):
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith(field + ":"):
        return int(line.split()[1]) * 1024

growth = {}
class Listener(tf.compat.v1.train.CheckpointSaverListener):
  def before_save(self, session, step):
    with open("/proc/self/clear_refs", "w") as f:
      f.write("5")  # the peak RSS starts again from the RSS now
    growth["start"] = status("VmRSS")
  def after_save(self, session, step):
    growth[int(step)] = status("VmHWM") - growth["start"]
    growth["values"] = [session.run(v).sum().item() for v in
                        tf.compat.v1.global_variables()
                        if "ids_embedding" in v.name]

config = es.RunConfig(model_dir=model_dir, save_checkpoints_steps=10**6,
                      save_summary_steps=None, log_step_count_steps=None)
estimator = es.TPUEstimator(model_fn=model_fn, config=config, use_tpu=False,
                            train_batch_size=64, embedding_config_spec=spec)
estimator.train(input_fn, max_steps=3, saving_listeners=[Listener()])
reader = tf.train.load_checkpoint(model_dir)
saved = [reader.get_tensor(name).sum().item()
         for name in sorted(reader.get_variable_to_shape_map())
         if "ids_embedding" in name]
state = (1 + len(params.slot_specs())) * ROWS * DIM * 4
print("RESULT", json.dumps({"growth": growth[3], "state": state,
                            "values": sorted(growth["values"]),
                            "saved": sorted(saved)}))
"""


@pytest.mark.parametrize("optimizer", ["adagrad", "adam"])
def test_the_final_save_does_not_copy_the_tables(tmp_path, optimizer):
  result = subprocess.run(
      [sys.executable, "-c", textwrap.dedent(CHILD), optimizer,
       str(tmp_path / "model")],
      cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT,
                         TF_CPP_MIN_LOG_LEVEL="2"),
      capture_output=True, text=True, timeout=600, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  line = [l for l in result.stdout.splitlines() if l.startswith("RESULT")][-1]
  found = json.loads(line[len("RESULT "):])
  # A copy of the tables and slots would add `state` bytes (64 MB for
  # Adagrad, 192 MB for Adam); the save's own buffers are a few MB.
  assert found["growth"] < 0.25 * found["state"], found
  assert len(found["saved"]) == len(found["values"]) > 1
  for saved, value in zip(found["saved"], found["values"]):
    assert saved == pytest.approx(value, rel=1e-6)
