"""Command line: `python -m estimator_spec COMMAND [SPEC] [...]`.

`SPEC` is `MODULE:FUNCTION`; the function (a callable taking no arguments)
returns the model's EmbeddingConfigSpec.

* `describe SPEC`: tables, features, per-shard memory and, with `--proto`,
  the TPU embedding configuration proto for the given topology;
  `--profile-dir DIR` adds what the lookup statistics in DIR show.
* `convert SPEC --checkpoint PATH_OR_MODEL_DIR --output PREFIX
  --to-strategy {div,mod} --to-shards N`: the checkpoint with its embedding
  tables and slots laid out for a run with that partition strategy and
  number of shards, everything else copied unchanged
  (`estimator_spec.checkpoints.convert.convert_checkpoint`).
* `export-mid-level SPEC --model-dir DIR --output PREFIX`: the tables and
  slots of a model_dir's latest checkpoint as a TF2 object-based checkpoint
  for `tf.tpu.experimental.embedding.TPUEmbeddingForServing`
  (`estimator_spec.interop.export_mid_level_checkpoint`).
* `profile DIR [--output PATH]` (no SPEC): the lookup statistics files in
  DIR (`profile_data_directory`) as a text summary on stdout and one
  self-contained HTML page (default `DIR/report.html`), whose path is the
  last line printed (`estimator_spec.engine.statistics_report`). Files that
  are not readable statistics are skipped with a warning on stderr.

`convert` and `export-mid-level` show a progress bar per table on stderr.
Exit codes: 0 done, 1 refused (the message says why; nothing was written:
for `profile`, DIR missing, not a directory or without statistics files, or
the page cannot be written), 2 bad command line.
"""
import argparse
import importlib
import os
import sys
import warnings


def _load_spec(target, command="describe"):
  module_name, _, attr = target.partition(":")
  if not module_name or not attr:
    raise SystemExit(
        f"{command}: expected MODULE:FUNCTION (e.g. examples.dlrm:build_spec); "
        f"got {target!r}.")
  sys.path.insert(0, os.getcwd())
  try:
    module = importlib.import_module(module_name)
  except ImportError as error:
    raise SystemExit(
        f"{command}: cannot import {module_name!r}: {error}.") from error
  factory = getattr(module, attr, None)
  if factory is None:
    raise SystemExit(f"{command}: {module_name!r} has no attribute {attr!r}.")
  return factory() if callable(factory) else factory


def _positive_int(text):
  try:
    value = int(text)
  except ValueError:
    raise argparse.ArgumentTypeError(
        f"expected a positive integer; got {text!r}") from None
  if value < 1:
    raise argparse.ArgumentTypeError(
        f"expected a positive integer; got {text!r}")
  return value


def _table_tensor(text):
  table, sep, tensor = text.partition("=")
  if not sep or not table or not tensor:
    raise argparse.ArgumentTypeError(
        f"expected TABLE=TENSOR_NAME; got {text!r}")
  return table, tensor


def _parser():
  parser = argparse.ArgumentParser(prog="python -m estimator_spec")
  sub = parser.add_subparsers(dest="command", required=True)
  describe = sub.add_parser(
      "describe", help="print tables, features, shard memory and the proto")
  describe.add_argument("spec", help="MODULE:FUNCTION returning a spec")
  describe.add_argument("--batch-size", type=int, default=1024)
  describe.add_argument("--num-hosts", type=int, default=1)
  describe.add_argument("--cores-per-host", type=int, default=1)
  describe.add_argument("--num-shards", type=int, default=None,
                        help="shards per table (default: num hosts)")
  describe.add_argument("--mode", choices=("train", "eval", "infer"),
                        default="train")
  describe.add_argument("--proto", action="store_true",
                        help="also print the configuration proto")
  describe.add_argument(
      "--profile-dir", default=None, metavar="DIR",
      help="a profile_data_directory whose lookup statistics to include")

  table_names = dict(
      metavar="TABLE=TENSOR", type=_table_tensor, action="append",
      default=[], dest="variable_names",
      help="checkpoint tensor of a table whose tensor cannot be found "
      "unambiguously (repeatable)")
  convert = sub.add_parser(
      "convert",
      help="re-lay out a checkpoint's embedding tables for another "
      "partition strategy / number of shards")
  convert.add_argument("spec", help="MODULE:FUNCTION returning the spec")
  convert.add_argument("--checkpoint", required=True,
                       help="model directory (latest checkpoint) or prefix")
  convert.add_argument("--output", required=True,
                       help="prefix of the converted checkpoint")
  convert.add_argument("--to-strategy", required=True, choices=("div", "mod"),
                       help="partition_strategy of the run that will restore")
  convert.add_argument(
      "--to-shards", required=True, type=_positive_int,
      help="shards per table of that run (TPU hosts or parameter servers)")
  convert.add_argument(
      "--from-strategy", choices=("div", "mod"), default=None,
      help="strategy the checkpoint was written with (default: what the "
      "checkpoint records, else the spec's partition_strategy)")
  convert.add_argument("--variable-name", **table_names)

  export = sub.add_parser(
      "export-mid-level",
      help="write a model_dir's tables and slots as a TF2 checkpoint for "
      "tf.tpu.experimental.embedding")
  export.add_argument("spec", help="MODULE:FUNCTION returning the spec")
  export.add_argument("--model-dir", required=True,
                      help="model directory (latest checkpoint) or prefix")
  export.add_argument("--output", required=True,
                      help="prefix of the TF2 checkpoint")
  export.add_argument(
      "--allow-missing-slots", action="store_true",
      help="export slots the checkpoint lacks at their initial values")
  export.add_argument(
      "--attribute", default="embedding",
      help="name of the embedding in the restoring tf.train.Checkpoint")
  export.add_argument("--variable-name", **table_names)

  profile = sub.add_parser(
      "profile",
      help="summarize a profile_data_directory's lookup statistics and "
      "write them as one HTML page")
  profile.add_argument("directory", metavar="DIR",
                       help="the profile_data_directory")
  profile.add_argument("--output", default=None, metavar="PATH",
                       help="the HTML page to write (default: "
                       "DIR/report.html)")
  return parser


