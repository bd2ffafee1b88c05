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
"""
