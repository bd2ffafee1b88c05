"""TPU-semantics embedding lookups as plain TensorFlow ops (no engine).

These functions implement the forward rules of docs/numerics.md
section 3 for one feature and one table: id validation, the `sum`/`mean`/
`sqrtn` combiners (empty examples give zeros), sequence features padded or
truncated to `max_sequence_length`, and the padded lookup of tensor-core
columns. Columns use them outside the embedding engine (plain Estimator,
Keras, serving export), so that a lookup gives the same numbers everywhere.
"""
import tensorflow as tf

COMBINERS = ("sum", "mean", "sqrtn")


def check(condition, message, data=()):
  """One Assert op: fails with `message` (if any) and `data` when the boolean
  tensor `condition` is not all true. (tf.debugging.assert_* build a guard
  cond and static-shape machinery per call; this runs as a single op.)"""
  rank = condition.shape.rank
  if rank is None:
    condition = tf.reduce_all(condition)
  elif rank:
    condition = tf.reduce_all(condition, axis=list(range(rank)))
  head = [tf.constant(message)] if message else []
  return tf.raw_ops.Assert(condition=condition, data=head + list(data),
                           summarize=8)


def check_each(ok, messages, data=()):
  """One Assert for several items (features, tables): every entry of `ok`
  (bool [items]) must hold; on failure it prints the failing items'
  `messages` (one per item) and their rows of `data` ([items, ...]
  tensors)."""
  if len(messages) == 1:
    return check(ok, messages[0], data)
  failing = tf.squeeze(tf.where(tf.logical_not(ok)), axis=1)
  return check(ok, None, [tf.gather(tf.constant(messages), failing)] +
               [tf.gather(item, failing) for item in data])


def gate(checks):
  """One op that depends on every check: ops that must wait for many checks
  depend on this (one control edge each) instead of on all of them."""
  checks = [c for c in checks if c is not None]
  if not checks:
    return None
  return tf.group(*checks)


def dense_to_sparse(tensor):
  """The non-zero entries of a dense id (or weight) tensor, as a
  SparseTensor: TPUEstimator's input convention for dense ids."""
  positions = tf.compat.v1.where(tf.not_equal(tensor, tf.zeros_like(tensor)))
  return tf.SparseTensor(positions, tf.gather_nd(tensor, positions),
                         tf.shape(tensor, out_type=tf.int64))


def id_column(column):
  """The categorical column that makes a TPU embedding column's ids: its
  categorical column without the weighted wrapper (weights are read from the
  weight key as they are, as on a TPU)."""
  categorical = column.categorical_column
  if type(categorical).__name__ == "WeightedCategoricalColumn":
    return categorical.categorical_column
  return categorical


def column_ids(column, features):
  """SparseTensor ids: a TPU embedding column's id column (`id_column`) run
  on the raw inputs it reads from `features` (RaggedTensors are taken as
  sparse)."""
  categorical = id_column(column)
  raw = {}
  for key in categorical.parse_example_spec:
    value = features[key]
    raw[key] = value.to_sparse() if isinstance(value,
                                               tf.RaggedTensor) else value
  cache = tf.__internal__.feature_column.FeatureTransformationCache(raw)
  return categorical.get_sparse_tensors(cache, None).id_tensor


