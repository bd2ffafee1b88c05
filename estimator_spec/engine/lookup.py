"""The forward pass: each table gathered once per step for all its features.

`LookupStep` parses nothing itself: it takes a step's parsed and checked
features (`inputs.parse_features`) and looks each table up on demand, by
the lookup its `TablePlan` records (`local_lookup` here; a table whose
partitions live on other tasks by the step's requests, `remote.py`).
A `TableLookup` keeps what the backward pass of the table needs
(docs/numerics.md, 'The forward pass').
"""
import collections
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import tensorflow as tf

from tpu_embedding_columns import columns
from tpu_embedding_columns import lookup as column_lookup

from estimator_spec.config import model as model_lib
from estimator_spec.engine import inputs as inputs_lib
from estimator_spec.engine import kernels
from estimator_spec.engine import plan as plan_lib
from estimator_spec.engine import storage


class TableLookup:
  """What the backward pass of one table needs from its forward pass.

  `rows` is what the forward pass read from the table: the rows of
  `unique_ids` (empty [0, D] where the compiled lookup reads the table
  itself and the update does not need them). Writes of the step wait for
  it. `index` maps every id, in feature order, to its place in
  `unique_ids`; `sizes` [features] counts each feature's ids (None where the
  compiled kernels combine and differentiate: `compiled`).

  `read`, for a table in one partition with the compiled kernels: (the
  partition's resource handle, whether the update needs `rows`). Then one
  op finds the distinct ids and computes the activations when
  `activations()` runs, which sets `unique_ids`, `index`, `rows` and
  `num_ids` (the number of distinct ids)."""

  def __init__(self, table: model_lib.Table, unique_ids: Any, rows: Any,
               features: List[inputs_lib.FeatureIds], plans: Dict[str, Any],
               index: Any, sizes: Any, compiled: bool = False,
               read: Optional[Tuple[Any, bool]] = None) -> None:
    self.table = table
    self.unique_ids = unique_ids
    self.rows = rows
    self.compiled = compiled
    self.features = features      # [FeatureIds]
    self.plans = plans            # {feature: Plan}
    self.index = index
    self.sizes = sizes
    self._read = read
    # The number of distinct ids, where the compiled lookup counts them
    # (else None: the gradient sums take it from `unique_ids`).
    self.num_ids: Any = None
    # The combiners' scales per feature from the compiled combine (an empty
    # tensor for 'sum'), which its gradient sums reuse.
    self.scales: Any = None

  def activations(self) -> Dict[str, Any]:
    """{feature: activation} of every feature of the table, in order."""
    plans = [self.plans[item.name] for item in self.features]
    if not self.compiled:
      parts = ([self.index] if len(plans) == 1 else
               tf.split(self.index, self.sizes, num=len(plans)))
      return {
          item.name: plan.combine(tf.gather(self.rows, part))
          for item, plan, part in zip(self.features, plans, parts)
      }
    checks = [check for plan in plans for check in plan.checks]
    combine = dict(
        segments=[plan.segment for plan in plans],
        weights=kernels.or_empty([plan.weights for plan in plans]),
        num_segments=[plan.num_segments for plan in plans],
        combiners=[plan.combiner for plan in plans])
    with tf.control_dependencies(checks):
      if self._read is None:
        outputs, self.scales = kernels.combine(
            self.rows, self.index, **combine)
      else:
        handle, keep_rows = self._read
        (self.unique_ids, self.index, self.rows, self.num_ids, outputs,
         self.scales) = kernels.lookup(
             handle, [item.flat.ids for item in self.features],
             keep_rows=keep_rows, **combine)
        self.rows.set_shape([None, self.table.dimension])
    result = {}
    for item, plan, out in zip(self.features, plans, outputs):
      if len(plan.output_shape) > 1:
        out = tf.reshape(out, [-1] + plan.output_shape)
      out.set_shape([None] + plan.output_shape)
      result[item.name] = out
    return result


class LookupResult:
  """Activations of one step, and the state its backward pass needs
  (`requests`: the step's `requests.StepRequests` where the partitions live
  on other tasks in training, else None)."""

  def __init__(self, activations: Dict[str, Any],
               sequence_lengths: Dict[str, Any],
               tables: Dict[str, TableLookup], checks: List[Any],
               requests: Any = None) -> None:
    self.activations = activations
    self.sequence_lengths = sequence_lengths
    self.tables = tables
    self.checks = checks
    self.requests = requests

  @property
  def length_features(self) -> Dict[str, Any]:
    """{'<feature>_seq_length_': lengths} for sequence features (the keys
    TF's sequence columns read)."""
    return {columns.sequence_length_key(name): value
            for name, value in self.sequence_lengths.items()}


