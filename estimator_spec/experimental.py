"""`estimator_spec.experimental`: the counterpart of TF's
`tf.compat.v1.estimator.tpu.experimental` (its `EmbeddingConfigSpec`), so
that code written as `tpu.experimental.EmbeddingConfigSpec(...)` or
`from ....estimator.tpu.experimental import EmbeddingConfigSpec` keeps its
shape after the import change (docs/migration.md)."""
from estimator_spec.config.spec import EmbeddingConfigSpec

__all__ = ["EmbeddingConfigSpec"]
