"""Serving inputs and served outputs of an exported model: the counterpart
of `tf.estimator.export` (docs/estimator.md, 'Two stacks').

A serving_input_receiver_fn, called by `Estimator.export_saved_model` in
the serving graph, returns a `ServingInputReceiver` (or a
`TensorServingInputReceiver`): the tensors a server feeds and the features
model_fn receives from them. `build_parsing_serving_input_receiver_fn` and
`build_raw_serving_input_receiver_fn` make the two usual ones: fed
serialized tf.Examples, or fed the features themselves.

model_fn names what the server returns with `ExportOutput`s in its PREDICT
spec's `export_outputs`: a `PredictOutput` (any tensors), a
`ClassificationOutput` (classes and/or scores) or a `RegressionOutput` (one
value). Each turns into one SignatureDef of the SavedModel
(`signatures.build_signature_defs`). The receivers' checks, default keys
and placeholders, and the outputs' checks and SignatureDefs, are those of
TF 2.15's `tf.estimator.export`; only serving exports exist here, so there
is no `EvalOutput`.
"""
import abc
import collections
import collections.abc

import tensorflow as tf

__all__ = [
    "ExportOutput", "PredictOutput", "ClassificationOutput",
    "RegressionOutput", "ServingInputReceiver", "TensorServingInputReceiver",
    "build_parsing_serving_input_receiver_fn",
    "build_raw_serving_input_receiver_fn"
]

# The key a single tensor gets where a dict of tensors is expected.
SINGLE_FEATURE_KEY = "feature"
SINGLE_RECEIVER_KEY = "input"
SINGLE_OUTPUT_KEY = "output"

# A tuple output key (from a multi-head model) is joined with this.
OUTPUT_KEY_SEPARATOR = "/"

# The parsing receiver's placeholder of serialized tf.Examples: its name in
# the graph and its key among the receiver tensors.
EXAMPLES_PLACEHOLDER_NAME = "input_example_tensor"
EXAMPLES_RECEIVER_KEY = "examples"

# What a receiver may hold: the tensors a server can feed or a model take.
_RECEIVABLE_TYPES = (tf.Tensor, tf.sparse.SparseTensor, tf.RaggedTensor)


def receiver_dict(receiver_tensors):
  """`receiver_tensors` as a dict: a single tensor goes under 'input'."""
  if isinstance(receiver_tensors, dict):
    return receiver_tensors
  return {SINGLE_RECEIVER_KEY: receiver_tensors}


class ExportOutput(abc.ABC):
  """One output of a served model, named in model_fn's `export_outputs`.

  A subclass says which tensors the server returns and with which serving
  API (method name), by building the SignatureDef that joins them to the
  tensors the server feeds.
  """

  @abc.abstractmethod
  def as_signature_def(self, receiver_tensors):
    """The SignatureDef serving this output from `receiver_tensors`.

    Args:
      receiver_tensors: {input name: tensor} the server feeds (a single
        tensor stands for {'input': tensor}).

    Returns:
      A `SignatureDef` proto.

    Raises:
      ValueError: when this output cannot be served from those inputs (the
        export then leaves the signature out).
    """


class PredictOutput(ExportOutput):
  """Any named tensors, served through the Predict API.

  Args:
    outputs: a `tf.Tensor` (served under the name 'output') or a dict of
      name to `tf.Tensor`. A name may be a tuple of strings (a multi-head
      model's), which is joined with '/'.

  Raises:
    ValueError: if a name is not a string or a value is not a `tf.Tensor`.
  """

  def __init__(self, outputs):
    self._outputs = _checked_outputs(outputs)

  @property
  def outputs(self):
    """{name: tensor} the Predict signature returns."""
    return self._outputs

  def as_signature_def(self, receiver_tensors):
    return tf.compat.v1.saved_model.predict_signature_def(
        receiver_dict(receiver_tensors), self._outputs)


