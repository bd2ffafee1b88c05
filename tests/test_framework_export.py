"""The framework's `export` (serving input receivers, export outputs) and
`signatures` (the SignatureDefs and directory of a serving export).

Behaviour tests run on both stacks: what a program relies on (the
receivers' features, receiver tensors and placeholders; the signatures'
method names, keys and tensors; which signatures an export keeps; the
errors; the export directory's name), and one SavedModel written with the
signatures, loaded and run.

The `tf215` tests compare with TF 2.15's own implementation
(tensorflow-estimator's `export_lib` and TF's `model_utils.export_utils`)
on the same graphs: the SignatureDef protos, the receiver fns' graphs and
placeholders, the directory names, and the kind of error on bad inputs.
"""
import logging
import os
import types

import numpy as np
import pytest
import tensorflow as tf

from estimator_spec.estimator.framework import export
from estimator_spec.estimator.framework import signatures

DEFAULT = tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY
FEATURE_SPEC = {
    "age": tf.io.FixedLenFeature([1], tf.float32),
    "tags": tf.io.VarLenFeature(tf.string),
}


def _floats(shape=(None, 3), name=None):
  return tf.compat.v1.placeholder(tf.float32, shape, name=name)


def _strings(shape=(None,), name=None):
  return tf.compat.v1.placeholder(tf.string, shape, name=name)


def _sparse():
  return tf.sparse.SparseTensor(
      tf.constant([[0, 0]], tf.int64), tf.constant([7], tf.int64),
      tf.constant([1, 4], tf.int64))


def _ragged():
  return tf.RaggedTensor.from_row_splits(
      tf.constant([1, 2, 3], tf.int64), tf.constant([0, 1, 3], tf.int64))


def _info(tensor):
  """(name, dtype, shape) a TensorInfo should record for `tensor`."""
  return (tensor.name, tensor.dtype.as_datatype_enum,
          tensor.shape.as_proto())


def _infos(tensor_infos):
  return {key: (info.name, info.dtype, info.tensor_shape)
          for key, info in tensor_infos.items()}


# ---------------------------------------------------------------- outputs


def test_predict_output_wraps_a_single_tensor_and_joins_tuple_keys():
  with tf.Graph().as_default():
    logits = _floats()
    assert export.PredictOutput(logits).outputs == {"output": logits}
    probabilities = tf.nn.softmax(logits)
    output = export.PredictOutput({("head", "probs"): probabilities,
                                   "logits": logits})
    assert output.outputs == {"head/probs": probabilities, "logits": logits}


def test_predict_signature_holds_every_input_and_output():
  with tf.Graph().as_default():
    examples, dense = _strings(name="examples"), _floats(name="dense")
    logits = tf.identity(dense, name="logits")
    signature = export.PredictOutput({"logits": logits}).as_signature_def(
        {"examples": examples, "dense": dense})
    assert signature.method_name == tf.saved_model.PREDICT_METHOD_NAME
    assert _infos(signature.inputs) == {"examples": _info(examples),
                                        "dense": _info(dense)}
    assert _infos(signature.outputs) == {"logits": _info(logits)}
    # A single receiver tensor is the input named 'input'.
    single = export.PredictOutput(logits).as_signature_def(dense)
    assert _infos(single.inputs) == {"input": _info(dense)}
    assert _infos(single.outputs) == {"output": _info(logits)}


@pytest.mark.parametrize("give", ["scores", "classes", "both"])
def test_classification_signature_outputs_what_was_given(give):
  with tf.Graph().as_default():
    examples = _strings()
    scores = tf.nn.softmax(_floats())
    classes = tf.constant([["a", "b", "c"]])
    kwargs = {"scores": scores, "classes": classes}
    if give != "both":
      kwargs = {give: kwargs[give]}
    output = export.ClassificationOutput(**kwargs)
    assert (output.scores, output.classes) == (kwargs.get("scores"),
                                               kwargs.get("classes"))
    signature = output.as_signature_def({"examples": examples})
    assert signature.method_name == tf.saved_model.CLASSIFY_METHOD_NAME
    assert _infos(signature.inputs) == {"inputs": _info(examples)}
    assert _infos(signature.outputs) == {
        key: _info(tensor) for key, tensor in kwargs.items()}


