"""`profile_data_directory` in the estimator: the profiling layer's
`Profiler` (`profiling.sampling`: sampling, saving, the start-up report)
with what needs the estimator's placement, the ps task of each table
partition on a cluster, balanced by the saved statistics.
"""
import tensorflow as tf

from estimator_spec.cluster import placement
from estimator_spec.profiling import sampling


class Profiler(sampling.Profiler):
  """`sampling.Profiler` with `resolve_ps_assignment` (see module
  docstring)."""

  def resolve_ps_assignment(self, run_placement, model_dir, wait_secs,
                            stats):
    """Decides which ps task holds each table partition on the cluster of
    `run_placement` (the estimator's `placement.Placement`, which keeps
    it): recorded in `model_dir`, or balanced by the saved statistics
    (`stats`, from `load`; `placement.resolve_ps_assignment`); logged."""
    assignment = run_placement.resolve_ps_assignment(
        self.model, model_dir, stats, wait_secs)
    tf.compat.v1.logging.info(
        "Table partitions on the ps tasks:\n%s",
        placement.assignment_report(self.model, assignment, stats,
                                    run_placement.cluster.num_ps))
    return assignment
