"""TPU embedding column classes.

A column is an ordinary dense (and sequence) feature column: it works in
`tf.compat.v1.feature_column.input_layer`, `tf.keras.layers.DenseFeatures` and
`tf.keras.experimental.SequenceFeatures`, shared columns included. It also
exposes, as plain properties, everything the config model needs to derive a
TPU embedding table and feature from it.

Where the lookup happens:
* inside a host embedding engine (an `ActivationSource` is installed on the
  graph), embedding-core columns return the engine's activations;
* anywhere else they look up their own variable with TPU semantics
  (`lookup.py`), named as TensorFlow's CPU path names it:
  `<layer>/<column name>/embedding_weights`, or `<shared collection name>` for
  shared tables.
"""
import enum
import re

import tensorflow as tf
# The v1 base classes are what `input_layer` accepts; v2 ones come from the
# public `tf.__internal__.feature_column` namespace.
from tensorflow.python.feature_column import feature_column as _fc_v1
from tensorflow.python.feature_column import feature_column_v2 as _fc_v2

from tpu_embedding_columns import context
from tpu_embedding_columns import lookup

TABLE_NAME_PREFIX = "tbl_"
_SEQUENCE_LENGTH_SUFFIX = "_seq_length_"
TENSOR_CORE_MASK_SUFFIX = "__TENSOR_CORE_MASK"
EMBEDDING_WEIGHTS = "embedding_weights"


def sequence_length_key(feature_key):
  """The features-dict key of a sequence feature's lengths, beside its ids
  (`<feature>_seq_length_`: TF's TPU sequence columns and infeed use it)."""
  return feature_key + _SEQUENCE_LENGTH_SUFFIX
LOOKUP_DEVICES = ("cpu", "tpu_tensor_core", "tpu_embedding_core")


class EmbeddingDevice(enum.Enum):
  """Where a column's lookup runs on a TPU; the names and values of TF's
  `EmbeddingDevice` (`column._embedding_lookup_device`)."""
  CPU = 1
  TPU_TENSOR_CORE = 2
  TPU_EMBEDDING_CORE = 3


CategoricalColumn = _fc_v2.CategoricalColumn
SequenceCategoricalColumn = _fc_v2.SequenceCategoricalColumn
WeightedCategoricalColumn = _fc_v2.WeightedCategoricalColumn