def test_regression_signature_maps_examples_to_outputs():
  with tf.Graph().as_default():
    examples, value = _strings(), tf.reduce_sum(_floats(), axis=1)
    output = export.RegressionOutput(value)
    assert output.value is value
    signature = output.as_signature_def(examples)
    assert signature.method_name == tf.saved_model.REGRESS_METHOD_NAME
    assert _infos(signature.inputs) == {"inputs": _info(examples)}
    assert _infos(signature.outputs) == {"outputs": _info(value)}


@pytest.mark.parametrize("make", [
    lambda: export.ClassificationOutput(scores=tf.nn.softmax(_floats())),
    lambda: export.RegressionOutput(tf.reduce_sum(_floats(), axis=1)),
], ids=["classification", "regression"])
@pytest.mark.parametrize("inputs", ["two_strings", "one_float"])
def test_classify_and_regress_need_one_string_input(make, inputs):
  with tf.Graph().as_default():
    output = make()
    receiver = ({"a": _strings(), "b": _strings()} if inputs == "two_strings"
                else {"x": _floats()})
    with pytest.raises(ValueError, match="exactly one string tensor"):
      output.as_signature_def(receiver)


def test_export_output_is_abstract():
  with pytest.raises(TypeError):
    export.ExportOutput()  # pylint: disable=abstract-class-instantiated


@pytest.mark.parametrize("make, message", [
    (lambda t: export.ClassificationOutput(), "both are None"),
    (lambda t: export.ClassificationOutput(scores=tf.cast(t, tf.int32)),
     "`scores` must be a float"),
    (lambda t: export.ClassificationOutput(classes=tf.cast(t, tf.int64)),
     "`classes` must be a string"),
    (lambda t: export.ClassificationOutput(scores=[0.5]),
     "`scores` must be a float"),
    (lambda t: export.RegressionOutput(tf.cast(t, tf.int32)),
     "`value` must be a float"),
    (lambda t: export.RegressionOutput(None), "`value` must be a float"),
    (lambda t: export.PredictOutput({1: t}), "must be strings"),
    (lambda t: export.PredictOutput({"s": _sparse()}), "must be a tf.Tensor"),
    (lambda t: export.PredictOutput(np.zeros(3)), "must be a tf.Tensor"),
])
def test_bad_export_outputs_are_value_errors(make, message):
  with tf.Graph().as_default():
    with pytest.raises(ValueError, match=message):
      make(_floats())


# -------------------------------------------------------------- receivers


def test_serving_input_receiver_wraps_single_tensors():
  with tf.Graph().as_default():
    examples, dense, raw = _strings(), _floats(), _strings()
    receiver = export.ServingInputReceiver(
        dense, examples, receiver_tensors_alternatives={"raw": raw})
    assert receiver.features == {"feature": dense}
    assert receiver.receiver_tensors == {"input": examples}
    assert receiver.receiver_tensors_alternatives == {"raw": {"input": raw}}
    assert receiver == (receiver.features, receiver.receiver_tensors,
                        receiver.receiver_tensors_alternatives)


def test_serving_input_receiver_takes_sparse_ragged_and_int_keys():
  with tf.Graph().as_default():
    sparse, ragged, examples = _sparse(), _ragged(), _strings()
    features = {"ids": sparse, 3: ragged}
    alternatives = {"parsed": {"ids": sparse, "lengths": ragged}}
    receiver = export.ServingInputReceiver(features, {"examples": examples},
                                           alternatives)
    assert receiver.features is features
    assert receiver.receiver_tensors == {"examples": examples}
    assert receiver.receiver_tensors_alternatives == alternatives
    assert receiver.receiver_tensors_alternatives is not alternatives


def test_tensor_serving_input_receiver_keeps_the_feature_tensor():
  with tf.Graph().as_default():
    examples, sparse = _strings(), _sparse()
    receiver = export.TensorServingInputReceiver(sparse, examples)
    assert receiver.features is sparse
    assert receiver.receiver_tensors == {"input": examples}
    assert receiver.receiver_tensors_alternatives is None


