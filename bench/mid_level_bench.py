"""Training throughput of TF2's mid-level path on the host
(`estimator_spec.HostTPUEmbedding`) against the estimator path and against
plain Keras embeddings.

One workload, e2e_bench's `wide26`: 26 single-id features, each its own
table of 100,000 x 16 (`--vocab`, `--dim`), Zipf ids (exponent 1.1),
batch 1024, embeddings concatenated -> Dense(64, relu) -> Dense(1), log
loss; the data pre-batched in numpy and cycled through
`Dataset.from_tensor_slices`, so that the training step is measured.

Sides (each env runs the ones it can; every run is its own 'spawn' child
process, sides alternate over `--rounds`):

* `host`: HostTPUEmbedding with TF2's `Adagrad(0.05,
  initial_accumulator_value=0.1, clipvalue=10, clip_weight_min=-5,
  clip_weight_max=5)` on the tables (the TPU semantics: per-id sums,
  lazy rows, clipping), Keras `Adagrad(0.05, initial_accumulator_value=0.1)`
  on the dense layers; one `tf.function` step (the batch taken from the
  dataset's iterator inside it, as TF2's TPUEmbedding documents; enqueue,
  dequeue, tape, both updates), dense ids [batch] per feature.
* `keras`: `keras.layers.Embedding` tables trained with the same Keras
  Adagrad as the dense layers (what a Keras user without this project
  writes; it skips the TPU semantics: no clipping, Keras' own Adagrad on
  the tables' sparse gradients); the same `tf.function` step shape.
* `estimator` (TF 2.15 only: TPUEstimator ended there):
  `estimator_spec.TPUEstimator(use_tpu=False)` with `tpu_embedding_columns`
  and the equivalent EmbeddingConfigSpec (Adagrad lr 0.05, initial
  accumulator 0.1, weights clipped to +-5, clipping_limit 10), the dense
  layers on tf.compat.v1 Adagrad (0.05, 0.1): e2e_bench's `wide26` job,
  run by `bench.e2e_bench.run_in_child`.

A run's rate: examples of the steps after `--warmup` over their wall time
(each step waits for its loss); a side's rate is the median over rounds.
Ratios: host / keras, host / estimator. Printed, never asserted.

`--first-trace 26,260,1000`: instead of throughput, the first trace of
each side's step (`get_concrete_function`: the step's graph built, the
tables and dense layers made before) at those feature counts, each its own
table of 1,000 rows, batch 64: seconds and the traced graph's ops, host /
keras (medians over `--rounds`).

Usage: python -m bench.mid_level_bench [--rounds 2] [--steps 60] [--quick]
  (in .venv: host, keras on Keras 2, estimator; in .venv-tf2: host, keras
  on Keras 3)
"""
import argparse
import multiprocessing
import os
import statistics
import sys
import time
import traceback

os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

HOST, KERAS, ESTIMATOR = "host", "keras", "estimator"
ON_TF215 = tf.__version__.startswith("2.15.")
LEARNING_RATE = 0.05
INITIAL_ACCUMULATOR = 0.1


def identity_data(features, vocabulary, num_examples, seed=0):
  """{f00..: [N, 1] Zipf(1.1) ids} and [N, 1] labels from a hidden per-id
  weight (e2e_bench's wide26 data)."""
  rng = np.random.RandomState(seed)
  data, logit = {}, np.zeros(num_examples)
  for i in range(features):
    ranks = np.minimum(rng.zipf(1.1, size=(num_examples, 1)), 10**9)
    ids = (ranks.astype(np.int64) * 2654435761) % vocabulary
    data[f"f{i:02d}"] = ids
    logit += rng.normal(0.0, 0.5, size=vocabulary)[ids[:, 0]]
  logit = (logit - logit.mean()) / max(logit.std(), 1e-9) - 0.9
  labels = rng.uniform(size=num_examples) < 1 / (1 + np.exp(-logit))
  return data, labels.astype(np.float32).reshape(-1, 1)


def _batches(features, labels, batch):
  count = len(labels) // batch

  def split(array):
    array = np.asarray(array)[:count * batch]
    return array.reshape((count, batch) + array.shape[1:])

  # Dense ids [batch] per feature (one id per example).
  ids = {k: split(v[:, 0]) for k, v in features.items()}
  return tf.data.Dataset.from_tensor_slices(
      (ids, split(labels))).repeat().prefetch(2)


def _keras_adagrad():
  import keras  # pylint: disable=g-import-not-at-top
  return keras.optimizers.Adagrad(
      LEARNING_RATE, initial_accumulator_value=INITIAL_ACCUMULATOR)


def _dense_tower(job):
  """The dense layers, built for the concatenated embeddings of `job`."""
  import keras  # pylint: disable=g-import-not-at-top
  tower = [keras.layers.Dense(64, activation="relu"), keras.layers.Dense(1)]
  width = job["features"] * job["dim"]
  for layer in tower:
    layer.build((None, width))
    width = layer.units
  return tower


