"""The training graph of one task of a loopback cluster, built (never run),
and the tensors that cross between its tasks in one step.

TF's distributed runtime moves one tensor per edge that crosses devices in
a step (the graph partitioner gives each (source output, destination task)
one Send/Recv pair, which the destination fetches with one RecvTensor
request), and a control edge between tasks becomes one such transfer too.
`cross_task_edges` counts them per (source task, destination task): the
requests of one step, whatever the bytes. Used by
tests/test_cluster_units.py (the structure of a step) and
bench/cluster_bench.py (requests per step beside the bytes).
"""
import collections
import json
import os

import tensorflow as tf

import estimator_spec as es
import tpu_embedding_columns as tec

HIDDEN = 8


# Ops that make a resource handle: their consumers run where they live.
_RESOURCES = ("VarHandleOp", "FIFOQueueV2", "MutableHashTableV2", "MutexV2")


class _Built(Exception):
  """Raised in the first hook's `begin`: the graph is complete."""


def _task_of(device, own):
  """'job:task' of an op's `device` ('' or without a job: this task)."""
  spec = tf.DeviceSpec.from_string(device or "")
  if spec.job is None:
    return own
  return f"{spec.job}:{spec.task or 0}"


def _step_nodes(graph, fetches):
  """The nodes a training step runs: the ancestors of `fetches` (the
  train op and the loss Estimator fetches each step)."""
  nodes = {node.name: node for node in graph.as_graph_def().node}
  todo = [fetch.name.split(":")[0] for fetch in fetches]
  seen = set()
  while todo:
    name = todo.pop()
    if name in seen:
      continue
    seen.add(name)
    todo.extend(i.lstrip("^").split(":")[0] for i in nodes[name].input)
  return [nodes[name] for name in seen], nodes


def cross_task_edges(built, own):
  """{(source task, destination task): number of distinct tensors (and
  control edges) that cross from one to the other} in one training step
  of `built` ((graph, fetches), from `training_graph`), whose ops without
  a job run on task `own` ('chief:0', 'worker:0')."""
  crossing = set()
  step, nodes = _step_nodes(*built)
  device = {name: _task_of(node.device, own) for name, node in nodes.items()}
  for node in step:
    # TF's placer puts an op that uses a resource (a variable, a queue)
    # on the resource's device, whatever its device scope said.
    owners = [i.split(":")[0] for i in node.input if not i.startswith("^")]
    owners = [o for o in owners if nodes[o].op in _RESOURCES]
    if owners:
      device[node.name] = device[owners[0]]
  for node in step:
    dst = device[node.name]
    for name in node.input:
      control = name.startswith("^")
      source = name.lstrip("^")
      op = source.split(":")[0]
      src = device[op]
      if src != dst:
        crossing.add((src, dst, "^" + op if control else source))
  counts = collections.Counter((src, dst) for src, dst, _ in crossing)
  return dict(counts)


def training_graph(task_type, index, workers=1, ps=2, tables=3, vocab=50,
                   dim=4, batch=8, asynchronous=False):
  """(graph, [train op, loss]) `TPUEstimator.train` builds on task
  (`task_type`, `index`) of a cluster of a chief, `workers` workers and
  `ps` ps tasks (addresses never contacted): `tables` tables of `vocab` x
  `dim`, one feature each, an MLP trained by Adagrad."""
  cluster = {"chief": ["localhost:2220"],
             "worker": [f"localhost:{2221 + i}" for i in range(workers)],
             "ps": [f"localhost:{2230 + i}" for i in range(ps)]}
  old = os.environ.get("TF_CONFIG")
  os.environ["TF_CONFIG"] = json.dumps(
      {"cluster": cluster, "task": {"type": task_type, "index": index}})
  try:
    return _build(tables, vocab, dim, batch * (workers + 1), asynchronous)
  finally:
    if old is None:
      del os.environ["TF_CONFIG"]
    else:
      os.environ["TF_CONFIG"] = old


def _build(tables, vocab, dim, batch, asynchronous):
  keys = [f"f{i}" for i in range(tables)]
  columns = [tec.embedding_column(
      tf.feature_column.categorical_column_with_identity(k, vocab), dim,
      combiner="sum") for k in keys]

  def input_fn(params):
    size = params["batch_size"]
    ids = tf.zeros([size, 2], tf.int64)
    features = {k: tf.sparse.from_dense(ids + 1) for k in keys}
    return features, tf.zeros([size, 1])

  def model_fn(features, labels, mode, params):
    del params
    net = tf.compat.v1.feature_column.input_layer(features, columns)
    net = tf.compat.v1.layers.dense(net, HIDDEN, tf.nn.relu)
    logits = tf.compat.v1.layers.dense(net, 1)
    loss = tf.compat.v1.losses.sigmoid_cross_entropy(labels, logits)
    optimizer = tf.compat.v1.train.AdagradOptimizer(0.05)
    return es.TPUEstimatorSpec(mode, loss=loss, train_op=optimizer.minimize(
        loss, global_step=tf.compat.v1.train.get_global_step()))

  spec = es.EmbeddingConfigSpec(
      feature_columns=columns,
      optimization_parameters=es.AdagradParameters(0.05))
  import tempfile  # pylint: disable=import-outside-toplevel
  built = []

  class Estimator(es.TPUEstimator):

    def _call_model_fn(self, *args, **kwargs):
      spec = super()._call_model_fn(*args, **kwargs)
      built.append((tf.compat.v1.get_default_graph(),
                    [spec.train_op, spec.loss]))
      return spec

  class Stop(tf.estimator.SessionRunHook):

    def begin(self):
      raise _Built()

  with tempfile.TemporaryDirectory() as model_dir:
    estimator = Estimator(
        model_fn=model_fn,
        config=tf.compat.v1.estimator.tpu.RunConfig(model_dir=model_dir),
        use_tpu=False, train_batch_size=batch, embedding_config_spec=spec,
        cluster_training=es.ClusterTraining(asynchronous=asynchronous))
    try:
      estimator.train(input_fn, max_steps=1, hooks=[Stop()])
    except _Built:
      pass
  return built[0]


def main():
  for asynchronous in (False, True):
    for task_type in ("chief", "worker"):
      built = training_graph(task_type, 0, asynchronous=asynchronous)
      edges = cross_task_edges(built, f"{task_type}:0")
      print("async" if asynchronous else "sync", task_type,
            sorted(edges.items()))


if __name__ == "__main__":
  main()