@pytest.mark.parametrize("make, message", [
    (lambda t: export.ServingInputReceiver(None, t), "`features` must be"),
    (lambda t: export.ServingInputReceiver(t, None),
     "`receiver_tensors` must be"),
    (lambda t: export.ServingInputReceiver({1.5: t}, t), "strings or ints"),
    (lambda t: export.ServingInputReceiver(t, {1: t}), "must be strings"),
    (lambda t: export.ServingInputReceiver({"a": [1.0]}, t),
     r"`features`\['a'\] must be a tf.Tensor"),
    (lambda t: export.ServingInputReceiver(t, t, [t]), "must be a dict"),
    (lambda t: export.ServingInputReceiver(t, t, {"alt": None}),
     r"`receiver_tensors_alternatives\['alt'\]` must be given"),
    (lambda t: export.ServingInputReceiver(t, t, {"alt": {2: t}}),
     "must be strings"),
    (lambda t: export.TensorServingInputReceiver(None, t), "must be given"),
    (lambda t: export.TensorServingInputReceiver({"a": t}, t),
     "`features` must be a tf.Tensor"),
])
def test_bad_receivers_are_value_errors(make, message):
  with tf.Graph().as_default():
    with pytest.raises(ValueError, match=message):
      make(_strings())


@pytest.mark.parametrize("batch", [None, 8])
def test_parsing_receiver_parses_one_string_placeholder(batch):
  with tf.Graph().as_default() as graph:
    receiver = export.build_parsing_serving_input_receiver_fn(
        FEATURE_SPEC, default_batch_size=batch)()
    (examples,) = receiver.receiver_tensors.values()
    assert list(receiver.receiver_tensors) == ["examples"]
    assert examples.name == "input_example_tensor:0"
    assert examples.op.type == "Placeholder" and examples.dtype == tf.string
    assert examples.shape.as_list() == [batch]
    assert receiver.receiver_tensors_alternatives is None
    assert sorted(receiver.features) == ["age", "tags"]
    assert isinstance(receiver.features["tags"], tf.sparse.SparseTensor)
    example = tf.train.Example(features=tf.train.Features(feature={
        "age": tf.train.Feature(float_list=tf.train.FloatList(value=[4.5])),
        "tags": tf.train.Feature(bytes_list=tf.train.BytesList(
            value=[b"x", b"y"]))}))
    with tf.compat.v1.Session(graph=graph) as session:
      age, tags = session.run(
          [receiver.features["age"], receiver.features["tags"].values],
          {examples: [example.SerializeToString()] * (batch or 2)})
    np.testing.assert_array_equal(age, [[4.5]] * (batch or 2))
    assert list(tags) == [b"x", b"y"] * (batch or 2)


@pytest.mark.parametrize("batch", [None, 4])
def test_raw_receiver_makes_placeholders_like_the_features(batch):
  with tf.Graph().as_default():
    dense = tf.zeros([2, 3], tf.float32, name="dense_example")
    ids = tf.constant([[1], [2]], tf.int64, name="ids_example")
  with tf.Graph().as_default():
    receiver = export.build_raw_serving_input_receiver_fn(
        {"dense": dense, "ids": ids}, default_batch_size=batch)()
    assert receiver.features == receiver.receiver_tensors
    got = {key: (t.name, t.op.type, t.dtype, t.shape.as_list())
           for key, t in receiver.receiver_tensors.items()}
    assert got == {
        "dense": ("dense_example:0", "Placeholder", tf.float32, [batch, 3]),
        "ids": ("ids_example:0", "Placeholder", tf.int64, [batch, 1])}


def test_raw_receiver_refuses_a_single_tensor():
  with tf.Graph().as_default():
    with pytest.raises(TypeError, match="must be a dict"):
      export.build_raw_serving_input_receiver_fn(_floats())


# ------------------------------------------------------------- signatures


def test_export_outputs_default_to_predicting_the_predictions():
  with tf.Graph().as_default():
    predictions = {"logits": _floats()}
    outputs = signatures.export_outputs_for_predictions(None, predictions)
    assert list(outputs) == [DEFAULT]
    assert outputs[DEFAULT].outputs == predictions


def test_a_single_export_output_is_also_the_default():
  with tf.Graph().as_default():
    given = {"scores": export.PredictOutput(_floats())}
    outputs = signatures.export_outputs_for_predictions(given, None)
    assert list(outputs) == ["scores", DEFAULT]
    assert outputs[DEFAULT] is given["scores"]
    assert list(given) == ["scores"]   # the caller's dict is not changed
    # Several outputs keep their names when one is the default.
    several = {DEFAULT: given["scores"],
               "other": export.PredictOutput(_floats())}
    assert signatures.export_outputs_for_predictions(several, None) == several


