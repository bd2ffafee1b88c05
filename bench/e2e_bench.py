"""End to end: TPUEstimator training on CPU, this project vs TF 2.15.

Both sides train the same model on the same data with TPUEstimator
(use_tpu=False) and an EmbeddingConfigSpec of Adagrad (lr 0.05, initial
accumulator 0.1, weights clipped to +-5, clipping_limit 10):

* ours: `estimator_spec.TPUEstimator` with `tpu_embedding_columns`. The
  user's optimizer trains the dense variables; the spec's Adagrad (with its
  clipping and learning-rate functions) trains the tables on the host
  embedding engine.
* TF:   `tf.compat.v1.estimator.tpu.TPUEstimator` with
  `tf.compat.v1.tpu.experimental` columns. Off the TPU, TF ignores the
  embedding optimizer: the user's optimizer trains the tables as ordinary
  variables.

Workloads:

1. `dlrm`: the example model (examples/dlrm.py: 26 embedding features,
   shared, sequence and weighted columns, 13 numeric features, DLRM
   interactions, Adam as the model's optimizer) on examples/ctr_data.py data.
   TF's side runs the model_fn with `CrossShardOptimizer` left out (it has
   no CPU kernel under TF's TPUEstimator(use_tpu=False); ours runs it as
   one replica). TF 2.15's v1 Adam, given the tables' sparse gradients,
   still decays its moments and moves EVERY row of every table each step.
2. `wide26`: 26 single-id features (`categorical_column_with_identity`),
   each its own table of 100,000 x 16, Zipf ids, DenseFeatures -> MLP
   (64, 1). The model's optimizer is Adagrad by default (`--wide-optimizer`):
   TF's sparse Adagrad then updates only the rows a batch touches, which is
   the strongest TF baseline.
3. `startup`: 1,000 features over 100 tables (100 `shared_embedding_columns`
   groups of 10 identity columns, vocabulary 1,000, dimension 8),
   DenseFeatures -> logit: seconds from calling train() until the first step
   has run (a hook's after_run), for one step.

Every run is its own child process (multiprocessing, 'spawn'), with a fresh
model_dir, and with checkpoints, summaries and step logging switched off on
both sides. Throughput runs alternate ours, TF, ours, TF, ... A hook records
the wall time after each step; the first `--warmup` steps are discarded and
a run's rate is the examples of the remaining steps over their wall time
(the median of the per-step times is printed too). A side's rate is the
median over its rounds. Peak RSS is the child's own ru_maxrss (largest over
its rounds).

Usage: .venv/bin/python -m bench.e2e_bench [--quick] [--rounds N] ...
"""
import argparse
import multiprocessing
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
import traceback
import warnings

os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"

import numpy as np  # pylint: disable=g-import-not-at-top

from estimator_spec import quiet  # pylint: disable=g-import-not-at-top

quiet.silence_deprecation_notices()

import tensorflow as tf  # pylint: disable=g-import-not-at-top

import estimator_spec  # pylint: disable=g-import-not-at-top
import tpu_embedding_columns  # pylint: disable=g-import-not-at-top
from examples import ctr_data  # pylint: disable=g-import-not-at-top
from examples import dlrm  # pylint: disable=g-import-not-at-top

OURS = "ours"
TF = "tf"
SIDES = (OURS, TF)

fc = tf.feature_column


# --- the two stacks ----------------------------------------------------------


def _column_api(side):
  return tpu_embedding_columns if side == OURS else tf.compat.v1.tpu.experimental


def _spec_class(side):
  if side == OURS:
    return estimator_spec.TPUEstimatorSpec
  return tf.compat.v1.estimator.tpu.TPUEstimatorSpec


def _embedding_spec(side, columns):
  """The same EmbeddingConfigSpec (dlrm.build_spec's parameters) of either
  stack."""
  if side == OURS:
    return estimator_spec.EmbeddingConfigSpec(
        feature_columns=columns,
        optimization_parameters=estimator_spec.AdagradParameters(
            learning_rate=0.05, initial_accumulator=0.1,
            clip_weight_min=-5.0, clip_weight_max=5.0),
        clipping_limit=10.0)
  return tf.compat.v1.estimator.tpu.experimental.EmbeddingConfigSpec(
      feature_columns=columns,
      optimization_parameters=tf.compat.v1.tpu.experimental.AdagradParameters(
          learning_rate=0.05, initial_accumulator=0.1,
          clip_weight_min=-5.0, clip_weight_max=5.0),
      clipping_limit=10.0)