class FlatIds:
  """The ids of one feature in flat form, after validation.

  example: int64 [N] example (row) of each id; position: int64 [N] position of
  each id within its example; ids: int64 [N]; weights: float32 [N] or None;
  batch_size: scalar int64 tensor; batch_size_int32: the same as int32 (the
  segments' type) when made with the others, else None; example_int32:
  `example` as int32 when made with the others, else None.

  Given `indices` ([N, 2]: example, position) instead of `example` and
  `position`, those two are split from it when first read (a lookup that
  has `example_int32` and no positions never reads them: one op less per
  feature in the graph).
  """

  def __init__(self, example, position, ids, weights, batch_size,
               static_batch_size=None, batch_size_int32=None,
               example_int32=None, indices=None):
    if (indices is None) == (example is None or position is None):
      raise ValueError("FlatIds: give `example` and `position`, or "
                       "`indices` instead of both.")
    self._columns = (example, position)
    self._split = None if indices is None else _deferred_split(indices)
    self.ids = ids
    self.weights = weights
    self.batch_size = batch_size
    self.static_batch_size = static_batch_size
    self.batch_size_int32 = batch_size_int32
    self.example_int32 = example_int32

  @property
  def example(self):
    return self._read_columns()[0]

  @property
  def position(self):
    return self._read_columns()[1]

  def _read_columns(self):
    if self._split is not None:
      self._columns, self._split = self._split(), None
    return self._columns


def _deferred_split(indices):
  """A function that returns `indices`' two columns (one Unpack), built the
  first time it is called as it would have been here and now: in this name
  scope, on the device of `indices`, outside any control dependencies.
  Eagerly, or inside a control-flow context (where an op must be made in
  its own context), the split is made at once."""
  graph = getattr(indices, "graph", None)
  if (tf.executing_eagerly() or graph is None or
      graph._get_control_flow_context() is not None):
    columns = tf.unstack(indices, num=2, axis=1)
    return lambda: columns
  scope = graph.get_name_scope()

  def split():
    with graph.as_default(), graph.name_scope(scope + "/" if scope else ""), \
        tf.control_dependencies(None), \
        graph.colocate_with(indices.op, ignore_existing=True):
      return tf.unstack(indices, num=2, axis=1)

  return split


class IdSource:
  """One feature's ids for `flatten_many`: a SparseTensor of integer `ids`
  and float `weights` at their positions (or None); the table's
  `vocabulary_size`; `where` names the feature and table in messages.
  `drop_negative`: negative ids are dropped (`use_safe_embedding_lookup`),
  else refused; `ids_non_negative`: none can be negative (see
  `never_negative`); `max_positions`: ids at positions >= it are dropped
  first (sequence length, tensor-core width); None: none are."""

  def __init__(self, ids, weights, vocabulary_size, where, *,
               drop_negative=True, ids_non_negative=False,
               max_positions=None):
    if not isinstance(ids, tf.SparseTensor):
      raise TypeError(
          f"{where}: ids must arrive as a SparseTensor here; got "
          f"{type(ids).__name__}.")
    if not ids.dtype.is_integer:
      raise TypeError(
          f"{where}: ids must be integers; got dtype {ids.dtype.name}. Pass "
          "the raw feature through the categorical column so that it is "
          "turned into ids.")
    self.ids = ids
    self.weights = weights
    self.vocabulary_size = vocabulary_size
    self.where = where
    self.drop_negative = drop_negative
    self.ids_non_negative = ids_non_negative
    self.max_positions = max_positions

  def example_and_position(self):
    """[n, 2] int64: the example and position of each id (the dimensions a
    lookup reads), and the dense_shape over them ([2])."""
    indices, shape = self.ids.indices, self.ids.dense_shape
    rank = tf.compat.dimension_value(shape.shape[0])
    if rank == 2:
      return indices, shape
    if rank == 1:
      return (tf.pad(indices, [[0, 0], [0, 1]]),
              tf.concat([shape, tf.ones([1], tf.int64)], 0))
    return indices[:, :2], shape[:2]


def structure_checks(sparse_ids, sparse_weights, where):
  """Run-time checks of a feature's SparseTensors, before any use of them:
  every index lies inside the ids' dense_shape, and the weights (if any) sit
  at exactly the ids' positions. `where` names the feature and table."""
  return _Joined([IdSource(sparse_ids, sparse_weights, None,
                           where)]).structure_checks()


