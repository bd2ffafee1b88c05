"""Command line: `python -m estimator_spec COMMAND [SPEC] [...]`.

`SPEC` names a callable taking no arguments that returns the model's
EmbeddingConfigSpec (or the spec itself): `MODULE:FUNCTION` (imported with
the current directory on the path, e.g. `examples.dlrm:build_spec`) or
`FILE.py:FUNCTION` (a path, loaded from that file with its directory on the
path, e.g. `path/to/model.py:build_spec`). docs/cli.md documents every
command and flag.

A SPEC in an absl program (`load_spec`): the program's absl flags are
parsed, at their defaults or from the arguments after `--` at the end of
the command line (`describe trainer.py:build_spec -- --vocab=100`); a
`main(argv)` is called as `absl.app.run` calls it and stopped at the first
`estimator_spec.TPUEstimator` it constructs, whose `embedding_config_spec`
is the spec.

* `describe SPEC`: tables, features, per-shard memory and, with `--proto`,
  the TPU embedding configuration proto for the given topology;
  `--profile-dir DIR` adds what the lookup statistics in DIR show.
* `convert SPEC --model-dir PATH --output PREFIX --to-strategy {div,mod}
  --to-shards N`: the checkpoint with its embedding tables and slots laid
  out for a run with that partition strategy and number of shards,
  everything else copied unchanged
  (`estimator_spec.checkpoints.convert.convert_checkpoint`).
* `export-mid-level SPEC --model-dir PATH --output PREFIX`: the tables and
  slots of a checkpoint as a TF2 object-based checkpoint for
  `tf.tpu.experimental.embedding.TPUEmbeddingForServing`
  (`estimator_spec.interop.export_mid_level_checkpoint`).
* `rows SPEC --model-dir PATH --table T --ids 1,2,5-9`: rows of a table (or
  with `--slot`, of one of its optimizer slots) by id, whatever layout wrote
  the checkpoint (`estimator_spec.checkpoints.rows.read_rows`).
* `profile DIR [--output PATH]` (no SPEC): the lookup statistics files in
  DIR (`profile_data_directory`) as a text summary on stdout and one
  self-contained HTML page (default `DIR/report.html`, rewritten each
  time), whose path is the last line printed. Files that are not readable
  statistics are skipped with a warning on stderr.
* `migrate PATH... [--output DIR | --in-place]` (no SPEC): rewrites the TF
  TPU embedding and TPUEstimator names of the Python files under PATH to
  this library's (`estimator_spec.migrate`, by the table of
  `estimator_spec.tf_names`); prints `FILE:LINE: old → new` for each change
  and what it left alone, and why. Without --output or --in-place it
  writes nothing. Exit 2 when a file could not be parsed, read or written
  (one line each; the others are migrated).

`--model-dir` (aliases `--model_dir`, `--checkpoint`) is a model directory
(its latest checkpoint) or a checkpoint prefix. An `--output` that already
holds files is refused unless `--force` (except profile's default page).
`convert` and `export-mid-level` show a progress bar per table on stderr.

Exit codes: 0 done; 2 a usage error, or input the command refuses (one
line on stderr, `python -m estimator_spec COMMAND: error: ...`, saying what
is wrong and what to do; nothing was written); 1 an unexpected internal
error (with a traceback).
"""
import argparse
import contextlib
import importlib
import importlib.util
import inspect
import io
import os
import sys
import traceback
import warnings

# Each command imports the modules it uses when it runs, so that one
# command does not load what only another needs (the checkpoint tools, the
# interop with TF's own TPU stack).

# How the user called it: the console command pip installs (pyproject's
# [project.scripts]) or `python -m estimator_spec`.
CONSOLE_COMMAND = "estimator-spec"
PROG = (CONSOLE_COMMAND if os.path.basename(sys.argv[0]) == CONSOLE_COMMAND
        else "python -m estimator_spec")

# Bounds of the topology flags (see docs/cli.md). The largest TPU slices
# have a few thousand hosts (a v5p pod: 8,960 chips on 2,240 hosts of 4
# chips) and no TPU host has more than 8 TensorCores; tables are sharded
# over hosts (or parameter servers), so 4,096 shards leaves headroom over
# any slice while catching a mistyped count. The batch size is an int32 in
# the configuration proto.
MAX_SHARDS = 4096
MAX_HOSTS = 4096
MAX_CORES_PER_HOST = 8
MAX_BATCH_SIZE = 2**31 - 1
MAX_IDS = 1 << 20  # ids one `rows` call prints
# The commands that take a SPEC, and so the program's arguments after `--`.
SPEC_COMMANDS = ("describe", "convert", "export-mid-level", "rows")
# Where the errors of a program the command cannot run as far as its spec
# send the user.
ABSL_DOCS = "docs/cli.md, 'SPEC in an absl program'"


