"""The engine's compiled kernels (the C++ files of this folder), built on
first use: each op's wrapper.

`row_updates()` returns the loaded op module, or None where the engine must
use its graph-op path instead. `builder` compiles the kernels into one
library, caches it and loads it (its docstring says where and on what
terms).

`HOST_EMBEDDING_KERNELS` chooses:
  * `auto` (default): use the kernels when they build and load; otherwise
    warn once (with the compiler's message) and use the graph-op path.
  * `1`: the kernels are required; a failed build raises `KernelBuildError`.
  * `0`: never use them (the graph-op path computes the same numbers).
"""
import os
import threading
import warnings
from typing import Any, Sequence

import tensorflow as tf

from estimator_spec.engine.kernels import builder
from estimator_spec.engine.kernels.builder import KernelBuildError
# The builder's names that callers reach through this package.
from estimator_spec.engine.kernels.builder import CACHE_ENV
from estimator_spec.engine.kernels.builder import DIGEST_SUFFIX
from estimator_spec.engine.kernels.builder import build

ENV = "HOST_EMBEDDING_KERNELS"

_lock = threading.Lock()
_state = {}


def mode():
  """`auto`, `1` or `0`, from $HOST_EMBEDDING_KERNELS."""
  value = os.environ.get(ENV, "auto").strip().lower() or "auto"
  if value not in ("auto", "1", "0"):
    raise ValueError(
        f"${ENV}={os.environ[ENV]!r}: use 'auto' (kernels when they build), "
        "'1' (kernels required) or '0' (graph ops only).")
  return value


# Called while tf.function traces the engine: AutoGraph must not convert
# the build (subprocess calls).
@tf.autograph.experimental.do_not_convert
def row_updates():
  """The loaded op module (the ops of this folder's C++ files; the
  functions below wrap each), or None when $HOST_EMBEDDING_KERNELS is 0 or
  (in `auto`) the build failed."""
  chosen = mode()
  if chosen == "0":
    return None
  with _lock:
    if "module" not in _state:
      try:
        _state["module"] = builder.load()
        _state["error"] = None
      except (KernelBuildError, OSError, tf.errors.OpError) as error:
        _state["module"] = None
        _state["error"] = error
        if chosen == "auto":
          warnings.warn(
              "The host embedding engine's compiled row updates are not "
              f"available ({error}); it uses TensorFlow ops instead (same "
              f"results, slower). Set {ENV}=0 to silence this.",
              RuntimeWarning, stacklevel=2)
    if _state["module"] is None and chosen == "1":
      raise KernelBuildError(
          f"{ENV}=1 requires the compiled row updates: {_state['error']}")
    return _state["module"]


def ops_for(variables: Sequence[Any]) -> Any:
  """The op module for ops on `variables` (their kernels are CPU-only), or
  None when one of them is on a GPU or the kernels are unavailable."""
  if any("GPU" in variable.device.upper() for variable in variables):
    return None
  return row_updates()


def or_empty(tensors):
  """`tensors` with an empty float32 tensor for each None: how the kernels
  are told that a feature has no weights (or a combiner no scale)."""
  if all(t is not None for t in tensors):
    return list(tensors)
  empty = free_constant([])
  return [empty if t is None else t for t in tensors]


def free_constant(value):
  """`value` as a float32 constant free of the enclosing control
  dependencies: the kernel given it waits for what it waits for itself
  (a step's checks, for an update), and a constant that waited too would
  run, one node after another, between those checks and the kernel."""
  with tf.control_dependencies(None):
    return tf.constant(value, tf.float32)


# Every op of this folder's C++ files has its wrapper here; callers check
# first that the kernels are available (`ops_for`).

# The compiled row updates, by the name an optimizer's `engine.rules.Record`
# gives its rule: each runs docs/numerics.md, 'The backward pass, table by
# table' steps 4 to 7 on the touched rows of one partition, in place.
_ROW_UPDATES = {"adagrad": "host_embedding_adagrad_rows",
                "sgd": "host_embedding_sgd_rows"}


def row_update(rule: str, table: Any, slots: Sequence[Any],
               **inputs: Any) -> Any:
  """The compiled row update `rule` (a key of `_ROW_UPDATES`) on the
  partition `table` and its `slots` (resource handles, in slot order); the
  other inputs and attributes by name (updates.cc)."""
  return getattr(row_updates(), _ROW_UPDATES[rule])(table, *slots, **inputs)