@pytest.mark.parametrize("export_outputs, error, message", [
    ([], TypeError, "must be a dict"),
    ({"a": "not an output"}, TypeError, r"\['a'\] must be an ExportOutput"),
    ("several", ValueError, "none is the default"),
])
def test_bad_export_outputs_dicts(export_outputs, error, message):
  with tf.Graph().as_default():
    if export_outputs == "several":
      export_outputs = {"a": export.PredictOutput(_floats()),
                        "b": export.PredictOutput(_floats())}
    with pytest.raises(error, match=message):
      signatures.export_outputs_for_predictions(export_outputs, None)


def _model(features):
  """Classification, regression and predict outputs of `features`."""
  logits = tf.matmul(features["age"], tf.constant([[1.0, 2.0, 3.0]]))
  scores = tf.nn.softmax(logits)
  return {DEFAULT: export.PredictOutput({"scores": scores}),
          "classify": export.ClassificationOutput(scores=scores),
          "regress": export.RegressionOutput(logits[:, 0])}


def test_parsing_receiver_serves_every_method_and_alternatives_predict():
  with tf.Graph().as_default():
    receiver = export.build_parsing_serving_input_receiver_fn(FEATURE_SPEC)()
    outputs = _model(receiver.features)
    alternatives = {"parsed": {"age": receiver.features["age"]}}
    got = signatures.build_signature_defs(
        receiver.receiver_tensors, outputs, alternatives)
  # Classify and Regress need the one string input: not the alternative.
  assert {name: s.method_name for name, s in got.items()} == {
      DEFAULT: tf.saved_model.PREDICT_METHOD_NAME,
      "classify": tf.saved_model.CLASSIFY_METHOD_NAME,
      "regress": tf.saved_model.REGRESS_METHOD_NAME,
      "parsed:" + DEFAULT: tf.saved_model.PREDICT_METHOD_NAME}
  assert list(got["parsed:" + DEFAULT].inputs) == ["age"]
  assert list(got[DEFAULT].inputs) == ["examples"]
  assert list(got["classify"].inputs) == ["inputs"]


def test_left_out_signatures_are_warned_about(caplog):
  with tf.Graph().as_default():
    age = _floats((None, 1))
    outputs = _model({"age": age})
    with caplog.at_level(logging.WARNING, logger="tensorflow"):
      got = signatures.build_signature_defs(
          {"age": age, "extra": _floats()}, outputs)
  assert list(got) == [DEFAULT]
  warned = " ".join(r.getMessage() for r in caplog.records
                    if r.levelno == logging.WARNING)
  assert "'classify' is left out" in warned
  assert "'regress' is left out" in warned


def test_outputs_needing_an_unfed_placeholder_are_left_out():
  with tf.Graph().as_default():
    examples, other = _strings(), _floats((None, 1), name="not_fed")
    fed = tf.strings.to_number(examples)[:, None]
    outputs = {DEFAULT: export.PredictOutput({"fed": fed * 2.0}),
               "needs_other": export.PredictOutput({"sum": fed + other})}
    got = signatures.build_signature_defs(
        {"examples": examples}, outputs,
        {"downstream": {"fed": fed, "other": other}})
  # Fed `examples` only, 'needs_other' lacks `other`; fed past the parsing,
  # both are computable.
  assert sorted(got) == sorted([DEFAULT, "downstream:" + DEFAULT,
                                "downstream:needs_other"])


class _Echo(export.ExportOutput):
  """Serves the receiver tensors back, under a given method name."""

  def __init__(self, method_name=tf.saved_model.PREDICT_METHOD_NAME):
    self.method_name = method_name

  def as_signature_def(self, receiver_tensors):
    infos = {key: tf.compat.v1.saved_model.build_tensor_info(tensor)
             for key, tensor in receiver_tensors.items()}
    return tf.compat.v1.saved_model.build_signature_def(
        infos, infos, self.method_name)


def _custom_outputs():
  return {"echo": _Echo(),
          "unknown_method": _Echo("my/method"),
          "bad_classify": _Echo(tf.saved_model.CLASSIFY_METHOD_NAME)}


