"""`make demo`: train the DLRM-style CTR model with TPU embedding semantics
on this machine's CPU, evaluate its AUC, export a SavedModel and run one
prediction through the export. Training samples lookup statistics into a
profile directory (shared by every demo run: counts add up), and the demo
ends with their report.

The examples come from a generator (no data in the graph: a run at the
defaults writes about 40 MB). The library's progress lines, every
--loss-window steps, give the step out of --steps, the loss averaged over
those steps, examples/s (with the evaluations that ran in between, and the
rate without them) and an ETA; its summaries the per-table learning rate,
rows touched and norms (docs/estimator.md, 'Monitoring').
The demo evaluates each of --evaluations checkpoints next to two
yardsticks (the hidden click model's own AUC, the ceiling, and a logistic
regression on the numeric features, the baseline) and draws
<model_dir>/training_curve.png. Rerun with the same --model-dir to resume
from its latest checkpoint.

The model is a TPUEstimator model (examples/dlrm.py): the only changes from
a TPU user's code are the imports (`tpu_embedding_columns` for
`tf.compat.v1.tpu.experimental`, `estimator_spec` for
`tf.compat.v1.estimator.tpu`).
"""
import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from estimator_spec import quiet

quiet.silence_deprecation_notices()

import numpy as np
import tensorflow as tf

import estimator_spec
from estimator_spec.profiling import page as statistics_page
from estimator_spec.profiling import sampling
from estimator_spec.profiling import store
from examples import ctr_data
from examples import dlrm
from examples import training_monitor


def demo_spec():
  """The spec `make demo` trains with its defaults (for the command line:
  `python -m estimator_spec convert examples.train_ctr:demo_spec ...`)."""
  return dlrm.build_spec(0.05, partition_strategy="mod")


