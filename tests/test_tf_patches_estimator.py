"""The estimator's reaches into TensorFlow (`estimator_spec.tf_patches`):
control inputs added to built ops, model_fn's optimizer updates recorded
instead of run, the gradient taps and gates, the shorter session-recovery
wait, and the record TF's own TPU columns leave in a graph.

For each: TF 2.15 still behaves as the module relies on (a test here fails
if TF changes that), the module does what it says, and a replaced method
comes back when the block ends, also when it ends with an error.
"""
import inspect

import numpy as np
import pytest
import tensorflow as tf

from tensorflow.python.training import monitored_session
from tensorflow.python.training import optimizer as optimizer_lib
from tensorflow.python.training import session_manager

from estimator_spec.tf_patches import apply_gradients
from estimator_spec.tf_patches import control_inputs
from estimator_spec.tf_patches import gradient_gates
from estimator_spec.tf_patches import gradient_taps
from estimator_spec.tf_patches import op_inputs
from estimator_spec.tf_patches import replica_context
from estimator_spec.tf_patches import session_recovery
from estimator_spec.tf_patches import tpu_columns

v1 = tf.compat.v1


# --- control_inputs -----------------------------------------------------------


def test_tf_operation_has_the_private_add_control_input():
  assert callable(getattr(tf.Operation, "_add_control_input", None))


def test_an_added_control_input_makes_a_built_op_wait():
  graph = tf.Graph()
  with graph.as_default():
    var = v1.get_variable("v", initializer=0.0, use_resource=True)
    # The op that reads, built first: nothing orders it yet.
    read = tf.raw_ops.ReadVariableOp(resource=var.handle, dtype=tf.float32)
    write = var.assign(5.0, read_value=False)
    assert write not in read.op.control_inputs
    control_inputs.add_control_input(read.op, write)
    assert write in read.op.control_inputs
    with v1.Session() as session:
      session.run(var.initializer)
      assert session.run(read) == 5.0


# --- op_inputs ----------------------------------------------------------------


def test_tf_operation_has_the_private_update_input():
  assert callable(getattr(tf.Operation, "_update_input", None))


def test_a_replaced_input_is_read_by_a_built_op():
  graph = tf.Graph()
  with graph.as_default():
    stand_in = v1.placeholder(tf.float32, [None])
    received = tf.identity(stand_in)
    doubled = received * 2.0  # built on the stand-in
    op_inputs.replace_input(received.op, 0, tf.constant([1.0, 2.0]))
    assert list(received.op.inputs) != [stand_in]
    with v1.Session() as session:
      assert session.run(doubled).tolist() == [2.0, 4.0]


# --- apply_gradients ----------------------------------------------------------


def test_tf_optimizers_apply_through_the_base_class_method():
  assert v1.train.Optimizer is optimizer_lib.Optimizer
  # The optimizers a model uses inherit the method the patch replaces, and
  # `minimize` calls it through `self`.
  for cls in (v1.train.GradientDescentOptimizer, v1.train.AdamOptimizer,
              v1.train.AdagradOptimizer, v1.train.MomentumOptimizer):
    assert cls.apply_gradients is optimizer_lib.Optimizer.apply_gradients
  assert "apply_gradients" in optimizer_lib.Optimizer.minimize.__code__.co_names


def test_apply_gradients_is_replaced_inside_and_restored():
  original = optimizer_lib.Optimizer.apply_gradients
  calls = []

  def record(optimizer, grads_and_vars, global_step=None, name=None):
    calls.append((optimizer, list(grads_and_vars), global_step, name))
    return tf.no_op()

  graph = tf.Graph()
  with graph.as_default():
    var = v1.get_variable("w", initializer=[1.0, 2.0], use_resource=True)
    loss = tf.reduce_sum(var * var)
    optimizer = v1.train.GradientDescentOptimizer(0.1)
    with apply_gradients.replaced(record) as given:
      assert given is original
      assert v1.train.Optimizer.apply_gradients is record
      optimizer.minimize(loss)
    assert optimizer_lib.Optimizer.apply_gradients is original
  assert len(calls) == 1 and calls[0][0] is optimizer
  assert [v for _, v in calls[0][1]] == [var]
  # The update was recorded, not built: no optimizer op in the graph.
  assert "ResourceApplyGradientDescent" not in {
      op.type for op in graph.get_operations()}