def _estimator(side, model_fn, model_dir, batch_size, spec):
  config = tf.compat.v1.estimator.tpu.RunConfig(
      model_dir=model_dir,
      save_checkpoints_steps=None,
      save_checkpoints_secs=None,
      save_summary_steps=None,
      log_step_count_steps=None,
      keep_checkpoint_max=1)
  estimator_class = (estimator_spec.TPUEstimator if side == OURS else
                     tf.compat.v1.estimator.tpu.TPUEstimator)
  return estimator_class(
      model_fn=model_fn,
      config=config,
      use_tpu=False,
      train_batch_size=batch_size,
      embedding_config_spec=spec)


def _without_cross_shard_optimizer(model_fn):
  """model_fn with `tf.compat.v1.tpu.CrossShardOptimizer(opt)` read as
  `opt` while it builds the graph: what a CPU user of TF's TPUEstimator
  writes (`if params['use_tpu']: ...`), since TF's CrossReplicaSum has no
  CPU kernel."""

  def wrapped(features, labels, mode, params):
    real = tf.compat.v1.tpu.CrossShardOptimizer
    tf.compat.v1.tpu.CrossShardOptimizer = lambda optimizer, *a, **k: optimizer
    try:
      return model_fn(features, labels, mode, params)
    finally:
      tf.compat.v1.tpu.CrossShardOptimizer = real

  return wrapped


def _mlp_model_fn(columns, spec_class, optimizer, hidden):
  """DenseFeatures(columns) -> relu layers `hidden` -> logit, log loss."""

  def model_fn(features, labels, mode, params):
    del params
    x = tf.compat.v1.keras.layers.DenseFeatures(columns)(features)
    for i, width in enumerate(hidden):
      x = tf.compat.v1.layers.dense(x, width, activation=tf.nn.relu,
                                    name=f"hidden_{i}")
    logits = tf.compat.v1.layers.dense(x, 1, name="logit")
    loss = tf.compat.v1.losses.sigmoid_cross_entropy(labels, logits)
    if optimizer == "adam":
      opt = tf.compat.v1.train.AdamOptimizer(0.01)
    else:
      opt = tf.compat.v1.train.AdagradOptimizer(
          0.05, initial_accumulator_value=0.1)
    train_op = opt.minimize(loss,
                            global_step=tf.compat.v1.train.get_global_step())
    return spec_class(mode=mode, loss=loss, train_op=train_op)

  return model_fn


# --- workloads -----------------------------------------------------------------


def _zipf_ids(rng, vocabulary, shape, exponent):
  ranks = np.minimum(rng.zipf(exponent, size=shape), 10**9).astype(np.int64)
  return (ranks * 2654435761) % vocabulary


def _identity_data(names, vocabulary, num_examples, exponent, seed):
  """{name: [N, 1] Zipf ids} and labels from a hidden per-id weight."""
  rng = np.random.RandomState(seed)
  features = {}
  logit = np.zeros(num_examples)
  for name in names:
    ids = _zipf_ids(rng, vocabulary, (num_examples, 1), exponent)
    features[name] = ids
    logit += rng.normal(0.0, 0.5, size=vocabulary)[ids[:, 0]]
  logit = (logit - logit.mean()) / max(logit.std(), 1e-9) - 0.9
  labels = rng.uniform(size=num_examples) < 1 / (1 + np.exp(-logit))
  return features, labels.astype(np.float32).reshape(-1, 1)


def _build_dlrm(side, job):
  scale = job["scale"]
  features, labels = ctr_data.generate(job["examples"], scale, seed=0)
  columns, numeric = dlrm.build_columns(scale, api=_column_api(side))
  if side == OURS:
    spec = dlrm.build_spec(scale)
    model_fn = dlrm.model_fn_for(columns, numeric)
  else:
    spec = _embedding_spec(TF, columns)
    model_fn = _without_cross_shard_optimizer(
        dlrm.model_fn_for(columns, numeric, spec_class=_spec_class(TF)))
  return model_fn, spec, dlrm.input_fn_for(features, labels)


