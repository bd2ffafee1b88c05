"""The graph's shared read of the global step, made before input_fn runs.

TF 2.15 and current TF work around: TF's session hooks (checkpoints,
summaries, step counting) read the global step through one tensor that
`training_util._get_or_create_global_step_read` makes on first use and
keeps in a graph collection. Estimator makes it right after the global
step, before input_fn and model_fn build their ops, so the ops they build
get the same ids, and so the same random seeds under a graph-level seed,
as in Estimator's graph; the library's run loop (estimator/framework/)
makes it at the same point, through the same private function.
tests/test_tf_patches_estimator.py checks that the hooks reuse it.
"""
from tensorflow.python.training import training_util


def make(graph):
  """Makes (or finds) `graph`'s shared read of its global step."""
  return training_util._get_or_create_global_step_read(graph)
