"""The TPU `RunConfig`, `TPUConfig` and `InputPipelineConfig` of
`tf.compat.v1.estimator.tpu`: tensorflow-estimator's own classes on TF 2.15,
this library's on current TensorFlow (`estimator/stack.py`). The host
estimator reads them as TF's TPUEstimator does (docs/estimator.md)."""
from estimator_spec.estimator import stack

RunConfig = stack.TPURunConfig
TPUConfig = stack.TPUConfig
InputPipelineConfig = stack.InputPipelineConfig

__all__ = ["RunConfig", "TPUConfig", "InputPipelineConfig"]
