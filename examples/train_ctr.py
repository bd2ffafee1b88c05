"""`make demo`: train the DLRM-style CTR model with TPU embedding semantics
on this machine's CPU, evaluate its AUC, export a SavedModel and run one
prediction through the export. Training samples lookup statistics into a
profile directory (shared by every demo run: counts add up), and the demo
ends with their report.

The model is a TPUEstimator model (examples/dlrm.py): the only changes from
a TPU user's code are the imports (`tpu_embedding_columns` for
`tf.compat.v1.tpu.experimental`, `estimator_spec` for
`tf.compat.v1.estimator.tpu`).
"""
import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from estimator_spec import quiet  # pylint: disable=g-import-not-at-top

quiet.silence_deprecation_notices()

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

import estimator_spec  # pylint: disable=g-import-not-at-top
from estimator_spec.engine import statistics  # pylint: disable=g-import-not-at-top
from estimator_spec.engine import statistics_report  # pylint: disable=g-import-not-at-top
from examples import ctr_data  # pylint: disable=g-import-not-at-top
from examples import dlrm  # pylint: disable=g-import-not-at-top


class ProgressHook(tf.compat.v1.train.SessionRunHook):
  """Prints step, loss and examples/s every `every` steps."""

  def __init__(self, batch_size, every):
    self._batch_size = batch_size
    self._every = every
    self._start = None
    self._last = None

  def begin(self):
    self._loss = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.LOSSES)[0]
    self._step = tf.compat.v1.train.get_global_step()

  def before_run(self, run_context):
    return tf.compat.v1.train.SessionRunArgs((self._step, self._loss))

  def after_run(self, run_context, run_values):
    step, loss = run_values.results
    now = time.time()
    if self._start is None:
      self._start = self._last = (step, now)
      return
    if (step + 1) % self._every == 0:
      done = step - self._last[0]
      rate = done * self._batch_size / max(now - self._last[1], 1e-9)
      print(f"  step {step + 1:5d}  loss {loss:.4f}  {rate:8.0f} examples/s",
            flush=True)
      self._last = (step, now)