class UsageError(Exception):
  """A problem with what the user asked for: reported in one line, exit 2."""


class _Parser(argparse.ArgumentParser):
  """argparse's parser, reporting a bad command line in one line."""

  def error(self, message):
    self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help).\n")


# --- argument types --------------------------------------------------------


def _bounded_int(maximum, why):
  def parse(text):
    try:
      value = int(text)
    except ValueError:
      value = None
    if value is None or not 1 <= value <= maximum:
      raise argparse.ArgumentTypeError(
          f"expected an integer from 1 to {maximum:,} ({why}); got {text!r}")
    return value
  return parse


_SHARDS = _bounded_int(MAX_SHARDS, "shards per table: TPU hosts or "
                       "parameter servers")


def _table_tensor(text):
  table, sep, tensor = text.partition("=")
  if not sep or not table or not tensor:
    raise argparse.ArgumentTypeError(
        f"expected TABLE=TENSOR_NAME; got {text!r}")
  return table, tensor


def _id_ranges(text):
  """'1,2,5-9' -> [(1, 1), (2, 2), (5, 9)] (inclusive ranges)."""
  ranges = []
  for part in text.split(","):
    part = part.strip()
    first, dash, last = part.partition("-")
    try:
      lo = int(first)
      hi = int(last) if dash else lo
    except ValueError:
      lo = hi = None
    if lo is None or lo < 0 or hi < lo:
      raise argparse.ArgumentTypeError(
          f"expected ids such as 1,2,3 or 0-9 (non-negative integers and "
          f"increasing ranges, comma-separated); {part!r} in {text!r} is not")
    ranges.append((lo, hi))
  return ranges


# --- the parser ------------------------------------------------------------


def _add(parser, name, *aliases, **kwargs):
  """Adds `--name` with the alias `--name_with_underscores` and `aliases`."""
  flags = [name]
  underscored = "--" + name[2:].replace("-", "_")
  if underscored != name:
    flags.append(underscored)
  return parser.add_argument(*flags, *aliases, **kwargs)


def _spec_argument(parser):
  parser.add_argument(
      "spec", metavar="SPEC",
      help="MODULE:FUNCTION or FILE.py:FUNCTION returning the model's "
      "EmbeddingConfigSpec, or the program's main(argv), stopped at the "
      "TPUEstimator it constructs (docs/cli.md, 'Naming the spec')")
  parser.epilog = (
      "After the command's own arguments, '-- ARGS...' are the program's: "
      "its absl flags (-- --learning_rate=0.1), parsed at their defaults "
      f"without ({ABSL_DOCS}).")


def _model_dir_argument(parser):
  _add(parser, "--model-dir", "--checkpoint", required=True,
       dest="model_dir", metavar="PATH",
       help="model directory (its latest checkpoint) or checkpoint prefix")


def _variable_name_argument(parser):
  _add(parser, "--variable-name", metavar="TABLE=TENSOR", type=_table_tensor,
       action="append", default=[], dest="variable_names",
       help="checkpoint tensor of a table whose tensor cannot be found "
       "unambiguously (repeatable)")


def _from_strategy_argument(parser):
  _add(parser, "--from-strategy", choices=("div", "mod"), default=None,
       help="strategy the checkpoint was written with (default: what the "
       "checkpoint records, else the spec's partition_strategy)")


def _force_argument(parser, what):
  parser.add_argument("--force", action="store_true",
                      help=f"replace {what} if it exists")


def _parser():
  parser = _Parser(prog=PROG, description="Embedding specs and checkpoints "
                   "of estimator_spec models (see docs/cli.md).")
  from estimator_spec._version import __version__
  parser.add_argument("--version", action="version",
                      version=f"tpu-embedding-estimator {__version__}")
  sub = parser.add_subparsers(dest="command", required=True,
                              metavar="COMMAND")
  _describe_command(sub)
  _convert_command(sub)
  _export_command(sub)
  _rows_command(sub)
  _profile_command(sub)
  _migrate_command(sub)
  return parser


