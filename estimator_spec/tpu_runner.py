"""Who runs a model on a real TPU.

`TPUEstimator(use_tpu=True)` with a RunConfig that names a TPU hands its
arguments to TF's own TPUEstimator (`estimator_spec.interop`, the layer
above the estimator's). The package connects that path here when it is
imported (`estimator_spec/__init__.py` calls `connect`), so that the
estimator layer asks this module and never imports interop, and so that
nothing of TF's TPU estimator loads until a TPU run asks for it.
"""

_runner = None


def connect(runner):
  """Sets the callable that builds the estimator of a TPU run from
  TPUEstimator's arguments (keyword arguments named as in
  `TPUEstimator.__init__`)."""
  global _runner
  _runner = runner


def run(**arguments):
  """The estimator that runs the model on the TPU its RunConfig names."""
  if _runner is None:
    raise RuntimeError(
        "TPUEstimator: nothing is connected to run a model on a TPU; import "
        "the estimator_spec package (it connects TF's TPUEstimator) first.")
  return _runner(**arguments)
