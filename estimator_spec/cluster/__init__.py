"""The cluster wing: TPUEstimator training on a between-graph cluster
(TF_CONFIG with `ps` tasks, docs/cluster.md), over the host engine.

* `tasks`: the cluster as a task sees it (`Cluster`, read from the
  RunConfig), how it trains (`ClusterTraining`) and each task's batch.
* `placement`: where the tables live, derived once per estimator
  (`Placement`): which ps task holds each table partition
  (`TablePlacement`, plain data), balanced by lookup statistics.
* `assignment_file`: that ps assignment, shared by every task through the
  model directory and the checkpoints, and read as untrusted input.
* `session`: the session config of a host run and of each cluster task
  (device filters).
* `sync`: the synchronous step: each task's entries in queues on the ps
  tasks, the chief's gather and updates, the replies, the step deadline.

The estimator layer calls it: it builds the `Placement` from its RunConfig
and the TPU topology (`estimator/tpu_context.py`), runs model_fn under
`sync.SyncStep.recording` and gives model_fn's EstimatorSpec the train op
and hooks `SyncStep.finish` returns.
"""
