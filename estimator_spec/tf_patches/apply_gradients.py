"""Recording model_fn's optimizer updates instead of running them.

TF 2.15 works around: `tf.compat.v1.train.Optimizer` gives no way to take
the gradients a model's optimizer applies, short of replacing its method.
A synchronous cluster step (cluster/sync/) must average every task's
dense gradients before one update, but model_fn builds its own update with
`minimize` or `apply_gradients` (`minimize` calls `self.apply_gradients`,
and `CrossShardOptimizer.apply_gradients` calls its inner optimizer's).
So while model_fn runs, the base class's `apply_gradients` is replaced by
a recorder, and the original is restored after; the original method is
then called with the averaged gradients. tests/test_tf_patches_estimator.py
checks that the public class's method is the one replaced, that `minimize`
goes through it, and that the original comes back.
"""
import contextlib

from tensorflow.python.training import optimizer as optimizer_lib


@contextlib.contextmanager
def replaced(replacement):
  """Inside: `tf.compat.v1.train.Optimizer.apply_gradients` is
  `replacement` (called as the method); yields the original method, which
  is restored on leaving."""
  original = optimizer_lib.Optimizer.apply_gradients
  optimizer_lib.Optimizer.apply_gradients = replacement
  try:
    yield original
  finally:
    optimizer_lib.Optimizer.apply_gradients = original