class _TPUEmbeddingColumnBase(tf.__internal__.feature_column.DenseColumn,
                              tf.__internal__.feature_column.SequenceDenseColumn,
                              _fc_v1._DenseColumn,
                              _fc_v1._SequenceDenseColumn):
  """Behaviour common to shared and non-shared TPU embedding columns.

  Arguments are validated by `api.embedding_column` and
  `api.shared_embedding_columns`; construct columns through them.
  """

  def __init__(self, categorical_column, dimension, combiner, initializer,
               max_sequence_length, learning_rate_fn, embedding_lookup_device,
               tensor_core_shape, use_safe_embedding_lookup):
    self.categorical_column = categorical_column
    self.dimension = dimension
    self.combiner = combiner
    self.initializer = initializer
    self.max_sequence_length = max_sequence_length
    self.learning_rate_fn = learning_rate_fn
    self.embedding_lookup_device = embedding_lookup_device
    self.tensor_core_shape = (None if tensor_core_shape is None else
                              tuple(tensor_core_shape))
    self.use_safe_embedding_lookup = use_safe_embedding_lookup

  # ---------------------------------------------------------------------
  # What the config model reads.

  @property
  def is_weighted(self):
    return isinstance(self.categorical_column, WeightedCategoricalColumn)

  @property
  def is_sequence(self):
    return isinstance(self.categorical_column, SequenceCategoricalColumn)

  @property
  def drops_negative_ids(self):
    """Whether negative ids are dropped (else refused). With
    `use_safe_embedding_lookup=True`; and always for sequence columns, whose
    ids TF's CPU path looks up with its safe lookup whatever the flag."""
    return self.use_safe_embedding_lookup or self.is_sequence

  @property
  def is_tensor_core(self):
    return self.embedding_lookup_device == "tpu_tensor_core"

  @property
  def feature_key(self):
    """The key of the ids in the features dict (the feature's name)."""
    if self.is_weighted:
      return self.categorical_column.categorical_column.name
    return self.categorical_column.name

  @property
  def weight_key(self):
    """The key of the weights in the features dict, or None."""
    if self.is_weighted:
      return self.categorical_column.weight_feature_key
    return None

  @property
  def embedding_var_name(self):
    raise NotImplementedError

  @property
  def table_name(self):
    return TABLE_NAME_PREFIX + self.embedding_var_name

  @property
  def vocabulary_size(self):
    return self.categorical_column.num_buckets

  @property
  def sequence_length_feature_key(self):
    return sequence_length_key(self.feature_key)

  @property
  def tensor_core_mask_key(self):
    return self.feature_key + TENSOR_CORE_MASK_SUFFIX

  # Accessors under the names TensorFlow's TPU columns use, so that code
  # written against those columns keeps working.
  def get_feature_key_name(self):
    return self.feature_key

  def get_weight_key_name(self):
    return self.weight_key

  def get_embedding_var_name(self):
    return self.embedding_var_name

  def get_embedding_table_size(self):
    return (self.vocabulary_size, self.dimension)

  def get_combiner(self):
    return self.combiner

  def get_initializer(self):
    return self.initializer

  def get_learning_rate_fn(self):
    return self.learning_rate_fn

  def get_max_sequence_length(self):
    return self.max_sequence_length

  def is_sequence_column(self):
    return self.is_sequence

  def is_categorical_column_weighted(self):
    return self.is_weighted

  def get_sequence_length_feature_key_name(self):
    return self.sequence_length_feature_key

  # Attributes of TensorFlow's TPU columns that user code reads, as aliases
  # of the public names.
  @property
  def _max_sequence_length(self):
    return self.max_sequence_length

  @property
  def _learning_rate_fn(self):
    return self.learning_rate_fn

  @property
  def _tpu_categorical_column(self):
    return self.categorical_column

  @property
  def _tensor_core_shape(self):
    return None if self.tensor_core_shape is None else list(
        self.tensor_core_shape)

  @property
  def _embedding_lookup_device(self):
    if self.embedding_lookup_device is None:
      return None
    return EmbeddingDevice[self.embedding_lookup_device.upper()]

  @property
  def max_norm(self):
    """TPU embedding columns take no max_norm (always None)."""
    return None

  def __repr__(self):
    fields = [
        f"categorical_column={self.categorical_column.name!r}",
        f"dimension={self.dimension}", f"combiner={self.combiner!r}"
    ]
    if self.max_sequence_length:
      fields.append(f"max_sequence_length={self.max_sequence_length}")
    if self.learning_rate_fn is not None:
      fields.append(f"learning_rate_fn={self.learning_rate_fn!r}")
    if self.embedding_lookup_device is not None:
      fields.append(f"embedding_lookup_device={self.embedding_lookup_device!r}")
    if self.tensor_core_shape is not None:
      fields.append(f"tensor_core_shape={list(self.tensor_core_shape)}")
    if not self.use_safe_embedding_lookup:
      fields.append("use_safe_embedding_lookup=False")
    return f"{type(self).__name__}({', '.join(fields)})"

  # ---------------------------------------------------------------------
  # Feature column protocol (v2 and v1).

  @property
  def _is_v2_column(self):
    return True

  @property
  def parents(self):
    return [self.categorical_column]

  @property
  def parse_example_spec(self):
    return self.categorical_column.parse_example_spec

  @property
  def _parse_example_spec(self):
    return self.categorical_column.parse_example_spec

  def transform_feature(self, transformation_cache, state_manager):
    return transformation_cache.get(self.categorical_column, state_manager)

  def _transform_feature(self, inputs):
    return inputs.get(self.categorical_column)

  @property
  def variable_shape(self):
    return tf.TensorShape([self.dimension])

  @property
  def _variable_shape(self):
    return self.variable_shape

  def create_state(self, state_manager):
    raise NotImplementedError

  def get_dense_tensor(self, transformation_cache, state_manager):
    self._check_dense_use("DenseFeatures")
    source = self._engine_source()
    if source is not None:
      self._register_v2(source)
      return source.dense_activation(self)
    pair = self._sparse_pair_v2(transformation_cache, state_manager)
    return self._embed(pair, self._table_v2(state_manager))

  def get_sequence_dense_tensor(self, transformation_cache, state_manager):
    self._check_sequence_use("SequenceFeatures")
    source = self._engine_source()
    if source is not None:
      self._register_v2(source)
      return self._sequence_pair(*source.sequence_activation(self))
    pair = self._sparse_pair_v2(transformation_cache, state_manager)
    return self._sequence_pair(*self._embed_sequence(
        pair, self._table_v2(state_manager)))

  def _get_dense_tensor(self, inputs, weight_collections=None, trainable=None):
    self._check_dense_use("input_layer")
    source = self._engine_source()
    if source is not None:
      source.register_variable(self, self._variable_name_v1())
      return source.dense_activation(self)
    pair = self._sparse_pair_v1(inputs, weight_collections, trainable)
    return self._embed(pair, self._table_v1(weight_collections, trainable))

  def _get_sequence_dense_tensor(self, inputs, weight_collections=None,
                                 trainable=None):
    self._check_sequence_use("a sequence input layer")
    source = self._engine_source()
    if source is not None:
      source.register_variable(self, self._variable_name_v1())
      return self._sequence_pair(*source.sequence_activation(self))
    pair = self._sparse_pair_v1(inputs, weight_collections, trainable)
    return self._sequence_pair(*self._embed_sequence(
        pair, self._table_v1(weight_collections, trainable)))

  # ---------------------------------------------------------------------
  # Helpers.

  def _check_dense_use(self, where):
    if self.is_sequence:
      raise ValueError(
          f"Column {self.name!r} is a sequence column (its categorical column "
          f"is a sequence_categorical_column_*), so {where} cannot use it. Use "
          "tf.keras.experimental.SequenceFeatures, or build the column from a "
          "non-sequence categorical column.")

  def _check_sequence_use(self, where):
    if not self.is_sequence:
      raise ValueError(
          f"Column {self.name!r} is not a sequence column, so {where} cannot "
          "use it. Use DenseFeatures/input_layer, or build the column from a "
          "sequence_categorical_column_with_*.")

  @staticmethod
  def _sequence_pair(activations, lengths):
    return tf.__internal__.feature_column.SequenceDenseColumn.TensorSequenceLengthPair(
        dense_tensor=activations, sequence_length=lengths)

  def _sparse_pair_v2(self, transformation_cache, state_manager):
    categorical = self.categorical_column
    if not self.is_weighted:
      return categorical.get_sparse_tensors(transformation_cache,
                                            state_manager)
    ids = categorical.categorical_column.get_sparse_tensors(
        transformation_cache, state_manager).id_tensor
    return _weighted_pair(
        categorical, ids,
        transformation_cache.get(categorical.weight_feature_key,
                                 state_manager))

  def _sparse_pair_v1(self, inputs, weight_collections, trainable):
    categorical = self.categorical_column
    if not self.is_weighted:
      return categorical._get_sparse_tensors(inputs, weight_collections,
                                             trainable)
    ids = categorical.categorical_column._get_sparse_tensors(
        inputs, weight_collections, trainable).id_tensor
    return _weighted_pair(categorical, ids,
                          inputs.get(categorical.weight_feature_key))

  def _engine_source(self):
    """The installed engine, for columns whose lookup the engine does: all
    but tensor-core columns. ('cpu' columns are tables of the embedding
    configuration like the others; on a host engine every lookup is a CPU
    lookup.)"""
    if self.is_tensor_core:
      return None
    return context.current_source()

  def _register_v2(self, source):
    del source  # Non-shared columns register in create_state; see subclass.

  def _variable_name_v1(self):
    raise NotImplementedError

  def _table_v1(self, weight_collections, trainable):
    raise NotImplementedError

  def _table_v2(self, state_manager):
    raise NotImplementedError

  def _flat_ids(self, pair):
    if self.is_tensor_core:
      max_positions = self.tensor_core_shape[1]
    elif self.is_sequence:
      max_positions = self.max_sequence_length
    else:
      max_positions = None
    return lookup.flatten_ids(
        pair.id_tensor,
        pair.weight_tensor,
        self.vocabulary_size,
        feature=self.feature_key,
        table=self.table_name,
        drop_negative=self.drops_negative_ids,
        ids_non_negative=lookup.never_negative(self.categorical_column),
        max_positions=max_positions)

  def _embed(self, pair, table):
    if self.embedding_lookup_device == "tpu_embedding_core" and (
        context.under_tpu_inference()):
      raise ValueError(
          f"Column {self.name!r}: Using embedding_lookup_device="
          "tpu_embedding_core during inference is not supported (TF's TPU "
          "serving graph has no TPU embedding); use "
          "embedding_lookup_device='cpu' or None for serving.")
    if not self.is_tensor_core and not tf.executing_eagerly():
      context.record_plain_lookup(self)
    flat = self._flat_ids(pair)
    plan = lookup.make_plan(flat, self.combiner, self.dimension,
                            self.max_sequence_length, feature=self.feature_key,
                            table=self.table_name)
    return plan.combine(lookup.gather_rows(table, flat.ids))

  def _embed_sequence(self, pair, table):
    lengths = lookup.sequence_lengths(pair.id_tensor, self.max_sequence_length)
    return self._embed(pair, table), lengths


