"""Whether a RunConfig asks for a real TPU.

`TPUEstimator(use_tpu=True)` decides with `tpu_named` whether the model
runs on a TPU, through TF's own TPUEstimator (`estimator_spec.tpu_runner`),
or on the host. This module loads nothing of TF's TPU estimator, so that a
host run never does.
"""
import tensorflow as tf


def tpu_named(config):
  """True when `config` names a TPU: a cluster resolver, a remote master
  with a `tpu_config`, or (no master) a TPU device on this machine."""
  cluster = getattr(config, "cluster", None)
  master = getattr(config, "master", "") or ""
  if cluster is not None:
    return True
  if master and master not in ("local", "") and not master.startswith(
      "grpc://localhost"):
    return bool(getattr(config, "tpu_config", None))
  return bool(tf.config.list_logical_devices("TPU"))