def argument_parser():
  """The demo's command line (`python -m examples.train_ctr --help`)."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--model-dir", default=None,
                      help="default: runs/ctr_demo/<time>; an existing "
                      "model dir resumes from its latest checkpoint")
  parser.add_argument("--scale", type=float, default=0.05,
                      help="vocabulary scale of the example (1.0 = full; "
                      "default: %(default)s)")
  parser.add_argument("--steps", type=int, default=1500,
                      help="max_steps: the global step training ends at "
                      "(default: %(default)s)")
  parser.add_argument("--evaluations", type=int, default=4,
                      help="checkpoints evenly spaced over the steps, each "
                      "evaluated as it is saved (default: %(default)s)")
  parser.add_argument("--loss-window", type=int, default=100,
                      help="steps between progress lines (each prints the "
                      "mean loss of its steps; default: %(default)s)")
  parser.add_argument("--batch-size", type=int, default=256,
                      help="train_batch_size: examples per training step "
                      "(default: %(default)s)")
  parser.add_argument("--train-examples", type=int, default=200_000,
                      help="training examples to generate; training cycles "
                      "through them, reshuffled each pass (default: "
                      "%(default)s)")
  parser.add_argument("--eval-examples", type=int, default=40_960,
                      help="held-out examples each evaluation reads, in "
                      "whole batches of 1024 (default: %(default)s)")
  parser.add_argument("--partition-strategy", default="mod",
                      choices=["div", "mod"],
                      help="how each table's rows are laid out over the 16 "
                      "emulated TPU cores (EmbeddingConfigSpec's "
                      "partition_strategy; default: %(default)s)")
  parser.add_argument("--pipelining", action="store_true",
                      help="pipeline_execution_with_tensor_core=True: "
                      "each step's embedding update is held until after the "
                      "next step's lookups, as on a pipelined TPU (default: "
                      "off)")
  parser.add_argument("--profile-dir", default=os.path.join("runs",
                                                            "profile"),
                      help="profile_data_directory: lookup statistics of "
                      "every demo run (default: runs/profile)")
  return parser


def main():
  parser = argument_parser()
  args = parser.parse_args()
  for name in ("steps", "evaluations", "loss_window", "batch_size"):
    if getattr(args, name) < 1:
      parser.error(f"--{name.replace('_', '-')} must be >= 1")
  eval_batch_size = 1024
  if args.eval_examples < eval_batch_size:
    parser.error(f"--eval-examples must be >= {eval_batch_size} (one "
                 "evaluation batch)")
  _require_matplotlib()

  model_dir = args.model_dir or os.path.join(
      "runs", "ctr_demo", time.strftime("%Y%m%d-%H%M%S"))
  start_step = _checkpoint_step(model_dir)
  if start_step >= args.steps:
    # Nothing to do: said before any data is made or any graph built.
    print(f"{model_dir} is at step {start_step}: max_steps {args.steps} "
          "already reached, nothing to train (pass a larger --steps to "
          f"train on; its evaluations are in {model_dir}/eval, its "
          f"SavedModels in {model_dir}/export).", flush=True)
    return
  print(f"Generating {args.train_examples:,} training and "
        f"{args.eval_examples:,} evaluation examples (Zipf ids, hidden "
        "click model) ...", flush=True)
  train_x, train_y = ctr_data.generate(args.train_examples, args.scale, seed=0)
  eval_x, eval_y, hidden_p = ctr_data.generate_with_probabilities(
      args.eval_examples, args.scale, seed=1)
  # Evaluation reads whole batches: the yardsticks score the same examples.
  evaluated = args.eval_examples // eval_batch_size * eval_batch_size
  eval_labels = eval_y[:evaluated]
  ceiling_auc = training_monitor.auc(eval_labels, hidden_p[:evaluated])
  ceiling_loss = training_monitor.log_loss(eval_labels, hidden_p[:evaluated])
  baseline_p = training_monitor.NumericBaseline(train_x, train_y).predict(
      {k: v[:evaluated] for k, v in eval_x.items()})
  baseline_auc = training_monitor.auc(eval_labels, baseline_p)
  baseline_loss = training_monitor.log_loss(eval_labels, baseline_p)

  columns, numeric = dlrm.build_columns(args.scale)
  spec = dlrm.build_spec(args.scale, partition_strategy=args.partition_strategy,
                         pipelining=args.pipelining,
                         profile_data_directory=args.profile_dir)
  every = -(-args.steps // args.evaluations)  # steps between evaluations
  config = estimator_spec.RunConfig(
      model_dir=model_dir,
      # A checkpoint every `every` steps, each evaluated as it is saved
      # (EvaluationListener); only the latest is kept (the tables and their
      # optimizer slots: ~20 MB at the default scale).
      save_checkpoints_steps=every, keep_checkpoint_max=1,
      save_summary_steps=100,
      # The tables laid out as on 2 TPU hosts of 8 cores.
      tpu_config=estimator_spec.TPUConfig(num_shards=16),
      # A progress line (and examples/sec, loss/mean) every this many steps.
      log_step_count_steps=args.loss_window)
  estimator = estimator_spec.TPUEstimator(
      model_fn=dlrm.model_fn_for(columns, numeric),
      config=config,
      use_tpu=False,
      train_batch_size=args.batch_size,
      eval_batch_size=eval_batch_size,
      predict_batch_size=1,
      # The demo serves the CPU graph (no TPU serving graph on the host).
      export_to_tpu=False,
      embedding_config_spec=spec)
  eval_input = dlrm.generator_input_fn_for(
      eval_x, eval_y, shuffle=False, repeat=False)
  evaluations = []

  def evaluate():
    metrics = estimator.evaluate(eval_input)
    step = int(metrics["global_step"])
    evaluations.append((step, float(metrics["auc"])))
    print(f"  evaluation at step {step:5d}: AUC {metrics['auc']:.4f} "
          f"(ceiling {ceiling_auc:.4f}, baseline {baseline_auc:.4f})  "
          f"log loss {metrics['loss']:.4f} (ceiling {ceiling_loss:.4f}, "
          f"baseline {baseline_loss:.4f})  click rate "
          f"{metrics['click_rate']:.3f}", flush=True)

  if start_step:
    print(f"Resuming from step {start_step} (latest checkpoint in "
          f"{model_dir}); training on to max_steps {args.steps}.")
  print(f"Training {len(columns)} embedding features in "
        f"{len(spec.model.tables)} tables ({args.partition_strategy} "
        f"layout as on 2 TPU hosts of 8 cores, pipelining "
        f"{'on' if args.pipelining else 'off'}) to step {args.steps} in "
        f"batches of {args.batch_size}, evaluating on {evaluated:,} "
        f"held-out examples every {every} steps, sampling the lookups of "
        "one step in "
        f"{sampling.sampling_period(sampling.DEFAULT_SAMPLING_RATE)}."
        "\nYardsticks on the evaluation examples: AUC "
        f"{ceiling_auc:.4f} (log loss {ceiling_loss:.4f}) for the hidden "
        f"click model itself (the ceiling); AUC {baseline_auc:.4f} (log "
        f"loss {baseline_loss:.4f}) for the baseline, a logistic "
        "regression on the 13 numeric features alone.", flush=True)
  started = time.time()
  estimator.train(
      dlrm.generator_input_fn_for(train_x, train_y), max_steps=args.steps,
      saving_listeners=[
          training_monitor.EvaluationListener(evaluate, start_step)])
  print(f"  trained from step {start_step} to {args.steps} in "
        f"{time.time() - started:.0f} s (evaluations included)",
        flush=True)

  curve_path = training_monitor.plot_training_curve(
      os.path.join(model_dir, "training_curve.png"),
      training_monitor.loss_curve(model_dir), evaluations, ceiling_auc,
      baseline_auc, args.loss_window)

  parse_spec = tf.compat.v1.feature_column.make_parse_example_spec(
      columns + numeric)
  export = estimator_spec.estimator.export
  serving_fn = export.build_parsing_serving_input_receiver_fn(parse_spec)
  export_dir = estimator.export_saved_model(
      os.path.join(model_dir, "export"), serving_fn).decode()
  print(f"Exported SavedModel: {export_dir}", flush=True)

  example = {k: v[:1] for k, v in eval_x.items()}
  served = _predict_with_saved_model(export_dir, _to_tf_example(example))
  predicted = next(estimator.predict(
      dlrm.generator_input_fn_for(example, eval_y[:1], shuffle=False,
                                  repeat=False),
      yield_single_examples=True))["probability"][0]
  print(f"One example through the SavedModel: click probability "
        f"{served:.6f} (estimator.predict: {predicted:.6f}, hidden model "
        f"{hidden_p[0]:.6f}, label {eval_y[0, 0]:.0f})")
  report = _lookup_statistics_report(spec, args.profile_dir)
  print("\nWritten:")
  print(f"  checkpoint and events   {os.path.abspath(model_dir)} "
        f"({_megabytes(model_dir):.1f} MB in all)")
  print(f"  training curve (PNG)    {os.path.abspath(curve_path)}")
  print(f"  SavedModel              {os.path.abspath(export_dir)}")
  print(f"  lookup statistics       {os.path.abspath(args.profile_dir)}")
  print(f"  their report            {os.path.abspath(report)}")
  print(f"    (python -m estimator_spec profile {args.profile_dir} prints "
        "the summary of every table)")
  print("TensorBoard (loss and its mean per progress line, steps and "
        "examples per second, and per table under embedding/: learning "
        "rate, rows touched per step, table and slot norms; evaluation AUC "
        "under eval/):")
  print(f"  tensorboard --logdir {model_dir}")


def _require_matplotlib():
  try:
    import matplotlib
  except ImportError:
    raise SystemExit(
        "The demo draws its training curve with matplotlib, which is not "
        "installed: pip install -e '.[demo]' (or pip install "
        "matplotlib).") from None


def _checkpoint_step(model_dir):
  """The global step of `model_dir`'s latest checkpoint (0: none)."""
  latest = tf.train.latest_checkpoint(model_dir) if os.path.isdir(
      model_dir) else None
  if latest is None:
    return 0
  return int(tf.train.load_checkpoint(latest).get_tensor(
      tf.compat.v1.GraphKeys.GLOBAL_STEP))


