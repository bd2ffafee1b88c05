"""TPU embedding feature columns that work on TPU, CPU and GPU.

`embedding_column` and `shared_embedding_columns` take the arguments of
TF 2.15's `tf.compat.v1.tpu.experimental` functions of the same names. As
TF's module does, this one also holds the optimization-parameter classes
TPU columns are trained with (`AdagradParameters`, `AdamParameters`,
`FtrlParameters`, `StochasticGradientDescentParameters`: estimator_spec's
own, loaded on first use), so that `tf.compat.v1.tpu.experimental` becomes
`tpu_embedding_columns` by the import change alone. `legacy` holds TF 1.x's
columns, which name their variables as TF 1.x did (docs/migration.md).
"""
from tpu_embedding_columns.api import embedding_column
from tpu_embedding_columns.api import shared_embedding_columns
from tpu_embedding_columns.columns import EmbeddingColumn
from tpu_embedding_columns.columns import SharedEmbeddingColumn
from tpu_embedding_columns.columns import SharedTable
from tpu_embedding_columns.context import ActivationSource
from tpu_embedding_columns.context import activation_source

TPU_EMBEDDING_COLUMN_TYPES = (EmbeddingColumn, SharedEmbeddingColumn)

__all__ = [
    "embedding_column",
    "shared_embedding_columns",
    "EmbeddingColumn",
    "SharedEmbeddingColumn",
    "SharedTable",
    "ActivationSource",
    "activation_source",
    "TPU_EMBEDDING_COLUMN_TYPES",
]

# The optimization-parameter classes TF keeps beside its columns. They are
# estimator_spec's (the config model, which this package must not import
# while loading: the config model imports the columns).
_PARAMETERS = ("AdagradParameters", "AdamParameters", "FtrlParameters",
               "StochasticGradientDescentParameters")


def __getattr__(name):
  import importlib
  if name in _PARAMETERS:
    optimizers = importlib.import_module("estimator_spec.config.optimizers")
    return getattr(optimizers, name)
  if name == "legacy":
    return importlib.import_module("tpu_embedding_columns.legacy")
  raise AttributeError(
      f"module 'tpu_embedding_columns' has no attribute {name!r}")


def __dir__():
  return sorted(set(globals()) | set(_PARAMETERS) | {"legacy"})


__all__ += list(_PARAMETERS)