def test_custom_export_outputs_are_kept_when_servable():
  with tf.Graph().as_default():
    examples = _strings()
    got = signatures.build_signature_defs(examples, _custom_outputs())
  # TensorFlow Serving has no 'my/method', and a Classify signature's
  # input must be named 'inputs': both are left out.
  assert list(got) == ["echo"]
  assert _infos(got["echo"].outputs) == {"input": _info(examples)}


def test_export_outputs_must_be_a_dict():
  with tf.Graph().as_default():
    with pytest.raises(ValueError, match="must be a dict"):
      signatures.build_signature_defs(_strings(),
                                      [export.PredictOutput(_floats())])


def test_a_saved_model_serves_the_signatures(tmp_path):
  export_dir = signatures.timestamped_export_dir(str(tmp_path))
  temp_dir = signatures.temp_export_dir(export_dir)
  with tf.Graph().as_default():
    receiver = export.build_parsing_serving_input_receiver_fn(FEATURE_SPEC)()
    doubled = receiver.features["age"][:, 0] * 2.0
    outputs = signatures.export_outputs_for_predictions(
        {"double": export.RegressionOutput(doubled)}, None)
    signature_defs = signatures.build_signature_defs(
        receiver.receiver_tensors, outputs)
    builder = tf.compat.v1.saved_model.Builder(temp_dir)
    with tf.compat.v1.Session() as session:
      builder.add_meta_graph_and_variables(
          session, [tf.saved_model.SERVING], signature_def_map=signature_defs)
    builder.save()
  tf.io.gfile.rename(temp_dir, export_dir)
  example = tf.train.Example(features=tf.train.Features(feature={
      "age": tf.train.Feature(float_list=tf.train.FloatList(value=[1.5]))}))
  with tf.Graph().as_default(), tf.compat.v1.Session() as session:
    meta_graph = tf.compat.v1.saved_model.load(
        session, [tf.saved_model.SERVING], export_dir)
    signature = meta_graph.signature_def[DEFAULT]
    assert signature.method_name == tf.saved_model.REGRESS_METHOD_NAME
    got = session.run(signature.outputs["outputs"].name,
                      {signature.inputs["inputs"].name:
                           [example.SerializeToString()]})
  np.testing.assert_allclose(got, [3.0])


# ----------------------------------------------------------- directories


def test_export_dir_is_the_base_and_the_seconds(monkeypatch, tmp_path):
  monkeypatch.setattr(signatures, "time", types.SimpleNamespace(
      time=lambda: 1700000000.75))
  got = signatures.timestamped_export_dir(str(tmp_path))
  assert got == os.path.join(os.fsencode(tmp_path), b"1700000000")
  assert signatures.temp_export_dir(got) == os.path.join(
      os.fsencode(tmp_path), b"temp-1700000000")
  assert signatures.temp_export_dir("base/12") == b"base/temp-12"


def test_export_dir_waits_for_a_free_second(monkeypatch, tmp_path):
  clock = iter([100.0, 100.5, 101.0])
  slept = []
  monkeypatch.setattr(signatures, "time", types.SimpleNamespace(
      time=lambda: next(clock), sleep=slept.append))
  (tmp_path / "100").mkdir()
  got = signatures.timestamped_export_dir(str(tmp_path))
  assert got == os.path.join(os.fsencode(tmp_path), b"101")
  assert slept == [1, 1]


def test_export_dir_gives_up_after_the_attempts(monkeypatch, tmp_path):
  slept = []
  monkeypatch.setattr(signatures, "time", types.SimpleNamespace(
      time=lambda: 100.0, sleep=slept.append))
  (tmp_path / "100").mkdir()
  with pytest.raises(RuntimeError, match="10 attempts"):
    signatures.timestamped_export_dir(str(tmp_path))
  assert slept == [1] * 9   # no wait after the last attempt


# ------------------------------------------------ TF 2.15 as the oracle


@pytest.fixture(name="tf_export")
def _tf_export():
  """tensorflow-estimator's export_lib (receivers, export outputs)."""
  # pylint: disable-next=g-import-not-at-top
  from tensorflow_estimator.python.estimator.export import export_lib
  return export_lib


