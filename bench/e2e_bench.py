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

Workloads (throughput: examples/s of steady-state training steps):

* `dlrm`: the example model (examples/dlrm.py: 26 embedding features,
  shared, sequence and weighted columns, 13 numeric features, DLRM
  interactions, Adam as the model's optimizer) on examples/ctr_data.py data,
  vocabularies at `--dlrm-scale` (0.05, as the demo), batch `--dlrm-batch`
  (1024). TF's side runs the model_fn with `CrossShardOptimizer` left out
  (TF's CrossReplicaSum has no CPU kernel under TF's
  TPUEstimator(use_tpu=False); ours runs it as one replica). Given the
  tables' sparse gradients, TF 2.15's v1 Adam still decays its moments and
  moves EVERY row of every table each step.
* `dlrm-full`: the same at the vocabularies examples/dlrm.py defines
  (scale 1.0, up to 1,000,000 rows per table), where TF's dense Adam over
  whole tables dominates its step.
* `dlrm-ex`: the same with the example's own input_fn (`dlrm.input_fn_for`:
  per-example shuffle, then batch). Its tf.data work (about 70 ms of CPU per
  batch of 1024 here) is the same on both sides and shares the CPUs with the
  step, so this ratio is diluted; the other workloads use pre-batched numpy
  data through `Dataset.from_tensor_slices`, made SparseTensors once and
  cached, then cycled (no per-step input work), so that the training step
  itself is measured.
* `wide26`: 26 single-id features (`categorical_column_with_identity`),
  each its own table of 100,000 x 16, Zipf ids, batch 1024,
  DenseFeatures -> MLP (64, 1). The model's optimizer is Adagrad by default
  (`--wide-optimizer`): TF's sparse Adagrad then updates only the rows a
  batch touches, which is the strongest TF baseline.
* `peer26`: the workload of the TorchRec peer (bench/peers/workload.py,
  whose numpy data both use): 26 features, each its own table of
  100,000 x 16, 1-3 Zipf ids per example (mean 2), combiner 'sum',
  concatenated (416) -> 256 relu -> 128 relu -> 1, batch 1024, Adagrad
  (lr 0.05, initial accumulator 0.1) on the tables (the spec's, without
  clipping: TorchRec's fused Adagrad has none) and the dense variables.
  bench/peers/compare.py runs it beside TorchRec.
* `peer26-fed`: the peer26 model with its 416 embedding activations given
  as an input (a float feature; no lookup, no table update), the rest
  unchanged. With peer26 in the same run, the summary prints the
  embedding's cost: peer26's median step time minus this one's, as a share
  of this one's.
* `peer26-fed-grad`: the same, with the activations fed as 26 inputs
  [N, 16] that the model concatenates (as DenseFeatures does) and whose
  gradients each step computes: the dense model's work that exists
  because its inputs are trained embeddings, without lookup or update.
  With peer26 and peer26-fed in the run, the summary splits the
  embedding's cost into that work and the lookup and update.
* `vocab`: peer26 with its 26 features sharing 2 tables (13 each) of
  `--vocab-rows` rows each (default 10^5, 10^6, 10^7; one round each):
  whether the step time stays flat as tables grow, and peak RSS against the
  bytes of all variables (tables, slots, dense model and its slots), both
  as measured and above the child's RSS before it built a graph (TF's
  runtime, the numpy data and this script). Their input is streamed (a
  generator, not graph constants; see `_batched_input_fn`), so that the
  peak holds the data once.