def _build_wide(side, job):
  names = [f"f{i:02d}" for i in range(job["features"])]
  features, labels = _identity_data(names, job["vocab"], job["examples"],
                                    exponent=1.1, seed=0)
  api = _column_api(side)
  columns = [
      api.embedding_column(
          fc.categorical_column_with_identity(name, job["vocab"]),
          dimension=job["dim"], combiner="mean") for name in names
  ]
  model_fn = _mlp_model_fn(columns, _spec_class(side), job["optimizer"],
                           hidden=(64,))
  return (model_fn, _embedding_spec(side, columns),
          dlrm.input_fn_for(features, labels))


def _build_startup(side, job):
  groups, per_group = job["tables"], job["features"] // job["tables"]
  names = [[f"t{g:03d}_f{i}" for i in range(per_group)] for g in range(groups)]
  flat = [n for group in names for n in group]
  features, labels = _identity_data(flat, job["vocab"], job["examples"],
                                    exponent=1.3, seed=0)
  api = _column_api(side)
  columns = []
  for g, group in enumerate(names):
    columns.extend(
        api.shared_embedding_columns(
            [fc.categorical_column_with_identity(n, job["vocab"])
             for n in group],
            dimension=job["dim"],
            combiner="mean",
            shared_embedding_collection_name=f"table_{g:03d}"))
  model_fn = _mlp_model_fn(columns, _spec_class(side), "adagrad", hidden=())
  return (model_fn, _embedding_spec(side, columns),
          dlrm.input_fn_for(features, labels, shuffle=False))


_BUILDERS = {"dlrm": _build_dlrm, "wide26": _build_wide,
             "startup": _build_startup}


# --- one run, in a child process --------------------------------------------


class _StepTimes(tf.compat.v1.train.SessionRunHook):
  """perf_counter() after every step."""

  def __init__(self):
    self.times = []

  def after_run(self, run_context, run_values):
    self.times.append(time.perf_counter())


def _run(job):
  """Builds the estimator of `job` and trains job['steps'] steps."""
  warnings.filterwarnings("ignore", category=UserWarning)
  tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
  model_fn, spec, input_fn = _BUILDERS[job["workload"]](job["side"], job)
  model_dir = tempfile.mkdtemp(prefix=f"e2e_{job['workload']}_{job['side']}_")
  try:
    estimator = _estimator(job["side"], model_fn, model_dir, job["batch"],
                           spec)
    hook = _StepTimes()
    start = time.perf_counter()
    estimator.train(input_fn, max_steps=job["steps"], hooks=[hook])
    end = time.perf_counter()
  finally:
    shutil.rmtree(model_dir, ignore_errors=True)
  times = hook.times
  result = {"first_step_s": times[0] - start, "train_s": end - start,
            "steps": len(times)}
  warmup = job.get("warmup", 0)
  if len(times) > warmup + 1:
    steady = np.diff(times[warmup:])
    result["examples_per_s"] = job["batch"] * len(steady) / float(
        steady.sum())
    result["median_step_ms"] = float(np.median(steady)) * 1e3
  return result


def _child(job, queue):
  try:
    result = _run(job)
    result["max_rss_mb"] = resource.getrusage(
        resource.RUSAGE_SELF).ru_maxrss / 1024.0
    queue.put(result)
  except BaseException:  # pylint: disable=broad-except
    queue.put({"error": traceback.format_exc()})


def run_in_child(job):
  context = multiprocessing.get_context("spawn")
  queue = context.Queue()
  process = context.Process(target=_child, args=(job, queue))
  process.start()
  result = queue.get()
  process.join()
  if "error" in result:
    raise RuntimeError(f"{job['workload']}/{job['side']} failed in its child "
                       f"process:\n{result['error']}")
  return result


# --- the benchmark --------------------------------------------------------------