def _checked_outputs(outputs):
  """PredictOutput's outputs as {string name: tensor}, checked."""
  if not isinstance(outputs, dict):
    outputs = {SINGLE_OUTPUT_KEY: outputs}
  checked = {}
  for key, value in outputs.items():
    if isinstance(key, tuple):
      key = OUTPUT_KEY_SEPARATOR.join(key)
    if not isinstance(key, str):
      raise ValueError(
          f"PredictOutput: output names must be strings (or tuples of "
          f"strings); got {key!r} of type {type(key).__name__}.")
    if not isinstance(value, tf.Tensor):
      raise ValueError(
          f"PredictOutput: the output {key!r} must be a tf.Tensor; got "
          f"{value!r}. Serve a SparseTensor or RaggedTensor through its "
          "dense tensors (e.g. tf.sparse.to_dense).")
    checked[key] = value
  return checked


def _is_tensor_of(value, dtype_test):
  return isinstance(value, tf.Tensor) and dtype_test(value.dtype)


def _single_string_input(receiver_tensors, owner):
  """The one string tensor a Classify or Regress signature is fed."""
  receiver_tensors = receiver_dict(receiver_tensors)
  if len(receiver_tensors) == 1:
    (examples,) = receiver_tensors.values()
    if examples.dtype == tf.string:
      return examples
  raise ValueError(
      f"{owner} is served from exactly one string tensor (of serialized "
      f"tf.Examples); these receiver tensors are not that: "
      f"{receiver_tensors}. Make the serving_input_receiver_fn take one "
      "string placeholder and parse it (tf.io.parse_example, or "
      "build_parsing_serving_input_receiver_fn), or serve this output with "
      "a PredictOutput.")


class ClassificationOutput(ExportOutput):
  """Classes and/or their scores, served through the Classify API.

  With scores alone, they are one per class, in class id order; with
  classes alone, they are the top classes, best first; with both, each
  score belongs to the class at the same position.

  Args:
    scores: a float `tf.Tensor` of class scores, or None.
    classes: a string `tf.Tensor` of class labels, or None.

  Raises:
    ValueError: if both are None, or either is not a tensor of its dtype.
  """

  def __init__(self, scores=None, classes=None):
    if scores is not None and not _is_tensor_of(
        scores, lambda dtype: dtype.is_floating):
      raise ValueError(
          f"ClassificationOutput: `scores` must be a float tf.Tensor (float32 "
          f"to be served); got {scores!r}.")
    if classes is not None and not _is_tensor_of(
        classes, lambda dtype: dtype == tf.string):
      raise ValueError(
          f"ClassificationOutput: `classes` must be a string tf.Tensor of "
          f"class labels (map class ids to names first); got {classes!r}.")
    if scores is None and classes is None:
      raise ValueError(
          "ClassificationOutput: give `scores`, `classes` or both; both "
          "are None.")
    self._scores = scores
    self._classes = classes

  @property
  def scores(self):
    """The float tensor of scores, or None."""
    return self._scores

  @property
  def classes(self):
    """The string tensor of class labels, or None."""
    return self._classes

  def as_signature_def(self, receiver_tensors):
    examples = _single_string_input(receiver_tensors, "ClassificationOutput")
    return tf.compat.v1.saved_model.classification_signature_def(
        examples, self._classes, self._scores)


class RegressionOutput(ExportOutput):
  """One predicted value per example, served through the Regress API.

  Args:
    value: a float `tf.Tensor` (float32 to be served).

  Raises:
    ValueError: if `value` is not a float tensor.
  """

  def __init__(self, value):
    if not _is_tensor_of(value, lambda dtype: dtype.is_floating):
      raise ValueError(
          f"RegressionOutput: `value` must be a float tf.Tensor (float32 to "
          f"be served); got {value!r}.")
    self._value = value

  @property
  def value(self):
    """The float tensor of predicted values."""
    return self._value

  def as_signature_def(self, receiver_tensors):
    examples = _single_string_input(receiver_tensors, "RegressionOutput")
    return tf.compat.v1.saved_model.regression_signature_def(
        examples, self._value)


