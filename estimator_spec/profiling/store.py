"""Lookup statistics files in a directory (`profile_data_directory`).

One JSON file per table and settings (`file_format`), named after a hash
of those settings (`file_name`), written atomically with the user's umask
and never through a link (`save`, `estimator_spec.files.write_atomic`);
runs and tasks add their counts to it one after another, under the
directory's lock (`add_to_file`). A file is read only if it is a regular
file of at most `MAX_FILE_BYTES` (`files.read_json`) whose fields pass
`file_format.from_json`'s checks: `load` returns None, with a warning
naming the file and the reason, for a file that is unreadable, corrupt, of
another format version, or for other settings; it never raises for the
file's content (docs/security.md).
"""
import contextlib
import fcntl
import json
import os
import re
import tempfile
import warnings

from estimator_spec import files
from estimator_spec.profiling import file_format
from estimator_spec.profiling import statistics

MAX_FILE_BYTES = 16 * 2**20  # what a statistics file may weigh


def file_name(settings):
  """`<table>-<first 16 hex digits of the settings' hash>.json`."""
  readable = re.sub(r"[^A-Za-z0-9_.-]", "_", settings["table"])[:64]
  return f"{readable}-{statistics.settings_key(settings)[:16]}.json"


def check_directory(directory):
  """Raises a clear error for a `profile_data_directory` the host cannot
  use: a URL (statistics files are merged under a file lock, which needs a
  local or mounted file system), or a directory that cannot be created or
  written. Called before any training step."""
  if "://" in directory:
    raise ValueError(
        f"profile_data_directory={directory!r}: the host writes lookup "
        "statistics to local or mounted directories only (files are merged "
        "under a file lock); mount the bucket or give a local directory.")
  check_writable(directory)


def check_writable(directory):
  """Raises a clear error unless `directory` exists (or can be made) and
  takes files; called before any training step."""
  try:
    os.makedirs(directory, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=directory, prefix=".write_test_"):
      pass
  except OSError as error:
    raise ValueError(
        f"profile_data_directory={directory!r} cannot be written "
        f"({error.strerror or error}); lookup statistics are saved there. "
        "Give a writable directory.") from error


def save(directory, stats):
  """Writes `stats` to its file in `directory` atomically (mode 0666 less
  the umask, never through a link: `files.write_atomic`); returns the
  path."""
  path = os.path.join(directory, file_name(stats.settings))
  text = json.dumps(file_format.to_json(stats), allow_nan=False)
  return files.write_atomic(path, text)


LOCK_FILE = ".lock"


@contextlib.contextmanager
def _locked(directory):
  """An exclusive lock on `directory`'s statistics (a `.lock` file), held
  by one process at a time: tasks of a cluster and models sharing the
  directory merge their counts one after another. A `.lock` that is a
  link or not a regular file is refused (FileRejected), never followed."""
  path = os.path.join(directory, LOCK_FILE)
  try:
    handle = files.open_lock(path)
  except files.FileRejected as error:
    raise files.FileRejected(
        f"the lock file {path} is refused: {error}; remove it") from None
  try:
    fcntl.flock(handle, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(handle, fcntl.LOCK_UN)
  finally:
    os.close(handle)


def add_to_file(directory, stats):
  """Adds `stats` to the statistics saved for its settings in `directory`
  (a missing, corrupt or foreign file counts as none, with a warning) and
  writes the sum atomically, under the directory's lock. Returns the path.
  Raises OSError or `files.FileRejected` (a refused lock file) when it
  cannot write."""
  with _locked(directory):
    total = load(directory, stats.settings)
    if total is None:
      total = statistics.TableStatistics(
          stats.settings, stats.sampling_rate, stats.capacity)
      total.runs = 0
    total.merge(stats)
    return save(directory, total)


# What reading a file that is not statistics of this format raises (the
# reader's checks raise ValueError; the others are kept as a last guard).
_UNREADABLE = (OSError, ValueError, KeyError, TypeError, OverflowError,
               RecursionError, IndexError)


def _read(path):
  """The statistics in the file `path` (raises one of `_UNREADABLE`)."""
  return file_format.from_json(files.read_json(path, MAX_FILE_BYTES))


def _reason(error):
  if isinstance(error, OSError):
    return error.strerror or str(error)
  return str(error) or type(error).__name__


def load(directory, settings):
  """The statistics saved in `directory` for `settings`, or None (no file;
  or an unreadable, corrupt, foreign or mismatched one, with a warning
  naming the file and the reason)."""
  path = os.path.join(directory, file_name(settings))
  if not os.path.lexists(path):
    return None
  try:
    stats = _read(path)
    if (statistics.settings_key(stats.settings) !=
        statistics.settings_key(settings)):
      raise ValueError("it holds statistics of other settings")
  except FileNotFoundError:
    return None  # removed since
  except _UNREADABLE as error:
    warnings.warn(
        f"Lookup statistics file {path} is ignored: {_reason(error)}. "
        "Training goes on; the file is replaced when statistics are next "
        "saved.", RuntimeWarning, stacklevel=2)
    return None
  return stats


def load_for_model(directory, model, num_shards):
  """{table: the statistics `directory` holds for each table of `model`
  (an `EmbeddingModel`) kept for `num_shards` shards, or None}."""
  return {table: load(directory,
                      statistics.table_settings(model, table, num_shards))
          for table in model.tables}


def load_all(directory):
  """Every statistics file in `directory`, as [TableStatistics] ordered by
  table name then file name; files that are not readable statistics are
  skipped with a warning (as `load` does)."""
  found = []
  for name in sorted(os.listdir(directory)):
    if not name.endswith(".json") or name.startswith("."):
      continue
    path = os.path.join(directory, name)
    try:
      stats = _read(path)
      if file_name(stats.settings) != name:
        raise ValueError("its name does not match its settings")
    except FileNotFoundError:
      continue  # removed since
    except _UNREADABLE as error:
      warnings.warn(f"Lookup statistics file {path} is skipped: "
                    f"{_reason(error)}.", RuntimeWarning, stacklevel=2)
      continue
    found.append((stats.settings["table"], name, stats))
  return [stats for _, _, stats in sorted(found, key=lambda f: f[:2])]