def _describe(name, job):
  if name == "dlrm":
    return (f"example model (examples/dlrm.py) scale {job['scale']}, "
            f"batch {job['batch']}, model optimizer Adam")
  if name == "wide26":
    return (f"{job['features']} features x own table {job['vocab']:,} x "
            f"{job['dim']}, batch {job['batch']}, MLP (64, 1), model "
            f"optimizer {job['optimizer'].capitalize()}")
  return (f"{job['features']:,} features over {job['tables']} shared tables "
          f"(vocab {job['vocab']:,}, dim {job['dim']}), batch {job['batch']}")


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true",
                      help="smoke run: a few steps, one round")
  parser.add_argument("--rounds", type=int, default=2,
                      help="alternating throughput rounds per side")
  parser.add_argument("--steps", type=int, default=None,
                      help="timed steps per throughput run (after warm-up)")
  parser.add_argument("--warmup", type=int, default=None)
  parser.add_argument("--dlrm-scale", type=float, default=0.05)
  parser.add_argument("--dlrm-batch", type=int, default=1024)
  parser.add_argument("--wide-optimizer", default="adagrad",
                      choices=["adagrad", "adam"])
  parser.add_argument("--startup-rounds", type=int, default=1)
  parser.add_argument("--workloads", default="dlrm,wide26,startup")
  args = parser.parse_args()

  if args.quick:
    steps = args.steps or 5
    warmup = args.warmup if args.warmup is not None else 2
    rounds = 1
  else:
    steps = args.steps or 100
    warmup = args.warmup if args.warmup is not None else 20
    rounds = args.rounds
  workloads = {
      "dlrm": {"workload": "dlrm", "scale": args.dlrm_scale,
               "batch": args.dlrm_batch, "examples": 16 * args.dlrm_batch},
      "wide26": {"workload": "wide26", "features": 26, "vocab": 100_000,
                 "dim": 16, "batch": 1024, "examples": 32 * 1024,
                 "optimizer": args.wide_optimizer},
      "startup": {"workload": "startup", "features": 1000, "tables": 100,
                  "vocab": 1000, "dim": 8, "batch": 64, "examples": 256,
                  "steps": 1},
  }
  chosen = [w for w in args.workloads.split(",") if w]
  for name in chosen:
    if name not in workloads:
      parser.error(f"--workloads: unknown workload {name!r} (choose from "
                   f"{sorted(workloads)})")
    if name != "startup":
      workloads[name].update(steps=warmup + steps, warmup=warmup)

  print(f"e2e_bench: {os.cpu_count()} CPUs, TF {tf.__version__}, "
        f"{rounds} round(s) of {warmup} warm-up + {steps} timed steps per side"
        f"{' (quick)' if args.quick else ''}", flush=True)
  begin = time.perf_counter()
  results = {name: {side: [] for side in SIDES} for name in chosen}
  for name in chosen:
    job = workloads[name]
    print(f"\n[{name}] {_describe(name, job)}", flush=True)
    count = args.startup_rounds if name == "startup" else rounds
    for r in range(count):
      for side in SIDES:
        result = run_in_child(dict(job, side=side))
        results[name][side].append(result)
        if name == "startup":
          detail = (f"first step after {result['first_step_s']:6.1f} s "
                    f"(train() {result['train_s']:.1f} s)")
        else:
          detail = (f"{result['examples_per_s']:9,.0f} examples/s  "
                    f"median step {result['median_step_ms']:7.1f} ms  "
                    f"first step after {result['first_step_s']:.1f} s")
        print(f"  round {r + 1} {side:4s}  {detail}  "
              f"peak RSS {result['max_rss_mb']:,.0f} MB", flush=True)

  print("\nSummary (ratio = ours / TF; peak RSS = largest ru_maxrss of the "
        "side's child processes)")
  print(f"{'workload':10s} {'ours ex/s':>11s} {'TF ex/s':>11s} "
        f"{'ratio':>6s}   {'ours RSS MB':>11s} {'TF RSS MB':>10s}")
  for name in chosen:
    rss = {s: max(r["max_rss_mb"] for r in results[name][s]) for s in SIDES}
    if name == "startup":
      first = {s: statistics.median(r["first_step_s"]
                                    for r in results[name][s]) for s in SIDES}
      print(f"{name:10s} {first[OURS]:9.1f} s {first[TF]:9.1f} s "
            f"{first[TF] / first[OURS]:5.2f}x   {rss[OURS]:11,.0f} "
            f"{rss[TF]:10,.0f}   (train() to first step; ratio = TF / ours)")
      continue
    rate = {s: statistics.median(r["examples_per_s"]
                                 for r in results[name][s]) for s in SIDES}
    print(f"{name:10s} {rate[OURS]:11,.0f} {rate[TF]:11,.0f} "
          f"{rate[OURS] / rate[TF]:5.2f}x   {rss[OURS]:11,.0f} "
          f"{rss[TF]:10,.0f}")
  print(f"\ntotal wall time {time.perf_counter() - begin:.0f} s")


if __name__ == "__main__":
  sys.exit(main())
