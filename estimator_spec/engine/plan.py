"""How each table's step runs, decided once and read by every pass.

`StepPlan` holds what holds for the whole engine (training or not, the
partitions here or on other tasks, updates now or held one step, the
compiled kernels this task's own ops use); `TablePlan` what holds per table,
decided when its variables are made: its `UpdatePipeline`, the executor of
its update (`executors.EXECUTORS`), where the update runs, when, whether
under a lock, and whether the lookup keeps the rows it read for the update.
The lookup and the backward pass and the update read these fields; none of
them asks the rules or the kernels again (docs/architecture.md, 'The
engine').
"""
import dataclasses
from typing import Any, Optional, Protocol

from estimator_spec.engine import executors
from estimator_spec.engine import kernels
from estimator_spec.engine import pipeline as pipeline_lib
from estimator_spec.engine import storage

# Where a table's update runs.
LOCAL = "local"      # in this process, on the whole table
REMOTE = "remote"    # per partition, on the task holding it
# When it runs.
NOW = "now"          # in the step that computed it
HELD = "held"        # in the next step, after its lookups (pipelining)


@dataclasses.dataclass(frozen=True)
class StepPlan:
  """What holds for every table of an engine.

  `kernels`: the compiled op module this task's own ops of a training step
  use (input checks, combiners, gradient sums, routing), or None (not
  training, or the kernels are off or did not build)."""
  training: bool
  remote: bool
  held: bool
  kernels: Any

  @classmethod
  def of(cls, training: bool, remote: bool, pipelining: bool) -> "StepPlan":
    return cls(training=training, remote=remote,
               held=training and pipelining,
               kernels=kernels.row_updates() if training else None)

  @property
  def compiles_here(self) -> bool:
    """Whether this task's own ops of a training step are compiled."""
    return self.kernels is not None

  @property
  def compiles_partitions(self) -> bool:
    """Whether the kernels run on this task's own table partitions: a
    training step's kernels are loaded and the partitions live here (their
    making, lookups, updates, a save's reads)."""
    return self.compiles_here and not self.remote

  @property
  def packs_requests(self) -> bool:
    """Whether a step's lookups and updates go as one request per task
    holding partitions (training with the partitions on other tasks)."""
    return self.training and self.remote


@dataclasses.dataclass(frozen=True)
class TablePlan:
  """How one table's step runs (see the module docstring).

  `ops`: the compiled op module the lookup and update of this table's
  partitions use (training, partitions in this process, on CPU), or None:
  TF ops. `executor` and `pipeline` are None outside training."""
  table: str
  pipeline: Optional[pipeline_lib.UpdatePipeline]
  executor: Optional[str]
  ops: Any
  where: str
  when: str
  keeps_rows: bool
  one_op_lookup: bool

  @classmethod
  def of(cls, step: StepPlan, name: str,
         pipeline: Optional[pipeline_lib.UpdatePipeline],
         rows: storage.PartitionedRows) -> "TablePlan":
    """The plan of table `name` whose variables are `rows`, updated by
    `pipeline` (None outside training)."""
    ops = (kernels.ops_for(rows.partitions) if step.compiles_partitions
           else None)
    executor = (executors.choose(pipeline, compiled=ops is not None,
                                 locked=step.remote)
                if pipeline is not None else None)
    return cls(
        table=name, pipeline=pipeline, executor=executor, ops=ops,
        where=REMOTE if step.remote else LOCAL,
        when=HELD if step.held else NOW,
        # The update reads the looked-up rows only where it is not compiled.
        keeps_rows=executor != "compiled",
        one_op_lookup=ops is not None and len(rows.partitions) == 1)

  @property
  def locked(self) -> bool:
    """Whether the update runs under a lock: on a partition's own task,
    where concurrent updates of the same rows (asynchronous training) must
    all count."""
    return self.where == REMOTE

  def describe(self) -> str:
    """One line: the table's executor, where and when."""
    return (f"{self.table}: {self.executor or 'no update'}, {self.where}, "
            f"{self.when}" + (", locked" if self.locked else "") +
            (", compiled lookup" if self.ops is not None else ""))


class PlanReader(Protocol):
  """What the passes read of the plans."""

  @property
  def step_plan(self) -> StepPlan:
    """The plan of the whole engine."""

  def table_plan(self, table_name: str) -> TablePlan:
    """The plan of table `table_name` (its variables exist)."""
