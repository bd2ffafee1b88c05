"""Synchronous training steps on a between-graph cluster (docs/numerics.md,
'Many machines').

One step, global step g at its start, W training tasks, P ps tasks:

1. Every training task looks up its share of the batch, runs the model and
   its backward pass, and sends its gradients, split by ps task, into its
   own queue on each ps task: one entry of two tensors (docs/cluster.md,
   'Requests per step'): the lookup's request there (the distinct local
   ids of each table partition on that ps), and one float32 tensor (g, the
   float32 gradients of the dense variables on that ps, then the learning
   rate and the gradient sums of each of those partitions); other dense
   gradients (sparse, or of other types) as components of their own
   (`entries`: the layout, the queues; `send`: the sending).
2. The chief takes one entry per task from every queue (entries of another
   step, left by a task that died or by a restored chief, are dropped), and
   on each ps task sums the embedding gradients per id and runs the
   optimizer once per touched row there (the tables never leave their ps);
   it averages the dense gradients and applies them with the model's own
   optimizer, which advances the global step by one (`chief`). The two
   updates run side by side, and the optimizer's is built under ps 0's
   device: its join and the step's increment run on ps 0, so once the
   entries are taken nothing waits for a round trip through the chief.
3. The chief then tells every worker that step g is done; a worker's step
   ends when it hears so (or that its entry was dropped: it then reruns)
   (`barrier`).

Each task's loss is the mean over its B/W examples, so its embedding
gradients are W times its share of the global-batch gradient: the chief
scales the per-id sums by 1/W, as `CrossShardOptimizer`'s MEAN reduction
scales each replica's loss on a TPU; the dense gradients are averaged as
`CrossShardOptimizer` averages them. W tasks with B/W examples each thus
train as one process with B examples (up to the order of float32 sums).

The dense gradients are taken where model_fn's optimizer applies them:
while model_fn runs, `tf.compat.v1.train.Optimizer.apply_gradients` records
its arguments and returns an op that stands for the step's update; the
update itself is built after model_fn returns, once the embedding gradients
are known too (`recording`).

`SyncWatchHook` gives each step a deadline (`ClusterTraining`'s
`step_timeout_secs`) and logs, while a step waits, which tasks have not sent
their gradients; the estimator turns the deadline's error into
`errors.SyncStepTimeoutError` naming them (`watch`).

`SyncStep` (`step`) puts these together for one TRAIN model_fn call: the
estimator calls model_fn inside `SyncStep.recording()`, then adds the train
op and hooks `SyncStep.finish` returns to model_fn's EstimatorSpec.
"""
from estimator_spec.cluster.sync.recording import SUM_REDUCTION_REFUSED
from estimator_spec.cluster.sync.step import SyncStep
from estimator_spec.cluster.sync.watch import SyncWatchHook
from estimator_spec.cluster.sync.watch import timeout_error

__all__ = ["SUM_REDUCTION_REFUSED", "SyncStep", "SyncWatchHook",
           "timeout_error"]