def _megabytes(directory):
  total = 0
  for root, _, files in os.walk(directory):
    total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
  return total / 1e6


def _lookup_statistics_report(spec, profile_dir):
  """Prints the three tables whose busiest shard (of 16) the choice of
  layout changes most; writes the report of the whole profile directory
  and returns its path."""
  saved = store.load_for_model(profile_dir, spec.model, 16).values()
  saved = [s for s in saved if s is not None and s.lookups]
  strategy = spec.model.partition_strategy
  other = "div" if strategy == "mod" else "mod"
  runs = max(s.runs for s in saved)
  print(f"Lookup statistics ({runs} run(s) so far). Each table's rows are "
        "spread over 16 shards, as on 2 TPU hosts of 8 cores, and a step "
        "waits for its busiest shard. For the three tables where the layout "
        "matters most: the ids their busiest shard looks up over the "
        f"average shard's (1.00 = even), with '{strategy}' (this run's "
        f"layout) vs with '{other}':")
  for stats in sorted(saved, key=lambda s: -abs(
      s.imbalance(strategy) - s.imbalance(other)))[:3]:
    print(f"  {stats.settings['table']:<48} {stats.imbalance(strategy):5.2f}"
          f"  vs {stats.imbalance(other):5.2f}  ({stats.lookups:,} ids "
          f"sampled, ~{stats.distinct_ids():,.0f} distinct)")
  return statistics_page.write_html(
      store.load_all(profile_dir),
      os.path.join(profile_dir, "report.html"), source=profile_dir)


def _to_tf_example(features):
  """One tf.Example from row 0 of padded feature arrays."""
  feature = {}
  for name, values in features.items():
    row = np.asarray(values)[0].reshape(-1)
    if row.dtype == object:
      kept = [v.encode() for v in row if v]
      feature[name] = tf.train.Feature(bytes_list=tf.train.BytesList(
          value=kept))
    elif np.issubdtype(row.dtype, np.integer):
      feature[name] = tf.train.Feature(int64_list=tf.train.Int64List(
          value=[int(v) for v in row if v >= 0]))
    else:
      ids = features.get(name.replace("_term_weights", "_terms"))
      if name.endswith("_term_weights") and ids is not None:
        row = row[np.asarray(ids)[0] >= 0]
      feature[name] = tf.train.Feature(float_list=tf.train.FloatList(
          value=[float(v) for v in row]))
  return tf.train.Example(features=tf.train.Features(
      feature=feature)).SerializeToString()


def _predict_with_saved_model(export_dir, serialized):
  with tf.Graph().as_default(), tf.compat.v1.Session() as session:
    meta_graph = tf.compat.v1.saved_model.load(session, ["serve"], export_dir)
    signature = meta_graph.signature_def["serving_default"]
    inputs = signature.inputs["examples"].name
    output = signature.outputs["probability"].name
    return float(session.run(output, {inputs: [serialized]}).reshape(-1)[0])


if __name__ == "__main__":
  main()