def _build_host(job, names):
  import estimator_spec  # pylint: disable=g-import-not-at-top
  emb = tf.tpu.experimental.embedding
  config = {
      name: emb.FeatureConfig(emb.TableConfig(
          vocabulary_size=job["vocab"], dim=job["dim"], name=name,
          combiner="mean"), name=name) for name in names}
  embedding = estimator_spec.HostTPUEmbedding(config, emb.Adagrad(
      LEARNING_RATE, initial_accumulator_value=INITIAL_ACCUMULATOR,
      clipvalue=10.0, clip_weight_min=-5.0, clip_weight_max=5.0))
  embedding.build()
  tower = _dense_tower(job)
  optimizer = _keras_adagrad()
  variables = [v for layer in tower for v in layer.trainable_variables]

  def step(ids, labels):
    embedding.enqueue(ids)
    activations = embedding.dequeue()
    with tf.GradientTape() as tape:
      tape.watch(activations)
      x = tf.concat([activations[n] for n in names], axis=1)
      for layer in tower:
        x = layer(x)
      loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
          labels=labels, logits=x))
    activation_grads, dense_grads = tape.gradient(
        loss, (activations, variables))
    optimizer.apply_gradients(zip(dense_grads, variables))
    embedding.apply_gradients(activation_grads)
    return loss

  return step


def _build_keras(job, names):
  import keras  # pylint: disable=g-import-not-at-top
  tables = {n: keras.layers.Embedding(job["vocab"], job["dim"]) for n in names}
  for table in tables.values():
    table.build((None,))
  tower = _dense_tower(job)
  optimizer = _keras_adagrad()
  variables = ([t.embeddings for t in tables.values()] +
               [v for layer in tower for v in layer.trainable_variables])

  def step(ids, labels):
    with tf.GradientTape() as tape:
      x = tf.concat([tables[n](ids[n]) for n in names], axis=1)
      for layer in tower:
        x = layer(x)
      loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
          labels=labels, logits=x))
    grads = tape.gradient(loss, variables)
    optimizer.apply_gradients(zip(grads, variables))
    return loss

  return step


def _side_step(job, names, features, labels):
  """(step, iterator): the side's training step over features `names` as a
  `tf.function` of an iterator over batches of `features` and `labels`
  (cycled), its tables and dense tower built."""
  build = _build_host if job["side"] == HOST else _build_keras
  body = build(job, names)
  iterator = iter(_batches(features, labels, job["batch"]).repeat())

  @tf.function
  def step(iterator):
    # The batch is taken inside the function, as TF2's TPUEmbedding
    # documents its training step: no side pays eager iteration.
    ids, batch_labels = next(iterator)
    return body(ids, batch_labels)

  return step, iterator


def _run_step_side(job):
  names = [f"f{i:02d}" for i in range(job["features"])]
  features, labels = identity_data(job["features"], job["vocab"],
                                   job["examples"])
  step, iterator = _side_step(job, names, features, labels)
  times = []
  start = time.perf_counter()
  for _ in range(job["steps"]):
    loss = step(iterator)
    float(loss)  # waits for the step
    times.append(time.perf_counter())
  steady = np.diff(times[job["warmup"]:])
  return {"examples_per_s": job["batch"] * len(steady) / float(steady.sum()),
          "median_step_ms": float(np.median(steady)) * 1e3,
          "first_step_s": times[0] - start, "loss": float(loss)}


def _first_trace_side(job):
  """The first trace of the side's step (`tf.function`, the batch taken
  from the iterator inside it) for job['features'] features: seconds (the
  tables and the dense tower exist before; the trace builds the step's
  graph) and the traced graph's ops."""
  features, labels = identity_data(job["features"], job["vocab"],
                                   2 * job["batch"])
  step, iterator = _side_step(job, list(features), features, labels)
  start = time.perf_counter()
  concrete = step.get_concrete_function(iterator)
  seconds = time.perf_counter() - start
  return {"trace_s": seconds, "graph_ops": len(concrete.graph.get_operations())}


def _child(job, queue):
  try:
    if job.get("first_trace"):
      queue.put(_first_trace_side(job))
      return
    queue.put(_run_step_side(job))
  except BaseException:  # pylint: disable=broad-except
    queue.put({"error": traceback.format_exc()})


def run_side(job):
  """One run of `job` in a fresh child process: its result dict."""
  if job["side"] == ESTIMATOR:
    from bench import e2e_bench  # pylint: disable=g-import-not-at-top
    estimator_job = {
        "workload": "wide26", "side": e2e_bench.OURS,
        "features": job["features"], "vocab": job["vocab"],
        "dim": job["dim"], "batch": job["batch"],
        "examples": job["examples"], "input": "batched",
        "optimizer": "adagrad", "steps": job["steps"],
        "warmup": job["warmup"]}
    return e2e_bench.run_in_child(estimator_job)
  context = multiprocessing.get_context("spawn")
  queue = context.Queue()
  process = context.Process(target=_child, args=(job, queue))
  process.start()
  try:
    result = queue.get()
  finally:
    process.join()
  if "error" in result:
    raise RuntimeError(f"{job['side']} failed in its child process:\n"
                       f"{result['error']}")
  return result


