"""The ps assignment every task of a cluster shares: which ps task holds
each table partition (`placement.TablePlacement`), recorded once per model
directory.

The chief decides it before its first step and writes it to
`ASSIGNMENT_FILE` in the model directory; the checkpoints record it too
(`checkpoint_record`, under `ASSIGNMENT_TENSOR`); a task that starts later
reads it from there, the latest checkpoint first, rather than decide again
(`resolve`).

What is read is untrusted input (docs/security.md): at most
`MAX_ASSIGNMENT_BYTES`, a regular file only, never followed through a
link, JSON nested at most 4 levels, and it must place every table of the
model on the cluster's ps tasks, one partition per task
(`assignment_problem`). A record that fails gets a warning naming it and
the reason, and is not used. The file is written whole or not at all,
never through a link, with the umask (`files.write_atomic`).
"""
import json
import os
import time
import warnings
from typing import Callable, Mapping, Optional, Sequence

import tensorflow as tf

from estimator_spec import files
from estimator_spec.cluster import tasks
from estimator_spec.config import model as model_lib

ASSIGNMENT_FILE = "embedding_ps_assignment.json"
ASSIGNMENT_TENSOR = "estimator_spec/ps_assignment"

# The largest ps-assignment file read (a model of 1,000 tables on 1,000 ps
# tasks writes about 5 MB).
MAX_ASSIGNMENT_BYTES = 16 * 2**20

# A ps assignment: {table: [ps task of each partition]}; one read from a
# record is decoded JSON that `assignment_problem` accepted.
Assignment = dict[str, list[int]]
# (where a record is, why it is not used)
_Problem = tuple[str, str]


def encode(assignment: Mapping[str, Sequence[int]]) -> str:
  """The text of a ps assignment, {table: [ps task of each partition]}, in
  the file and in checkpoints."""
  return json.dumps(assignment, sort_keys=True)


def checkpoint_record(assignment: Optional[Mapping[str, Sequence[int]]]
                      ) -> Optional[dict[str, str]]:
  """{ASSIGNMENT_TENSOR: text} that a training checkpoint records of the
  ps assignment, or None when there is none."""
  return {ASSIGNMENT_TENSOR: encode(assignment)} if assignment else None


def assignment_problem(model: model_lib.EmbeddingModel, num_ps: int,
                       assignment: object) -> Optional[str]:
  """Why `assignment` (decoded JSON) does not place every table of `model`
  on `num_ps` ps tasks, one partition per task; None when it does."""
  if not isinstance(assignment, dict):
    return "it is not a JSON object of {table: [ps task of each partition]}"
  if sorted(assignment) != sorted(model.tables):
    return (f"it names the tables {sorted(assignment)[:8]}, not this model's "
            f"{sorted(model.tables)[:8]}")
  for name, table in model.tables.items():
    tasks = assignment[name]
    partitions = min(table.vocabulary_size, num_ps)
    if not isinstance(tasks, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in tasks):
      return f"table {name!r}: it is not a list of ps task indices"
    if len(tasks) != partitions:
      return (f"table {name!r}: {len(tasks)} partitions, not {partitions} "
              f"(one per ps task of {num_ps})")
    if not all(0 <= t < num_ps for t in tasks):
      return f"table {name!r}: a ps task index is not in [0, {num_ps})"
    if len(set(tasks)) != len(tasks):
      return f"table {name!r}: a ps task holds two partitions"
  return None


def _read_text(path: str) -> bytes:
  """The bytes of the assignment file `path` (a local path: a regular file
  only, never followed through a link; a URL: through tf.io.gfile), at
  most MAX_ASSIGNMENT_BYTES; raises FileRejected or OSError."""
  if "://" not in path:
    data: bytes = files.read_bytes(path, MAX_ASSIGNMENT_BYTES)
    return data
  size = tf.io.gfile.stat(path).length
  if size > MAX_ASSIGNMENT_BYTES:
    raise files.FileRejected(f"it holds {size:,} bytes, more than the "
                             f"{MAX_ASSIGNMENT_BYTES:,} allowed")
  with tf.io.gfile.GFile(path, "rb") as f:
    read: bytes = f.read(MAX_ASSIGNMENT_BYTES + 1)
    return read