@pytest.fixture(name="tf_utils")
def _tf_utils():
  """TF's model_utils.export_utils (signatures, export directories)."""
  # pylint: disable-next=g-import-not-at-top
  from tensorflow.python.saved_model.model_utils import export_utils
  return export_utils


def _both_signatures(tf_export, make, receiver_tensors):
  """(ours, TF's) SignatureDef of the output `make(module, tensors)`
  builds, on the same tensors of one graph."""
  with tf.Graph().as_default():
    x, w, s = _floats(name="x"), _floats((3, 2), name="w"), _strings(name="s")
    tensors = {"x": x, "w": w, "s": s, "y": tf.matmul(x, w),
               "probs": tf.nn.softmax(x), "names": tf.strings.as_string(x),
               "first": x[:, 0]}
    receiver = receiver_tensors(tensors)
    return tuple(make(module, tensors).as_signature_def(receiver)
                 for module in (export, tf_export))


_OUTPUTS = {
    "predict_dict": lambda m, t: m.PredictOutput({"y": t["y"],
                                                  ("h", "z"): t["x"]}),
    "predict_single": lambda m, t: m.PredictOutput(t["y"]),
    "scores": lambda m, t: m.ClassificationOutput(scores=t["probs"]),
    "classes": lambda m, t: m.ClassificationOutput(classes=t["names"]),
    "both": lambda m, t: m.ClassificationOutput(scores=t["probs"],
                                                classes=t["names"]),
    "regression": lambda m, t: m.RegressionOutput(t["first"]),
}


@pytest.mark.tf215
@pytest.mark.parametrize("kind", sorted(_OUTPUTS))
def test_signature_def_is_tfs(tf_export, kind):
  ours, theirs = _both_signatures(tf_export, _OUTPUTS[kind],
                                  lambda t: {"examples": t["s"]})
  assert ours == theirs
  assert ours.outputs


@pytest.mark.tf215
@pytest.mark.parametrize("kind", ["predict_dict", "predict_single"])
def test_predict_signature_of_several_inputs_is_tfs(tf_export, kind):
  ours, theirs = _both_signatures(tf_export, _OUTPUTS[kind],
                                  lambda t: {"x": t["x"], "w": t["w"]})
  assert ours == theirs
  assert len(ours.inputs) == 2


def _tf_and_our_signature_defs(tf_export, tf_utils, receiver_fns, model,
                               alternatives=None):
  """{signature name: SignatureDef} from ours and from TF's
  build_all_signature_defs, for the same graph built by `receiver_fns`
  (ours, TF's) and `model(module, features)`."""
  results = []
  for module, build in ((export, signatures.build_signature_defs),
                        (tf_export, tf_utils.build_all_signature_defs)):
    with tf.Graph().as_default():
      receiver = receiver_fns[module is tf_export]()
      outputs = model(module, receiver.features)
      alts = alternatives(receiver.features) if alternatives else None
      results.append(build(receiver.receiver_tensors, outputs, alts))
  return results


def _every_method(module, features):
  inputs = tf.concat([tf.cast(f, tf.float32)
                      for _, f in sorted(features.items())
                      if isinstance(f, tf.Tensor)], 1)
  dense = tf.matmul(inputs, tf.ones([3, 3]))
  scores = tf.nn.softmax(dense)
  return {DEFAULT: module.PredictOutput({"scores": scores, "dense": dense}),
          "classify": module.ClassificationOutput(
              scores=scores, classes=tf.strings.as_string(dense)),
          "regress": module.RegressionOutput(dense[:, 0]),
          "double": module.RegressionOutput(tf.cast(dense[:, 0], tf.float64)),
          "identity": module.PredictOutput(
              {key: f for key, f in features.items()
               if isinstance(f, tf.Tensor)})}


@pytest.mark.tf215
def test_parsing_receiver_signatures_are_tfs(tf_export, tf_utils):
  spec = dict(FEATURE_SPEC, count=tf.io.FixedLenFeature([2], tf.int64))
  fns = (export.build_parsing_serving_input_receiver_fn(spec),
         tf_export.build_parsing_serving_input_receiver_fn(spec))
  ours, theirs = _tf_and_our_signature_defs(
      tf_export, tf_utils, fns, _every_method,
      alternatives=lambda f: {"parsed": {"age": f["age"],
                                         "count": f["count"]},
                              "age_only": f["age"]})
  assert ours == theirs
  # Classify and Regress (float32) kept for the examples only.
  assert {"classify", "regress", "parsed:" + DEFAULT} <= set(ours)
  assert not {"double", "parsed:classify", "age_only:" + DEFAULT} & set(ours)


