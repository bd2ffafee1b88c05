"""Running an `estimator_spec` model on a real TPU through TF's TPUEstimator.

`DelegatedTPUEstimator` is TF 2.15's `tf.compat.v1.estimator.tpu.
TPUEstimator`, built with the spec converted by `to_tensorflow` and with the
user's model_fn wrapped so that OUR columns work inside TF's TPU step:

* On TF's TPU path, TF's TPUEstimator replaces `features[key]` of every
  configured feature by its activation (and adds `<key>_seq_length_` for
  sequence features) before calling model_fn; TF's own columns read them
  from there. While the wrapped model_fn runs inside TF's TPU computation,
  a `FeatureActivationSource` is installed, so our embedding-core columns
  return `features[column.feature_key]` (and, for sequence columns,
  `(features[key], features[key + '_seq_length_'])`). They also record
  their variable scope where TF's TPUEstimator looks for it, so the TPU
  tables get the variable names our CPU lookups use (checkpoints move
  between the TPU, `estimator_spec.TPUEstimator` on the host and TF's CPU
  path).
* Tensor-core columns keep their own lookup: TF hands them padded ids with a
  mask (`<key>__TENSOR_CORE_MASK`); the wrapper turns the pair back into
  sparse ids before model_fn sees them.
* Outside TF's TPU computation (CPU evaluation with `eval_on_tpu=False`,
  CPU serving export) the columns do their own CPU lookups, as everywhere.
* A `TPUEstimatorSpec` of estimator_spec is handed to TF as TF's own class.

Before train/evaluate/predict the TPU's master is probed (a TCP connection,
then a device listing, each bounded by `REACHABILITY_TIMEOUT_SECONDS`): TF
itself would retry for a day when the master does not answer. A master that
does not answer, or shows no TPU, raises `TPUNotReachableError` naming it.
"""
import collections
import socket
import urllib.parse

from estimator_spec import tf215

tf215.require("estimator_spec.interop.delegate_to_tensorflow and "
              "DelegatedTPUEstimator (TF's own TPUEstimator on a TPU)")

# The imports below load TF 2.15's TPU estimator; they follow the check
# above so that without it the import fails with that check's message
# (what to install), not with the name of a missing module.
import tensorflow as tf
from tensorflow.python.tpu import feature_column as _tf_tpu_columns
from tensorflow.python.tpu import tpu as _tf_tpu
from tensorflow.python.tpu import tpu_function as _tf_tpu_function
from tensorflow_estimator.python.estimator.tpu import tpu_estimator as _tf_tpu_estimator

from tpu_embedding_columns import context as _context
from tpu_embedding_columns.errors import TPUNotReachableError

from estimator_spec.estimator import calling
from estimator_spec.estimator import tpu_context
from estimator_spec.interop import _tensorflow
from estimator_spec.config import topology as config_lib

REACHABILITY_TIMEOUT_SECONDS = 10.0


def in_tpu_computation():
  """True while TF builds the replicated TPU computation of a training,
  evaluation or prediction step (not its CPU paths or TPU serving export)."""
  if _tf_tpu.under_tpu_inference_context():
    return False
  return _tf_tpu_function.get_tpu_context().number_of_shards is not None


class FeatureActivationSource(_context.ActivationSource):
  """Feeds our columns from the activations TF's TPUEstimator put into the
  features dict.

  Args:
    features: the features dict model_fn received.
    model: the `EmbeddingModel` of the estimator's spec (to check that a
      column used in model_fn is configured).
  """

  def __init__(self, features, model):
    self._features = features
    self._model = model
    self.used = collections.OrderedDict()

  def _activation(self, column, key):
    feature = self._model.feature_of_column(column)
    if key not in self._features:
      raise ValueError(
          f"model_fn: column {column.name!r} needs the activation "
          f"features[{key!r}] that TF's TPUEstimator provides on the TPU, "
          "but the features dict has no such key (keys: "
          f"{sorted(self._features)}).")
    self.used[feature.name] = column
    return self._features[key]

  def register_variable(self, column, variable_name):
    # TF's TPUEstimator names the TPU tables from the graph collection that
    # its own columns fill with {embedding var name: (scope, name)}: the
    # first use records a table; a later use must agree on the name, and a
    # non-shared table also on the variable scope (as TF's columns check).
    scope, _, name = variable_name.rpartition("/")
    graph = tf.compat.v1.get_default_graph()
    collection = graph.get_collection_ref(_tf_tpu_columns._TPU_FC_TO_SCOPE)
    if not collection:
      collection.append({})
    var_name = column.embedding_var_name
    recorded = collection[0].setdefault(var_name, (scope, name))
    shared = hasattr(column, "shared_table")
    if recorded[0] != scope and not shared:
      raise ValueError(
          f"model_fn: For embedding var name {var_name}, the variable scope "
          f"name is different, got {scope}; expected {recorded[0]}. On a TPU "
          f"the table of column {column.name!r} has one name: use the "
          "column's layer once, or in one variable scope.")
    if recorded[1] != name:
      raise ValueError(
          f"model_fn: For embedding var name {var_name}, the embedding name "
          f"is different, got {name}; expected {recorded[1]} (column "
          f"{column.name!r}).")

  def dense_activation(self, column):
    return self._activation(column, column.feature_key)

  def sequence_activation(self, column):
    return (self._activation(column, column.feature_key),
            self._activation(column, column.sequence_length_feature_key))


