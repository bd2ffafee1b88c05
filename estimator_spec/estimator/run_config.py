"""TF's `RunConfig`, `TPUConfig` and `InputPipelineConfig` of
`tf.compat.v1.estimator.tpu`, re-exported unchanged: the host estimator
reads them as TF's TPUEstimator does (docs/estimator.md), so
`estimator_spec.RunConfig` is TF's class itself and a config built with
either name works with either estimator."""
import tensorflow as tf

_TPU = tf.compat.v1.estimator.tpu
RunConfig = _TPU.RunConfig
TPUConfig = _TPU.TPUConfig
InputPipelineConfig = _TPU.InputPipelineConfig

__all__ = ["RunConfig", "TPUConfig", "InputPipelineConfig"]
