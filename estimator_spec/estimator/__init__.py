"""The TPUEstimator drop-in: TF's TPUEstimator surface over the host engine."""
from estimator_spec.estimator.spec import ExportSavedModelApiVersion
from estimator_spec.estimator.spec import TPUEstimatorSpec
from estimator_spec.estimator.tpu_estimator import TPUEstimator
from estimator_spec.estimator.tpu_estimator import host_only_settings

__all__ = ["TPUEstimator", "TPUEstimatorSpec", "ExportSavedModelApiVersion",
           "host_only_settings"]