def _describe_command(sub):
  """`describe`'s arguments."""
  describe = sub.add_parser(
      "describe", help="print tables, features, shard memory and the proto")
  _spec_argument(describe)
  _add(describe, "--batch-size", default=1024,
       type=_bounded_int(MAX_BATCH_SIZE, "the global batch size"),
       help="the global batch size (default: %(default)s)")
  _add(describe, "--num-hosts", default=1,
       type=_bounded_int(MAX_HOSTS, "TPU hosts"),
       help="TPU hosts of the topology (default: %(default)s)")
  _add(describe, "--cores-per-host", default=1,
       type=_bounded_int(MAX_CORES_PER_HOST,
                         "no TPU host has more TensorCores"),
       help="TensorCores per host, at most 8 (default: %(default)s)")
  _add(describe, "--num-shards", default=None, type=_SHARDS,
       help="shards per table (default: num hosts)")
  describe.add_argument("--mode", choices=("train", "eval", "infer"),
                        default="train",
                        help="the mode whose configuration to describe "
                        "(default: %(default)s)")
  describe.add_argument("--proto", action="store_true",
                        help="also print the configuration proto")
  _add(describe, "--profile-dir", default=None, metavar="DIR",
       help="a profile_data_directory whose lookup statistics to include")


def _convert_command(sub):
  """`convert`'s arguments."""
  convert = sub.add_parser(
      "convert",
      help="re-lay out a checkpoint's embedding tables for another "
      "partition strategy / number of shards")
  _convert_arguments(convert)


def _export_command(sub):
  """`export-mid-level`'s arguments."""
  export = sub.add_parser(
      "export-mid-level",
      help="write a checkpoint's tables and slots as a TF2 checkpoint for "
      "tf.tpu.experimental.embedding")
  _spec_argument(export)
  _model_dir_argument(export)
  export.add_argument("--output", required=True, metavar="PREFIX",
                      help="prefix of the TF2 checkpoint")
  _add(export, "--allow-missing-slots", action="store_true",
       help="export slots the checkpoint lacks at their initial values")
  export.add_argument(
      "--attribute", default="embedding",
      help="name of the embedding in the restoring tf.train.Checkpoint")
  _from_strategy_argument(export)
  _variable_name_argument(export)
  _force_argument(export, "a checkpoint at --output")


def _rows_command(sub):
  """`rows`' arguments."""
  rows = sub.add_parser(
      "rows", help="print rows of a table (or of an optimizer slot) by id")
  _spec_argument(rows)
  _model_dir_argument(rows)
  rows.add_argument("--table", required=True,
                    help="the table's name (as describe lists them)")
  rows.add_argument("--ids", required=True, type=_id_ranges,
                    help="row ids: 1,2,3 and ranges 0-9 (inclusive)")
  rows.add_argument("--slot", default=None, metavar="NAME",
                    help="read this optimizer slot of the table instead "
                    "(e.g. Adagrad, or accumulators)")
  rows.add_argument("--format", choices=("text", "npy"), default="text",
                    help="text: one line 'ID<TAB>v1 v2 ...' per id; npy: "
                    "a [len(ids), dimension] float32 array (needs --output)")
  rows.add_argument("--output", default=None, metavar="FILE",
                    help="write there instead of stdout")
  _from_strategy_argument(rows)
  _variable_name_argument(rows)
  _force_argument(rows, "--output")


def _profile_command(sub):
  """`profile`'s arguments."""
  profile = sub.add_parser(
      "profile",
      help="summarize a profile_data_directory's lookup statistics and "
      "write them as one HTML page")
  profile.add_argument("directory", metavar="DIR",
                       help="the profile_data_directory")
  profile.add_argument("--output", default=None, metavar="PATH",
                       help="the HTML page to write (default: "
                       "DIR/report.html, rewritten each time)")
  _force_argument(profile, "an --output page")


def _migrate_command(sub):
  """`migrate`'s arguments."""
  migrate = sub.add_parser(
      "migrate",
      help="rewrite TF's TPU embedding and TPUEstimator names in Python "
      "files to this library's (the import change)")
  migrate.add_argument("paths", nargs="+", metavar="PATH",
                       help="Python files, or directories (every .py file "
                       "below them, symbolic links not followed)")
  target = migrate.add_mutually_exclusive_group()
  target.add_argument("--output", default=None, metavar="DIR",
                      help="write the migrated tree there (the files of a "
                      "directory PATH at their paths below it, other files "
                      "copied); default: only print the report")
  target.add_argument("--in-place", action="store_true",
                      help="rewrite the changed files where they are")
  _force_argument(migrate, "files that exist below --output")