def main(argv=None):
  args = _parser().parse_args(argv)

  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  from estimator_spec import quiet  # pylint: disable=import-outside-toplevel
  quiet.silence_deprecation_notices()
  import estimator_spec  # pylint: disable=import-outside-toplevel
  from estimator_spec.config import report  # pylint: disable=import-outside-toplevel

  if args.command == "profile":
    return _run_profile(args)
  spec = _load_spec(args.spec, args.command)
  if args.command == "describe":
    config = estimator_spec.EmbeddingConfig(
        spec,
        batch_size=args.batch_size,
        num_hosts=args.num_hosts,
        num_cores=args.num_hosts * args.cores_per_host,
        mode=args.mode)
    saved = None
    if args.profile_dir is not None:
      from estimator_spec.engine import statistics  # pylint: disable=import-outside-toplevel
      saved = statistics.load_for_model(args.profile_dir, config.model,
                                        config.num_cores)
    print(report.describe(config, num_shards=args.num_shards,
                          include_proto=args.proto, statistics=saved))
    return 0
  return _run_checkpoint_command(args, spec)


def _run_profile(args):
  """profile: summary on stdout, the page written, its path last; a
  directory without statistics exits with 1 and a message."""
  from estimator_spec.engine import statistics  # pylint: disable=import-outside-toplevel
  from estimator_spec.engine import statistics_report  # pylint: disable=import-outside-toplevel
  command = "python -m estimator_spec profile"
  directory = args.directory
  if not os.path.isdir(directory):
    reason = "does not exist" if not os.path.exists(directory) else (
        "is not a directory")
    print(f"{command}: error: {directory} {reason}.", file=sys.stderr)
    return 1
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:
      found = statistics.load_all(directory)
    except OSError as error:
      print(f"{command}: error: cannot read {directory}: "
            f"{error.strerror or error}.", file=sys.stderr)
      return 1
  for warning in caught:
    print(f"{command}: warning: {warning.message}", file=sys.stderr)
  if not found:
    print(f"{command}: error: no lookup statistics files in {directory} "
          "(a training run with profile_data_directory writes them).",
          file=sys.stderr)
    return 1
  output = args.output or os.path.join(directory, "report.html")
  try:
    statistics_report.write_html(found, output, source=directory)
  except OSError as error:
    print(f"{command}: error: cannot write {output}: "
          f"{error.strerror or error}.", file=sys.stderr)
    return 1
  print(statistics_report.summary(found))
  print(output)
  return 0


def _run_checkpoint_command(args, spec):
  """convert / export-mid-level; refusals exit with 1 and a message."""
  from estimator_spec.checkpoints import convert  # pylint: disable=import-outside-toplevel
  names = dict(args.variable_names) or None
  try:
    if args.command == "convert":
      path = convert.convert_checkpoint(
          spec, args.checkpoint, args.output, to_strategy=args.to_strategy,
          to_shards=args.to_shards, from_strategy=args.from_strategy,
          variable_names=names, progress=True)
    else:
      from estimator_spec.checkpoints import mid_level  # pylint: disable=import-outside-toplevel
      path = mid_level.export_mid_level_checkpoint(
          args.model_dir, spec, args.output, variable_names=names,
          allow_missing_slots=args.allow_missing_slots,
          attribute=args.attribute, progress=True)
  except (ValueError, TypeError, FileNotFoundError, FileExistsError) as error:
    print(f"python -m estimator_spec {args.command}: error: {error}",
          file=sys.stderr)
    return 1
  print(path)
  return 0


if __name__ == "__main__":
  sys.exit(main())