def _check_receivable(value, what):
  if not isinstance(value, _RECEIVABLE_TYPES):
    raise ValueError(
        f"{what} must be a tf.Tensor, tf.SparseTensor or tf.RaggedTensor; "
        f"got {value!r}.")


def _checked_tensors(tensors, what, single_key, int_keys=False):
  """`tensors` as a dict (a single one under `single_key`), checked.

  Args:
    tensors: a tensor or a dict of name to tensor.
    what: the argument's name, for errors.
    single_key: the key a single tensor gets.
    int_keys: whether names may be ints as well as strings.

  Returns:
    The dict given, or a new one holding the single tensor.

  Raises:
    ValueError: if `tensors` is None, a name is not a string (or int, when
      allowed) or a value is not a tensor, SparseTensor or RaggedTensor.
  """
  if tensors is None:
    raise ValueError(f"ServingInputReceiver: `{what}` must be given; got "
                     "None.")
  if not isinstance(tensors, dict):
    tensors = {single_key: tensors}
  key_types = (str, int) if int_keys else (str,)
  for key, value in tensors.items():
    if not isinstance(key, key_types):
      raise ValueError(
          f"ServingInputReceiver: the names in `{what}` must be "
          f"{'strings or ints' if int_keys else 'strings'}; got {key!r} of "
          f"type {type(key).__name__}.")
    _check_receivable(value, f"ServingInputReceiver: `{what}`[{key!r}]")
  return tensors


def _checked_alternatives(alternatives):
  """{alternative name: receiver tensors dict}, checked, or None."""
  if alternatives is None:
    return None
  if not isinstance(alternatives, dict):
    raise ValueError(
        "ServingInputReceiver: `receiver_tensors_alternatives` must be a "
        "dict of name to a tensor or a dict of tensors; got "
        f"{alternatives!r}.")
  return {
      name: _checked_tensors(tensors,
                             f"receiver_tensors_alternatives[{name!r}]",
                             SINGLE_RECEIVER_KEY)
      for name, tensors in alternatives.items()
  }


_RECEIVER_FIELDS = ("features", "receiver_tensors",
                    "receiver_tensors_alternatives")


class ServingInputReceiver(
    collections.namedtuple("ServingInputReceiver", _RECEIVER_FIELDS)):
  """What a serving_input_receiver_fn returns: the fed tensors and the
  features model_fn gets from them.

  Args:
    features: a tensor, SparseTensor or RaggedTensor, or a dict of name
      (string or int) to one; a single one reaches model_fn as
      {'feature': tensor} (use `TensorServingInputReceiver` to pass it as it
      is).
    receiver_tensors: the tensors the server feeds by default (usually one
      string placeholder of serialized tf.Examples): a tensor (named
      'input') or a dict of string name to tensor.
    receiver_tensors_alternatives: None, or {name: a tensor or a dict of
      tensors} fed instead of `receiver_tensors` by extra signatures, named
      '<name>:<export output name>' (e.g. the parsed features, fed past
      the parsing).

  Raises:
    ValueError: if `features` or `receiver_tensors` is None, or a name or a
      value is not of the kinds above.
  """

  def __new__(cls, features, receiver_tensors,
              receiver_tensors_alternatives=None):
    return super().__new__(
        cls,
        features=_checked_tensors(features, "features", SINGLE_FEATURE_KEY,
                                  int_keys=True),
        receiver_tensors=_checked_tensors(receiver_tensors,
                                          "receiver_tensors",
                                          SINGLE_RECEIVER_KEY),
        receiver_tensors_alternatives=_checked_alternatives(
            receiver_tensors_alternatives))


