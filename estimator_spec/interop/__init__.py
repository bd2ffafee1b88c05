"""Where this project talks to TensorFlow's own TPU stack.

The only package of the library that imports TensorFlow's TPU implementation
(`tensorflow.python.tpu`, TF's TPU feature columns and TPUEstimator). It holds:
* `single_replica()`: `tf.compat.v1.tpu.CrossShardOptimizer` run as one
  replica on the host (`_replica.py`).
* `to_tensorflow`, `from_tensorflow`, `columns_by_name`: the spec as TF
  2.15's own classes and back (`_tensorflow.py`).
* `DelegatedTPUEstimator`, `TPUNotReachableError`: TF's TPUEstimator running
  a model written with our columns on a real TPU (`_tpu.py`).
* `to_mid_level`, `export_mid_level_checkpoint`: the spec and its
  checkpoints for TF2's `tf.tpu.experimental.embedding` (`_mid_level.py`).
"""
from estimator_spec.checkpoints.mid_level import export_mid_level_checkpoint
from estimator_spec.interop._mid_level import to_mid_level
from estimator_spec.interop._replica import refuse_tensorflow_columns
from estimator_spec.interop._replica import single_replica
from estimator_spec.interop._tensorflow import (columns_by_name,
                                                from_tensorflow, to_tensorflow)
from estimator_spec.interop._tpu import (DelegatedTPUEstimator,
                                         TPUNotReachableError)

__all__ = ["single_replica", "refuse_tensorflow_columns"]
__all__ += ["to_mid_level", "export_mid_level_checkpoint"]
__all__ += ["to_tensorflow", "from_tensorflow", "columns_by_name",
            "DelegatedTPUEstimator", "TPUNotReachableError"]