Startup (`startup`): N features over N/10 tables (`shared_embedding_columns`
groups of 10 identity columns, vocabulary 1,000, dimension 8),
DenseFeatures -> logit, batch 64: seconds from calling train() until the
first step has run (a hook's after_run), one step, and the train graph's
op count when the session is made (a hook's begin). Default N = 100 and
1,000 (`--startup-features`). Its input (`--startup-input`) is by default
what a TPU program reads: tf.Examples from a TFRecord file, batched and
parsed by `tf.io.parse_example` (`records`); `constants` gives the
throughput runs' pre-batched arrays instead, whose map builds each
feature's SparseTensor with a few ops of its own (at 1,000 features about
2.8 s of input_fn and 2 s of the iterator's start, on both sides). A run
still without a first step `--startup-limit` seconds after train(), or
whose RSS passes `--rss-limit-mb`, is stopped and reported as
"> seconds".

Every run is its own child process (multiprocessing, 'spawn'), with a fresh
model_dir, and with checkpoints, summaries and step logging switched off on
both sides. Throughput runs alternate ours, TF, ours, TF, ... A hook records
the wall time after each step; the first `--warmup` steps are discarded and
a run's rate is the examples of the remaining steps over their wall time
(the median step time is printed too). A side's rate is the median over its
rounds. Peak RSS is the child's own ru_maxrss (largest over its rounds;
for a stopped child, the VmHWM last seen).

Usage: .venv/bin/python -m bench.e2e_bench [--quick] [--rounds N] ...
"""
import argparse
import multiprocessing
import os
import queue as queue_lib
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
from bench.peers import workload as peer  # pylint: disable=g-import-not-at-top
from examples import ctr_data  # pylint: disable=g-import-not-at-top
from examples import dlrm  # pylint: disable=g-import-not-at-top

OURS = "ours"
TF = "tf"
SIDES = (OURS, TF)

fc = tf.feature_column


# --- the two stacks ----------------------------------------------------------


def _column_api(side):
  if side == OURS:
    return tpu_embedding_columns
  return tf.compat.v1.tpu.experimental


def _spec_class(side):
  if side == OURS:
    return estimator_spec.TPUEstimatorSpec
  return tf.compat.v1.estimator.tpu.TPUEstimatorSpec


def _embedding_spec(side, columns, clipping=True):
  """The same EmbeddingConfigSpec (dlrm.build_spec's parameters) of either
  stack; without `clipping`, plain Adagrad (lr 0.05, initial accumulator
  0.1: no weight clipping, no clipping_limit)."""
  clip = ({"clip_weight_min": -5.0, "clip_weight_max": 5.0} if clipping else
          {})
  limit = 10.0 if clipping else None
  if side == OURS:
    return estimator_spec.EmbeddingConfigSpec(
        feature_columns=columns,
        optimization_parameters=estimator_spec.AdagradParameters(
            learning_rate=0.05, initial_accumulator=0.1, **clip),
        clipping_limit=limit)
  return tf.compat.v1.estimator.tpu.experimental.EmbeddingConfigSpec(
      feature_columns=columns,
      optimization_parameters=tf.compat.v1.tpu.experimental.AdagradParameters(
          learning_rate=0.05, initial_accumulator=0.1, **clip),
      clipping_limit=limit)


def _estimator(side, model_fn, model_dir, batch_size, spec,
               profile_sampling_rate=None, tf_random_seed=None,
               summaries_every=None):
  """`summaries_every`: RunConfig's save_summary_steps and
  log_step_count_steps (None: no summaries and no step logging)."""
  # Each side's own RunConfig (ours is the library's framework's when it
  # stands on it, docs/estimator.md 'Two stacks').
  config_class = (estimator_spec.RunConfig if side == OURS else
                  tf.compat.v1.estimator.tpu.RunConfig)
  config = config_class(
      model_dir=model_dir,
      tf_random_seed=tf_random_seed,
      save_checkpoints_steps=None,
      save_checkpoints_secs=None,
      save_summary_steps=summaries_every,
      log_step_count_steps=summaries_every)
  estimator_class = (estimator_spec.TPUEstimator if side == OURS else
                     tf.compat.v1.estimator.tpu.TPUEstimator)
  extra = ({} if profile_sampling_rate is None else
           {"profile_sampling_rate": profile_sampling_rate})
  return estimator_class(
      model_fn=model_fn,
      config=config,
      use_tpu=False,
      train_batch_size=batch_size,
      embedding_config_spec=spec,
      **extra)


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


def _mlp_model_fn(columns, spec_class, optimizer, hidden, pieces=None):
  """DenseFeatures(columns) -> relu layers `hidden` -> logit, log loss.
  columns None: the features dict holds the layer's output ready made,
  under "activations" (the same model with its embeddings fed), or as the
  features `pieces` (one per embedding), which are concatenated as
  DenseFeatures concatenates its columns and whose gradients each step
  computes, as a step that trains embeddings must."""

  def model_fn(features, labels, mode, params):
    del params
    inputs = [features[name] for name in pieces or ()]
    if inputs:
      x = tf.concat(inputs, axis=1)
    elif columns is None:
      x = features["activations"]
    else:
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
    if not inputs:
      train_op = opt.minimize(
          loss, global_step=tf.compat.v1.train.get_global_step())
      return spec_class(mode=mode, loss=loss, train_op=train_op)
    # One backward pass for the dense variables and the fed pieces.
    variables = tf.compat.v1.trainable_variables()
    grads = tf.compat.v1.gradients(loss, variables + inputs)
    train_op = tf.group(
        opt.apply_gradients(zip(grads[:len(variables)], variables),
                            global_step=tf.compat.v1.train.get_global_step()),
        *grads[len(variables):])
    return spec_class(mode=mode, loss=loss, train_op=train_op)

  return model_fn


# --- workloads ---------------------------------------------------------------


_zipf_ids = peer.zipf_ids


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


def _batched_input_fn(features, labels, streamed=False):
  """An input_fn yielding the data's consecutive batches of
  params['batch_size'] examples, pre-batched in numpy, their ids made
  SparseTensors once (cached, as the TorchRec side builds its
  KeyedJaggedTensors once), cycled: no per-step input work shares the CPUs
  with the step, so the step itself is measured.

  The batches enter the graph as constants, unless `streamed`: then a
  generator hands them to tf.data one at a time (the `vocab` runs, which
  measure memory). As constants, TF holds the data several times over (the
  GraphDef, the graph, the constant's tensor and Grappler's copies: about
  135 MB for peer26's 20 MB of ids), which neither side's tables cause;
  read from a source, as a model's input is, the data is held once, plus
  the cache of its batches. From the second pass on, both give the step
  the same cached batches."""

  def input_fn(params):
    batch = params["batch_size"]
    count = len(labels) // batch
    if count < 1:
      raise ValueError(f"{len(labels)} examples < one batch of {batch}")

    def split(array):
      array = np.asarray(array)[:count * batch]
      return array.reshape((count, batch) + array.shape[1:])

    batched = ({k: split(v) for k, v in features.items()}, split(labels))
    if streamed:
      def batches():
        for i in range(count):
          yield {k: v[i] for k, v in batched[0].items()}, batched[1][i]

      dataset = tf.data.Dataset.from_generator(
          batches, output_signature=tf.nest.map_structure(
              lambda a: tf.TensorSpec(a.shape[1:], a.dtype), batched))
    else:
      dataset = tf.data.Dataset.from_tensor_slices(batched)
    # Ids and weights as SparseTensors (as parsing gives them; a TPU input
    # path refuses dense weights), the same on both sides.
    dataset = dataset.map(lambda x, y: (dlrm.as_sparse(x), y)).cache()
    return dataset.repeat().prefetch(2)

  return input_fn


def _records_input_fn(features, labels, path):
  """An input_fn as TPU programs write one: tf.Examples read from a TFRecord
  file, repeated, batched by params['batch_size'] with drop_remainder and
  parsed by `tf.io.parse_example` (each id feature a VarLenFeature, so its
  ids arrive as a SparseTensor of the present ids), then prefetched. The
  file is written to `path` now, before train(), so writing it is not
  timed."""
  label_key = "label"
  if label_key in features:
    raise ValueError(f"a feature is named {label_key!r}, the labels' key")
  with tf.io.TFRecordWriter(path) as writer:
    for i in range(len(labels)):
      example = {name: tf.train.Feature(int64_list=tf.train.Int64List(
          value=ids[i][ids[i] >= 0].tolist()))
                 for name, ids in features.items()}
      example[label_key] = tf.train.Feature(
          float_list=tf.train.FloatList(value=labels[i].tolist()))
      writer.write(tf.train.Example(features=tf.train.Features(
          feature=example)).SerializeToString())
  spec = {name: tf.io.VarLenFeature(tf.int64) for name in features}
  spec[label_key] = tf.io.FixedLenFeature([labels.shape[1]], tf.float32)

  def parse(serialized):
    parsed = tf.io.parse_example(serialized, spec)
    return parsed, parsed.pop(label_key)

  def input_fn(params):
    dataset = tf.data.TFRecordDataset(path).repeat()
    dataset = dataset.batch(params["batch_size"], drop_remainder=True)
    return dataset.map(parse).prefetch(2)

  return input_fn


def _input_fn(job, features, labels):
  if job.get("input") == "records":
    return _records_input_fn(
        features, labels, os.path.join(job["model_dir"], "input.tfrecord"))
  if job.get("input") == "example":
    # The example's own input_fn: per-example shuffle, then batch.
    return dlrm.input_fn_for(features, labels)
  return _batched_input_fn(features, labels,
                           streamed=job.get("input") == "streamed")


def _build_dlrm(side, job):
  scale = job["scale"]
  features, labels = ctr_data.generate(job["examples"], scale, seed=0)
  columns, numeric = dlrm.build_columns(scale, api=_column_api(side))
  if side == OURS:
    spec = dlrm.build_spec(scale,
                           profile_data_directory=job.get("profile_dir"))
    model_fn = dlrm.model_fn_for(columns, numeric)
  else:
    spec = _embedding_spec(TF, columns)
    model_fn = _without_cross_shard_optimizer(
        dlrm.model_fn_for(columns, numeric, spec_class=_spec_class(TF)))
  return model_fn, spec, _input_fn(job, features, labels)


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
          _input_fn(job, features, labels))


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
          _input_fn(job, features, labels))


def _build_peer26(side, job):
  """The TorchRec peer's workload (bench/peers/workload.py): its data, sizes
  and optimizers. Job keys beyond the peer's: `rows` (per table; default
  the peer's 100,000), `tables` (the 26 features share this many tables,
  in equal groups; default 26, one each) and `fed` (the same model with
  its embedding activations given as an input: no lookup, no update)."""
  rows, tables = job.get("rows", peer.ROWS), job.get("tables", peer.FEATURES)
  features, labels = peer.make_data(job["examples"], rows=rows,
                                    seed=job.get("seed", 0))
  if job.get("fed"):
    # One input [N, 26 x 16]; with `fed_gradients`, 26 inputs [N, 16] whose
    # gradients the step computes.
    activations = peer.fed_activations(len(labels), job.get("seed", 0))
    pieces = None
    if job.get("fed_gradients"):
      pieces = [f"activation_{name}" for name in features]
      fed = {name: activations[:, i * peer.DIM:(i + 1) * peer.DIM]
             for i, name in enumerate(pieces)}
    else:
      fed = {"activations": activations}
    model_fn = _mlp_model_fn(None, _spec_class(side), "adagrad",
                             hidden=peer.HIDDEN, pieces=pieces)
    return model_fn, None, _input_fn(job, fed, labels)
  api = _column_api(side)
  categorical = [fc.categorical_column_with_identity(name, rows)
                 for name in features]
  if tables == peer.FEATURES:
    columns = [
        api.embedding_column(column, dimension=peer.DIM, combiner="sum")
        for column in categorical
    ]
  else:
    if peer.FEATURES % tables:
      raise ValueError(f"peer26: {peer.FEATURES} features do not split "
                       f"into {tables} equal tables")
    size = peer.FEATURES // tables
    columns = []
    for t in range(tables):
      columns.extend(
          api.shared_embedding_columns(
              categorical[t * size:(t + 1) * size], dimension=peer.DIM,
              combiner="sum", shared_embedding_collection_name=f"table_{t}"))
  model_fn = _mlp_model_fn(columns, _spec_class(side), "adagrad",
                           hidden=peer.HIDDEN)
  return (model_fn, _embedding_spec(side, columns, clipping=False),
          _input_fn(job, features, labels))


_BUILDERS = {"dlrm": _build_dlrm, "wide26": _build_wide,
             "startup": _build_startup, "peer26": _build_peer26}


# --- one run, in a child process --------------------------------------------


def build_parts(job):
  """(model_fn, EmbeddingConfigSpec, input_fn) of `job`'s workload and side
  (its stack's classes)."""
  return _BUILDERS[job["workload"]](job["side"], job)


def build_estimator(job):
  """(estimator, input_fn) of `job` (workload, side, model_dir, batch, and
  the workload's own keys; `profile_rate`: ours with lookup statistics
  sampled at that rate into `<model_dir>/profile`; `tf_random_seed`: the
  graph's seed, for runs that must start from the same values;
  `summaries_every`: summaries and step logging every that many steps)."""
  if job.get("profile_rate"):
    job = dict(job, profile_dir=os.path.join(job["model_dir"], "profile"))
  model_fn, spec, input_fn = build_parts(job)
  estimator = _estimator(job["side"], model_fn, job["model_dir"], job["batch"],
                         spec, job.get("profile_rate"),
                         job.get("tf_random_seed"),
                         job.get("summaries_every"))
  return estimator, input_fn


class StepTimes(tf.compat.v1.train.SessionRunHook):
  """perf_counter() after every step; the graph's trainable variables
  ({name: size}), the bytes of all its variables (tables, slots, dense
  model and its optimizer's slots) and the types of its optimizer ops
  (`...Apply...`) when the session is built."""

  def __init__(self):
    self.times = []
    self.trainable = {}
    self.state_bytes = 0
    self.apply_ops = []
    self.graph_ops = 0
    self.begin_at = self.session_at = self.first_run_at = None

  def begin(self):
    self.begin_at = time.perf_counter()
    self.trainable = {
        v.op.name: int(np.prod(v.shape.as_list()))
        for v in tf.compat.v1.trainable_variables()}
    self.state_bytes = sum(
        int(np.prod(v.shape.as_list())) * v.dtype.base_dtype.size
        for v in tf.compat.v1.global_variables())
    operations = tf.compat.v1.get_default_graph().get_operations()
    self.apply_ops = sorted({op.type for op in operations
                             if "Apply" in op.type})
    # The train graph's size once model_fn and the estimator built it.
    self.graph_ops = len(operations)

  def after_create_session(self, session, coord):
    self.session_at = time.perf_counter()

  def before_run(self, run_context):
    if self.first_run_at is None:
      self.first_run_at = time.perf_counter()

  def after_run(self, run_context, run_values):
    self.times.append(time.perf_counter())


def run_job(job, queue):
  """Builds the estimator of `job` and trains job['steps'] steps; tells the
  parent (through `queue`) when train() is called."""
  warnings.filterwarnings("ignore", category=UserWarning)
  tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
  estimator, input_fn = build_estimator(job)
  # RSS before any graph exists: TF's runtime, the data and this script.
  base_rss_mb = _rss_mb(os.getpid(), "VmRSS")
  hook = StepTimes()
  input_times = []

  def timed_input_fn(params):
    input_times.append(time.perf_counter())
    dataset = input_fn(params)
    input_times.append(time.perf_counter())
    return dataset

  queue.put({"event": "train", "at": time.monotonic()})
  start = time.perf_counter()
  estimator.train(timed_input_fn, max_steps=job["steps"], hooks=[hook])
  end = time.perf_counter()
  times = hook.times
  result = {"first_step_s": times[0] - start, "train_s": end - start,
            "phases": _phases(start, input_times, hook),
            "steps": len(times), "trainable": hook.trainable,
            "base_rss_mb": base_rss_mb,
            "state_mb": hook.state_bytes / 2**20,
            "apply_ops": hook.apply_ops, "graph_ops": hook.graph_ops}
  warmup = job.get("warmup", 0)
  if len(times) > warmup + 1:
    steady = np.diff(times[warmup:])
    result["examples_per_s"] = job["batch"] * len(steady) / float(
        steady.sum())
    result["median_step_ms"] = float(np.median(steady)) * 1e3
  return result


def _phases(start, input_times, hook):
  """Seconds of each phase up to the end of the first step: `input`
  (input_fn: the dataset's graph), `graph` (model_fn and the estimator's
  wiring, to the hooks' begin), `session` (the session made: variables
  initialized, the iterator started), `step` (the first step's run, which
  builds its executor); `other` is what falls between them."""
  input_s = input_times[1] - input_times[0] if len(input_times) == 2 else 0.0
  phases = {"input": input_s,
            "graph": hook.begin_at - (input_times[-1] if input_times else
                                      start),
            "session": hook.session_at - hook.begin_at,
            "step": hook.times[0] - hook.first_run_at}
  phases["other"] = hook.times[0] - start - sum(phases.values())
  return phases


def _child(job, queue):
  try:
    result = run_job(job, queue)
    result["max_rss_mb"] = resource.getrusage(
        resource.RUSAGE_SELF).ru_maxrss / 1024.0
    queue.put(dict(result, event="result"))
  except BaseException:  # pylint: disable=broad-except
    queue.put({"event": "error", "error": traceback.format_exc()})


def _peak_rss_mb(pid):
  """VmHWM of a live process (Linux), else None."""
  return _rss_mb(pid, "VmHWM")


def _rss_mb(pid, field):
  """`field` (VmRSS: now, VmHWM: peak) of a live process (Linux), in MB;
  None when unknown."""
  try:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
      for line in status:
        if line.startswith(field + ":"):
          return int(line.split()[1]) / 1024.0
  except (OSError, ValueError):
    pass
  return None


def run_in_child(job, time_limit=None, rss_limit_mb=None):
  """Runs `job` in a fresh 'spawn' child process; returns its result dict.

  With `time_limit` (seconds after the child calls train()) or
  `rss_limit_mb`, a child that exceeds either is killed and the result says
  so (`stopped`), with the seconds since train() and the peak RSS seen.
  """
  context = multiprocessing.get_context("spawn")
  queue = context.Queue()
  model_dir = tempfile.mkdtemp(prefix=f"e2e_{job['workload']}_{job['side']}_")
  job = dict(job, model_dir=model_dir)
  process = context.Process(target=_child, args=(job, queue))
  process.start()
  train_at = None
  peak = 0.0
  try:
    while True:
      try:
        message = queue.get(timeout=0.5)
      except queue_lib.Empty:
        message = None
      if message is not None:
        if message["event"] == "train":
          train_at = message["at"]
          continue
        if message["event"] == "error":
          raise RuntimeError(f"{job['workload']}/{job['side']} failed in its "
                             f"child process:\n{message['error']}")
        message["max_rss_mb"] = max(message["max_rss_mb"], peak)
        return message
      peak = max(peak, _peak_rss_mb(process.pid) or 0.0)
      if not process.is_alive() and queue.empty():
        raise RuntimeError(f"{job['workload']}/{job['side']}: the child "
                           f"process died (exit code {process.exitcode}).")
      since_train = None if train_at is None else time.monotonic() - train_at
      reason = None
      if time_limit and since_train is not None and since_train > time_limit:
        reason = f"no first step {time_limit:.0f} s after train()"
      elif rss_limit_mb and peak > rss_limit_mb:
        reason = f"peak RSS above {rss_limit_mb:,.0f} MB"
      if reason:
        process.kill()
        return {"stopped": reason, "since_train_s": since_train or 0.0,
                "max_rss_mb": peak}
  finally:
    process.join()
    shutil.rmtree(model_dir, ignore_errors=True)


# --- the benchmark -----------------------------------------------------------


WORKLOADS = ("dlrm", "dlrm-full", "dlrm-ex", "wide26", "peer26",
             "peer26-fed", "peer26-fed-grad", "vocab", "startup")


def _describe(job):
  name = job["workload"]
  inputs = {"batched": "pre-batched input",
            "streamed": "pre-batched input, streamed from a generator",
            "example": "the example's input_fn (per-example shuffle + batch)",
            "records": "tf.Examples from a TFRecord file, batched, parsed by "
                       "tf.io.parse_example"}
  if name == "dlrm":
    return (f"example model (examples/dlrm.py) at scale {job['scale']}, "
            f"batch {job['batch']}, model optimizer Adam, "
            f"{inputs[job['input']]}")
  if name == "wide26":
    return (f"{job['features']} features, each its own table "
            f"{job['vocab']:,} x {job['dim']}, batch {job['batch']}, MLP "
            f"(64, 1), model optimizer {job['optimizer'].capitalize()}, "
            f"{inputs[job['input']]}")
  if name == "peer26" and job.get("fed"):
    how = ("fed as inputs, concatenated, their gradients computed"
           if job.get("fed_gradients") else "fed as an input")
    return (f"the peer26 model with its {peer.FEATURES} x {peer.DIM} "
            f"embedding activations {how} (no lookup, no update), "
            f"batch {job['batch']}, MLP {peer.HIDDEN + (1,)}, Adagrad, "
            f"{inputs[job['input']]}")
  if name == "peer26":
    rows, tables = job.get("rows", peer.ROWS), job.get("tables",
                                                        peer.FEATURES)
    where = ("each its own table" if tables == peer.FEATURES else
             f"sharing {tables} tables")
    return (f"{peer.FEATURES} features, {where} of {rows:,} x "
            f"{peer.DIM}, {peer.MIN_IDS}-{peer.MAX_IDS} ids each, combiner "
            f"sum, batch {job['batch']}, MLP {peer.HIDDEN + (1,)}, Adagrad on "
            f"tables and dense variables, {inputs[job['input']]}")
  return (f"{job['features']:,} features over {job['tables']} shared tables "
          f"(vocab {job['vocab']:,}, dim {job['dim']}), batch {job['batch']}, "
          f"one step, {inputs[job['input']]}")


def peer26_job(steps, warmup):
  """The `peer26` throughput job (bench/peers/compare.py runs it too)."""
  return {"workload": "peer26", "batch": peer.BATCH,
          "examples": peer.BATCHES * peer.BATCH, "input": "batched",
          "steps": steps, "warmup": warmup}


STARTUP_INPUTS = {"records": "records", "constants": "batched"}


def _startup_job(features, source="records"):
  """`source`: 'records' (tf.Examples from a file, parsed by parse_example)
  or 'constants' (the throughput runs' pre-batched input)."""
  return {"workload": "startup", "features": features,
          "tables": max(1, features // 10), "vocab": 1000, "dim": 8,
          "batch": 64, "examples": 256, "steps": 1,
          "input": STARTUP_INPUTS[source]}


def _fmt_first_step(result):
  if "stopped" in result:
    return f"> {result['since_train_s']:.0f} s"
  return f"{result['first_step_s']:.1f} s"


def plan(argv=None):
  """The command line `argv` (default sys.argv[1:]) read: (args, jobs, rounds,
  warmup, steps), jobs being (label, job, rounds) in the order they run."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true",
                      help="smoke run: a few steps, one round, small startup")
  parser.add_argument("--rounds", type=int, default=2,
                      help="alternating throughput rounds per side")
  parser.add_argument("--steps", type=int, default=None,
                      help="timed steps per throughput run (after warm-up); "
                      "default 80, --quick 5")
  parser.add_argument("--warmup", type=int, default=None,
                      help="discarded steps per run; default 20, --quick 2")
  parser.add_argument("--dlrm-scale", type=float, default=0.05)
  parser.add_argument("--dlrm-batch", type=int, default=1024)
  parser.add_argument("--wide-optimizer", default="adagrad",
                      choices=["adagrad", "adam"])
  parser.add_argument("--startup-features", default=None,
                      help="comma-separated feature counts (10 features per "
                      "table); default 100,1000, --quick 100")
  parser.add_argument("--startup-input", default="records",
                      help="comma-separated input_fns of the startup runs: "
                      "records (tf.Examples from a TFRecord file, parsed by "
                      "tf.io.parse_example, as TPU programs read their "
                      "input) and/or constants (the throughput runs' "
                      "pre-batched arrays, made SparseTensors by a map)")
  parser.add_argument("--startup-limit", type=float, default=120.0,
                      help="seconds after train() before a startup run is "
                      "stopped and reported as '> limit'")
  parser.add_argument("--rss-limit-mb", type=float, default=8000.0,
                      help="a child process above this peak RSS is stopped")
  parser.add_argument("--vocab-rows", default="100000,1000000,10000000",
                      help="rows per table of the `vocab` workloads (the "
                      "peer26 model, its 26 features sharing 2 tables)")
  parser.add_argument("--workloads", default=",".join(WORKLOADS),
                      help="comma-separated, from the default")
  args = parser.parse_args(argv)

  if args.quick:
    steps, rounds = args.steps or 5, 1
    warmup = args.warmup if args.warmup is not None else 2
    startup_features = args.startup_features or "100"
  else:
    steps = args.steps or 80
    warmup = args.warmup if args.warmup is not None else 20
    rounds = args.rounds
    startup_features = args.startup_features or "100,1000"
  chosen = [w for w in args.workloads.split(",") if w]
  unknown = sorted(set(chosen) - set(WORKLOADS))
  if unknown:
    parser.error(f"--workloads: unknown {unknown}; choose from "
                 f"{','.join(WORKLOADS)}")
  jobs = []   # (label, job, rounds)
  dlrm_job = {"workload": "dlrm", "scale": args.dlrm_scale,
              "batch": args.dlrm_batch, "examples": 16 * args.dlrm_batch,
              "steps": warmup + steps, "warmup": warmup}
  if "dlrm" in chosen:
    jobs.append(("dlrm", dict(dlrm_job, input="batched"), rounds))
  if "dlrm-full" in chosen:
    # The example model with the vocabularies examples/dlrm.py defines
    # (scale 1.0: up to 1,000,000 rows per table).
    jobs.append(("dlrm-full", dict(dlrm_job, input="batched", scale=1.0),
                 rounds))
  if "dlrm-ex" in chosen:
    jobs.append(("dlrm-ex", dict(dlrm_job, input="example"), rounds))
  if "wide26" in chosen:
    jobs.append(("wide26", {
        "workload": "wide26", "features": 26, "vocab": 100_000, "dim": 16,
        "batch": 1024, "examples": 32 * 1024, "input": "batched",
        "optimizer": args.wide_optimizer, "steps": warmup + steps,
        "warmup": warmup}, rounds))
  if "peer26" in chosen:
    jobs.append(("peer26", peer26_job(warmup + steps, warmup), rounds))
  if "peer26-fed" in chosen:
    jobs.append(("peer26-fed", dict(peer26_job(warmup + steps, warmup),
                                    fed=True), rounds))
  if "peer26-fed-grad" in chosen:
    jobs.append(("peer26-fed-grad", dict(peer26_job(warmup + steps, warmup),
                                         fed=True, fed_gradients=True),
                 rounds))
  if "vocab" in chosen:
    rows_list = [int(r) for r in args.vocab_rows.split(",") if r]
    if args.quick:
      rows_list = rows_list[:1]
    for rows in rows_list:
      jobs.append((f"vocab{rows:.0e}".replace("+0", ""), dict(
          peer26_job(warmup + steps, warmup), rows=rows, tables=2,
          input="streamed"), 1))
  sources = [s for s in args.startup_input.split(",") if s]
  unknown = sorted(set(sources) - set(STARTUP_INPUTS))
  if unknown or not sources:
    parser.error(f"--startup-input: {unknown or 'none'}; choose from "
                 f"{','.join(STARTUP_INPUTS)}")
  if "startup" in chosen:
    for source in sources:
      suffix = "" if source == "records" else f"-{source}"
      for count in startup_features.split(","):
        jobs.append((f"start{int(count)}{suffix}",
                     _startup_job(int(count), source), 1))
  return args, jobs, rounds, warmup, steps


def main():
  args, jobs, rounds, warmup, steps = plan()
  print(f"e2e_bench: {os.cpu_count()} CPUs, TF {tf.__version__}; throughput: "
        f"{rounds} alternating round(s) per side of {warmup} warm-up + "
        f"{steps} timed steps{' (quick)' if args.quick else ''}", flush=True)
  begin = time.perf_counter()
  results = {}
  for label, job, count in jobs:
    print(f"\n[{label}] {_describe(job)}", flush=True)
    results[label] = {side: [] for side in SIDES}
    startup = job["workload"] == "startup"
    for r in range(count):
      for side in SIDES:
        result = run_in_child(
            dict(job, side=side),
            time_limit=args.startup_limit if startup else None,
            rss_limit_mb=args.rss_limit_mb)
        results[label][side].append(result)
        if "stopped" in result:
          detail = (f"STOPPED ({result['stopped']}) after "
                    f"{result['since_train_s']:.0f} s in train()")
        elif startup:
          detail = (f"first step {_fmt_first_step(result):>8s} after "
                    f"train() (train() returned after "
                    f"{result['train_s']:.1f} s), graph "
                    f"{result['graph_ops']:,} ops")
        else:
          detail = (f"{result['examples_per_s']:9,.0f} examples/s  median "
                    f"step {result['median_step_ms']:6.1f} ms  first step "
                    f"{result['first_step_s']:.1f} s after train()")
        print(f"  round {r + 1} {side:4s}  {detail}  peak RSS "
              f"{result['max_rss_mb']:,.0f} MB", flush=True)

  print("\nSummary. Throughput: median examples/s over rounds, ratio = ours "
        "/ TF. Startup: seconds from train() to the end of the first step, "
        "ratio = TF / ours.\nPeak RSS: largest ru_maxrss of the side's child "
        "processes.")
  width = max(len(label) for label, _, _ in jobs + [("workload", 0, 0)])
  print(f"{'workload':{width}s} {'ours':>12s} {'TF':>12s} {'ratio':>7s}  "
        f"{'ours RSS MB':>11s} {'TF RSS MB':>10s}")
  for label, job, _ in jobs:
    by_side = results[label]
    rss = {s: max(r["max_rss_mb"] for r in by_side[s]) for s in SIDES}
    if job["workload"] == "startup":
      first = {s: by_side[s][0] for s in SIDES}
      if any("stopped" in r for r in first.values()):
        ratio = "n/a"
      else:
        speedup = first[TF]["first_step_s"] / first[OURS]["first_step_s"]
        ratio = f"{speedup:.2f}x"
      print(f"{label:{width}s} {_fmt_first_step(first[OURS]):>12s} "
            f"{_fmt_first_step(first[TF]):>12s} {ratio:>7s}  "
            f"{rss[OURS]:11,.0f} {rss[TF]:10,.0f}")
      continue
    rate = {}
    for s in SIDES:
      rates = [r["examples_per_s"] for r in by_side[s] if "stopped" not in r]
      rate[s] = statistics.median(rates) if rates else float("nan")
    print(f"{label:{width}s} {rate[OURS]:8,.0f} ex/s {rate[TF]:8,.0f} ex/s "
          f"{rate[OURS] / rate[TF]:6.2f}x  {rss[OURS]:11,.0f} "
          f"{rss[TF]:10,.0f}")
  print_embedding_cost(results)
  print_memory(jobs, results)
  print_startup(jobs, results)
  print(f"\ntotal wall time {time.perf_counter() - begin:.0f} s")


def _median_step_ms(runs):
  steps = [r["median_step_ms"] for r in runs if "stopped" not in r]
  return statistics.median(steps) if steps else float("nan")


def print_embedding_cost(results):
  """The embedding's cost beside the dense model: peer26's step time minus
  the step time of the same model with its activations fed (peer26-fed),
  over the latter."""
  if "peer26" not in results or "peer26-fed" not in results:
    return
  print("\nEmbedding cost (peer26 step - peer26-fed step, over the fed "
        "step; median step times):")
  steps = {side: {name: _median_step_ms(results[name][side])
                  for name in ("peer26", "peer26-fed", "peer26-fed-grad")
                  if name in results} for side in SIDES}
  for side, step in steps.items():
    full, fed = step["peer26"], step["peer26-fed"]
    print(f"  {side:4s} {full:6.2f} ms - {fed:6.2f} ms = {full - fed:6.2f} ms"
          f" = {100 * (full - fed) / fed:5.0f}% of the fed model's step")
  if "peer26-fed-grad" not in results:
    return
  # The part of that cost which is the dense model's own work for the
  # activations (their concatenation, its gradient, the first layer's
  # gradient with respect to its input), and the rest: lookup and update.
  print("Of which (peer26-fed-grad: the fed activations concatenated and "
        "their gradients computed):")
  for side, step in steps.items():
    full, fed, grad = (step["peer26"], step["peer26-fed"],
                       step["peer26-fed-grad"])
    print(f"  {side:4s} dense work for the activations {grad - fed:6.2f} ms "
          f"({100 * (grad - fed) / fed:4.0f}%); lookup and update "
          f"{full - grad:6.2f} ms ({100 * (full - grad) / fed:4.0f}%)")


def print_startup(jobs, results):
  """The startup runs: seconds to the first step and the train graph's ops
  (when the session is made) of each side, ours over TF's."""
  labels = [(label, job) for label, job, _ in jobs
            if job["workload"] == "startup"]
  runs = [(job, {s: results[label][s][0] for s in SIDES})
          for label, job in labels]
  runs = [(job, first) for job, first in runs
          if not any("stopped" in r for r in first.values())]
  if not runs:
    return
  print("\nStartup: seconds from train() to the end of the first step and "
        "the train graph's ops, ours / TF")
  print(f"{'input':9s} {'features':>8s} {'ours s':>8s} {'TF s':>8s} "
        f"{'ratio':>6s} {'ours ops':>9s} {'TF ops':>9s} {'ratio':>6s}")
  for job, first in runs:
    seconds = {s: first[s]["first_step_s"] for s in SIDES}
    ops = {s: first[s]["graph_ops"] for s in SIDES}
    print(f"{_startup_source(job):9s} {job['features']:8,d} "
          f"{seconds[OURS]:8.1f} {seconds[TF]:8.1f} "
          f"{seconds[OURS] / seconds[TF]:5.2f}x {ops[OURS]:9,d} "
          f"{ops[TF]:9,d} {ops[OURS] / ops[TF]:5.2f}x")
  print("\nStartup phases, seconds (input: input_fn; graph: model_fn and "
        "the estimator's wiring; session: variables initialized and the "
        "iterator started; step: the first step's run)")
  names = ("input", "graph", "session", "step", "other")
  print(f"{'input':9s} {'features':>8s} {'side':4s} " +
        " ".join(f"{name:>8s}" for name in names))
  for job, first in runs:
    for side in SIDES:
      phases = first[side]["phases"]
      print(f"{_startup_source(job):9s} {job['features']:8,d} {side:4s} " +
            " ".join(f"{phases[name]:8.1f}" for name in names))


def _startup_source(job):
  return next(source for source, name in STARTUP_INPUTS.items()
              if name == job["input"])


def print_memory(jobs, results):
  """Peak RSS against the variables' bytes (tables, slots, dense model and
  its slots), for the `vocab` runs: as measured, and above the child's RSS
  before it built a graph (TF's runtime and the numpy data)."""
  labels = [label for label, _, _ in jobs if label.startswith("vocab")]
  if not labels:
    return
  print("\nMemory (vocab runs): variables' MB, peak RSS MB, peak / "
        "variables, (peak - RSS before the graph) / variables")
  for label in labels:
    for side in SIDES:
      run = results[label][side][0]
      if "stopped" in run:
        print(f"  {label:9s} {side:4s} stopped: {run['stopped']}")
        continue
      state, peak = run["state_mb"], run["max_rss_mb"]
      print(f"  {label:9s} {side:4s} variables {state:9,.0f}  peak "
            f"{peak:9,.0f}  {peak / state:5.2f}x  "
            f"{(peak - run['base_rss_mb']) / state:5.2f}x above "
            f"{run['base_rss_mb']:,.0f} MB before the graph")
  # What the tables themselves cost: the growth of the peak between the
  # smallest and the largest vocabulary over the growth of the variables
  # (the runtime, graph and session are in both and cancel out).
  for side in SIDES:
    runs = [(label, results[label][side][0]) for label in labels
            if "stopped" not in results[label][side][0]]
    if len(runs) < 2:
      continue
    low, small = min(runs, key=lambda item: item[1]["state_mb"])
    high, large = max(runs, key=lambda item: item[1]["state_mb"])
    grown = large["state_mb"] - small["state_mb"]
    if grown > 0:
      print(f"  {side:4s} {low} -> {high}: peak RSS grew "
            f"{large['max_rss_mb'] - small['max_rss_mb']:,.0f} MB for "
            f"{grown:,.0f} MB more variables: "
            f"{(large['max_rss_mb'] - small['max_rss_mb']) / grown:.2f}x")


if __name__ == "__main__":
  sys.exit(main())
