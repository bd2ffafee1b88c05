"""`python -m estimator_spec migrate`: the import change, made by a program.

Rewrites the TF names of TPU embedding and TPUEstimator programs
(`tf.compat.v1.estimator.tpu.TPUEstimator`, `from tensorflow.compat.v1.
estimator import tpu as tpu_estimator`, `tf.contrib.tpu.RunConfig`,
`tf.compat.v1.tpu.experimental.embedding_column`, `tf.estimator.ModeKeys`,
`tf.estimator.export.ServingInputReceiver`, `import tensorflow_estimator`,
...) to this library's, by the one table of names (`estimator_spec.
tf_names`), so that the program no longer needs tensorflow-estimator. It
reads each file's syntax tree (Python's `ast`), finds the names through the
file's own import aliases, and edits only those spans of the source:
comments, formatting and everything else stay byte for byte. See
docs/migration.md.

One module per phase:

* `read`: a file's bytes (bounded, never through a link), its declared
  encoding and syntax tree, and the `Source` the edits are made on;
* `names`: the names the file's imports bind and every read of them;
* `table`: what a name becomes, by the table of names (plain functions);
* `edits`: the plan for the uses (`Edits`: the edits, the report's lines,
  the modules the new names need), then `imports`: the import statements;
* `write`: which files go where (`plan`), each written atomically;
* `report`: `Change`, `Note`, `Result` and every line printed (it
  imports no other phase);
* `command`: the phases in order, `migrate_source` (one file's bytes) and
  `run` (the command).

The package itself uses no TensorFlow: it reads programs, never runs them.
"""
from estimator_spec.migrate.command import migrate_source
from estimator_spec.migrate.command import run
from estimator_spec.migrate.read import MAX_FILE_BYTES
from estimator_spec.migrate.read import read_source
from estimator_spec.migrate.report import Change
from estimator_spec.migrate.report import Note
from estimator_spec.migrate.report import Result
from estimator_spec.migrate.write import Plan
from estimator_spec.migrate.write import plan
from estimator_spec.migrate.write import UsageError
from estimator_spec.migrate.write import write_file

__all__ = ["migrate_source", "run", "plan", "read_source", "write_file",
           "Plan", "UsageError", "Change", "Note", "Result",
           "MAX_FILE_BYTES"]
