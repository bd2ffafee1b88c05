"""The TPUEstimator drop-in: TF's TPUEstimator surface over the host engine.

`tpu_estimator` is the surface (arguments, modes, params and context,
input_fn, hooks, export); `host_step` does one model_fn call's embedding
work (checks from `batch_checks`, lookups, gradients, update); `spec` holds
`TPUEstimatorSpec`; `hooks` the session hooks; `placement` where the tables
live; `tpu_context` the emulated TPU topology.

It needs TF 2.15 and tensorflow-estimator 2.15: on current TensorFlow,
importing it raises an ImportError saying so (`estimator_spec.tf215`).
"""
from estimator_spec import tf215

tf215.require("The TPUEstimator surface (estimator_spec.TPUEstimator, "
              "TPUEstimatorSpec, ExportSavedModelApiVersion, ClusterTraining, "
              "estimator_spec.estimator)")

# pylint: disable=g-import-not-at-top,wrong-import-position
from estimator_spec.estimator.host_step import StepTable
from estimator_spec.estimator.host_step import step_tables
from estimator_spec.estimator.spec import ExportSavedModelApiVersion
from estimator_spec.estimator.spec import TPUEstimatorSpec
from estimator_spec.estimator.tpu_estimator import TPUEstimator
from estimator_spec.estimator.tpu_estimator import host_only_settings

__all__ = ["TPUEstimator", "TPUEstimatorSpec", "ExportSavedModelApiVersion",
           "host_only_settings", "StepTable", "step_tables"]