def demo_spec():
  """The spec `make demo` trains with its defaults (for the command line:
  `python -m estimator_spec convert examples.train_ctr:demo_spec ...`)."""
  return dlrm.build_spec(0.05, partition_strategy="mod")


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--model-dir", default=None,
                      help="default: runs/ctr_demo/<time>")
  parser.add_argument("--scale", type=float, default=0.05,
                      help="vocabulary scale of the example (1.0 = full)")
  parser.add_argument("--steps", type=int, default=1500)
  parser.add_argument("--batch-size", type=int, default=256)
  parser.add_argument("--train-examples", type=int, default=200_000)
  parser.add_argument("--eval-examples", type=int, default=40_960)
  parser.add_argument("--partition-strategy", default="mod",
                      choices=["div", "mod"])
  parser.add_argument("--pipelining", action="store_true")
  parser.add_argument("--profile-dir", default=os.path.join("runs",
                                                            "profile"),
                      help="profile_data_directory: lookup statistics of "
                      "every demo run (default: runs/profile)")
  args = parser.parse_args()

  model_dir = args.model_dir or os.path.join(
      "runs", "ctr_demo", time.strftime("%Y%m%d-%H%M%S"))
  print(f"Generating {args.train_examples:,} training and "
        f"{args.eval_examples:,} evaluation examples (Zipf ids, hidden "
        "click model) ...", flush=True)
  train_x, train_y = ctr_data.generate(args.train_examples, args.scale, seed=0)
  eval_x, eval_y = ctr_data.generate(args.eval_examples, args.scale, seed=1)

  columns, numeric = dlrm.build_columns(args.scale)
  spec = dlrm.build_spec(args.scale, partition_strategy=args.partition_strategy,
                         pipelining=args.pipelining,
                         profile_data_directory=args.profile_dir)
  config = tf.compat.v1.estimator.tpu.RunConfig(
      model_dir=model_dir, save_checkpoints_steps=args.steps,
      tpu_config=tf.compat.v1.estimator.tpu.TPUConfig(
          iterations_per_loop=100, num_shards=16),
      log_step_count_steps=None)
  estimator = estimator_spec.TPUEstimator(
      model_fn=dlrm.model_fn_for(columns, numeric),
      config=config,
      use_tpu=False,
      train_batch_size=args.batch_size,
      eval_batch_size=1024,
      predict_batch_size=1,
      embedding_config_spec=spec)
  print(f"Training {len(columns)} embedding features in "
        f"{len(spec.model.tables)} tables ({args.partition_strategy} layout "
        f"as on 2 TPU hosts of 8 cores, pipelining "
        f"{'on' if args.pipelining else 'off'}) for {args.steps} steps of "
        f"{args.batch_size} examples, sampling the lookups of one step in "
        f"{statistics.sampling_period(statistics.DEFAULT_SAMPLING_RATE)}:",
        flush=True)
  start = time.time()
  estimator.train(
      dlrm.input_fn_for(train_x, train_y),
      max_steps=args.steps,
      hooks=[ProgressHook(args.batch_size, every=max(1, args.steps // 10))])
  print(f"  trained in {time.time() - start:.0f} s", flush=True)

  metrics = estimator.evaluate(
      dlrm.input_fn_for(eval_x, eval_y, shuffle=False, repeat=False))
  print(f"Evaluation on {args.eval_examples:,} held-out examples: "
        f"AUC {metrics['auc']:.4f}, log loss {metrics['loss']:.4f}, click "
        f"rate {metrics['click_rate']:.3f}", flush=True)

  parse_spec = tf.compat.v1.feature_column.make_parse_example_spec(
      columns + numeric)
  serving_fn = tf.estimator.export.build_parsing_serving_input_receiver_fn(
      parse_spec)
  export_dir = estimator.export_saved_model(
      os.path.join(model_dir, "export"), serving_fn).decode()
  print(f"Exported SavedModel: {export_dir}", flush=True)

  example = {k: v[:1] for k, v in eval_x.items()}
  served = _predict_with_saved_model(export_dir, _to_tf_example(example))
  predicted = next(estimator.predict(
      dlrm.input_fn_for(example, eval_y[:1], shuffle=False, repeat=False),
      yield_single_examples=True))["probability"][0]
  print(f"One example through the SavedModel: click probability "
        f"{served:.6f} (estimator.predict: {predicted:.6f}, label "
        f"{eval_y[0, 0]:.0f})")
  report = _lookup_statistics_report(spec, args.profile_dir)
  print("\nWritten:")
  print(f"  checkpoints and events  {os.path.abspath(model_dir)}")
  print(f"  SavedModel              {os.path.abspath(export_dir)}")
  print(f"  lookup statistics       {os.path.abspath(args.profile_dir)}")
  print(f"  their report            {os.path.abspath(report)}")
  print(f"    (python -m estimator_spec profile {args.profile_dir} prints "
        "the summary of every table)")


def _lookup_statistics_report(spec, profile_dir):
  """Prints the three tables whose busiest shard (of 16) the choice of
  layout changes most; writes the report of the whole profile directory
  and returns its path."""
  saved = statistics.load_for_model(profile_dir, spec.model, 16).values()
  saved = [s for s in saved if s is not None and s.lookups]
  strategy = spec.model.partition_strategy
  other = "div" if strategy == "mod" else "mod"
  runs = max(s.runs for s in saved)
  print(f"Lookup statistics ({runs} run(s) so far): busiest of 16 shards "
        f"over the mean, '{strategy}' (configured) vs '{other}':")
  for stats in sorted(saved, key=lambda s: -abs(
      s.imbalance(strategy) - s.imbalance(other)))[:3]:
    print(f"  {stats.settings['table']:<48} {stats.imbalance(strategy):5.2f}"
          f"  vs {stats.imbalance(other):5.2f}  ({stats.lookups:,} ids "
          f"sampled, ~{stats.distinct_ids():,.0f} distinct)")
  return statistics_report.write_html(
      statistics.load_all(profile_dir),
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