class EmbeddingColumn(_TPUEmbeddingColumnBase):
  """A TPU embedding column with a table of its own."""

  # The fields TF's embedding columns have and TPU ones fix.
  trainable = True
  ckpt_to_load_from = None
  tensor_name_in_ckpt = None

  @property
  def name(self):
    return f"{self.categorical_column.name}_embedding"

  @property
  def embedding_var_name(self):
    return self.categorical_column.name

  def create_state(self, state_manager):
    source = self._engine_source()
    if source is not None:
      source.register_variable(
          self, _state_manager_variable_name(state_manager, EMBEDDING_WEIGHTS))
      return
    state_manager.create_variable(
        self,
        name=EMBEDDING_WEIGHTS,
        shape=(self.vocabulary_size, self.dimension),
        dtype=tf.float32,
        trainable=True,
        use_resource=True,
        initializer=self.initializer)

  def _table_v2(self, state_manager):
    return state_manager.get_variable(self, name=EMBEDDING_WEIGHTS)

  def _variable_name_v1(self):
    return _scoped(EMBEDDING_WEIGHTS)

  def _table_v1(self, weight_collections, trainable):
    return _embedding_weights_v1(self, weight_collections, trainable)


class SharedTable:
  """The one table behind a group of shared embedding columns.

  Its variable is named `<scope>/<name>`, where `<scope>` is the variable
  scope the layer was called in (without the scopes `input_layer` opens for
  itself), so that DenseFeatures and input_layer name it alike.
  """

  def __init__(self, name, vocabulary_size, dimension, initializer):
    self.name = name
    self.vocabulary_size = vocabulary_size
    self.dimension = dimension
    self.initializer = initializer

  def variable_name(self, outer_scope):
    return f"{outer_scope}/{self.name}" if outer_scope else self.name

  def variable(self, outer_scope, trainable=True):
    # Keep the partitioner of the scope the layer runs in, as TF does.
    partitioner = tf.compat.v1.get_variable_scope().partitioner
    scope = tf.compat.v1.VariableScope(
        reuse=tf.compat.v1.AUTO_REUSE, name=outer_scope,
        partitioner=partitioner)
    with tf.compat.v1.variable_scope(scope, auxiliary_name_scope=False):
      return tf.compat.v1.get_variable(
          self.name,
          shape=(self.vocabulary_size, self.dimension),
          dtype=tf.float32,
          initializer=self.initializer,
          trainable=trainable)

  def __repr__(self):
    return (f"SharedTable(name={self.name!r}, vocabulary_size="
            f"{self.vocabulary_size}, dimension={self.dimension})")