def _convert_arguments(convert):
  """The convert command's arguments (extend here for new options)."""
  _spec_argument(convert)
  _model_dir_argument(convert)
  convert.add_argument("--output", required=True, metavar="PREFIX",
                       help="prefix of the converted checkpoint")
  _add(convert, "--to-strategy", required=True, choices=("div", "mod"),
       help="partition_strategy of the run that will restore")
  _add(convert, "--to-shards", required=True, type=_SHARDS,
       help="shards per table of that run (TPU hosts or parameter servers)")
  _from_strategy_argument(convert)
  _variable_name_argument(convert)
  _force_argument(convert, "a checkpoint at --output")


# --- loading the spec ------------------------------------------------------


class _SpecFound(BaseException):
  """Raised by the first TPUEstimator a SPEC function constructs: stops the
  program there (a BaseException, so that the program's `except
  Exception` does not catch it)."""


def _where(error):
  """' (at FILE:LINE)' of the innermost frame of `error`, or ''."""
  frames = traceback.extract_tb(error.__traceback__)
  if not frames:
    return ""
  frame = frames[-1]
  return f" (at {frame.filename}:{frame.lineno})"


def _describe_error(error):
  return f"{type(error).__name__}: {error}{_where(error)}"


def _flag_hint(error):
  """What to do about an error of absl's flags raised by the program."""
  if not type(error).__module__.startswith("absl.flags"):
    return ""
  if type(error).__name__ == "UnparsedFlagAccessError":
    return ("; the program reads an absl flag while it is imported: read it "
            f"inside a function ({ABSL_DOCS})")
  return f"; the program's flags go after '--' ({ABSL_DOCS})"


def _is_file_target(location):
  return location.endswith(".py") or "/" in location or os.sep in location


def load_spec(target, program_args=(), restore=None):
  """The spec that `target` (MODULE:FUNCTION or FILE.py:FUNCTION) names.

  The module runs as if started with `program_args` (`sys.argv` is the
  module's path and them); its absl flags, if absl is loaded and they are
  not parsed yet, are parsed from `program_args` (at their defaults
  without). FUNCTION is called without arguments, or with `argv` when it
  takes one (`main(argv)`, as `absl.app.run` calls it); the first
  `estimator_spec.TPUEstimator` it constructs stops it, and that
  estimator's `embedding_config_spec` is the spec (docs/cli.md, 'SPEC in
  an absl program').

  Args:
    target: MODULE:FUNCTION or FILE.py:FUNCTION.
    program_args: the program's own arguments (the command line after
      `--`).
    restore: a `contextlib.ExitStack` that takes the restoring of absl's
      flags as they were; None leaves them parsed.

  Raises:
    UsageError: saying what is wrong.
  """
  location, sep, attr = target.rpartition(":")
  if not sep or not location or not attr:
    raise UsageError(
        "SPEC must be MODULE:FUNCTION (e.g. examples.dlrm:build_spec) or "
        f"FILE.py:FUNCTION (e.g. path/to/model.py:build_spec); got "
        f"{target!r}.")
  program = (os.path.abspath(location) if _is_file_target(location) else
             location)
  saved = _save_flags(restore)
  with _program_argv([program] + list(program_args)):
    module = (_load_file(location) if _is_file_target(location) else
              _import_module(location, attr))
    if not saved:  # absl loaded by the program
      _save_flags(restore)
    if not hasattr(module, attr):
      raise UsageError(
          f"{location!r} has no attribute {attr!r}; SPEC is "
          f"{location}:<name of the function returning the spec>.")
    factory = getattr(module, attr)
    argv = _parse_absl_flags(target, program, list(program_args))
    spec = _call(target, factory, argv) if callable(factory) else factory
  from estimator_spec.config import spec as spec_lib
  if not isinstance(spec, spec_lib.EmbeddingConfigSpec):
    raise UsageError(
        f"{target} returned a {type(spec).__name__}, not an "
        "estimator_spec.EmbeddingConfigSpec.")
  return spec


@contextlib.contextmanager
def _program_argv(argv):
  """`sys.argv` is `argv` in the block: the program sees the command line
  it would have if started as `python FILE ARGS`."""
  saved = sys.argv
  sys.argv = argv
  try:
    yield
  finally:
    sys.argv = saved