class LookupStep:
  """The lookups of one step, table by table on demand (see
  `HostEmbeddingEngine.begin_lookup`)."""

  def __init__(self, model: model_lib.EmbeddingModel,
               lookup_table: "LookupFn", step_requests: "RequestsFn",
               parsed: Dict[str, inputs_lib.FeatureIds], checks: List[Any],
               batch_size: Any) -> None:
    self._model = model
    self._lookup_table = lookup_table
    self._make_requests = step_requests
    # int64 scalar tensor; None when features have batch sizes of their own
    # (`HostEmbeddingEngine(same_batch_size=False)`).
    self.batch_size = batch_size
    # The static batch dimension of the activations: the inputs' when they
    # have one; a caller that knows better (a TPU step's fixed batch) sets it
    # before the first lookup. Unused when features have batch sizes of
    # their own: each activation has its feature's.
    self.static_batch_size = next(
        (item.flat.static_batch_size for item in parsed.values()
         if item.flat.static_batch_size is not None), None)
    self._parsed = parsed
    self._checks = checks
    # Every write of the step waits for every input check of every table:
    # the validated ids and weights carry their range/position checks.
    self._validated = [item.flat.ids for item in parsed.values()]
    self._validated += [item.flat.weights for item in parsed.values()
                        if item.flat.weights is not None]
    self.activations: Dict[str, Any] = collections.OrderedDict()
    self.sequence_lengths: Dict[str, Any] = collections.OrderedDict()
    self.tables: Dict[str, TableLookup] = collections.OrderedDict()
    self._gate: Any = None
    # (StepRequests, {table: (unique ids, index)})
    self._requests: Any = None

  @property
  def feature_ids(self) -> List[inputs_lib.FeatureIds]:
    """[inputs.FeatureIds] of the step's features (validated ids)."""
    return list(self._parsed.values())

  def add_checks(self, checks: Iterable[Any]) -> None:
    """More check ops that gate the lookups and every write of the step;
    only before the first table is looked up."""
    if self.tables:
      raise RuntimeError(
          "LookupStep.add_checks: tables were already looked up.")
    self._checks = self._checks + list(checks)
    self._gate = None

  def table(self, name: str) -> TableLookup:
    """Gathers table `name` for all its features (once); returns its
    `TableLookup`."""
    if name not in self.tables:
      table = self._model.tables[name]
      if self._gate is None:
        self._gate = column_lookup.gate(self._checks)
      with tf.control_dependencies([self._gate] if self._gate else []):
        lookup = self._lookup_table(
            table, [self._parsed[f] for f in table.features],
            self._step_requests())
        activations = lookup.activations()
        for item in lookup.features:
          activation = activations[item.name]
          static_batch = (self.static_batch_size if self.batch_size is not None
                          else item.flat.static_batch_size)
          activation.set_shape([static_batch] +
                               activation.shape[1:].as_list())
          self.activations[item.name] = activation
          if item.lengths is not None:
            item.lengths.set_shape([static_batch])
            self.sequence_lengths[item.name] = item.lengths
      self.tables[name] = lookup
    return self.tables[name]

  def _step_requests(self) -> Any:
    """(the step's `requests.StepRequests`, {table: (distinct ids, index of
    each id)}), made on the first lookup, where the engine sends one
    request per task holding partitions; else None."""
    if self._requests is None and self._make_requests is not None:
      self._requests = self._make_requests(self._parsed)
    return self._requests

  def activation(self, feature: str) -> Any:
    """The activation of `feature` ([B, D], or [B, L, D] for sequences)."""
    self.table(self._model.features[feature].table)
    return self.activations[feature]

  def sequence_length(self, feature: str) -> Any:
    """min(length, L) per example of sequence feature `feature`."""
    self.table(self._model.features[feature].table)
    return self.sequence_lengths[feature]

  def result(self) -> LookupResult:
    """Looks up the remaining tables; returns the step's `LookupResult`."""
    for name in self._model.tables:
      self.table(name)
    tables = collections.OrderedDict(
        (name, self.tables[name]) for name in self._model.tables)
    plan_checks = [
        check for lookup in tables.values() for plan in lookup.plans.values()
        for check in plan.checks
    ]
    return LookupResult(self.activations, self.sequence_lengths, tables,
                        self._checks + self._validated + plan_checks,
                        self._requests[0] if self._requests else None)


# (table, its features' ids, the step's requests or None) -> TableLookup.
LookupFn = Callable[[model_lib.Table, List[inputs_lib.FeatureIds], Any],
                    TableLookup]
# The step's parsed features -> its requests (`remote.step_requests`), or
# None where the partitions are in this process.
RequestsFn = Optional[Callable[[Dict[str, inputs_lib.FeatureIds]], Any]]


def feature_plans(table: model_lib.Table,
                  items: List[inputs_lib.FeatureIds]) -> Dict[str, Any]:
  """{feature: the columns' lookup plan} of `table`'s features `items`."""
  return {
      item.name: column_lookup.make_plan(
          item.flat, item.combiner, table.dimension,
          item.max_sequence_length, feature=item.name, table=table.name)
      for item in items
  }


def local_lookup(table: model_lib.Table, items: List[inputs_lib.FeatureIds],
                 rows: storage.PartitionedRows,
                 plan: plan_lib.TablePlan) -> TableLookup:
  """The `TableLookup` of `table`, whose partitions are in this process.

  Where the plan has the compiled kernels, they find the distinct ids and
  combine their rows (one op for a table in one partition; else Unique, a
  compiled gather per partition and a compiled combine), and
  differentiate; else TF ops."""
  plans = feature_plans(table, items)
  if plan.one_op_lookup:
    return TableLookup(table, None, None, items, plans, None, None,
                       compiled=True,
                       read=(rows.partitions[0].handle, plan.keeps_rows))
  compiled = plan.ops is not None
  ids = [item.flat.ids for item in items]
  unique_ids, index = tf.unique(tf.concat(ids, axis=0))
  gathered = rows.gather(unique_ids, compiled=compiled)
  sizes = None if compiled else tf.concat(tf.shape_n(ids), axis=0)
  return TableLookup(table, unique_ids, gathered, items, plans, index, sizes,
                     compiled=compiled)