def _write(model_dir: str, assignment: Mapping[str, Sequence[int]]) -> None:
  """Writes `assignment` to the model directory's file: atomically and
  through no link on a local path, by a rename on a TF file system."""
  tf.io.gfile.makedirs(model_dir)
  path = os.path.join(model_dir, ASSIGNMENT_FILE)
  text = encode(assignment)
  if "://" in path:
    partial = path + ".partial"
    with tf.io.gfile.GFile(partial, "w") as f:
      f.write(text)
    tf.io.gfile.rename(partial, path, overwrite=True)
  else:
    files.write_atomic(path, text)


def _recorded(model_dir: str, model: model_lib.EmbeddingModel, num_ps: int
              ) -> tuple[Optional[Assignment], list[_Problem]]:
  """(the assignment the latest checkpoint, else the model directory's
  file, records for this model and ps count, or None; [(where, why) of
  each record that is not a valid one])."""
  checkpoint = tf.train.latest_checkpoint(model_dir)
  texts: list[tuple[str, Callable[[], bytes]]] = []
  if checkpoint is not None:
    reader = tf.compat.v1.train.NewCheckpointReader(checkpoint)
    if reader.has_tensor(ASSIGNMENT_TENSOR):
      texts.append((f"checkpoint {checkpoint} ({ASSIGNMENT_TENSOR})",
                    lambda: reader.get_tensor(ASSIGNMENT_TENSOR)))
  path = os.path.join(model_dir, ASSIGNMENT_FILE)
  if tf.io.gfile.exists(path) or os.path.lexists(path):
    texts.append((path, lambda: _read_text(path)))
  problems: list[_Problem] = []
  for where, read in texts:
    try:
      decoded = files.parse_json(read(), max_depth=4)
      problem = assignment_problem(model, num_ps, decoded)
    except FileNotFoundError:
      continue  # removed since
    except (OSError, ValueError, tf.errors.OpError) as error:
      problem = (error.strerror if isinstance(error, OSError) and
                 error.strerror else getattr(error, "message", None) or
                 str(error))
    if problem is None:
      return decoded, problems
    problems.append((where, problem))
  return None, problems


def _warn(problems: Sequence[_Problem], said: set[_Problem],
          then: str) -> None:
  """A warning for each (where, why) in `problems` not yet `said`, shown
  at the code that asked for the assignment (the caller of `resolve`'s
  caller, `placement.resolve_ps_assignment`)."""
  for where, why in problems:
    if (where, why) not in said:
      said.add((where, why))
      warnings.warn(f"The ps assignment in {where} is not used: {why}. "
                    f"{then}", RuntimeWarning, stacklevel=4)


def resolve(model: model_lib.EmbeddingModel, cluster: tasks.Cluster,
            model_dir: str, wait_secs: float,
            decide: Callable[[], Assignment]) -> Assignment:
  """The ps assignment every task of `cluster` uses for `model_dir`.

  The chief takes the one recorded in the model directory (checkpoint,
  then file) or else the one `decide()` returns, checked as a record is
  (one that no task could use is refused before anything is written), and
  writes the file;
  other training tasks wait up to `wait_secs` for a recorded one. A record
  that is unreadable or does not fit this model and ps count gets a
  warning naming it and the reason: the chief then replaces the file, a
  worker waits for the chief's.
  """
  said: set[_Problem] = set()
  recorded, problems = _recorded(model_dir, model, cluster.num_ps)
  if recorded is not None:
    return recorded
  if cluster.is_chief:
    _warn(problems, said, "The chief writes a new one.")
    assignment = decide()
    problem = assignment_problem(model, cluster.num_ps, assignment)
    if problem is not None:
      raise ValueError(
          f"The ps assignment decided for {model_dir} is not one the "
          f"training tasks can use: {problem}. Nothing was recorded; a rule "
          "places each table's partitions on different ps tasks.")
    _write(model_dir, assignment)
    return assignment
  deadline = time.monotonic() + wait_secs
  while time.monotonic() < deadline:
    _warn(problems, said, "This task waits for the chief's.")
    time.sleep(0.5)
    recorded, problems = _recorded(model_dir, model, cluster.num_ps)
    if recorded is not None:
      return recorded
  raise RuntimeError(
      f"{cluster.training_task_name(cluster.index)}: waited {wait_secs:.0f} "
      f"s for the chief to record which ps task holds each table partition "
      f"({os.path.join(model_dir, ASSIGNMENT_FILE)}); start the chief with "
      "the same model_dir and profile_data_directory.")