def _sparse_from_padded(ids, mask):
  """The sparse ids that TF padded to [batch, width] with a 0/1 mask."""
  indices = tf.where(tf.cast(mask, tf.bool))
  return tf.SparseTensor(indices, tf.gather_nd(ids, indices),
                         tf.shape(ids, out_type=tf.int64))


def wrap_model_fn(model_fn, spec):
  """The model_fn TF's TPUEstimator calls: the user's `model_fn`, with our
  columns fed from TF's activations inside the TPU computation.

  Args:
    model_fn: the user's model_fn (features[, labels, mode, params,
      config]), written with estimator_spec / tpu_embedding_columns columns.
    spec: the `estimator_spec.EmbeddingConfigSpec`, or None.
  """
  user_args = calling.fn_args(model_fn)
  model = spec.model if spec is not None else None
  tensor_core = list(spec.tensor_core_feature_columns or ()) if spec else []

  def tpu_model_fn(features, labels, mode, params, config):
    kwargs = calling.model_fn_kwargs(user_args, labels, mode, params, config)
    if model is None or not in_tpu_computation() or not isinstance(
        features, dict):
      return _to_tensorflow_spec(model_fn(features=features, **kwargs))
    features = dict(features)
    for column in tensor_core:
      mask_key = column.tensor_core_mask_key
      if mask_key in features and column.feature_key in features:
        features[column.feature_key] = _sparse_from_padded(
            features[column.feature_key], features.pop(mask_key))
    source = FeatureActivationSource(features, model)
    with _context.activation_source(source):
      return _to_tensorflow_spec(model_fn(features=features, **kwargs))

  return tpu_model_fn


def _to_tensorflow_spec(spec):
  """TF's TPUEstimatorSpec for ours (same fields); others unchanged."""
  if isinstance(spec, (tf.estimator.EstimatorSpec,
                       _tf_tpu_estimator.TPUEstimatorSpec)):
    return spec
  fields = getattr(spec, "_fields", None)
  if fields is not None and tuple(fields) == tuple(
      _tf_tpu_estimator.TPUEstimatorSpec._fields):
    return _tf_tpu_estimator.TPUEstimatorSpec(**spec._asdict())
  raise TypeError(
      "model_fn must return a TPUEstimatorSpec (estimator_spec's or TF's) or "
      f"a tf.estimator.EstimatorSpec; got {type(spec).__name__}.")


def master_address(config, mode):
  """The master TF's TPUEstimator connects to in `mode`."""
  if mode == tf.estimator.ModeKeys.EVAL:
    return config.evaluation_master or config.master
  return config.master


def check_tpu_reachable(config, mode, timeout=None):
  """Raises `TPUNotReachableError` unless the grpc master of `config` answers
  within `timeout` seconds (default `REACHABILITY_TIMEOUT_SECONDS`) and
  lists TPU devices: first a TCP connection, then the device listing TF's
  TPUEstimator asks for (TF itself waits 5 minutes per attempt and retries
  for a day). Masters that are not `grpc://` addresses (a local TPU) are
  not probed."""
  master = master_address(config, mode)
  if not master or not master.startswith("grpc://"):
    return
  timeout = REACHABILITY_TIMEOUT_SECONDS if timeout is None else timeout
  parsed = urllib.parse.urlparse(master)
  cluster = getattr(config, "cluster", None)
  named_by = (f"the RunConfig's cluster ({type(cluster).__name__})"
              if cluster is not None else "the RunConfig's master")
  advice = ("Check the TPU's name or address and that it is running, or pass "
            "use_tpu=False to run the model on the host embedding engine.")
  try:
    port = parsed.port
  except ValueError:
    port = None
  if not parsed.hostname or port is None:
    raise TPUNotReachableError(
        f"TPUEstimator(use_tpu=True): the TPU master {master!r} named by "
        f"{named_by} is not a 'grpc://host:port' address. {advice}")
  try:
    socket.create_connection((parsed.hostname, port), timeout=timeout).close()
    devices = _list_devices(master, timeout)
  except (OSError, tf.errors.OpError) as error:
    raise TPUNotReachableError(
        f"TPUEstimator(use_tpu=True): no TPU answers at {master!r} (named by "
        f"{named_by}) within {timeout:g} s: {type(error).__name__}: "
        f"{error}. {advice}") from error
  if not any(d.device_type == "TPU" for d in devices):
    raise TPUNotReachableError(
        f"TPUEstimator(use_tpu=True): the master {master!r} (named by "
        f"{named_by}) answers but has no TPU devices (devices: "
        f"{[d.name for d in devices]}). {advice}")


