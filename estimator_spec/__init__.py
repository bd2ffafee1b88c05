"""TPU embedding configuration for Estimator-era models.

`EmbeddingConfigSpec`, the optimization-parameter classes, `TableConfig` and
`FeatureConfig` take the arguments of TF 2.15's classes of the same names;
`EmbeddingConfig` derives the TPU embedding configuration proto.

The TPUEstimator surface (`TPUEstimator`, `TPUEstimatorSpec`,
`ExportSavedModelApiVersion`, `ClusterTraining`, `RunConfig`, `TPUConfig`
and `InputPipelineConfig`) loads on first use, on TF 2.15 over
tensorflow-estimator and on current TensorFlow over the library's own
Estimator framework (`estimator_spec.estimator`, which also holds the
counterparts of `tf.estimator`'s names: `ModeKeys`, `EstimatorSpec`,
`export`, `train_and_evaluate`, ...).

With `estimator_spec.experimental.EmbeddingConfigSpec`, this package holds
every name of TF's `tf.compat.v1.estimator.tpu` (`estimator_spec.tf_names`
is the table of every TF name and where it lives here).

`HostTPUEmbedding` (`estimator_spec.mid_level`, loaded on first use) is TF2's
`tf.tpu.experimental.embedding.TPUEmbedding` trained on CPU/GPU with the
TPU's semantics; it works on TF 2.15 and on current TensorFlow.
"""
import os as _os
import sys as _sys

# `python -m estimator_spec ...`: TF's own log lines are silenced before TF
# loads (below), unless the user set their level (docs/cli.md).
_ARGV = list(getattr(_sys, "orig_argv", ()))
if "-m" in _ARGV and _ARGV[_ARGV.index("-m") + 1:][:1] == ["estimator_spec"]:
  _os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# TensorFlow, when this package loads it, without the notices its GPU build
# prints at import on a machine without CUDA (`tf_import`).
from estimator_spec import tf_import as _tf_import

_tf_import.import_tensorflow()

from estimator_spec._version import __version__
from estimator_spec.config.modes import EVAL
from estimator_spec.config.modes import PREDICT
from estimator_spec.config.modes import TRAIN
from estimator_spec.tpu.embedding_config import EmbeddingConfig
from estimator_spec.config.model import EmbeddingModel
from estimator_spec.config.optimizers import ALL_OPTIMIZERS
from estimator_spec.config.optimizers import AdagradMomentumParameters
from estimator_spec.config.optimizers import AdagradParameters
from estimator_spec.config.optimizers import AdamParameters
from estimator_spec.config.optimizers import FtrlParameters
from estimator_spec.config.optimizers import MomentumParameters
from estimator_spec.config.optimizers import OptimizationParameters
from estimator_spec.config.optimizers import ProximalAdagradParameters
from estimator_spec.config.optimizers import ProximalYogiParameters
from estimator_spec.config.optimizers import RMSPropParameters
from estimator_spec.config.optimizers import StochasticGradientDescentParameters
from estimator_spec.config.sharding import ShardLayout
from estimator_spec.config.spec import EmbeddingConfigSpec
from estimator_spec.config.spec import FeatureConfig
from estimator_spec.config.spec import TableConfig

from estimator_spec import tpu_runner as _tpu_runner


def _run_on_tpu(**arguments):
  """TF's own TPUEstimator on the TPU the arguments name (interop, loaded
  only now)."""
  from estimator_spec import interop
  return interop.delegate_to_tensorflow(**arguments)


_tpu_runner.connect(_run_on_tpu)

# The TPUEstimator surface loads an Estimator framework; it is imported on
# first use, so that the config model, the engine and the columns load
# without it.
_LAZY = {
    "TPUEstimator": "estimator_spec.estimator",
    "TPUEstimatorSpec": "estimator_spec.estimator",
    "ExportSavedModelApiVersion": "estimator_spec.estimator",
    "ClusterTraining": "estimator_spec.estimator.cluster",
    "RunConfig": "estimator_spec.estimator.run_config",
    "TPUConfig": "estimator_spec.estimator.run_config",
    "InputPipelineConfig": "estimator_spec.estimator.run_config",
    "HostTPUEmbedding": "estimator_spec.mid_level",
}


def __getattr__(name):
  import importlib
  if name in _LAZY:
    return getattr(importlib.import_module(_LAZY[name]), name)
  if name in _SUBPACKAGES:
    return importlib.import_module(f"estimator_spec.{name}")
  raise AttributeError(f"module 'estimator_spec' has no attribute {name!r}")


_SUBPACKAGES = ("estimator", "interop", "checkpoints", "engine", "tpu",
                "config", "mid_level", "experimental", "tf_names")


def __dir__():
  return sorted(set(globals()) | set(_LAZY) | set(_SUBPACKAGES))


__all__ = [
    "EmbeddingConfigSpec", "EmbeddingConfig", "EmbeddingModel", "TableConfig",
    "FeatureConfig", "ShardLayout", "OptimizationParameters",
    "AdagradParameters", "AdagradMomentumParameters", "AdamParameters",
    "FtrlParameters", "MomentumParameters", "ProximalAdagradParameters",
    "ProximalYogiParameters", "RMSPropParameters",
    "StochasticGradientDescentParameters", "ALL_OPTIMIZERS", "TRAIN", "EVAL",
    "PREDICT"
] + list(_LAZY)
