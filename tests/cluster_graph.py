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
import tempfile

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


def op_inputs(node):
  """The names of the ops `node` (a NodeDef) takes an output of or waits
  for."""
  return [i.lstrip("^").split(":")[0] for i in node.input]


def closure(start, edges):
  """Every name reachable from the names `start` through `edges`
  ({name: [names]}), `start` included."""
  seen, todo = set(), list(start)
  while todo:
    name = todo.pop()
    if name not in seen:
      seen.add(name)
      todo.extend(edges.get(name, ()))
  return seen


def _step_nodes(graph, fetches):
  """The nodes a training step runs: the ancestors of `fetches` (the
  train op and the loss Estimator fetches each step)."""
  nodes = {node.name: node for node in graph.as_graph_def().node}
  inputs = {name: op_inputs(node) for name, node in nodes.items()}
  seen = closure([fetch.name.split(":")[0] for fetch in fetches], inputs)
  return [nodes[name] for name in seen], nodes


def step_devices(built, own):
  """(the nodes a training step of `built` runs, {name: node} of its graph,
  {name: 'job:task' where the node runs}); ops without a job run on task
  `own` ('chief:0', 'worker:0'), ops using a resource where it lives."""
  step, nodes = _step_nodes(*built)
  device = {name: _task_of(node.device, own) for name, node in nodes.items()}
  for node in step:
    # TF's placer puts an op that uses a resource (a variable, a queue)
    # on the resource's device, whatever its device scope said.
    owners = [i.split(":")[0] for i in node.input if not i.startswith("^")]
    owners = [o for o in owners if nodes[o].op in _RESOURCES]
    if owners:
      device[node.name] = device[owners[0]]
  return step, nodes, device


def cross_task_edges(built, own):
  """{(source task, destination task): number of distinct tensors (and
  control edges) that cross from one to the other} in one training step
  of `built` ((graph, fetches), from `training_graph`), whose ops without
  a job run on task `own` ('chief:0', 'worker:0')."""
  crossing = set()
  step, _, device = step_devices(built, own)
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


def training_graph(task_type, index, side="sync", workers=1, ps=2, tables=3,
                   vocab=50, dim=4, batch=8):
  """(graph, [train op, loss]) that `train` builds on task (`task_type`,
  `index`) of a cluster of a chief, `workers` workers and `ps` ps tasks
  (addresses never contacted): `tables` tables of `vocab` x `dim`, one
  feature each, an MLP trained by Adagrad. `side`: ours, synchronous
  ('sync') or asynchronous ('async'), or TF 2.15's TPUEstimator on its CPU
  path ('tf')."""
  cluster = {"chief": ["localhost:2220"],
             "worker": [f"localhost:{2221 + i}" for i in range(workers)],
             "ps": [f"localhost:{2230 + i}" for i in range(ps)]}
  old = os.environ.get("TF_CONFIG")
  os.environ["TF_CONFIG"] = json.dumps(
      {"cluster": cluster, "task": {"type": task_type, "index": index}})
  try:
    return _build(side, tables, vocab, dim,
                  batch * (workers + 1) if side == "sync" else batch)
  finally:
    if old is None:
      del os.environ["TF_CONFIG"]
    else:
      os.environ["TF_CONFIG"] = old


def _model(side, tables, vocab, dim):
  """(input_fn, model_fn, the estimator's class and keyword arguments)."""
  keys = [f"f{i}" for i in range(tables)]
  categorical = [tf.feature_column.categorical_column_with_identity(k, vocab)
                 for k in keys]
  if side == "tf":
    columns = [tf.compat.v1.tpu.experimental.embedding_column(
        c, dim, combiner="sum") for c in categorical]
    spec = tf.compat.v1.estimator.tpu.experimental.EmbeddingConfigSpec(
        feature_columns=columns,
        optimization_parameters=(
            tf.compat.v1.tpu.experimental.AdagradParameters(0.05)))
    base, kwargs = tf.compat.v1.estimator.tpu.TPUEstimator, {}
    spec_class = tf.compat.v1.estimator.tpu.TPUEstimatorSpec
  else:
    columns = [tec.embedding_column(c, dim, combiner="sum")
               for c in categorical]
    spec = es.EmbeddingConfigSpec(
        feature_columns=columns,
        optimization_parameters=es.AdagradParameters(0.05))
    base, kwargs = es.TPUEstimator, {"cluster_training": es.ClusterTraining(
        asynchronous=side == "async")}
    spec_class = es.TPUEstimatorSpec

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
    train_op = optimizer.minimize(
        loss, global_step=tf.compat.v1.train.get_global_step())
    built.append((tf.compat.v1.get_default_graph(), [train_op, loss]))
    return spec_class(mode, loss=loss, train_op=train_op)

  built = []
  kwargs["embedding_config_spec"] = spec
  return input_fn, model_fn, base, kwargs, built


def _build(side, tables, vocab, dim, batch):
  input_fn, model_fn, base, kwargs, built = _model(side, tables, vocab, dim)

  class Estimator(base):
    """Ours: the train op of the step is the one the estimator makes of
    model_fn's (TF's CPU path runs model_fn's own)."""

    if side != "tf":

      def _call_model_fn(self, *args, **kwargs):
        spec = super()._call_model_fn(*args, **kwargs)
        built.append((tf.compat.v1.get_default_graph(),
                      [spec.train_op, spec.loss]))
        return spec

  class Stop(tf.compat.v1.train.SessionRunHook):

    def begin(self):
      raise _Built()

  with tempfile.TemporaryDirectory() as model_dir:
    estimator = Estimator(
        model_fn=model_fn,
        config=es.RunConfig(model_dir=model_dir),
        use_tpu=False, train_batch_size=batch, **kwargs)
    try:
      estimator.train(input_fn, max_steps=1, hooks=[Stop()])
    except _Built:
      pass
  return built[-1]


def requests_per_step(side, tasks, tables, ps=2):
  """(tensors a training task sends to the ps tasks per task step,
  tensors it receives from them, tensors between ps tasks): the chief's
  and, with workers, a worker's graph; for 'sync' summed over the chief
  and the workers of one global step."""
  totals = [0, 0, 0]
  roles = [("chief", 0)] + ([("worker", 0)] if tasks > 1 else [])
  for task_type, index in roles:
    built = training_graph(task_type, index, side, workers=tasks - 1, ps=ps,
                           tables=tables)
    edges = cross_task_edges(built, f"{task_type}:{index}")
    weight = 1 if task_type == "chief" or side != "sync" else tasks - 1
    if side != "sync" and task_type == "chief" and tasks > 1:
      continue  # every task step is alike: a worker's stands for them
    for (src, dst), count in edges.items():
      column = (2 if src.startswith("ps") and dst.startswith("ps") else
                1 if src.startswith("ps") else 0)
      totals[column] += count * weight
  return tuple(totals)


def main():
  for side in ("sync", "async", "tf"):
    for task_type in ("chief", "worker"):
      built = training_graph(task_type, 0, side)
      edges = cross_task_edges(built, f"{task_type}:0")
      print(side, task_type, sorted(edges.items()))


if __name__ == "__main__":
  main()