def flatten_ids(sparse_ids, sparse_weights, vocabulary_size, *, feature,
                table, drop_negative, ids_non_negative=False,
                max_positions=None):
  """`flatten_many` of one feature's ids (and weights): its `FlatIds`."""
  return flatten_many([
      IdSource(sparse_ids, sparse_weights, vocabulary_size,
               f"Feature {feature!r} (table {table!r})",
               drop_negative=drop_negative, ids_non_negative=ids_non_negative,
               max_positions=max_positions)
  ])[0]


def flatten_many(sources, compiled_ops=None):
  """Validates the ids (and weights) of several features together and
  returns the `FlatIds` of each `IdSource`, in order.

  `compiled_ops`: optional ops that do two steps for all features at once
  (by default TF ops do them, per feature):
    * `extremes(tensors)`: for int64 tensors [n] or [n, k], their largest
      and smallest values per column ([len(tensors), k] each; the int64
      extremes for a tensor without rows);
    * `drop_negative_ids(indices, ids, weights, smallest)`: the same three
      lists without the entries of negative ids (weights entries may be
      None), and a fourth: each feature's examples (the first column of its
      kept indices) as int32, given their smallest ids (from `extremes`;
      int64 [len(ids)]). Called once for all features, after the
      weights' checks and beside the check of the indices and ids; what it
      gives waits for that check (features that keep negative ids have
      none once it passed: it refuses them). By default a cond over the
      features that drop negative ids, after the checks, which copies
      nothing when no id is negative, and a cast per feature;
    * `check_ids(index_extremes, shapes, id_extremes, vocabulary,
      refuse_negative, structure_messages, range_messages)`: one op for
      both Asserts below (each feature's index extremes, dense shape, id
      extremes, vocabulary size, whether negative ids are refused, and its
      message of each check), reporting as they do.

  Per feature: ids at positions >= `max_positions` are dropped first (they
  are never looked up, so they are never checked); negative ids are then
  dropped when `drop_negative`, else refused; ids >= the vocabulary size are
  always refused; weights are cast to float32. The checks run when the graph
  runs, in this order: indices inside the dense_shape and weights at the
  ids' positions (`structure_checks`), then ids in range. Each is one Assert
  over every feature's extremes, whose failure names every feature (and
  table) at fault.
  """
  joined = _Joined(sources, compiled_ops)
  checks = joined.structure_checks()
  weight_checks = list(checks)
  joined.truncate()
  # The ids' extremes (reads only) are computed alongside the structure
  # checks; the range Assert waits for them, so that a structure error is
  # the one reported when both are wrong.
  extremes = joined.id_extremes()
  with tf.control_dependencies(checks):
    checks.append(joined.range_check(*extremes))
  return joined.flat_ids(checks, weight_checks)


# Features per compiled drop of negative ids (see `_Joined._drop_negative`).
_DROP_GROUP = 64