class SharedEmbeddingColumn(_TPUEmbeddingColumnBase):
  """A TPU embedding column whose table is shared with other columns."""

  def __init__(self, categorical_column, shared_table, combiner,
               max_sequence_length, learning_rate_fn, embedding_lookup_device,
               tensor_core_shape, use_safe_embedding_lookup):
    super().__init__(categorical_column, shared_table.dimension, combiner,
                     shared_table.initializer, max_sequence_length,
                     learning_rate_fn, embedding_lookup_device,
                     tensor_core_shape, use_safe_embedding_lookup)
    self.shared_table = shared_table

  @property
  def name(self):
    return f"{self.categorical_column.name}_shared_embedding"

  @property
  def shared_embedding_collection_name(self):
    return self.shared_table.name

  @property
  def _shared_embedding_collection_name(self):
    return self.shared_table.name

  @property
  def _initializer(self):
    return self.initializer

  @property
  def embedding_var_name(self):
    return self.shared_table.name

  def create_state(self, state_manager):
    del state_manager  # The shared table is created on first use.

  def _register_v2(self, source):
    source.register_variable(
        self, self.shared_table.variable_name(_current_scope()))

  def _table_v2(self, state_manager):
    del state_manager
    return self.shared_table.variable(_current_scope())

  def _outer_scope_v1(self):
    """The scope input_layer was called in: input_layer opens
    `input_layer[_N]/<column scope>[_N]` below it."""
    parts = _current_scope().split("/")
    if (len(parts) >= 2 and re.fullmatch(r"input_layer(_\d+)?", parts[-2]) and
        re.fullmatch(re.escape(self._var_scope_name) + r"(_\d+)?", parts[-1])):
      parts = parts[:-2]
    return "/".join(p for p in parts if p)

  def _variable_name_v1(self):
    return self.shared_table.variable_name(self._outer_scope_v1())

  def _table_v1(self, weight_collections, trainable):
    del weight_collections  # One variable serves every column of the group.
    return self.shared_table.variable(
        self._outer_scope_v1(), trainable=True if trainable is None else trainable)


