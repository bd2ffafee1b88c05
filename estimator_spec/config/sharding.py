"""Row sharding of a table: `div` and `mod` layouts as inspectable data.

One function of (vocabulary_size, num_shards, strategy) shared by the engine,
the checkpoint converter and the reports. A table with fewer rows than shards
has one partition per row.

* `div`: partition i holds a contiguous block; the first `V % n` partitions
  hold ceil(V/n) rows, the others floor(V/n) (TF's partitioned variables).
* `mod`: row r lives in partition r % n at local index r // n.
"""
from typing import Any, Callable, Optional, Sequence

import numpy as np
import numpy.typing as npt

from tpu_embedding_columns import checks

STRATEGIES = ("div", "mod")


class ShardLayout:
  """Where each row of a [vocabulary_size, ...] table lives."""

  def __init__(self, vocabulary_size: int, num_shards: int,
               strategy: str) -> None:
    owner = "ShardLayout"
    self.vocabulary_size = checks.check_int(owner, "vocabulary_size",
                                             vocabulary_size, minimum=1)
    num_shards = checks.check_int(owner, "num_shards", num_shards, minimum=1)
    if strategy not in STRATEGIES:
      checks.fail(owner, "strategy", "must be 'div' or 'mod'", strategy)
    self.strategy = strategy
    self.num_shards = num_shards
    self.num_partitions = min(self.vocabulary_size, num_shards)
    base, extra = divmod(self.vocabulary_size, self.num_partitions)
    self.sizes: tuple[int, ...] = tuple(base + (1 if i < extra else 0)
                       for i in range(self.num_partitions))
    self.offsets: tuple[int, ...] = tuple(int(x) for x in np.cumsum((0,) + self.sizes[:-1]))

  def locate(self, ids: npt.ArrayLike) -> tuple[Any, Any]:
    """Returns (partition, local_index) arrays for an array of row ids."""
    return self.route(np.asarray(ids, dtype=np.int64))

  def route(self, ids: Any, where: Callable[..., Any] = np.where,
            constant: Callable[..., Any] = np.asarray,
            gather: Callable[..., Any] = np.take) -> tuple[Any, Any]:
    """(partition, local index) of each row id in `ids`, the one routing
    rule of both strategies. The operations default to NumPy's; the engine
    passes TensorFlow's (`tf.where`, an int64 `tf.constant`, `tf.gather`)
    to route int64 tensors with the same formula."""
    n = self.num_partitions
    if self.strategy == "mod" or n == 1:
      return ids % n, ids // n
    base, extra = divmod(self.vocabulary_size, n)
    threshold = extra * (base + 1)  # rows held by the bigger partitions
    partition = where(ids < threshold, ids // (base + 1),
                      extra + (ids - threshold) // base)
    return partition, ids - gather(constant(self.offsets), partition)

  def row_ids(self, partition: int, start: int = 0,
              stop: Optional[int] = None) -> npt.NDArray[np.int64]:
    """The global row ids stored in `partition` at local indices [start,
    stop) (default: all of them), in local order."""
    stop = self.sizes[partition] if stop is None else stop
    if self.strategy == "mod":
      n = self.num_partitions
      return np.arange(partition + start * n, partition + stop * n, n,
                       dtype=np.int64)
    first = self.offsets[partition]
    return np.arange(first + start, first + stop, dtype=np.int64)

  def split(self, full: npt.ArrayLike) -> list[npt.NDArray[Any]]:
    """Splits a full [V, ...] array into its partitions."""
    array = np.asarray(full)
    return [array[self.row_ids(i)] for i in range(self.num_partitions)]

  def join(self, parts: Sequence[npt.ArrayLike]) -> npt.NDArray[Any]:
    """Inverse of `split`."""
    if len(parts) != self.num_partitions:
      raise ValueError(
          f"ShardLayout.join: expected {self.num_partitions} partitions; got "
          f"{len(parts)}.")
    first = np.asarray(parts[0])
    full = np.empty((self.vocabulary_size,) + first.shape[1:], first.dtype)
    for i, part in enumerate(parts):
      full[self.row_ids(i)] = part
    return full

  def __eq__(self, other: object) -> bool:
    return isinstance(other, ShardLayout) and (
        self.vocabulary_size, self.num_partitions, self.strategy) == (
            other.vocabulary_size, other.num_partitions, other.strategy)

  def __hash__(self) -> int:
    return hash((self.vocabulary_size, self.num_partitions, self.strategy))

  def __repr__(self) -> str:
    return (f"ShardLayout(vocabulary_size={self.vocabulary_size}, "
            f"num_shards={self.num_shards}, strategy={self.strategy!r}, "
            f"sizes={list(self.sizes)})")