class _Joined:
  """Several features' ids, each kept in its own tensors (`indices` [n, 2]:
  example and position; `ids` int64; `weights` float32 or None), checked
  together: each check compares every feature's extremes (one small
  reduction per feature) in one Assert."""

  def __init__(self, sources, compiled_ops=None):
    self.sources = list(sources)
    self.compiled_ops = compiled_ops
    # The indices' (largest, smallest) [features, 2] by the compiled
    # extremes, for the compiled check (`structure_checks`).
    self.index_extremes = None
    if not self.sources:
      raise ValueError("flatten_many: no features given.")
    pairs = [s.example_and_position() for s in self.sources]
    self.indices = [indices for indices, _ in pairs]
    # [features, 2]: each feature's dense_shape over (example, position).
    self.shapes = tf.stack([shape for _, shape in pairs])
    self.ids = [tf.cast(s.ids.values, tf.int64) for s in self.sources]
    self.weights = [None if s.weights is None else
                    tf.cast(s.weights.values, tf.float32)
                    for s in self.sources]

  def structure_checks(self):
    """Every index inside its feature's dense_shape (one Assert for all
    features; with compiled ops, `range_check`'s op compares it first);
    weights at the ids' positions (per weighted feature)."""
    # Reduced first, then compared: cheaper than comparing every index.
    # A feature without ids reduces to the dtype's extremes and passes.
    checks = []
    if self.compiled_ops is not None:
      # Compared by the compiled check of `range_check`, before the ids.
      self.index_extremes = self.compiled_ops.extremes(self.indices)
    else:
      largest = tf.stack([tf.reduce_max(t, axis=0) for t in self.indices])
      smallest = tf.stack([tf.reduce_min(t, axis=0) for t in self.indices])
      ok = tf.reduce_all(tf.logical_and(tf.less(largest, self.shapes),
                                        tf.greater_equal(smallest, 0)),
                         axis=1)
      checks.append(check_each(ok, self._structure_messages(),
                               [self.shapes, largest]))
    for s in self.sources:
      if s.weights is None:
        continue
      count = check(
          tf.equal(tf.size(s.weights.values), tf.size(s.ids.values)),
          f"{s.where}: weights do not match the ids (different number of "
          "values).")
      with tf.control_dependencies([count]):
        same = tf.reduce_all(tf.equal(s.weights.indices, s.ids.indices))
      checks += [
          count,
          check(
              same, f"{s.where}: weights are at other positions than the "
              "ids (their SparseTensors' indices differ); give weights at "
              "exactly the ids' positions.")
      ]
    return checks

  def _structure_messages(self):
    return [
        f"{s.where}: SparseTensor indices are out of bounds of its "
        "dense_shape (an id would land in another example or "
        "position); make dense_shape cover every index. dense_shape "
        "and the largest example and position:" for s in self.sources
    ]

  def _keep(self, k, keep):
    """Keeps feature k's ids (and their indices and weights) where the bool
    vector `keep` is true."""
    where = tf.squeeze(tf.where(keep), axis=1)
    axis = tf.constant(0)
    self.indices[k], self.ids[k] = (tf.gather(t, where, axis=axis)
                                    for t in (self.indices[k], self.ids[k]))
    if self.weights[k] is not None:
      self.weights[k] = tf.gather(self.weights[k], where, axis=axis)

  def truncate(self):
    """Drops the ids at positions >= their feature's `max_positions`."""
    for k, s in enumerate(self.sources):
      if s.max_positions is not None:
        self._keep(k, tf.less(self.indices[k][:, 1], s.max_positions))

  def id_extremes(self):
    """The batch's largest and smallest id per feature ([features] each):
    the numbers `range_check` compares and prints. A feature without ids
    reduces to the dtype's extremes (and passes the check)."""
    if self.compiled_ops is not None:
      return tuple(
          tf.reshape(t, [-1]) for t in self.compiled_ops.extremes(self.ids))
    return (tf.stack([tf.reduce_max(ids) for ids in self.ids]),
            tf.stack([tf.reduce_min(ids) for ids in self.ids]))

  def range_check(self, largest, smallest):
    """One Assert: every id in [0, vocabulary) (below the vocabulary, for
    features that drop negative ids), from `id_extremes`: the batch's
    smallest and largest id per feature are compared, not every id. With
    compiled ops, one op that checks the indices (`structure_checks`) and
    then this."""
    self.smallest = smallest
    refuse = [not s.drop_negative for s in self.sources]
    messages = []
    for s in self.sources:
      message = f"id out of range [0, {s.vocabulary_size})"
      if not s.drop_negative:
        message += (" (negative ids are refused with "
                    "use_safe_embedding_lookup=False)")
      messages.append(f"{s.where}: {message}; smallest and largest id of "
                      "the batch:")
    if self.compiled_ops is not None:
      # The structure check of every feature, then this one: one op.
      return self.compiled_ops.check_ids(
          self.index_extremes, self.shapes, (largest, smallest),
          [s.vocabulary_size for s in self.sources], refuse,
          self._structure_messages(), messages)
    ok = tf.less(largest, tf.constant(
        [s.vocabulary_size for s in self.sources], tf.int64))
    if any(refuse):
      ok = tf.logical_and(ok, tf.logical_or(
          tf.greater_equal(self.smallest, 0),
          tf.logical_not(tf.constant(refuse))))
    return check_each(ok, messages, [self.smallest, largest])

  def flat_ids(self, checks, weight_checks):
    """The `FlatIds` of every source, in order: the ids and weights pass
    through `checks`; negative ids are dropped where the source says so.
    `weight_checks`: those of `checks` that the compiled drop waits for
    (its own checks of the weights' count would report first otherwise)."""
    examples = [None] * len(self.sources)
    if self.compiled_ops is not None:
      # The compiled drop reads only the ids' smallest values: it runs
      # while the indices are reduced and checked, and what it gives passes
      # through the checks (`_compiled_drop`), for every feature: one that
      # keeps negative ids has none once the range check passed.
      with tf.control_dependencies(weight_checks):
        examples = self._compiled_drop(checks)
    else:
      dropping = [k for k, s in enumerate(self.sources)
                  if s.drop_negative and not s.ids_non_negative]
      # The ids and weights pass through an identity under the checks.
      with tf.control_dependencies(checks):
        self.ids = [tf.identity(ids) for ids in self.ids]
        self.weights = [w if w is None else tf.identity(w)
                        for w in self.weights]
      if dropping:
        self._drop_negative(dropping)
    # Every feature's batch size from the one [features, 2] tensor of
    # dense shapes (one slice and one cast, not one of each per feature).
    sizes = self.shapes[:, 0]
    count = len(self.sources)
    batch_sizes = tf.unstack(sizes, num=count)
    batch_sizes_int32 = tf.unstack(tf.cast(sizes, tf.int32), num=count)
    flats = []
    for k, s in enumerate(self.sources):
      flats.append(FlatIds(
          None, None, self.ids[k], self.weights[k], batch_sizes[k],
          tf.compat.dimension_value(s.ids.shape[0])
          if s.ids.shape.rank else None, batch_sizes_int32[k],
          examples[k], indices=self.indices[k]))
    return flats

  def _compiled_drop(self, checks):
    """Every feature through the compiled drop of negative ids, then through
    one identity per group of features that waits for `checks`; returns each
    feature's int32 examples."""
    # One op per _DROP_GROUP features: an op with n inputs and n outputs
    # costs graph walkers that visit each input once per output (Keras'
    # history check of a layer's inputs) n * n steps.
    count = len(self.sources)
    examples = [None] * count
    for start in range(0, count, _DROP_GROUP):
      group = list(range(start, min(start + _DROP_GROUP, count)))
      smallest = (self.smallest if len(group) == count else
                  self.smallest[start:start + len(group)])
      indices, ids, weights, kept_examples = (
          self.compiled_ops.drop_negative_ids(
              [self.indices[k] for k in group], [self.ids[k] for k in group],
              [self.weights[k] for k in group], smallest))
      indices, ids, weights, kept_examples = _through(
          checks, indices, ids, weights, kept_examples)
      for k, i, v, w, e in zip(group, indices, ids, weights, kept_examples):
        self.indices[k], self.ids[k], self.weights[k] = i, v, w
        examples[k] = e
    return examples

  def _drop_negative(self, dropping):
    """Drops the negative ids of features `dropping` (indices) by TF ops;
    copies nothing when none of them has one (one cond for all of them)."""
    weighted = [k for k in dropping if self.weights[k] is not None]

    def state():
      return ([self.indices[k] for k in dropping],
              [self.ids[k] for k in dropping],
              [self.weights[k] for k in weighted])

    def drop():
      for k in dropping:
        self._keep(k, tf.greater_equal(self.ids[k], 0))
      return state()

    if len(self.sources) == 1:
      # A cond costs more to build than one feature's copies cost to run.
      drop()
      return
    negative = tf.reduce_any(tf.less(tf.gather(self.smallest, dropping), 0))
    if tf.executing_eagerly():
      if bool(negative):
        drop()
      return
    kept = state()
    indices, ids, weights = tf.cond(negative, drop, lambda: kept)
    for k, i, v in zip(dropping, indices, ids):
      self.indices[k], self.ids[k] = i, v
    for k, w in zip(weighted, weights):
      self.weights[k] = w