# The graph collection `<this>:<collection name>` holds the variable name a
# legacy shared group's first use registered with an engine (no variable
# exists then), which every later use of the group registers again.
_LEGACY_REGISTERED = "tpu_embedding_columns.legacy_shared_variable_name"


class LegacySharedEmbeddingColumn(SharedEmbeddingColumn):
  """A shared column named as TF1's TPU shared columns were
  (`tpu_embedding_columns.legacy.shared_embedding_columns`).

  On the v1 path (`input_layer`, `_get_dense_tensor`): `_var_scope_name` is
  the shared collection name, so `input_layer` opens
  `input_layer/<collection name>` for each column of the group. The first
  use creates one variable `embedding_weights` in the variable scope current
  there and keeps it in the graph collection named by the collection name;
  every other use (another column, layer or scope) reuses it. With an engine
  installed, every column of the group registers that first name.

  On the v2 path (DenseFeatures; TF1's columns had none) the variable is
  named as `SharedEmbeddingColumn` names it, unless a v1 use in the same
  graph created it first; either way the graph keeps one variable per group.
  """

  @property
  def _var_scope_name(self):
    return self.shared_table.name

  def _group_variable(self):
    """The group's variable kept in the graph collection named by the
    collection name, or None before its first use."""
    if tf.executing_eagerly():
      return None
    found = tf.compat.v1.get_collection(self.shared_table.name)
    if not found:
      return None
    if len(found) > 1:
      raise ValueError(
          f"Column {self.name!r}: graph collection "
          f"{self.shared_table.name!r} (the shared_embedding_collection_name "
          f"of its group) can only hold the group's one variable, but holds "
          f"{len(found)} items: {found}. Choose a collection name nothing "
          "else uses, or add nothing to that collection yourself.")
    variable = found[0]
    shape = (self.vocabulary_size, self.dimension)
    if variable.get_shape() != shape:
      raise ValueError(
          f"Column {self.name!r}: graph collection "
          f"{self.shared_table.name!r} (the shared_embedding_collection_name "
          f"of its group) holds {_variable_op_name(variable)!r} of shape "
          f"{variable.get_shape()}, but the group's table has shape "
          f"{tf.TensorShape(shape)}. Choose a collection name nothing else "
          "uses, or add nothing to that collection yourself.")
    return variable

  def _first_name(self, name_here):
    """The group's variable name in this graph: that of its variable if it
    exists, else the first name registered, else `name_here` (recorded)."""
    variable = self._group_variable()
    if variable is not None:
      return _variable_op_name(variable)
    graph = tf.compat.v1.get_default_graph()
    registered = graph.get_collection_ref(
        f"{_LEGACY_REGISTERED}:{self.shared_table.name}")
    if not registered:
      registered.append(name_here)
    return registered[0]

  def _variable_name_v1(self):
    return self._first_name(_scoped(EMBEDDING_WEIGHTS))

  def _table_v1(self, weight_collections, trainable):
    variable = self._group_variable()
    if variable is not None:
      return variable
    variable = _embedding_weights_v1(self, weight_collections, trainable)
    tf.compat.v1.add_to_collection(self.shared_table.name, variable)
    return variable

  def _register_v2(self, source):
    if tf.executing_eagerly():
      super()._register_v2(source)
      return
    source.register_variable(
        self,
        self._first_name(self.shared_table.variable_name(_current_scope())))

  def _table_v2(self, state_manager):
    variable = self._group_variable()
    if variable is not None:
      return variable
    variable = super()._table_v2(state_manager)
    if not tf.executing_eagerly():
      tf.compat.v1.add_to_collection(self.shared_table.name, variable)
    return variable


