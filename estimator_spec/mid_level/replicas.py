"""Several replicas on one host: `HostTPUEmbedding` under a
`tf.distribute.MirroredStrategy`.

A TPU keeps one copy of each table (sharded over the cores' hosts) and sums
the gradients of an id over every core before its single update. The host
does the same: the tables are created once, on the host's CPU, whatever
strategy is in scope; the replicas' inputs are joined into one global
batch in replica order, looked up once, and the activations are split back
by replica; the replicas' activation gradients are joined in the same
order and applied once. So N replicas compute exactly what one replica
computes on the global batch (the per-id sums run over the same values in
the same order).

This module holds the strategy mechanics: which strategies are supported,
the variable creator that keeps one copy, and the joining and splitting.
"""
import contextlib
from typing import Iterable, Iterator, Optional

import tensorflow as tf

from estimator_spec.tensor_types import Tensor
from estimator_spec.tf_patches import one_copy as one_copy_lib

# Where the tables live under a strategy (the host's memory, as on a TPU).
TABLE_DEVICE = "/device:CPU:0"


def strategy_at_construction(owner: str) -> Optional[tf.distribute.Strategy]:
  """The strategy in scope (None for none), refused unless supported."""
  if not tf.distribute.has_strategy():
    return None
  strategy = tf.distribute.get_strategy()
  if isinstance(strategy, (tf.distribute.MirroredStrategy,
                           tf.distribute.OneDeviceStrategy)):
    return strategy
  raise ValueError(
      f"{owner}: created under {type(strategy).__name__}, which is not "
      "supported: the host engine trains under MirroredStrategy (the "
      "replicas of one machine) or OneDeviceStrategy, or with no strategy. "
      "On a TPU use TF's own tf.tpu.experimental.embedding.TPUEmbedding.")


def check_strategy(owner: str, what: str,
                   strategy: Optional[tf.distribute.Strategy]) -> None:
  """Refuses a call under another strategy than the object's."""
  current = (tf.distribute.get_strategy() if tf.distribute.has_strategy()
             else None)
  if current is None or current is strategy:
    return
  made = (f"under {type(strategy).__name__}" if strategy is not None else
          "with no strategy in scope")
  raise RuntimeError(
      f"{owner}.{what}: called under {type(current).__name__}, but the "
      f"object was created {made}; create it under the strategy's scope "
      "it is used with.")


@contextlib.contextmanager
def one_copy(strategy: Optional[tf.distribute.Strategy]) -> Iterator[None]:
  """Variables created in this scope are plain variables on the host's CPU,
  one copy, even under `strategy`'s scope (which would mirror them)."""
  if strategy is None or not tf.distribute.has_strategy():
    yield
    return

  with one_copy_lib.single_device_variables(TABLE_DEVICE):
    yield


def num_replicas(strategy: Optional[tf.distribute.Strategy]) -> int:
  return 1 if strategy is None else strategy.num_replicas_in_sync


def in_replica_context(strategy: Optional[tf.distribute.Strategy]) -> bool:
  """True inside `strategy.run` (a replica's function); outside the
  strategy's scope is cross-replica, as in its scope outside `run`."""
  return (strategy is not None and tf.distribute.has_strategy() and
          not tf.distribute.in_cross_replica_context())


def replica_id(owner: str, what: str) -> int:
  """The calling replica's index (inside `strategy.run`)."""
  context = tf.distribute.get_replica_context()
  index = tf.get_static_value(context.replica_id_in_sync_group)
  if index is None:
    raise RuntimeError(
        f"{owner}.{what}: the replica's index is not known while the "
        "function is built; call it inside MirroredStrategy.run.")
  return int(index)


def is_distributed(values: Iterable[object]) -> bool:
  """Whether any of `values` holds one value per replica."""
  return any(isinstance(v, tf.distribute.DistributedValues) for v in values)


def local_values(strategy: Optional[tf.distribute.Strategy],
                 value: Optional[Tensor], count: int) -> list[Optional[Tensor]]:
  """The `count` replicas' values of `value` in replica order (`count` 1:
  `value` is one batch that no replica owns)."""
  if value is None:
    return [None] * count
  if count == 1 and not isinstance(value, tf.distribute.DistributedValues):
    return [value]
  if strategy is None:
    raise ValueError(
        "per-replica values reached an object made without a strategy; "
        "make it under `strategy.scope()` of the strategy whose values it "
        "takes, or give it one plain batch.")
  values = list(strategy.experimental_local_results(value))
  if count > 1 and len(values) != count:
    raise ValueError(
        "one value for all replicas; give per-replica values (a distributed "
        "dataset's elements, or the value inside strategy.run).")
  return values


def join(pieces: list[Tensor]) -> Tensor:
  """One global batch of the replicas' dense pieces (e.g. gradients), in
  replica order, on axis 0. (Ids join with `inputs.GivenIds.join`.)"""
  if len(pieces) == 1:
    return pieces[0]
  return tf.concat(pieces, axis=0)


def split(value: Tensor, sizes: list[Tensor]) -> list[Tensor]:
  """`value` split on axis 0 into pieces of `sizes` (one per replica)."""
  if len(sizes) == 1:
    return [value]
  pieces: list[Tensor] = tf.split(value, tf.stack(sizes), num=len(sizes),
                                  axis=0)
  return pieces
