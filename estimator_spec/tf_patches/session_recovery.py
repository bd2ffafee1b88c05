"""A shorter wait for a model that is not ready yet, on a cluster.

TF 2.15 works around: Estimator's session creators build
`SessionManager`s with TF's default `recovery_wait_secs` (30 seconds)
and offer no argument for it, so a worker that waits for the chief's
initialization or restore (after a start or a ps restart) looks only
every 30 seconds. While training on a cluster, the estimator replaces
`SessionManager.__init__` by one that defaults the argument to its own
value (docs/cluster.md, 'Faults') and restores it after.
tests/test_tf_patches_estimator.py checks the argument and its default.
"""
import contextlib

from tensorflow.python.training import session_manager


@contextlib.contextmanager
def recovery_wait(seconds):
  """Inside: a `SessionManager` built without `recovery_wait_secs` looks
  again every `seconds` seconds."""
  original = session_manager.SessionManager.__init__

  def init(self, *args, **kwargs):
    kwargs.setdefault("recovery_wait_secs", seconds)
    original(self, *args, **kwargs)

  session_manager.SessionManager.__init__ = init
  try:
    yield
  finally:
    session_manager.SessionManager.__init__ = original