def first_traces(counts, dim, rounds):
  """Seconds and ops of the first trace of each side's step at each
  feature count (each its own table of 1,000 rows, batch 64), the sides
  alternating over `rounds` (medians); host / keras."""
  print(f"mid_level_bench: {os.cpu_count()} CPUs, TF {tf.__version__}; first "
        f"trace of the step (tf.function), {rounds} round(s) per side",
        flush=True)
  rows = []
  for count in counts:
    job = {"features": count, "vocab": 1000, "dim": dim, "batch": 64,
           "first_trace": True}
    seconds = {HOST: [], KERAS: []}
    ops = {}
    for r in range(rounds):
      for side in (HOST, KERAS):
        result = run_side(dict(job, side=side))
        seconds[side].append(result["trace_s"])
        ops[side] = result["graph_ops"]
        print(f"  {count:5d} features round {r + 1} {side:5s} "
              f"{result['trace_s']:6.2f} s  {result['graph_ops']:7,d} ops",
              flush=True)
    rows.append((count, {s: statistics.median(v) for s, v in seconds.items()},
                 ops))
  print("\nFirst trace (median seconds; ops of the traced step graph), "
        "host / keras:")
  print(f"{'features':>8s} {'host s':>7s} {'keras s':>7s} {'ratio':>6s} "
        f"{'host ops':>9s} {'keras ops':>9s} {'ratio':>6s}")
  for count, sec, op in rows:
    print(f"{count:8,d} {sec[HOST]:7.2f} {sec[KERAS]:7.2f} "
          f"{sec[HOST] / sec[KERAS]:5.2f}x {op[HOST]:9,d} {op[KERAS]:9,d} "
          f"{op[HOST] / op[KERAS]:5.2f}x")
  return rows


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--steps", type=int, default=60,
                      help="timed steps per run (after the warm-up)")
  parser.add_argument("--warmup", type=int, default=10)
  parser.add_argument("--vocab", type=int, default=100_000)
  parser.add_argument("--dim", type=int, default=16)
  parser.add_argument("--batch", type=int, default=1024)
  parser.add_argument("--quick", action="store_true",
                      help="smoke run: 1 round of 3 + 5 steps, vocab 1,000")
  parser.add_argument("--first-trace", default=None, metavar="FEATURES",
                      help="instead of throughput: the first trace of the "
                      "step of host and keras at these comma-separated "
                      "feature counts (vocab 1,000, batch 64)")
  args = parser.parse_args(argv)
  if args.first_trace:
    return first_traces([int(n) for n in args.first_trace.split(",") if n],
                        args.dim, args.rounds)
  if args.quick:
    args.rounds, args.steps, args.warmup, args.vocab = 1, 5, 3, 1000
  sides = (HOST, KERAS, ESTIMATOR) if ON_TF215 else (HOST, KERAS)
  job = {"features": 26, "vocab": args.vocab, "dim": args.dim,
         "batch": args.batch, "examples": 32 * args.batch,
         "steps": args.warmup + args.steps + 1, "warmup": args.warmup}
  import keras  # pylint: disable=g-import-not-at-top
  print(f"mid_level_bench: {os.cpu_count()} CPUs, TF {tf.__version__}, "
        f"Keras {keras.__version__}; {job['features']} tables "
        f"{job['vocab']:,} x {job['dim']}, batch {job['batch']}, MLP (64, 1); "
        f"{args.rounds} round(s) per side of {args.warmup} warm-up + "
        f"{args.steps} timed steps", flush=True)
  begin = time.perf_counter()
  rates = {side: [] for side in sides}
  for r in range(args.rounds):
    for side in sides:
      result = run_side(dict(job, side=side))
      rates[side].append(result["examples_per_s"])
      print(f"  round {r + 1} {side:9s} {result['examples_per_s']:9,.0f} "
            f"examples/s  median step {result['median_step_ms']:6.1f} ms  "
            f"first step {result['first_step_s']:.1f} s", flush=True)
  median = {side: statistics.median(v) for side, v in rates.items()}
  print("\nSummary (median examples/s over rounds):")
  for side in sides:
    print(f"  {side:9s} {median[side]:9,.0f} examples/s")
  print(f"  host / keras     {median[HOST] / median[KERAS]:5.2f}x  (TPU "
        "semantics vs Keras Embedding + Keras Adagrad)")
  if ESTIMATOR in median:
    print(f"  host / estimator {median[HOST] / median[ESTIMATOR]:5.2f}x  "
          "(the TF2 path vs estimator_spec.TPUEstimator)")
  print(f"total wall time {time.perf_counter() - begin:.0f} s")
  return median


if __name__ == "__main__":
  sys.exit(main() and 0)
