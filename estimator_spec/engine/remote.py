"""Tables whose partitions live on other tasks (a cluster's ps tasks).

The engine's one local path asks this room for what differs there
(docs/cluster.md, 'Requests per step'): the step's requests (every table's
distinct ids routed once, one request per task holding partitions), the
lookup of a table from them, and the update targets: each partition
updated on its own task, reading its rows and slots at update time under
the partition's lock (or inside one of TF's sparse-apply kernels, which
lock the variables), so that concurrent updates of the same rows from
several tasks all count.
"""
import collections
from typing import Dict, List, Mapping, Tuple

import tensorflow as tf

from estimator_spec.config import model as model_lib
from estimator_spec.engine import backward
from estimator_spec.engine import executors
from estimator_spec.engine import inputs as inputs_lib
from estimator_spec.engine import kernels
from estimator_spec.engine import lookup as lookup_lib
from estimator_spec.engine import plan as plan_lib
from estimator_spec.engine import requests as requests_lib
from estimator_spec.engine import state as state_lib
from estimator_spec.engine import storage
from estimator_spec.tensor_types import Op, Tensor

# (the step's `requests.StepRequests`, {table: (distinct ids, index of each
# id)}).
Requests = Tuple[requests_lib.StepRequests, Dict[str, Tuple[Tensor, Tensor]]]


def step_requests(model: model_lib.EmbeddingModel,
                  state: state_lib.EngineState, step: plan_lib.StepPlan,
                  parsed: Mapping[str, inputs_lib.FeatureIds]) -> Requests:
  """The requests of a step's `parsed` features: every table's distinct ids
  routed once, one request per task holding partitions; by one compiled op
  per table where this task compiles its ops."""
  layouts = collections.OrderedDict(
      (name, model.shard_layout(name, state.num_shards))
      for name in model.tables)
  dimensions = {name: t.dimension for name, t in model.tables.items()}
  uniques: Dict[str, Tuple[Tensor, Tensor]] = collections.OrderedDict()
  if step.compiles_here:
    dtype = requests_lib.request_dtype(layouts)
    routed = collections.OrderedDict()
    for name, table in model.tables.items():
      unique, index, locals_, sizes = kernels.route_ids(
          [parsed[f].flat.ids for f in table.features], layouts[name], dtype)
      uniques[name] = (unique, index)
      routed[name] = (locals_, sizes)
    requests = requests_lib.StepRequests(
        layouts, dimensions, state.partition_device, routed=routed)
    return requests, uniques
  for name, table in model.tables.items():
    ids = [parsed[f].flat.ids for f in table.features]
    uniques[name] = tf.unique(tf.concat(ids, axis=0))
  requests = requests_lib.StepRequests(
      layouts, dimensions, state.partition_device,
      {name: unique for name, (unique, _) in uniques.items()})
  return requests, collections.OrderedDict(
      (name, requests.in_request_order(name, unique, index))
      for name, (unique, index) in uniques.items())


def requested_lookup(table: model_lib.Table,
                     items: List[inputs_lib.FeatureIds],
                     requests: Requests, state: state_lib.EngineState,
                     step: plan_lib.StepPlan) -> lookup_lib.TableLookup:
  """The `TableLookup` of `table` from the step's requests; once every
  table's variables exist, builds the requests' replies."""
  step_requests_, uniques = requests
  unique_ids, index = uniques[table.name]
  plans = lookup_lib.feature_plans(table, items)
  ids = [item.flat.ids for item in items]
  rows = step_requests_.rows(table.name)
  if step_requests_.replies is None and all(
      state.has_variables(name) for name in state.model.tables):
    step_requests_.finish(
        lambda name, p: state.table_rows(name).partitions[p])
  # This task combines the rows it received and sums their gradients by
  # the compiled kernels where they build.
  if step.compiles_here:
    return lookup_lib.TableLookup(table, unique_ids, rows, items, plans,
                                  index, None, compiled=True)
  return lookup_lib.TableLookup(table, unique_ids, rows, items, plans, index,
                                tf.concat(tf.shape_n(ids), axis=0))


def partition_target(state: state_lib.EngineState, name: str,
                     partition: int) -> executors.Target:
  """The update target of partition `partition` of table `name` on its own
  task: its rows and slots read at update time, under its lock."""
  variable = state.table_rows(name).partitions[partition]
  return executors.Target(
      executors.PartitionRows(variable),
      {k: executors.PartitionRows(v)
       for k, v in state.partition_slots(name, partition).items()},
      lock_name=f"{variable.op.name}/update_lock")


def update_partition(state: state_lib.EngineState,
                     plan: plan_lib.TablePlan, partition: int,
                     local_ids: Tensor, grads: Tensor, lr: Tensor) -> Op:
  """docs/numerics.md, 'The backward pass, table by table' and 'Each
  optimizer on a touched row' on one partition of `plan`'s table, on the
  task holding it (see the module docstring)."""
  assert plan.pipeline is not None and plan.executor is not None
  target = partition_target(state, plan.table, partition)
  with storage.device_scope(state.partition_device(plan.table, partition)):
    return executors.update(plan.executor, plan.pipeline, target, local_ids,
                            grads, lr)


def requested_update(state: state_lib.EngineState,
                     table_plan: "plan_lib.PlanReader",
                     step: backward.StepGradients) -> Op:
  """The update of a step whose partitions live on other tasks: one request
  per task (`requests.StepRequests.gradients`, after every check of the
  step), unpacked there into the update of each partition, after the
  step's lookup there read the rows."""
  requests = step.requests
  updates = []
  for device, reply in requests.replies.items():
    with tf.control_dependencies([step.gate]):
      floats = requests.gradients(device, step.grads, step.rates)
    with tf.control_dependencies(None), storage.device_scope(device):
      with tf.control_dependencies([reply]):
        for name, p, ids, grads, lr in requests.unpack(
            device, requests.ids(device), floats):
          updates.append(update_partition(
              state, table_plan.table_plan(name), p, ids, grads, lr))
  return tf.group(*updates, name="embedding_update")