def test_apply_gradients_is_restored_after_an_error():
  original = optimizer_lib.Optimizer.apply_gradients
  with pytest.raises(RuntimeError, match="model_fn failed"):
    with apply_gradients.replaced(lambda *args, **kwargs: None):
      raise RuntimeError("model_fn failed")
  assert optimizer_lib.Optimizer.apply_gradients is original


# --- gradient_taps ------------------------------------------------------------


def test_tf_registers_a_gradient_name_once_per_process():
  name = "EstimatorSpecTestRegisteredOnce"
  tf.RegisterGradient(name)(lambda op, *grads: list(grads))
  with pytest.raises(KeyError):
    tf.RegisterGradient(name)(lambda op, *grads: list(grads))


def test_a_tap_records_the_gradient_of_the_backward_pass_through_it():
  graph = tf.Graph()
  with graph.as_default():
    activation = tf.constant([[1.0, 2.0], [3.0, 4.0]])
    anchor = tf.constant(0.0)
    recorded = []
    tapped = gradient_taps.tapped(activation, anchor, recorded)
    loss = tf.reduce_sum(tapped * tf.constant([[1.0, 2.0], [3.0, 4.0]]))
    to_activation, to_anchor = tf.gradients(loss, [activation, anchor])
    assert tapped.op.type == "IdentityN"
    assert len(recorded) == 1
    # The gradient stops at the tap (the engine takes it from there); the
    # anchor gets zero.
    assert to_activation is None
    with v1.Session() as session:
      got, zero = session.run([recorded[0], to_anchor])
  np.testing.assert_array_equal(got, [[1.0, 2.0], [3.0, 4.0]])
  assert zero == 0.0


def test_a_tap_of_several_activations_records_only_those_the_loss_reaches():
  """TF's backward pass fills a zero (ZerosLike of the output) for an output
  of an op that no gradient reaches when another output has one; the tap
  records none for it, so that a missing gradient is still found."""
  graph = tf.Graph()
  with graph.as_default():
    first = tf.constant([[1.0, 2.0]])
    second = tf.constant([[3.0, 4.0]])
    anchor = tf.constant(0.0)
    recorded = [[], []]
    tapped = gradient_taps.tapped_many([first, second], anchor, recorded)
    loss = tf.reduce_sum(tapped[0] * 3.0 + tf.stop_gradient(tapped[1]))
    (to_anchor,) = tf.gradients(loss, [anchor])
    assert [len(r) for r in recorded] == [1, 0]
    with v1.Session() as session:
      got, zero = session.run([recorded[0][0], to_anchor])
  np.testing.assert_array_equal(got, [[3.0, 3.0]])
  assert zero == 0.0


# --- gradient_gates -----------------------------------------------------------


def _product_gradients(gate_gradients):
  """(input, weights, d loss / d input) of loss = sum(input @ weights)."""
  inputs = tf.constant([[1.0, 2.0], [3.0, 4.0]])
  weights = tf.constant([[0.5, -1.0], [2.0, 0.25]])
  loss = tf.reduce_sum(tf.matmul(inputs, weights))
  to_input, _ = tf.gradients(loss, [inputs, weights],
                             gate_gradients=gate_gradients)
  return inputs, weights, to_input


