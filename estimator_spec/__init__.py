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

Importing the package loads no TensorFlow: the names above load (with
TensorFlow) on first use, so that `python -m estimator_spec --help`
answers at once (docs/cli.md). Whoever imports TensorFlow first after this
package, the package or the program, gets it without the notices its GPU
build prints at import on a machine without CUDA (`tf_import`).
"""
import os as _os
import sys as _sys

# `python -m estimator_spec ...`: TF's own log lines are silenced before TF
# loads, unless the user set their level (docs/cli.md).
_ARGV = list(getattr(_sys, "orig_argv", ()))
if "-m" in _ARGV and _ARGV[_ARGV.index("-m") + 1:][:1] == ["estimator_spec"]:
  _os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from estimator_spec import tf_import as _tf_import
from estimator_spec import tpu_runner as _tpu_runner
from estimator_spec._version import __version__


class _TensorFlowLoader:
  """TensorFlow's own loader, run without its GPU build's import notices;
  once TensorFlow is loaded, its module and spec name TF's loader again."""

  def __init__(self, loader):
    self.loader = loader

  def __getattr__(self, name):
    return getattr(self.loader, name)

  def create_module(self, spec):
    return self.loader.create_module(spec)

  def exec_module(self, module):
    try:
      with _tf_import.notices_dropped():
        self.loader.exec_module(module)
    finally:
      module.__spec__.loader = self.loader
      module.__loader__ = self.loader
      if _FIRST_TF_IMPORT in _sys.meta_path:
        _sys.meta_path.remove(_FIRST_TF_IMPORT)


class _FirstTensorFlowImport:
  """On `sys.meta_path` (first) until TensorFlow is imported: the first
  `import tensorflow` of the process, by this package or by the program,
  runs TF's loader through `_TensorFlowLoader`. It finds nothing itself:
  TF's module spec comes from the finders after it."""

  def __init__(self):
    self.done = False

  def find_spec(self, name, path=None, target=None):
    if name != "tensorflow" or self.done:
      return None
    self.done = True  # stays in sys.meta_path (a no-op) until TF is loaded
    if _os.environ.get(_tf_import.KEEP_VARIABLE) == "1":
      return None
    for finder in list(_sys.meta_path):
      find = getattr(finder, "find_spec", None)
      if finder is self or find is None:
        continue
      spec = find(name, path, target)
      if spec is not None:
        if hasattr(spec.loader, "exec_module"):
          spec.loader = _TensorFlowLoader(spec.loader)
        return spec
    return None


_FIRST_TF_IMPORT = _FirstTensorFlowImport()
if "tensorflow" not in _sys.modules:
  _sys.meta_path.insert(0, _FIRST_TF_IMPORT)


def _run_on_tpu(**arguments):
  """TF's own TPUEstimator on the TPU the arguments name (interop, loaded
  only now)."""
  from estimator_spec import interop
  return interop.delegate_to_tensorflow(**arguments)


_tpu_runner.connect(_run_on_tpu)

# The config model and the TPU configuration: loaded together, in this
# order, with TensorFlow (which the columns import), on the first use of
# any name of the package (`_load`).
_CORE = {
    "EVAL": "estimator_spec.config.modes",
    "PREDICT": "estimator_spec.config.modes",
    "TRAIN": "estimator_spec.config.modes",
    "EmbeddingConfig": "estimator_spec.tpu.embedding_config",
    "EmbeddingModel": "estimator_spec.config.model",
    "ALL_OPTIMIZERS": "estimator_spec.config.optimizers",
    "AdagradMomentumParameters": "estimator_spec.config.optimizers",
    "AdagradParameters": "estimator_spec.config.optimizers",
    "AdamParameters": "estimator_spec.config.optimizers",
    "FtrlParameters": "estimator_spec.config.optimizers",
    "MomentumParameters": "estimator_spec.config.optimizers",
    "OptimizationParameters": "estimator_spec.config.optimizers",
    "ProximalAdagradParameters": "estimator_spec.config.optimizers",
    "ProximalYogiParameters": "estimator_spec.config.optimizers",
    "RMSPropParameters": "estimator_spec.config.optimizers",
    "StochasticGradientDescentParameters": "estimator_spec.config.optimizers",
    "ShardLayout": "estimator_spec.config.sharding",
    "EmbeddingConfigSpec": "estimator_spec.config.spec",
    "FeatureConfig": "estimator_spec.config.spec",
    "TableConfig": "estimator_spec.config.spec",
}

# The TPUEstimator surface loads an Estimator framework; it is imported on
# first use of its names, so that the config model, the engine and the
# columns load without it.
_LAZY = {
    "TPUEstimator": "estimator_spec.estimator",
    "TPUEstimatorSpec": "estimator_spec.estimator",
    "ExportSavedModelApiVersion": "estimator_spec.estimator",
    "ClusterTraining": "estimator_spec.cluster.tasks",
    "RunConfig": "estimator_spec.estimator.run_config",
    "TPUConfig": "estimator_spec.estimator.run_config",
    "InputPipelineConfig": "estimator_spec.estimator.run_config",
    "HostTPUEmbedding": "estimator_spec.mid_level",
}

_SUBPACKAGES = ("estimator", "interop", "checkpoints", "engine", "tpu",
                "config", "mid_level", "experimental", "tf_names", "cluster",
                "profiling", "migrate")


def _load():
  """Imports the modules of `_CORE` (once) and binds their names here, as
  the package did while it loaded before these names became lazy."""
  import importlib
  for name, module in _CORE.items():
    if name not in globals():
      globals()[name] = getattr(importlib.import_module(module), name)


def __getattr__(name):
  import importlib
  import importlib.util
  if name.startswith("__"):  # probes of module protocols load nothing
    raise AttributeError(f"module 'estimator_spec' has no attribute {name!r}")
  if name in _SUBPACKAGES or (name.isidentifier() and
                              importlib.util.find_spec(
                                  f"estimator_spec.{name}") is not None):
    # A module of the package (`from estimator_spec import files` asks here
    # first): imported alone, as the import statement would.
    return importlib.import_module(f"estimator_spec.{name}")
  _load()
  if name in _LAZY:
    return getattr(importlib.import_module(_LAZY[name]), name)
  if name in globals():  # a name of _CORE
    return globals()[name]
  raise AttributeError(f"module 'estimator_spec' has no attribute {name!r}")


def __dir__():
  return sorted(set(globals()) | set(_CORE) | set(_LAZY) | set(_SUBPACKAGES))


__all__ = [
    "EmbeddingConfigSpec", "EmbeddingConfig", "EmbeddingModel", "TableConfig",
    "FeatureConfig", "ShardLayout", "OptimizationParameters",
    "AdagradParameters", "AdagradMomentumParameters", "AdamParameters",
    "FtrlParameters", "MomentumParameters", "ProximalAdagradParameters",
    "ProximalYogiParameters", "RMSPropParameters",
    "StochasticGradientDescentParameters", "ALL_OPTIMIZERS", "TRAIN", "EVAL",
    "PREDICT"
] + list(_LAZY)
