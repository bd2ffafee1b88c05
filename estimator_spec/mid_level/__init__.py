"""TF2's mid-level TPU embedding API, trained on the host.

`HostTPUEmbedding` takes what `tf.tpu.experimental.embedding.TPUEmbedding`
takes (FeatureConfig / TableConfig / optimizer objects) and offers its
interface (`build`, `enqueue`, `dequeue`, `apply_gradients`,
`embedding_tables`), computing on CPU/GPU what a TPU computes
(docs/numerics.md, 'Lookup' to 'Pipelining') with the host engine. It needs no
TPU and no TF 2.15: it runs on current TensorFlow, eagerly and inside
`tf.function`, on one device or on the replicas of a `MirroredStrategy`
(`replicas`).
"""
from estimator_spec.mid_level.embedding import HostTPUEmbedding

__all__ = ["HostTPUEmbedding"]