def _through(checks, *lists):
  """The tensors of `lists` (entries may be None) as one op's outputs that
  wait for `checks`; the same lists' shape."""
  flat = [t for tensors in lists for t in tensors if t is not None]
  with tf.control_dependencies(checks):
    passed = iter(tf.identity_n(flat))
  return [[None if t is None else next(passed) for t in tensors]
          for tensors in lists]


# Categorical columns whose ids are never negative: hashing, crossing and
# bucketizing cannot give negative ids. (An identity column passes negative
# ids through unless it has a default_value, which replaces them.)
_NON_NEGATIVE_COLUMNS = ("HashedCategoricalColumn", "CrossedColumn",
                         "BucketizedColumn")
_VOCABULARY_COLUMNS = ("VocabularyListCategoricalColumn",
                       "VocabularyFileCategoricalColumn")


def never_negative(categorical_column):
  """Whether a categorical column's transformation never yields a negative
  id (weighted and sequence wrappers are looked through)."""
  column = categorical_column
  while type(column).__name__ in ("WeightedCategoricalColumn",
                                  "SequenceCategoricalColumn"):
    column = column.categorical_column
  name = type(column).__name__
  if name in _NON_NEGATIVE_COLUMNS:
    return True
  if name == "IdentityCategoricalColumn":
    return column.default_value is not None
  if name in _VOCABULARY_COLUMNS:
    # Out-of-vocabulary values get an oov bucket, or default_value (-1 when
    # there are no oov buckets and no default).
    return column.num_oov_buckets > 0 or (
        column.default_value is not None and column.default_value >= 0)
  return False