def _import_module(location, attr):
  """The module MODULE names, imported with the current directory on the
  path."""
  if os.getcwd() not in sys.path:
    sys.path.insert(0, os.getcwd())
  try:
    return importlib.import_module(location)
  except ModuleNotFoundError as error:
    if error.name and location.startswith(error.name) and (
        location == error.name or location[len(error.name)] == "."):
      raise UsageError(
          f"cannot import module {location!r} ({error}); run from the "
          "directory that holds it, add that directory to PYTHONPATH, or "
          f"give the file: path/to/{location.split('.')[-1]}.py:{attr}."
      ) from None
    raise UsageError(
        f"importing {location!r} failed: {_describe_error(error)}."
    ) from None
  except Exception as error:
    raise UsageError(
        f"importing {location!r} failed: {_describe_error(error)}"
        f"{_flag_hint(error)}.") from None


def _load_file(path):
  if not os.path.isfile(path):
    what = "is a directory" if os.path.isdir(path) else "does not exist"
    raise UsageError(f"spec file {path} {what}; SPEC is FILE.py:FUNCTION "
                     "or MODULE:FUNCTION.")
  path = os.path.abspath(path)
  name = "_estimator_spec_cli_" + "".join(
      c if c.isalnum() else "_" for c in os.path.splitext(path)[0])
  if name in sys.modules:
    return sys.modules[name]
  loader_spec = importlib.util.spec_from_file_location(name, path)
  if loader_spec is None:
    raise UsageError(f"spec file {path} cannot be loaded as Python "
                     "(it should end in .py).")
  module = importlib.util.module_from_spec(loader_spec)
  directory = os.path.dirname(path)
  if directory not in sys.path:  # its sibling modules import
    sys.path.insert(0, directory)
  sys.modules[name] = module
  try:
    loader_spec.loader.exec_module(module)
  except Exception as error:
    del sys.modules[name]
    raise UsageError(
        f"loading {path} failed: {_describe_error(error)}"
        f"{_flag_hint(error)}.") from None
  return module


# --- the program's absl flags ----------------------------------------------


def _parse_absl_flags(target, program, program_args):
  """The `argv` a `main(argv)` gets: `[program]` and the program arguments
  absl does not take as flags. Parses absl's flags when absl is loaded (the
  program, or TensorFlow, imported it; absl is never imported here) and
  they are not parsed yet, or program arguments were given."""
  flags = sys.modules.get("absl.flags")
  if flags is None:
    return [program] + program_args
  values = flags.FLAGS
  if values.is_parsed() and not program_args:
    return [program]
  was_parsed = values.is_parsed()
  try:
    return values([program] + program_args)
  except flags.Error as error:
    missing = _missing_required_flags(values, flags) if (
        not was_parsed and values.is_parsed()) else []
    if missing:
      names = ", ".join(f"--{name}" for name in missing)
      raise UsageError(
          f"{target}: the program requires the absl flag(s) {names} "
          "(flags.mark_flag_as_required), which have no value; pass them "
          "at the end of the command line, after '--': -- " +
          " ".join(f"--{name}=VALUE" for name in missing) +
          f" ({ABSL_DOCS}).") from None
    raise UsageError(
        f"{target}: the program's absl flags refuse the arguments after "
        f"'--' {program_args}: {type(error).__name__}: {error} "
        f"({ABSL_DOCS}).") from None


def _missing_required_flags(values, flags):
  """The flags without a value whose own validator refuses None (what
  `flags.mark_flag_as_required` registers)."""
  missing = []
  for name in sorted(values):
    flag = values[name]
    if flag.name != name or flag.value is not None:  # a short name, a value
      continue
    for validator in flag.validators:
      if validator.get_flags_names() != [name]:
        continue
      try:
        validator.verify(values)
      except flags.ValidationError:
        missing.append(name)
        break
  return missing


def _save_flags(restore):
  """Whether absl is loaded; if so, and `restore` is an ExitStack, pushes
  the restoring of absl's flags as they are now (parsed or not, and their
  values) onto it."""
  flags = sys.modules.get("absl.flags")
  if flags is None:
    return False
  if restore is not None:
    values = flags.FLAGS
    saved = values.is_parsed(), {
        name: (values[name].value, values[name].present,
               values[name].using_default_value) for name in values}
    restore.callback(_restore_flags, values, saved)
  return True


def _restore_flags(values, saved):
  """absl's flags as `_save_flags` saw them (unparsed: every flag at its
  default, those defined since included)."""
  was_parsed, by_name = saved
  if not was_parsed:
    values.unparse_flags()
  for name, (value, present, using_default) in by_name.items():
    if name in values:
      flag = values[name]
      flag.value, flag.present = value, present
      flag.using_default_value = using_default


# --- calling the SPEC function ---------------------------------------------