def test_tf_gates_a_products_input_gradient_on_its_weights_gradient():
  graph = tf.Graph()
  with graph.as_default():
    _, _, gated = _product_gradients(gate_gradients=True)
    ungated = gradient_gates.ungated(gated)
    # TF's gate: an Identity waiting for the NoOp that groups both
    # gradients of the product; the engine reads what it passes on.
    assert gated.op.type == "Identity"
    assert [op.type for op in gated.op.control_inputs] == ["NoOp"]
    assert ungated is not gated
    assert ungated.op.type == "MatMul" and not ungated.op.control_inputs
    with v1.Session() as session:
      got_gated, got_ungated = session.run([gated, ungated])
  np.testing.assert_array_equal(got_gated, got_ungated)
  np.testing.assert_array_equal(got_ungated, [[-0.5, 2.25], [-0.5, 2.25]])


def test_an_ungated_gradient_and_a_users_waiting_identity_stay_as_they_are():
  graph = tf.Graph()
  with graph.as_default():
    _, _, plain = _product_gradients(gate_gradients=False)
    assert gradient_gates.ungated(plain) is plain
    first = tf.constant(1.0)
    with tf.control_dependencies([tf.no_op()]):
      waiting = tf.identity(first)
    assert gradient_gates.ungated(waiting) is waiting
    assert gradient_gates.ungated(None) is None


# --- session_recovery ---------------------------------------------------------


def test_tf_session_managers_wait_30_seconds_and_estimator_cannot_say_less():
  parameters = inspect.signature(
      session_manager.SessionManager.__init__).parameters
  assert parameters["recovery_wait_secs"].default == 30
  for creator in (monitored_session.ChiefSessionCreator,
                  monitored_session.WorkerSessionCreator):
    source = inspect.getsource(creator._get_session_manager)
    assert "SessionManager(" in source
    assert "recovery_wait_secs" not in source


def test_recovery_wait_sets_the_default_inside_and_restores_it():
  original = session_manager.SessionManager.__init__
  with session_recovery.recovery_wait(1):
    assert session_manager.SessionManager()._recovery_wait_secs == 1
    given = session_manager.SessionManager(recovery_wait_secs=7)
    assert given._recovery_wait_secs == 7
  assert session_manager.SessionManager.__init__ is original
  assert session_manager.SessionManager()._recovery_wait_secs == 30
  with pytest.raises(RuntimeError, match="stopped"):
    with session_recovery.recovery_wait(1):
      raise RuntimeError("stopped")
  assert session_manager.SessionManager.__init__ is original


# --- tpu_columns ----------------------------------------------------------------


def _tf_tpu_column_graph():
  # As model_fn runs on the host: one replica, where TF's column takes
  # itself to be on a TPU.
  graph = tf.Graph()
  with graph.as_default(), replica_context.one_replica():
    categorical = v1.feature_column.categorical_column_with_identity(
        "ids", 10)
    column = v1.tpu.experimental.embedding_column(categorical, 4)
    try:
      v1.feature_column.input_layer(
          {"ids": tf.sparse.from_dense(tf.constant([[1, 2]], tf.int64))},
          [column])
    except TypeError as error:  # raw ids read as activations
      return graph, error
  raise AssertionError("TF's TPU column read raw ids on the host")


def test_tf_tpu_columns_record_their_tables_where_the_module_reads():
  graph, _ = _tf_tpu_column_graph()
  assert tpu_columns.recorded_tables(graph) == ["ids"]


def test_a_graph_with_tf_tpu_columns_is_refused_with_what_to_do():
  graph, cause = _tf_tpu_column_graph()
  with pytest.raises(TypeError) as raised:
    tpu_columns.refuse_tensorflow_columns(graph, cause)
  assert str(raised.value) == (
      "TPUEstimator: model_fn uses TensorFlow's own TPU embedding columns "
      "(tables ['ids']); build them with tpu_embedding_columns."
      "embedding_column / shared_embedding_columns (the same arguments), or "
      "run `python -m estimator_spec migrate` on the program "
      "(docs/migration.md).")
  assert raised.value.__cause__ is cause
  tpu_columns.refuse_tensorflow_columns(tf.Graph())  # nothing recorded