@pytest.mark.tf215
def test_raw_receiver_signatures_are_tfs(tf_export, tf_utils):
  with tf.Graph().as_default():
    examples = {"age": tf.zeros([2, 1]), "count": tf.zeros([2, 2], tf.int64)}
  fns = (export.build_raw_serving_input_receiver_fn(examples),
         tf_export.build_raw_serving_input_receiver_fn(examples))
  ours, theirs = _tf_and_our_signature_defs(tf_export, tf_utils, fns,
                                            _every_method)
  assert ours == theirs
  # Classify and Regress dropped: several inputs, none a string.
  assert sorted(ours) == sorted([DEFAULT, "identity"])


@pytest.mark.tf215
def test_custom_export_outputs_are_kept_as_tf_keeps_them(tf_utils):
  with tf.Graph().as_default():
    examples = {"examples": _strings(), "other": _floats()}
    ours = signatures.build_signature_defs(examples, _custom_outputs())
    theirs = tf_utils.build_all_signature_defs(examples, _custom_outputs())
  assert ours == theirs
  assert list(ours) == ["echo"]


@pytest.mark.tf215
def test_default_serving_key_is_added_as_tf_adds_it(tf_export, tf_utils):
  got = []
  for module, settle in ((export, signatures.export_outputs_for_predictions),
                         (tf_export, tf_utils.get_export_outputs)):
    with tf.Graph().as_default():
      examples = _strings(name="examples")
      outputs = settle(
          {"only": module.RegressionOutput(tf.strings.to_number(examples))},
          None)
      got.append(((list(outputs), outputs[DEFAULT] is outputs["only"]),
                  (signatures.build_signature_defs if module is export else
                   tf_utils.build_all_signature_defs)(examples, outputs)))
  assert got[0] == got[1]
  assert got[0][0] == (["only", DEFAULT], True)


@pytest.mark.tf215
@pytest.mark.parametrize("receiver", ["parsing", "raw"])
@pytest.mark.parametrize("batch", [None, 5])
def test_receiver_fns_make_tfs_graph_and_placeholders(tf_export, receiver,
                                                       batch):
  with tf.Graph().as_default():
    examples = {"dense": tf.zeros([2, 3], name="dense_example"),
                "ids": tf.constant([[1, 2]], tf.int64),
                "sparse": _sparse()}
  made = []
  for module in (export, tf_export):
    fn = (module.build_parsing_serving_input_receiver_fn(FEATURE_SPEC, batch)
          if receiver == "parsing" else
          module.build_raw_serving_input_receiver_fn(examples, batch))
    with tf.Graph().as_default() as graph:
      result = fn()
    made.append((graph.as_graph_def(), {
        key: (t.name, t.dtype, t.shape.as_list())
        for key, t in result.receiver_tensors.items()}))
  assert made[0] == made[1]
  if receiver == "raw":
    assert {node.op for node in made[0][0].node} == {"Placeholder"}
    assert made[0][1]["dense"] == ("dense_example:0", tf.float32, [batch, 3])
  else:
    assert made[0][1] == {"examples": ("input_example_tensor:0", tf.string,
                                       [batch])}


@pytest.mark.tf215
def test_receivers_hold_what_tfs_hold(tf_export):
  with tf.Graph().as_default():
    t, s, r = _floats(), _sparse(), _ragged()
    cases = [(t, t, None), ({"a": s, 1: r}, {"b": t}, {"alt": s}),
             (s, {"x": t}, {"alt": {"y": r}}), ({}, t, {})]
    for args in cases:
      ours = export.ServingInputReceiver(*args)
      theirs = tf_export.ServingInputReceiver(*args)
      assert tuple(ours) == tuple(theirs)
    ours = export.TensorServingInputReceiver(s, t, {"alt": t})
    theirs = tf_export.TensorServingInputReceiver(s, t, {"alt": t})
    assert tuple(ours) == tuple(theirs)


