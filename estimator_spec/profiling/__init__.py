"""Profiling (`profile_data_directory`, docs/profile.md): the lookup
statistics a training run samples, their files, and the reports made from
them.

* `statistics`: `TableStatistics`, one table's sampled lookups as plain
  data, and the settings they are for;
* `file_format`: their JSON form, every field checked when read;
* `store`: their files in a directory, added to under a lock;
* `sampling`: gathering them in training: the sampling rate, the
  `Profiler` of a model's tables and its `StatisticsHook`, which samples
  a step's ids and adds them to the files;
* `shards`: what the statistics say about a config's shards (lookup
  load and memory under `div` and `mod`), for training's start-up report
  and `describe --profile-dir`;
* `summary`, `plots`, `page`: the `profile` command's report: the numbers
  and text summary of each table, its SVG plots, the HTML page.

It sits above the engine and below the estimator, which builds the
`Profiler` with what needs its placement (the ps task of each table
partition on a cluster) and adds the hook to a training step
(docs/architecture.md, 'Who owns what').
"""