def gather_rows(table, ids):
  """Gathers rows of `table` (a variable, a PartitionedVariable or a list of
  `div` partitions) for `ids`, reading each distinct id once."""
  unique_ids, index = tf.unique(ids)
  if isinstance(table, (list, tuple)) or hasattr(table, "_get_variable_list"):
    rows = tf.compat.v1.nn.embedding_lookup(
        table, unique_ids, partition_strategy="div")
  else:
    rows = tf.gather(table, unique_ids)
  return tf.gather(rows, index)


def combiner_scale(weights, segment, num_segments, combiner):
  """Per-segment factor c of the combiner: 1 (sum), 1/sum(w) (mean),
  1/sqrt(sum(w^2)) (sqrtn); 0 where the denominator is 0 (empty examples).
  Returns None for 'sum'."""
  if combiner == "sum":
    return None
  if weights is None:
    weights = tf.ones_like(segment, dtype=tf.float32)
  if combiner == "mean":
    denominator = tf.math.unsorted_segment_sum(weights, segment, num_segments)
  elif combiner == "sqrtn":
    denominator = tf.sqrt(
        tf.math.unsorted_segment_sum(weights * weights, segment, num_segments))
  else:
    raise ValueError(f"Unknown combiner {combiner!r}; use one of {COMBINERS}.")
  return tf.math.divide_no_nan(tf.ones_like(denominator), denominator)