def _bad_inputs():
  """{case: make(module, tensors)} for inputs both should refuse."""
  return {
      "classification_neither": lambda m, t: m.ClassificationOutput(),
      "classification_int_scores": lambda m, t: m.ClassificationOutput(
          scores=t["i"]),
      "classification_float_classes": lambda m, t: m.ClassificationOutput(
          classes=t["f"]),
      "classification_list_scores": lambda m, t: m.ClassificationOutput(
          scores=[1.0]),
      "regression_int": lambda m, t: m.RegressionOutput(t["i"]),
      "regression_none": lambda m, t: m.RegressionOutput(None),
      "predict_int_key": lambda m, t: m.PredictOutput({1: t["f"]}),
      "predict_sparse_value": lambda m, t: m.PredictOutput({"a": t["sp"]}),
      "predict_number": lambda m, t: m.PredictOutput(3.0),
      "classify_two_inputs": lambda m, t: m.ClassificationOutput(
          scores=t["f"]).as_signature_def({"a": t["s"], "b": t["s"]}),
      "regress_float_input": lambda m, t: m.RegressionOutput(
          t["f"]).as_signature_def({"a": t["f"]}),
      "receiver_no_features": lambda m, t: m.ServingInputReceiver(
          None, t["s"]),
      "receiver_float_key": lambda m, t: m.ServingInputReceiver(
          {1.5: t["f"]}, t["s"]),
      "receiver_int_receiver_key": lambda m, t: m.ServingInputReceiver(
          t["f"], {1: t["s"]}),
      "receiver_numpy_feature": lambda m, t: m.ServingInputReceiver(
          {"a": np.zeros(2)}, t["s"]),
      "receiver_alternatives_list": lambda m, t: m.ServingInputReceiver(
          t["f"], t["s"], [t["s"]]),
      "receiver_alternative_none": lambda m, t: m.ServingInputReceiver(
          t["f"], t["s"], {"alt": None}),
      "tensor_receiver_dict": lambda m, t: m.TensorServingInputReceiver(
          {"a": t["f"]}, t["s"]),
  }


@pytest.mark.tf215
@pytest.mark.parametrize("case", sorted(_bad_inputs()))
def test_bad_inputs_raise_tfs_kind_of_error(tf_export, case):
  make = _bad_inputs()[case]
  kinds = []
  for module in (export, tf_export):
    with tf.Graph().as_default():
      tensors = {"f": _floats(), "i": tf.constant([1]), "s": _strings(),
                 "sp": _sparse()}
      with pytest.raises(Exception) as raised:
        make(module, tensors)
      kinds.append(raised.type)
  assert kinds[0] is kinds[1]


_BAD_EXPORT_OUTPUTS = {
    "not_a_dict": lambda m, t: [m.PredictOutput(t)],
    "not_an_output": lambda m, t: {DEFAULT: t},
    "several_without_default": lambda m, t: {"a": m.PredictOutput(t),
                                             "b": m.PredictOutput(t)},
    "bad_predictions": lambda m, t: None,
}


@pytest.mark.tf215
@pytest.mark.parametrize("case", sorted(_BAD_EXPORT_OUTPUTS))
def test_bad_export_outputs_raise_tfs_kind_of_error(tf_export, tf_utils,
                                                    case):
  kinds = []
  for module, settle in ((export, signatures.export_outputs_for_predictions),
                         (tf_export, tf_utils.get_export_outputs)):
    with tf.Graph().as_default():
      tensor = _floats()
      with pytest.raises(Exception) as raised:
        settle(_BAD_EXPORT_OUTPUTS[case](module, tensor), {"p": [1]})
      kinds.append(raised.type)
  assert kinds[0] is kinds[1]


@pytest.mark.tf215
def test_export_dirs_are_tfs(tf_utils, monkeypatch, tmp_path):
  monkeypatch.setattr("time.time", lambda: 1234567890.5)
  for base in (str(tmp_path), os.fsencode(tmp_path)):
    ours = signatures.timestamped_export_dir(base)
    assert ours == tf_utils.get_timestamped_export_dir(base)
    assert (signatures.temp_export_dir(ours) ==
            tf_utils.get_temp_export_dir(ours))
  for name in ("a/b/17", b"a/b/17", "17"):
    assert (signatures.temp_export_dir(name) ==
            tf_utils.get_temp_export_dir(name))