class TensorServingInputReceiver(
    collections.namedtuple("TensorServingInputReceiver", _RECEIVER_FIELDS)):
  """A `ServingInputReceiver` whose model_fn takes one tensor, not a dict.

  `features` is kept as the single tensor it is; `receiver_tensors` and
  `receiver_tensors_alternatives` become dicts as in `ServingInputReceiver`
  (every served input needs a name).

  Args:
    features: a tensor, SparseTensor or RaggedTensor, model_fn's features.
    receiver_tensors: as in `ServingInputReceiver`.
    receiver_tensors_alternatives: as in `ServingInputReceiver`.

  Raises:
    ValueError: if `features` is not a single tensor, SparseTensor or
      RaggedTensor, or the other arguments are invalid.
  """

  def __new__(cls, features, receiver_tensors,
              receiver_tensors_alternatives=None):
    if features is None:
      raise ValueError("TensorServingInputReceiver: `features` must be "
                       "given; got None.")
    _check_receivable(features, "TensorServingInputReceiver: `features`")
    receiver = ServingInputReceiver(features, receiver_tensors,
                                    receiver_tensors_alternatives)
    return super().__new__(
        cls,
        features=receiver.features[SINGLE_FEATURE_KEY],
        receiver_tensors=receiver.receiver_tensors,
        receiver_tensors_alternatives=receiver.receiver_tensors_alternatives)


def build_parsing_serving_input_receiver_fn(feature_spec,
                                            default_batch_size=None):
  """A serving_input_receiver_fn fed serialized tf.Examples.

  The receiver fn makes a string placeholder 'input_example_tensor' of
  shape [default_batch_size] (received as 'examples') and parses it with
  `feature_spec` into the features.

  Args:
    feature_spec: {feature name: `tf.io.FixedLenFeature`,
      `VarLenFeature`, ...}, as `tf.io.parse_example` takes.
    default_batch_size: the batch size the placeholder fixes, or None for
      any (usually best).

  Returns:
    A function of no arguments returning a `ServingInputReceiver`.
  """

  def serving_input_receiver_fn():
    examples = tf.compat.v1.placeholder(
        dtype=tf.string, shape=[default_batch_size],
        name=EXAMPLES_PLACEHOLDER_NAME)
    features = tf.compat.v1.io.parse_example(examples, feature_spec)
    return ServingInputReceiver(features, {EXAMPLES_RECEIVER_KEY: examples})

  return serving_input_receiver_fn


def _placeholder_like(tensor, default_batch_size):
  """A placeholder of `tensor`'s dtype and shape, its first dimension
  replaced by `default_batch_size`, named after `tensor`'s op when it has
  one (a graph tensor)."""
  shape = tf.TensorShape([default_batch_size]).concatenate(
      tensor.get_shape()[1:])
  try:
    name = tensor.op.name
  except AttributeError:
    name = None
  return tf.compat.v1.placeholder(dtype=tensor.dtype, shape=shape, name=name)


def build_raw_serving_input_receiver_fn(features, default_batch_size=None):
  """A serving_input_receiver_fn fed the features themselves.

  The receiver fn makes one placeholder per feature, like it in dtype and
  in shape past the batch dimension (which becomes `default_batch_size`),
  named after the example tensor's op; each is both a receiver tensor and
  the feature of the same name.

  Args:
    features: {feature name: an example tensor of the feature}.
    default_batch_size: the batch size the placeholders fix, or None for
      any (usually best).

  Returns:
    A function of no arguments returning a `ServingInputReceiver`.

  Raises:
    TypeError: if `features` is not a mapping.
  """
  if not isinstance(features, collections.abc.Mapping):
    raise TypeError(
        "build_raw_serving_input_receiver_fn: `features` must be a dict of "
        f"feature name to an example tensor; got {features!r}.")

  def serving_input_receiver_fn():
    placeholders = {
        name: _placeholder_like(tensor, default_batch_size)
        for name, tensor in features.items()
    }
    return ServingInputReceiver(placeholders, placeholders)

  return serving_input_receiver_fn
