"""The cluster wing: TPUEstimator training on a between-graph cluster
(TF_CONFIG with `ps` tasks, docs/cluster.md), over the host engine.

* `tasks`: the cluster as a task sees it (`Cluster`, read from the
  RunConfig), how it trains (`ClusterTraining`) and each task's batch.
* `session`: the session config of a host run and of each cluster task
  (device filters).
"""
