"""Where this project talks to TensorFlow's own TPU stack.

The only package of the library that imports TensorFlow's TPU implementation
(`tensorflow.python.tpu`, TF's TPU feature columns and TPUEstimator). It holds:
* `single_replica()`: `tf.compat.v1.tpu.CrossShardOptimizer` run as one
  replica on the host (`_replica.py`).
"""
from estimator_spec.interop._replica import single_replica

__all__ = ["single_replica"]
