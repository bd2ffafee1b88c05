"""Checkpoint listeners added to a `CheckpointSaverHook` the user built.

TF 2.15 and current TF work around: `CheckpointSaverHook` takes its
listeners when it is built and offers no way to add one later. When
`train(saving_listeners=...)` meets a saver hook of the user's own (in
`hooks` or model_fn's training hooks), Estimator appends the listeners to
the hook's private `_listeners` list; the library's run loop
(estimator/framework/) does the same, through this module.
tests/test_tf_patches_estimator.py checks that an added listener is called.
"""


def add(hook, listeners):
  """Adds each of `listeners` that `hook` (a CheckpointSaverHook) lacks."""
  for listener in listeners:
    if listener not in hook._listeners:
      hook._listeners.append(listener)