class Plan:
  """How the ids of one feature combine into its activation, and back.

  Output segment s (the example, or the (example, position) slot of a
  sequence feature) is `scale[s] * sum of weight[i] * row(id_i)` over the
  ids i in it; the backward pass sends `scale[segment[i]] * weight[i] *
  grad[segment[i]]` to id i (docs/numerics.md, 'The backward pass, table by
  table'). `weights` (per id) is None when they are all 1; `combiner` ('sum',
  'mean' or 'sqrtn') decides `scale` (per segment: 1/sum(w) or 1/sqrt(sum(w^2));
  None for 'sum'), which is computed when first asked for.
  """

  def __init__(self, segment, num_segments, weights, combiner, output_shape,
               checks):
    if combiner not in COMBINERS:
      raise ValueError(
          f"Unknown combiner {combiner!r}; use one of {COMBINERS}.")
    self.segment = segment
    self.num_segments = num_segments
    self.weights = weights
    self.combiner = combiner
    self.output_shape = output_shape
    self.checks = checks
    self._scale = None

  @property
  def scale(self):
    """The combiner's factor per segment [num_segments], or None (sum)."""
    if self._scale is None and self.combiner != "sum":
      self._scale = combiner_scale(self.weights, self.segment,
                                   self.num_segments, self.combiner)
    return self._scale

  def combine(self, rows):
    """Rows [N, D] of the ids -> activation [B, D] or [B, L, D]."""
    if self.weights is not None:
      rows = rows * tf.expand_dims(self.weights, 1)
    with tf.control_dependencies(self.checks):
      out = tf.math.unsorted_segment_sum(rows, self.segment, self.num_segments)
    if self.scale is not None:
      out = out * tf.expand_dims(self.scale, 1)
    out = tf.reshape(out, [-1] + self.output_shape)
    out.set_shape([None] + self.output_shape)
    return out

  def segment_grads(self, grad):
    """Activation gradient -> the gradient of each output segment, times the
    combiner's factor [num_segments, D]."""
    grad = tf.reshape(grad, [-1, self.output_shape[-1]])
    if self.scale is not None:
      grad = grad * tf.expand_dims(self.scale, 1)
    return grad

  def backprop(self, grad):
    """Activation gradient -> per-id gradient contributions [N, D]."""
    contributions = tf.gather(self.segment_grads(grad), self.segment)
    if self.weights is not None:
      contributions = contributions * tf.expand_dims(self.weights, 1)
    return contributions


def make_plan(flat, combiner, dimension, max_sequence_length=0, *,
              feature="", table=""):
  """The `Plan` of a feature's (already truncated) ids.

  combiner None (non-sequence): each example has at most one id, which must
  be checked when the graph runs; its activation is the row itself. Sequence
  features place ids at their positions (several ids at one position are
  combined with the combiner, `sum` when None).
  """
  example = (flat.example_int32 if flat.example_int32 is not None else
             tf.cast(flat.example, tf.int32))
  batch = (flat.batch_size_int32 if flat.batch_size_int32 is not None else
           tf.cast(flat.batch_size, tf.int32))
  checks = []
  if max_sequence_length:
    segment = example * max_sequence_length + tf.cast(flat.position, tf.int32)
    num_segments = batch * max_sequence_length
    output_shape = [max_sequence_length, dimension]
    combiner = combiner or "sum"
  else:
    segment = example
    num_segments = batch
    output_shape = [dimension]
    if combiner is None:
      counts = tf.math.unsorted_segment_sum(
          tf.ones_like(segment), segment, num_segments)
      checks.append(
          check(
              tf.less_equal(counts, 1),
              f"Feature {feature!r} (table {table!r}): combiner=None takes "
              "exactly one id per example."))
      combiner = "sum"
  return Plan(segment, num_segments, flat.weights, combiner or "sum",
              output_shape, checks)


def sequence_lengths(sparse_ids, max_sequence_length):
  """The `<key>_seq_length_` feature: min(last position + 1, L) per example."""
  example = tf.cast(sparse_ids.indices[:, 0], tf.int32)
  batch = tf.cast(sparse_ids.dense_shape[0], tf.int32)
  last = tf.math.unsorted_segment_max(
      tf.cast(sparse_ids.indices[:, 1], tf.int64) + 1, example, batch)
  lengths = tf.maximum(last, 0)  # empty examples give the dtype's minimum
  return tf.minimum(lengths, max_sequence_length)