def _list_devices(master, timeout):
  """The devices a TF session at `master` lists, waiting at most
  `timeout` seconds."""
  config = tf.compat.v1.ConfigProto(
      operation_timeout_in_ms=max(1, int(timeout * 1000)))
  with tf.Graph().as_default():
    with tf.compat.v1.Session(master, config=config) as session:
      return session.list_devices()


class DelegatedTPUEstimator(_tf_tpu_estimator.TPUEstimator):
  """TF 2.15's TPUEstimator for a model written with estimator_spec.

  What `estimator_spec.TPUEstimator(use_tpu=True, ...)` returns when its
  RunConfig names a TPU. Arguments are TF's TPUEstimator's, except that
  `embedding_config_spec` is an `estimator_spec.EmbeddingConfigSpec`
  (converted with `to_tensorflow`; the original stays in
  `estimator_spec_embedding_config`) and model_fn uses our columns (see the
  module docstring). `params['batch_size']` is what TF gives: the per-core
  batch in model_fn on the TPU, the per-host batch in input_fn.

  train/evaluate/predict first check that the TPU answers
  (`check_tpu_reachable`); evaluation with `eval_on_tpu=False` runs on the
  CPU and is not checked.
  """

  def __init__(self, model_fn, embedding_config_spec=None, **kwargs):
    self.estimator_spec_embedding_config = embedding_config_spec
    tf_spec = (None if embedding_config_spec is None else
               _tensorflow.to_tensorflow(embedding_config_spec))
    self._eval_on_tpu_setting = kwargs.get("eval_on_tpu", True)
    super().__init__(
        model_fn=wrap_model_fn(model_fn, embedding_config_spec),
        embedding_config_spec=tf_spec,
        **kwargs)

  def _assert_members_are_not_overridden(self):
    # train/evaluate/predict are extended below, as TF's TPUEstimator does.
    pass

  def train(self, input_fn, hooks=None, steps=None, max_steps=None,
            saving_listeners=None):
    check_tpu_reachable(self.config, tf.estimator.ModeKeys.TRAIN)
    return super().train(input_fn, hooks=hooks, steps=steps,
                         max_steps=max_steps,
                         saving_listeners=saving_listeners)

  def evaluate(self, input_fn, steps=None, hooks=None, checkpoint_path=None,
               name=None):
    if self._eval_on_tpu_setting:
      check_tpu_reachable(self.config, tf.estimator.ModeKeys.EVAL)
    return super().evaluate(input_fn, steps=steps, hooks=hooks,
                            checkpoint_path=checkpoint_path, name=name)

  def predict(self, input_fn, predict_keys=None, hooks=None,
              checkpoint_path=None, yield_single_examples=True):
    check_tpu_reachable(self.config, tf.estimator.ModeKeys.PREDICT)
    return super().predict(input_fn, predict_keys=predict_keys, hooks=hooks,
                           checkpoint_path=checkpoint_path,
                           yield_single_examples=yield_single_examples)


def _tpu_description(config):
  cluster = getattr(config, "cluster", None)
  if cluster is not None:
    return f"cluster {type(cluster).__name__}"
  master = getattr(config, "master", "")
  return f"master {master!r}" if master else "a local TPU device"


def delegate_to_tensorflow(model_fn, embedding_config_spec, config,
                           train_batch_size, **kwargs):
  """The `DelegatedTPUEstimator` that `TPUEstimator(use_tpu=True, ...)`
  becomes for a TPU its RunConfig names (`tpu_named`); its arguments are
  the TPUEstimator's, already checked."""
  if embedding_config_spec is not None and getattr(
      getattr(config, "tpu_config", None), "num_shards", None):
    # The TPU topology must fit the spec and the batch (as on the host).
    hosts, cores, _ = tpu_context.table_topology(config)
    config_lib.TopologyConfig(
        embedding_config_spec, batch_size=train_batch_size, num_hosts=hosts,
        num_cores=cores, mode=tf.estimator.ModeKeys.TRAIN)
  tf.compat.v1.logging.info(
      "TPUEstimator(use_tpu=True): running on the TPU of %s through "
      "TensorFlow's TPUEstimator.", _tpu_description(config))
  return DelegatedTPUEstimator(
      model_fn=model_fn, embedding_config_spec=embedding_config_spec,
      config=config, train_batch_size=train_batch_size, **kwargs)
