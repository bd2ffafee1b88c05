"""Where this project talks to TensorFlow's own TPU stack.

With `estimator_spec.tf_patches` (the TPU pieces the host run patches or
reads: `replica_context`, `tpu_columns`), the only package of the library
that imports TensorFlow's TPU implementation (`tensorflow.python.tpu`, TF's
TPU feature columns and TPUEstimator). It holds:
* `single_replica()`: `tf.compat.v1.tpu.CrossShardOptimizer` run as one
  replica on the host (`_replica.py`, over
  `estimator_spec.tf_patches.replica_context`);
  `refuse_tensorflow_columns(graph)`: the host's refusal of TF's own TPU
  columns in a model_fn (`estimator_spec.tf_patches.tpu_columns`).
* `to_tensorflow`, `from_tensorflow`, `columns_by_name`: the spec as TF
  2.15's own classes and back (`_tensorflow.py`).
* `tpu_named(config)`: whether a RunConfig asks for a real TPU
  (`estimator_spec.estimator.target`); `delegate_to_tensorflow`,
  `DelegatedTPUEstimator`,
  `TPUNotReachableError`: TF's TPUEstimator running a model written with
  our columns on that TPU (`_tpu.py`).
* `to_mid_level`: the spec for TF2's `tf.tpu.experimental.embedding`
  (`_mid_level.py`), and `from_mid_level`, TF2's objects as a spec (what
  `estimator_spec.HostTPUEmbedding` trains; loads on current TF too);
  `export_mid_level_checkpoint`, its checkpoints
  (`_mid_level_export.py`).

Each name loads its module on first use: a host run loads nothing of
this package, and never TF's TPU estimator.
"""
import importlib

# Public name -> the module that defines it.
_MODULES = {
    "single_replica": "estimator_spec.interop._replica",
    "refuse_tensorflow_columns": "estimator_spec.tf_patches.tpu_columns",
    "to_tensorflow": "estimator_spec.interop._tensorflow",
    "from_tensorflow": "estimator_spec.interop._tensorflow",
    "columns_by_name": "estimator_spec.interop._tensorflow",
    "tpu_named": "estimator_spec.estimator.target",
    "delegate_to_tensorflow": "estimator_spec.interop._tpu",
    "DelegatedTPUEstimator": "estimator_spec.interop._tpu",
    "TPUNotReachableError": "tpu_embedding_columns.errors",
    "to_mid_level": "estimator_spec.interop._mid_level",
    "from_mid_level": "estimator_spec.interop._mid_level",
    "convert_mid_level": "estimator_spec.interop._mid_level",
    "export_mid_level_checkpoint": "estimator_spec.interop._mid_level_export",
}


def __getattr__(name):
  if name not in _MODULES:
    raise AttributeError(
        f"module 'estimator_spec.interop' has no attribute {name!r}")
  value = getattr(importlib.import_module(_MODULES[name]), name)
  globals()[name] = value
  return value


def __dir__():
  return sorted(set(globals()) | set(_MODULES))


__all__ = list(_MODULES)