def fill(shape, value):
  """A new [rows, columns] float32 matrix (`shape`, an integer vector),
  every entry `value` (a float32 scalar tensor), its pages huge from the
  start (initialize.cc)."""
  return row_updates().host_embedding_fill(shape, value)


def truncated_normal(shape, seed, seed2):
  """TensorFlow's TruncatedNormal draws of a new [rows, columns] float32
  matrix for the op seeds `seed` and `seed2` (the same bits), its pages
  huge from the start (initialize.cc)."""
  return row_updates().host_embedding_truncated_normal(shape, seed=seed,
                                                       seed2=seed2)


def share_on_read(handles):
  """One op taking the variables of `handles` (resource handles) out of
  copy-on-read mode, so that whole reads share their buffers (updates.cc,
  HostEmbeddingShareOnRead)."""
  return row_updates().host_embedding_share_on_read(handles)


def squared_sums(handles):
  """float32 [len(handles)]: the sum of the squares of each variable's
  entries (resource handles of float32 matrices), read in place (lookup.cc,
  HostEmbeddingSquaredSums)."""
  return row_updates().host_embedding_squared_sums(handles)


def gather_rows(table, indices):
  """Rows [len(indices), D] of the partition `table` (a resource handle)."""
  return row_updates().host_embedding_gather_rows(table, indices)


def combine(rows, index, **inputs):
  """(activations, scales) of each feature from a table's distinct rows
  `rows` and each id's position `index` in them."""
  return row_updates().host_embedding_combine(rows, index, **inputs)


def lookup(table, ids, **inputs):
  """(unique ids, index, rows, number of ids, activations, scales): a
  single-partition table's lookup by one op."""
  return row_updates().host_embedding_lookup(table, ids, **inputs)


def route_ids(ids, layout, out_type):
  """(distinct ids, index, [local ids of partition p], [their number]): the
  distinct ids of one table's features (`ids`, int64 vectors) grouped by
  partition of `layout` (a `ShardLayout`), the local ids and sizes as
  `out_type` (routing.cc, HostEmbeddingRouteIds)."""
  unique_ids, index, local_ids, sizes = (
      row_updates().host_embedding_route_ids(
          ids, K=layout.num_partitions,
          vocabulary_size=layout.vocabulary_size, strategy=layout.strategy,
          out_type=out_type))
  return unique_ids, index, list(local_ids), list(sizes)


def id_gradients(**inputs):
  """(summed, finite): the float32 gradient sum of each distinct id and
  whether all of it is finite."""
  return row_updates().host_embedding_id_gradients(**inputs)


def check_all(ok, messages):
  """One op that fails the step with InvalidArgument, naming `messages[i]`
  for each false `ok[i]` (bool scalars), when any is false."""
  return row_updates().host_embedding_check_all(ok=ok, messages=messages)


# The compiled ops that `tpu_embedding_columns.lookup.flatten_many` takes
# (`compiled_ops`): this module gives them.


def extremes(tensors):
  """Each int64 tensor's largest and smallest values per column, by one op
  for all of them (see `flatten_many`)."""
  return row_updates().host_embedding_extremes(tensors)


def check_ids(index_extremes, shapes, id_extremes, vocabulary,
              refuse_negative, structure_messages, range_messages):
  """One op for the input checks of every feature (see `flatten_many`):
  fails when an index lies outside its feature's dense shape, else when an
  id is outside its feature's range."""
  return row_updates().host_embedding_check_ids(
      *index_extremes, shapes, *id_extremes, vocabulary=vocabulary,
      refuse_negative=refuse_negative,
      structure_messages=structure_messages, range_messages=range_messages)


def drop_negative_ids(indices, ids, weights, smallest):
  """The entries of non-negative ids and their examples as int32, by one op
  for all features, which passes a feature's tensors through uncopied when
  none of its ids is negative, without reading its ids when `smallest`
  (int64 [features]: each feature's smallest id, or a lower bound of it) is
  not negative (see `flatten_many`)."""
  kept_indices, kept_ids, kept_weights, kept_examples = row_updates(
  ).host_embedding_drop_negative_ids(
      indices=indices, ids=ids, weights=or_empty(weights), smallest=smallest)
  return kept_indices, kept_ids, [
      None if w is None else kept for w, kept in zip(weights, kept_weights)
  ], kept_examples