def _variable_op_name(variable):
  """A variable's (or partitioned variable's) name without ':0'."""
  if isinstance(variable, tf.Variable):
    return variable.op.name
  return variable.name


def _embedding_weights_v1(column, weight_collections, trainable):
  """A v1 column's `embedding_weights` variable in the current variable
  scope, as TF's v1 columns create it (in GLOBAL_VARIABLES whatever
  `weight_collections` lists)."""
  if weight_collections is not None and (
      tf.compat.v1.GraphKeys.GLOBAL_VARIABLES not in weight_collections):
    weight_collections = list(weight_collections) + [
        tf.compat.v1.GraphKeys.GLOBAL_VARIABLES
    ]
  return tf.compat.v1.get_variable(
      EMBEDDING_WEIGHTS,
      shape=(column.vocabulary_size, column.dimension),
      dtype=tf.float32,
      initializer=column.initializer,
      trainable=True if trainable is None else trainable,
      collections=weight_collections)


def _weighted_pair(categorical, ids, weights):
  """(ids, weights) of a weighted categorical column. Integer weights are
  cast to float32 first, as TF's TPU input path does (its CPU path refuses
  them); the rest is the column's own weight handling."""
  if weights.dtype.is_integer and categorical.dtype.is_floating:
    if isinstance(weights, tf.SparseTensor):
      weights = tf.SparseTensor(weights.indices,
                                tf.cast(weights.values, categorical.dtype),
                                weights.dense_shape)
    else:
      weights = tf.cast(weights, categorical.dtype)
  return CategoricalColumn.IdWeightPair(
      ids, categorical._transform_weight_tensor(weights))


def _current_scope():
  return tf.compat.v1.get_variable_scope().name


def _scoped(name):
  scope = _current_scope()
  return f"{scope}/{name}" if scope else name


def _state_manager_variable_name(state_manager, name):
  """The full name `state_manager.create_variable(name=...)` would give here.

  TF's own state manager (compat.v1 DenseFeatures, SequenceFeatures) creates
  variables under the variable scope; the one of Keras' v2 DenseFeatures (a
  subclass) creates layer weights, named by the name scope.
  """
  # TF's class itself, not a subclass: Keras' subclass names by name scope.
  if type(state_manager) is _fc_v2._StateManagerImpl:
    return _scoped(name)
  scope = tf.compat.v1.get_default_graph().get_name_scope()
  return f"{scope}/{name}" if scope else name