def _arguments(target, factory, argv):
  """[] or [argv]: how to call `factory` (a function that takes one
  argument is a `main(argv)`)."""
  try:
    parameters = inspect.signature(factory).parameters.values()
  except (TypeError, ValueError):  # a builtin: called without arguments
    parameters = []
  required = [p.name for p in parameters if p.default is p.empty and p.kind
              not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
  if len(required) > 1 or any(
      p.kind == p.KEYWORD_ONLY and p.default is p.empty for p in parameters):
    raise UsageError(
        f"{target} needs the arguments {', '.join(required)}; SPEC names a "
        "function called without arguments, or a main(argv) as "
        f"absl.app.run calls it ({ABSL_DOCS}).")
  if required:
    return [argv]
  if len(argv) > 1:
    raise UsageError(
        f"{target} takes no arguments, so the program arguments {argv[1:]} "
        "have nowhere to go: after '--', absl flags are parsed and the "
        f"other arguments go to a main(argv) ({ABSL_DOCS}).")
  return []


def _call(target, factory, argv):
  """What `factory` returns, or the spec of the first TPUEstimator it
  constructs (which stops it)."""
  arguments = _arguments(target, factory, argv)
  with _eager_kept(), _estimator_intercepted() as found:
    try:
      result = factory(*arguments)
    except _SpecFound:
      result = None
    except SystemExit as error:
      if not found:
        raise UsageError(
            f"{target} exited (SystemExit: {error.code}) before it "
            "constructed an estimator_spec.TPUEstimator; SPEC names a "
            "function that returns the spec or constructs the estimator "
            f"({ABSL_DOCS}).") from None
    except Exception as error:  # pylint: disable=broad-except
      if not found:
        raise UsageError(f"{target} raised {_describe_error(error)}"
                         f"{_flag_hint(error)}.") from None
  if found:  # even if the program caught _SpecFound and went on
    if found[0] is None:
      raise UsageError(
          f"{target} constructed an estimator_spec.TPUEstimator without an "
          "embedding_config_spec (its model has no TPU embedding tables).")
    return found[0]
  from estimator_spec.config import spec as spec_lib
  if result is None or (arguments and not isinstance(
      result, spec_lib.EmbeddingConfigSpec)):
    raise UsageError(
        f"{target} returned without constructing an estimator_spec."
        "TPUEstimator (where the command stops it and takes its spec) or "
        f"returning an EmbeddingConfigSpec ({ABSL_DOCS}).")
  return result


# What a TF1-style main calls first to turn TF 2 behaviour off.
_TF2_OFF = ("disable_v2_behavior", "disable_eager_execution")


@contextlib.contextmanager
def _eager_kept():
  """TensorFlow's eager execution kept on in the block: a TF1-style main
  turns TF 2 behaviour off (`tf.compat.v1.disable_v2_behavior()`), which
  the commands that write TF2 checkpoints need, and which TF cannot turn
  on again once a graph was built. The command stops main at its
  TPUEstimator, before main builds a graph, so those calls are skipped in
  the block (docs/cli.md, 'SPEC in an absl program')."""
  import tensorflow as tf
  saved = {name: getattr(tf.compat.v1, name) for name in _TF2_OFF}
  for name in _TF2_OFF:
    setattr(tf.compat.v1, name, lambda: None)
  try:
    yield
  finally:
    for name, function in saved.items():
      setattr(tf.compat.v1, name, function)


@contextlib.contextmanager
def _estimator_intercepted():
  """In the block, constructing an `estimator_spec.TPUEstimator` (or a
  subclass) records its `embedding_config_spec` in the list yielded and
  raises `_SpecFound`; the class is restored after."""
  from estimator_spec.estimator import tpu_estimator
  cls = tpu_estimator.TPUEstimator
  original_new = cls.__dict__["__new__"]
  original_init = cls.__dict__["__init__"]
  signature = inspect.signature(original_init)
  found = []

  def stop(args, kwargs):
    try:
      bound = signature.bind(None, *args, **kwargs)
    except TypeError:
      return  # the real constructor says what is wrong
    found.append(bound.arguments.get("embedding_config_spec"))
    raise _SpecFound()

  def new(klass, *args, **kwargs):
    stop(args, kwargs)
    return super(cls, klass).__new__(klass)  # a subclass's own arguments

  def init(self, *args, **kwargs):
    stop(args, kwargs)
    original_init(self, *args, **kwargs)

  cls.__new__ = staticmethod(new)
  cls.__init__ = init
  try:
    yield found
  finally:
    cls.__new__ = original_new
    cls.__init__ = original_init


# --- running ---------------------------------------------------------------


def _one_line(text):
  return " ".join(str(text).split())


def _op_error_text(error):
  """What a TF error raised while reading or writing a checkpoint says,
  without the stack of where TF built the op (`Detected at node ...
  defined at: File ...`) or its node tags (`[[{{node ...}}]]`)."""
  lines = str(error.message).splitlines()
  nodes = [i for i, line in enumerate(lines) if line.startswith("Node: ")]
  if nodes:  # the error's own text follows the stack's last `Node:` line
    lines = lines[nodes[-1] + 1:]
  kept = [line for line in lines if line.strip() and "[[" not in line and
          not line.startswith("Graph execution error")]
  text = " ".join(kept) or type(error).__name__
  return (f"TensorFlow cannot read or write the checkpoint: {text} "
          f"({type(error).__name__}); check that the checkpoint's files are "
          "complete and readable.")


def _split_program_arguments(argv):
  """(the command's own arguments, the program's: those after the first
  `--` of a SPEC command)."""
  command = next((a for a in argv if not a.startswith("-")), None)
  if command in SPEC_COMMANDS and "--" in argv:
    split = argv.index("--")
    return argv[:split], argv[split + 1:]
  return argv, []


def main(argv=None):
  """Runs a command; returns its exit code (argparse exits itself on a bad
  command line, with 2)."""
  own, program_args = _split_program_arguments(
      sys.argv[1:] if argv is None else list(argv))
  args = _parser().parse_args(own)
  if args.command == "migrate":
    return _run_migrate(args)
  # TF's own log lines (C++ and Python) are silenced unless the user set
  # their level: the command says what went wrong in its own one line.
  # (Under `python -m`, the package sets the C++ level when it loads.)
  # TensorFlow loads only now (the package loads it on first use): --help,
  # --version and a bad command line answer without it.
  user_level = "TF_CPP_MIN_LOG_LEVEL" in os.environ
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  from estimator_spec import quiet
  quiet.silence_deprecation_notices()
  import tensorflow as tf
  logger_level = tf.get_logger().level  # restored when the command ends
  if not user_level:
    tf.get_logger().setLevel("FATAL")
  user_errors = (UsageError, ValueError, TypeError, OSError,
                 tf.errors.OpError)
  try:
    with contextlib.ExitStack() as restore:
      return _run_command(args, program_args, restore)
  except user_errors as error:
    if isinstance(error, tf.errors.OpError):
      message = _op_error_text(error)
    elif isinstance(error, OSError) and error.strerror:
      message = (f"cannot access {error.filename}: {error.strerror}; check "
                 "the path and its permissions." if error.filename else
                 error.strerror)
    else:
      message = str(error)
    print(f"{PROG} {args.command}: error: {_one_line(message)}",
          file=sys.stderr)
    return 2
  finally:
    tf.get_logger().setLevel(logger_level)


def _run_command(args, program_args, restore):
  """Runs a command other than migrate; `restore` takes what is to be
  put back when it ends (absl's flags)."""
  if args.command == "profile":
    return _run_profile(args)
  spec = load_spec(args.spec, program_args, restore=restore)
  if args.command == "describe":
    return _run_describe(args, spec)
  if args.command == "rows":
    return _run_rows(args, spec)
  return _run_checkpoint_command(args, spec)


def _run_migrate(args):
  from estimator_spec import migrate
  try:
    return migrate.run(args.paths, output=args.output,
                       in_place=args.in_place, force=args.force)
  except migrate.UsageError as error:
    print(f"{PROG} migrate: error: {_one_line(error)}", file=sys.stderr)
    return 2


def _run_describe(args, spec):
  import estimator_spec
  from estimator_spec.config import report
  config = estimator_spec.EmbeddingConfig(
      spec,
      batch_size=args.batch_size,
      num_hosts=args.num_hosts,
      num_cores=args.num_hosts * args.cores_per_host,
      mode=args.mode)
  statistics_text = ""
  if args.profile_dir is not None:
    if not os.path.isdir(args.profile_dir):
      raise UsageError(
          f"--profile-dir {args.profile_dir} is not a directory; give the "
          "profile_data_directory of a training run.")
    from estimator_spec.profiling import shards
    from estimator_spec.profiling import store
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("always")
      saved = store.load_for_model(args.profile_dir, config.model,
                                   config.num_cores)
    for warning in caught:  # one line each, as profile says them
      print(f"{PROG} describe: warning: {_one_line(warning.message)}",
            file=sys.stderr)
    statistics_text = shards.describe_section(config, saved, args.num_shards)
  print(report.describe(config, num_shards=args.num_shards,
                        include_proto=args.proto,
                        statistics_text=statistics_text))
  return 0


def _run_profile(args):
  """profile: summary on stdout, the page written, its path last."""
  from estimator_spec.profiling import page
  from estimator_spec.profiling import store
  from estimator_spec.profiling import summary
  directory = args.directory
  if not os.path.isdir(directory):
    reason = "does not exist" if not os.path.exists(directory) else (
        "is not a directory")
    raise UsageError(f"{directory} {reason}; give the "
                     "profile_data_directory of a training run.")
  if args.output is not None and os.path.exists(args.output) and (
      not args.force):
    raise UsageError(f"--output {args.output} exists; pass --force to "
                     "replace it or choose another path.")
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:
      found = store.load_all(directory)
    except OSError as error:
      raise UsageError(f"cannot read {directory}: "
                       f"{error.strerror or error}.") from None
  for warning in caught:
    print(f"{PROG} profile: warning: {_one_line(warning.message)}",
          file=sys.stderr)
  if not found:
    raise UsageError(f"no lookup statistics files in {directory} (a "
                     "training run with profile_data_directory writes them).")
  output = args.output or os.path.join(directory, "report.html")
  try:
    page.write_html(found, output, source=directory)
  except OSError as error:
    raise UsageError(f"cannot write {output}: "
                     f"{error.strerror or error}.") from None
  print(summary.summary(found))
  print(output)
  return 0


def _run_checkpoint_command(args, spec):
  """convert / export-mid-level."""
  names = dict(args.variable_names) or None
  if args.command == "convert":
    from estimator_spec.checkpoints import convert
    path = convert.convert_checkpoint(
        spec, args.model_dir, args.output, to_strategy=args.to_strategy,
        to_shards=args.to_shards, from_strategy=args.from_strategy,
        variable_names=names, progress=True, overwrite=args.force)
  else:
    from estimator_spec import interop
    path = interop.export_mid_level_checkpoint(
        args.model_dir, spec, args.output, variable_names=names,
        allow_missing_slots=args.allow_missing_slots,
        attribute=args.attribute, progress=True,
        from_strategy=args.from_strategy, overwrite=args.force)
  print(path)
  return 0


def _run_rows(args, spec):
  import numpy as np
  from estimator_spec import files
  from estimator_spec.checkpoints import rows
  owner = "read_rows"
  table = rows.table_of(owner, spec.model, args.table)
  # Range ends first: a mistyped range must not build a huge id list.
  rows.check_ids(owner, [i for r in args.ids for i in r], table)
  count = sum(hi - lo + 1 for lo, hi in args.ids)
  if count > MAX_IDS:
    raise UsageError(f"--ids asks for {count:,} rows, more than {MAX_IDS:,};"
                     " ask for fewer, or read the table in Python "
                     "(estimator_spec.checkpoints.rows.read_rows).")
  if args.format == "npy" and args.output is None:
    raise UsageError("--format npy writes a binary file: give --output FILE.")
  if args.output is not None:
    if os.path.isdir(args.output):
      raise UsageError(f"--output {args.output} is a directory; give a file "
                       "path.")
    if os.path.exists(args.output) and not args.force:
      raise UsageError(f"--output {args.output} exists; pass --force to "
                       "replace it or choose another path.")
  ids = np.concatenate([np.arange(lo, hi + 1, dtype=np.int64)
                        for lo, hi in args.ids])
  values = rows.read_rows(args.model_dir, spec, args.table, ids,
                          slot=args.slot, from_strategy=args.from_strategy,
                          variable_names=dict(args.variable_names) or None)
  text = None if args.format == "npy" else "".join(
      f"{row_id}\t{' '.join(str(v) for v in row)}\n"
      for row_id, row in zip(ids, values))
  if args.output is None:
    sys.stdout.write(text)
    return 0
  directory = os.path.dirname(os.path.abspath(args.output))
  if not os.path.isdir(directory):
    raise UsageError(f"--output {args.output}: directory {directory} does "
                     "not exist; create it first.")
  if args.format == "npy":
    buffer = io.BytesIO()
    np.save(buffer, values)
    data = buffer.getvalue()
  else:
    data = text.encode()
  files.write_atomic(args.output, data)
  print(args.output)
  return 0


if __name__ == "__main__":
  sys.exit(main())
