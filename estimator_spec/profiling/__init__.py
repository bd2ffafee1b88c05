"""Profiling (`profile_data_directory`, docs/profile.md): the lookup
statistics a training run samples, their files, and the reports made from
them.

* `statistics`: `TableStatistics`, one table's sampled lookups as plain
  data, and the settings they are for;
* `file_format`: their JSON form, every field checked when read;
* `store`: their files in a directory, added to under a lock;
* `sampling`: how often training samples its lookups;
* `report`: the `profile` command's text summary and its HTML page.

It sits above the engine and below the estimator, which wires its hook
into training (docs/architecture.md, 'Who owns what').
"""
