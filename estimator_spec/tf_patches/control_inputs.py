"""Control inputs added to an op after it was built.

TF 2.15 works around: `tf.Operation` has no public way to make an op that
already exists wait for another one (`tf.control_dependencies` applies only
to ops built inside it). The estimator needs it where the op it must order
was built by model_fn before the op it must wait for exists: the stand-in
train ops of a synchronous step (which wait for the chief's update) and the
writes of the global step (which wait for the step's reads of it). The
private `Operation._add_control_input` does it; it exists and makes the op
wait in TF 2.15 (tests/test_tf_patches_estimator.py).
"""
from estimator_spec.tensor_types import Op


def add_control_input(op: Op, dependency: Op) -> None:
  """Makes the built `op` run after `dependency` (an op)."""
  op._add_control_input(dependency)
