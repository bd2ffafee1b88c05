"""Table size: start-up, step, checkpoints and memory as one table grows.

One table of V rows x 32 (`categorical_column_with_identity`, combiner
'sum'), Adagrad (lr 0.05, initial accumulator 0.1) on the table, batches of
2,048 examples x 8 ids drawn with a power-law skew (Zipf, exponent 1.05,
ids shuffled over the whole table), DenseFeatures -> dense 64 relu -> logit,
on both sides:

* ours: `estimator_spec.TPUEstimator(use_tpu=False)` with
  `tpu_embedding_columns`: the spec's Adagrad trains the table on the host
  embedding engine.
* tf: TF 2.15's `TPUEstimator(use_tpu=False)` with TF's columns: off the
  TPU it ignores the spec's optimizer, so the model's
  `AdagradOptimizer(0.05, initial_accumulator_value=0.1)` trains the table
  as a graph variable (sparse updates of the rows a batch touches).

Either way the state is the table and its Adagrad accumulators (8 bytes
per float of the table). `--optimizer adam` trains with Adam instead (the
spec's `AdamParameters(0.01)`, lazy, on ours; `AdamOptimizer(0.01)` on
TF's, which moves every row of the table each step): the table and two
slots.

Each (size, side, mode) runs in a fresh child process; sides alternate
within each size (ours, tf, ours, tf with `--rounds 2`). Modes:

* `train`: `--steps` steps with checkpoints on (the estimator's step-0
  checkpoint and the final one). `first step`: train() called until the
  first step has run (graph, variables initialized, step-0 checkpoint, the
  first step itself), split into phases; `step`: the median of the steps
  after `--warmup`; `save`: the final checkpoint's save; `peak RSS`: the
  child's high-water mark (VmHWM).
* `evaluate`, `predict`, `export`: each in its own child, from the train
  run's checkpoint (its model_dir is kept until the size is done):
  evaluate() of 4 batches, predict() of 4 batches, export_saved_model();
  seconds and peak RSS each. `export` also loads the SavedModel in stock TF
  (`tf.saved_model.load` in a child without this library imported) and
  reports that child's peak RSS.
* `commands` (ours only): `python -m estimator_spec convert` (to `mod`, 4
  shards), `export-mid-level` and `rows` (8 ids) on the train run's
  checkpoint: seconds and peak RSS each.

A child whose RSS passes `--rss-limit-gb` (default: the machine's memory
less 1.5 GB) stops itself and is reported as stopped (the largest table
that trains here is the largest V whose train run was not stopped).

The disk: before the runs, `--disk-gb` GB (default 2) are written and
fsync'ed, then read back after dropping them from the page cache where
allowed, to give the checkpoint times a yardstick.

Idle check: each child's run reports the CPUs other work kept busy while
it ran (the machine's busy time less its own); above 0.2 the summary says
the numbers are not an idle machine's.

Usage: .venv/bin/python -m bench.scale_bench [--rows 1M 8M 32M]
           [--sides ours tf] [--modes train evaluate predict export commands]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

from bench.peers import compare

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

SIDES = ("ours", "tf")
MODES = ("train", "evaluate", "predict", "export", "commands")
DIMENSION = 32
BATCH = 2048
IDS_PER_EXAMPLE = 8
EXPONENT = 1.05
HIDDEN = 64
TABLE_NAME = "tbl_ids"  # the table of feature "ids" as `describe` names it
MARK = compare.MARK
BUSY = compare.BUSY


def parse_rows(text):
  """'8M' -> 8,000,000; '500k' -> 500,000; '1000' -> 1,000."""
  scale = {"k": 10**3, "m": 10**6, "g": 10**9}
  text = text.strip().lower()
  if text and text[-1] in scale:
    return int(float(text[:-1]) * scale[text[-1]])
  return int(text)


def rows_label(rows):
  if rows % 10**6 == 0:
    return f"{rows // 10**6}M"
  if rows % 10**3 == 0:
    return f"{rows // 10**3}k"
  return str(rows)


# --optimizer: (slot variables per table, the spec's parameters class and
# keyword arguments, TF's v1 optimizer class and keyword arguments, which
# trains the dense layers on both sides and the table on TF's).
OPTIMIZERS = {
    "adagrad": (1, "AdagradParameters",
                {"learning_rate": 0.05, "initial_accumulator": 0.1},
                "AdagradOptimizer",
                {"learning_rate": 0.05, "initial_accumulator_value": 0.1}),
    "adam": (2, "AdamParameters", {"learning_rate": 0.01},
             "AdamOptimizer", {"learning_rate": 0.01}),
}


def state_bytes(rows, optimizer="adagrad"):
  """The table and its optimizer's slots, float32."""
  return (1 + OPTIMIZERS[optimizer][0]) * rows * DIMENSION * 4


# --- the child ---------------------------------------------------------------


class RssWatch:
  """Polls this process's VmRSS; past `limit_mb` prints a stopped result
  and exits at once (before the kernel's OOM killer picks a process)."""

  def __init__(self, limit_mb, mode, started):
    self.limit_mb = limit_mb
    self.mode = mode
    self.started = started
    self.phase = "start"
    self.peaks = {}  # {phase: the largest RSS seen during it, MB}
    thread = threading.Thread(target=self._watch, daemon=True)
    thread.start()

  def _watch(self):
    while True:
      rss = _status_mb("VmRSS")
      if rss:
        phase = self.phase
        self.peaks[phase] = max(self.peaks.get(phase, 0.0), rss)
      if self.limit_mb and rss and rss > self.limit_mb:
        result = {"stopped": f"RSS {rss / 1024:.1f} GB passed the limit of "
                             f"{self.limit_mb / 1024:.1f} GB in {self.phase}",
                  "seconds": time.perf_counter() - self.started,
                  "peak_rss_mb": _status_mb("VmHWM")}
        print(MARK + json.dumps(result), flush=True)
        os._exit(0)
      time.sleep(0.05)


def _status_mb(field):
  try:
    with open("/proc/self/status", encoding="ascii") as status:
      for line in status:
        if line.startswith(field + ":"):
          return int(line.split()[1]) / 1024.0
  except (OSError, ValueError):
    pass
  return None


def zipf_ids(rng, rows, shape):
  """Ids in [0, rows) with a power-law skew, the popular ones scattered
  over the table (a fixed permutation of ranks, made by a multiplicative
  hash, so no [rows] array is needed)."""
  ranks = np.minimum(rng.zipf(EXPONENT, size=shape) - 1, rows - 1)
  step = _coprime_step(rows)
  return ((ranks.astype(np.int64) * step + 12345) % rows).astype(np.int64)


def _coprime_step(rows):
  step = 2654435761 % rows or 1
  while np.gcd(step, rows) != 1:
    step += 1
  return step


def _data(rows, steps):
  rng = np.random.RandomState(0)
  count = max(1, steps)
  ids = zipf_ids(rng, rows, (count, BATCH, IDS_PER_EXAMPLE))
  labels = (rng.uniform(size=(count, BATCH, 1)) < 0.25).astype(np.float32)
  return ids, labels


def _input_fn(tf, ids, labels):
  """Pre-batched ids as SparseTensors (as parsing gives them), streamed
  from a generator (the data held once), cached and cycled."""

  def input_fn(params):
    del params

    def batches():
      for i in range(len(labels)):
        yield ids[i], labels[i]

    dataset = tf.data.Dataset.from_generator(
        batches, output_signature=(
            tf.TensorSpec((BATCH, IDS_PER_EXAMPLE), tf.int64),
            tf.TensorSpec((BATCH, 1), tf.float32)))

    dataset = dataset.map(
        lambda x, y: ({"ids": _sparse_ids(tf, x)}, y)).cache()
    return dataset.repeat().prefetch(2)

  return input_fn


def _sparse_ids(tf, dense_ids):
  """[BATCH, 8] ids as a SparseTensor holding all of them."""
  indices = tf.where(tf.ones_like(dense_ids, tf.bool))
  return tf.SparseTensor(indices, tf.reshape(dense_ids, [-1]),
                         tf.shape(dense_ids, out_type=tf.int64))


def _build(side, rows, model_dir, save_steps, optimizer, summaries=None):
  import tensorflow as tf
  _, spec_params, spec_kwargs, tf_optimizer, tf_kwargs = OPTIMIZERS[optimizer]
  if side == "ours":
    import estimator_spec
    import tpu_embedding_columns as columns_api
    estimator_class = estimator_spec.TPUEstimator
    config_class = estimator_spec.RunConfig
    spec_class = estimator_spec.TPUEstimatorSpec
    parameters = getattr(estimator_spec, spec_params)
    config_spec = estimator_spec.EmbeddingConfigSpec
  else:
    columns_api = tf.compat.v1.tpu.experimental
    estimator_class = tf.compat.v1.estimator.tpu.TPUEstimator
    config_class = tf.compat.v1.estimator.tpu.RunConfig
    spec_class = tf.compat.v1.estimator.tpu.TPUEstimatorSpec
    parameters = getattr(tf.compat.v1.tpu.experimental, spec_params)
    config_spec = tf.compat.v1.estimator.tpu.experimental.EmbeddingConfigSpec
  column = columns_api.embedding_column(
      tf.feature_column.categorical_column_with_identity("ids", rows),
      dimension=DIMENSION, combiner="sum")
  spec = config_spec(
      feature_columns=[column],
      optimization_parameters=parameters(**spec_kwargs))

  def model_fn(features, labels, mode, params):
    del params
    x = tf.compat.v1.keras.layers.DenseFeatures([column])(features)
    x = tf.compat.v1.layers.dense(x, HIDDEN, activation=tf.nn.relu,
                                  name="hidden")
    logits = tf.compat.v1.layers.dense(x, 1, name="logit")
    if mode == tf.estimator.ModeKeys.PREDICT:
      return spec_class(mode=mode, predictions={"logit": logits})
    loss = tf.compat.v1.losses.sigmoid_cross_entropy(labels, logits)
    if mode == tf.estimator.ModeKeys.EVAL:
      return spec_class(mode=mode, loss=loss)
    opt = getattr(tf.compat.v1.train, tf_optimizer)(**tf_kwargs)
    train_op = opt.minimize(loss,
                            global_step=tf.compat.v1.train.get_global_step())
    return spec_class(mode=mode, loss=loss, train_op=train_op)

  config = config_class(model_dir=model_dir, save_checkpoints_steps=save_steps,
                        save_checkpoints_secs=None,
                        save_summary_steps=summaries,
                        log_step_count_steps=summaries, keep_checkpoint_max=1)
  estimator = estimator_class(
      model_fn=model_fn, config=config, use_tpu=False,
      train_batch_size=BATCH, eval_batch_size=BATCH,
      predict_batch_size=BATCH, embedding_config_spec=spec,
      export_to_tpu=False)
  return tf, estimator, column


def _train(args, watch):
  steps = args.steps
  ids, labels = _data(args.rows, steps)
  tf, estimator, _ = _build(args.side, args.rows, args.model_dir,
                            save_steps=10**9, optimizer=args.optimizer,
                            summaries=args.summaries_every)
  times = {"steps": [], "saves": []}

  class Hook(tf.compat.v1.train.SessionRunHook):

    def begin(self):
      times["begin"] = time.perf_counter()
      watch.phase = "session (variables initialized, step-0 checkpoint)"

    def after_create_session(self, session, coord):
      times["session"] = time.perf_counter()

    def before_run(self, run_context):
      times.setdefault("first_run", time.perf_counter())
      watch.phase = "steps"

    def after_run(self, run_context, run_values):
      times["steps"].append(time.perf_counter())

  class Listener(tf.compat.v1.train.CheckpointSaverListener):

    def before_save(self, session, global_step_value):
      times["save_start"] = time.perf_counter()
      watch.phase = f"checkpoint at step {global_step_value}"

    def after_save(self, session, global_step_value):
      times["saves"].append(
          (int(global_step_value), time.perf_counter() - times["save_start"]))

  watch.phase = "graph"
  start = time.perf_counter()
  estimator.train(_input_fn(tf, ids, labels), max_steps=steps, hooks=[Hook()],
                  saving_listeners=[Listener()])
  end = time.perf_counter()
  step_times = np.diff(np.array(times["steps"]))
  steady = step_times[args.warmup:] if len(step_times) > args.warmup else (
      step_times)
  saves = times["saves"]
  first_save = saves[0][1] if saves and saves[0][0] == 0 else 0.0
  return {
      "first_step_s": times["steps"][0] - start,
      "phases": {
          "graph": times["begin"] - start,
          "session": times["session"] - times["begin"] - first_save,
          "step0_save": first_save,
          "first_step": times["steps"][0] - times["first_run"],
      },
      "step_ms": float(np.median(steady)) * 1e3 if len(steady) else None,
      "save_s": saves[-1][1] if saves else None,
      "train_s": end - start,
      "steps": len(times["steps"]),
  }


def _evaluate(args, watch):
  ids, labels = _data(args.rows, 4)
  tf, estimator, _ = _build(args.side, args.rows, args.model_dir, None,
                               args.optimizer)
  watch.phase = "evaluate"
  start = time.perf_counter()
  estimator.evaluate(_input_fn(tf, ids, labels), steps=4)
  return {"seconds": time.perf_counter() - start}


def _predict(args, watch):
  ids, labels = _data(args.rows, 4)
  tf, estimator, _ = _build(args.side, args.rows, args.model_dir, None,
                               args.optimizer)
  watch.phase = "predict"
  start = time.perf_counter()
  count = 0
  for _ in estimator.predict(_input_fn(tf, ids, labels),
                             yield_single_examples=False):
    count += 1
    if count == 4:
      break
  return {"seconds": time.perf_counter() - start}


def _export(args, watch):
  tf, estimator, column = _build(args.side, args.rows, args.model_dir, None,
                               args.optimizer)
  watch.phase = "export"
  spec = tf.feature_column.make_parse_example_spec([column])
  serving = tf.estimator.export.build_parsing_serving_input_receiver_fn(spec)
  start = time.perf_counter()
  path = estimator.export_saved_model(os.path.join(args.model_dir, "export"),
                                      serving)
  path = path.decode() if isinstance(path, bytes) else path
  return {"seconds": time.perf_counter() - start, "path": path}


def _load_saved_model(args, watch):
  import tensorflow as tf
  watch.phase = "tf.saved_model.load"
  start = time.perf_counter()
  loaded = tf.saved_model.load(args.model_dir)
  signature = loaded.signatures["serving_default"]
  example = tf.train.Example(features=tf.train.Features(feature={
      "ids": tf.train.Feature(int64_list=tf.train.Int64List(value=[1, 2]))}))
  outputs = signature(examples=tf.constant([example.SerializeToString()]))
  return {"seconds": time.perf_counter() - start,
          "library_imported": "estimator_spec" in sys.modules,
          "outputs": sorted(outputs)}


CHILD_MODES = {"train": _train, "evaluate": _evaluate, "predict": _predict,
               "export": _export, "load": _load_saved_model}


def child_main(args):
  started = time.perf_counter()
  watch = RssWatch(args.rss_limit_mb, args.mode, started)
  if args.mode != "load":
    from estimator_spec import quiet
    quiet.silence_deprecation_notices()
  result = CHILD_MODES[args.mode](args, watch)
  result["peak_rss_mb"] = _status_mb("VmHWM")
  result["phase_peaks_mb"] = dict(watch.peaks)
  print(MARK + json.dumps(result), flush=True)


# --- the parent --------------------------------------------------------------


def _python():
  return sys.executable


def run_child(args, side, rows, mode, model_dir, timeout):
  command = [_python(), "-m", "bench.scale_bench", "--child", "--side", side,
             "--mode", mode, "--rows", str(rows), "--model-dir", model_dir,
             "--steps", str(args.steps), "--warmup", str(args.warmup),
             "--optimizer", args.optimizer,
             "--rss-limit-gb", str(args.rss_limit_gb)]
  if args.summaries_every:
    command += ["--summaries-every", str(args.summaries_every)]
  try:
    return compare.run_measured(command, timeout)
  except compare.SideFailed as error:
    return {"failed": str(error).splitlines()[-1][:300]}


def run_command(args, command, timeout):
  """A checkpoint command (`python -m estimator_spec ...`) timed, with its
  peak RSS (the child's ru_maxrss, from GNU time's format when present)."""
  wrapped = [_python(), "-c", _COMMAND_WRAPPER, json.dumps(command)]
  try:
    return compare.run_measured(wrapped, timeout)
  except compare.SideFailed as error:
    return {"failed": str(error).splitlines()[-1][:300]}


# Runs `python -m estimator_spec ARGS...` as a child, then prints its
# seconds and peak RSS (ru_maxrss of the finished child) as a result line.
_COMMAND_WRAPPER = """
import json, resource, subprocess, sys, time
command = json.loads(sys.argv[1])
start = time.perf_counter()
done = subprocess.run(command, capture_output=True, text=True)
seconds = time.perf_counter() - start
if done.returncode:
  sys.stderr.write(done.stderr[-3000:])
  sys.exit(done.returncode)
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0
print("%s" + json.dumps({"seconds": seconds, "peak_rss_mb": peak}))
""" % MARK


SPEC_MODULE = """
import estimator_spec
import tensorflow as tf
import tpu_embedding_columns


def build_spec(rows=%d):
  column = tpu_embedding_columns.embedding_column(
      tf.feature_column.categorical_column_with_identity("ids", rows),
      dimension=%d, combiner="sum")
  return estimator_spec.EmbeddingConfigSpec(
      feature_columns=[column],
      optimization_parameters=estimator_spec.AdagradParameters(
          learning_rate=0.05, initial_accumulator=0.1))
"""


def commands(args, rows, model_dir, workdir, timeout):
  spec_path = os.path.join(workdir, "scale_spec.py")
  with open(spec_path, "w", encoding="utf-8") as spec_file:
    spec_file.write(SPEC_MODULE % (rows, DIMENSION))
  spec = f"{spec_path}:build_spec"
  base = [_python(), "-m", "estimator_spec"]
  out = os.path.join(workdir, "out")
  jobs = {
      "convert": base + ["convert", spec, "--model-dir", model_dir,
                         "--output", os.path.join(out, "mod4", "model.ckpt"),
                         "--to-strategy", "mod", "--to-shards", "4"],
      "export-mid-level": base + ["export-mid-level", spec, "--model-dir",
                                  model_dir, "--output",
                                  os.path.join(out, "mid", "embedding")],
      "rows": base + ["rows", spec, "--model-dir", model_dir, "--table",
                      TABLE_NAME,
                      "--ids", "0-7"],
  }
  results = {}
  for name, command in jobs.items():
    results[name] = run_command(args, command, timeout)
    shutil.rmtree(out, ignore_errors=True)
  return results


def measure_disk(gigabytes, directory):
  """(write GB/s with fsync, read GB/s) of a file of `gigabytes` in
  `directory`; the read after asking the kernel to drop the file's pages
  (posix_fadvise DONTNEED), so it comes from the disk where that works."""
  if gigabytes <= 0:
    return None
  path = os.path.join(directory, "disk_probe")
  block = np.random.RandomState(0).bytes(64 * 2**20)
  total = int(gigabytes * 2**30)
  start = time.perf_counter()
  with open(path, "wb") as probe:
    written = 0
    while written < total:
      probe.write(block)
      written += len(block)
    probe.flush()
    os.fsync(probe.fileno())
  write_s = time.perf_counter() - start
  with open(path, "rb") as probe:
    os.posix_fadvise(probe.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    start = time.perf_counter()
    while probe.read(64 * 2**20):
      pass
    read_s = time.perf_counter() - start
  os.remove(path)
  return {"write_gb_s": written / 2**30 / write_s,
          "read_gb_s": written / 2**30 / read_s}


def run_size(args, rows, workdir):
  """{side: {mode: result}} for one table size, sides alternating."""
  results = {side: {} for side in args.sides}
  timeout = args.timeout
  for round_index in range(args.rounds):
    for side in args.sides:
      model_dir = os.path.join(workdir, f"{side}_{rows}_{round_index}")
      shutil.rmtree(model_dir, ignore_errors=True)
      train = run_child(args, side, rows, "train", model_dir, timeout)
      results[side].setdefault("train", []).append(train)
      _progress(rows, side, "train", train)
      trained = "failed" not in train and "stopped" not in train
      if round_index == args.rounds - 1 and trained:
        _other_modes(args, side, rows, model_dir, workdir, results[side])
      shutil.rmtree(model_dir, ignore_errors=True)
  return results


def _other_modes(args, side, rows, model_dir, workdir, results):
  for mode in ("evaluate", "predict", "export"):
    if mode not in args.modes:
      continue
    result = run_child(args, side, rows, mode, model_dir, args.timeout)
    results[mode] = result
    _progress(rows, side, mode, result)
    if mode == "export" and "path" in result:
      loaded = run_child(args, "tf", rows, "load", result["path"],
                         args.timeout)
      results["load"] = loaded
      _progress(rows, side, "load", loaded)
  if "commands" in args.modes and side == "ours":
    for name, result in commands(args, rows, model_dir, workdir,
                                 args.timeout).items():
      results[name] = result
      _progress(rows, side, name, result)


def _progress(rows, side, mode, result):
  print(f"  {rows_label(rows)} {side} {mode}: "
        + json.dumps({k: (round(v, 3) if isinstance(v, float) else v)
                      for k, v in result.items()}), flush=True)


def _gb(mb):
  return "-" if mb is None else f"{mb / 1024:.2f}"


def _cell(values, fmt):
  return " / ".join("-" if v is None else fmt(v) for v in values)


def _train_summary(run):
  """The median over a side's train rounds of each figure; None when a
  round stopped or failed."""
  good = [r for r in run if "failed" not in r and "stopped" not in r]
  if len(good) != len(run) or not good:
    return None

  def median(key):
    values = [r[key] for r in good if r.get(key) is not None]
    return float(np.median(values)) if values else None

  return {"first_step_s": median("first_step_s"), "step_ms": median("step_ms"),
          "save_s": median("save_s"),
          "peak_rss_mb": max(r["peak_rss_mb"] for r in good),
          "others_cpus": max(r.get("others_cpus") or 0.0 for r in good)}


def print_table(args, all_results, disk):
  sides = args.sides
  print()
  print(f"Train, {args.steps} steps (median over {args.rounds} round(s)); "
        f"{' / '.join(sides)}:")
  print("| rows | state | first step (s) | step (ms) | final save (s) | "
        "peak RSS (GB) | peak / state |")
  print("| --- | --- | --- | --- | --- | --- | --- |")
  busy = 0.0
  for rows, results in all_results.items():
    state_gb = state_bytes(rows, args.optimizer) / 2**30
    summaries = [_train_summary(results[s].get("train", [])) for s in sides]
    cells = []
    for key, fmt in (("first_step_s", lambda v: f"{v:.1f}"),
                     ("step_ms", lambda v: f"{v:.1f}"),
                     ("save_s", lambda v: f"{v:.1f}"),
                     ("peak_rss_mb", lambda v: f"{v / 1024:.2f}")):
      cells.append(_cell([s[key] if s else None for s in summaries], fmt))
    ratio = _cell([s["peak_rss_mb"] / 1024 / state_gb if s else None
                   for s in summaries], lambda v: f"{v:.2f}")
    print(f"| {rows_label(rows)} | {state_gb:.2f} GB | " + " | ".join(cells)
          + f" | {ratio} |")
    for side in sides:
      for run in results[side].get("train", []):
        busy = max(busy, run.get("others_cpus") or 0.0)
        if "stopped" in run or "failed" in run:
          print(f"|   {side}: {run.get('stopped') or run.get('failed')} |")
  _print_phases(args, all_results)
  _print_modes(args, all_results)
  if disk:
    print(f"\nDisk: write {disk['write_gb_s']:.2f} GB/s (fsync'ed), read "
          f"{disk['read_gb_s']:.2f} GB/s.")
  print(f"\nIdle check: other work kept at most {busy:.2f} CPUs busy during "
        "a run" + (" -- NOT an idle machine." if busy > BUSY else "."))


def _print_phases(args, all_results):
  print("\nFirst step's phases (s, first round): graph / session (variables "
        "initialized) / step-0 checkpoint / the step itself")
  for rows, results in all_results.items():
    for side in args.sides:
      runs = results[side].get("train", [])
      if runs and "phases" in runs[0]:
        p = runs[0]["phases"]
        print(f"  {rows_label(rows):>5} {side:>4}: {p['graph']:.1f} / "
              f"{p['session']:.1f} / {p['step0_save']:.1f} / "
              f"{p['first_step']:.2f}")


def _print_modes(args, all_results):
  names = [m for m in ("evaluate", "predict", "export", "load", "convert",
                       "export-mid-level", "rows")
           if any(m in r[s] for r in all_results.values() for s in args.sides)]
  if not names:
    return
  print("\nOther modes: seconds, peak RSS GB (peak / state)")
  for rows, results in all_results.items():
    state_gb = state_bytes(rows, args.optimizer) / 2**30
    for side in args.sides:
      parts = []
      for name in names:
        result = results[side].get(name)
        if result is None:
          continue
        if "failed" in result or "stopped" in result:
          parts.append(f"{name} {result.get('stopped') or result['failed']}")
          continue
        rss = result.get("peak_rss_mb") or 0.0
        parts.append(f"{name} {result['seconds']:.1f} s, {rss / 1024:.2f} GB "
                     f"({rss / 1024 / state_gb:.2f}x)")
      if parts:
        print(f"  {rows_label(rows):>5} {side:>4}: " + "; ".join(parts))


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rows", nargs="+", default=["1M", "8M", "32M"])
  parser.add_argument("--sides", nargs="+", choices=SIDES,
                      default=list(SIDES))
  parser.add_argument("--modes", nargs="+", choices=MODES, default=["train"])
  parser.add_argument("--steps", type=int, default=30)
  parser.add_argument("--optimizer", choices=sorted(OPTIMIZERS),
                      default="adagrad")
  parser.add_argument("--summaries-every", type=int, default=None,
                      help="train with summaries and step logging every N "
                      "steps (RunConfig's default is 100; default: off)")
  parser.add_argument("--warmup", type=int, default=5)
  parser.add_argument("--rounds", type=int, default=1)
  parser.add_argument("--timeout", type=float, default=1800.0)
  memory_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
  parser.add_argument("--rss-limit-gb", type=float,
                      default=round(memory_gb - 1.5, 1))
  parser.add_argument("--disk-gb", type=float, default=2.0)
  parser.add_argument("--workdir", default=None)
  parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
  parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)
  parser.add_argument("--mode", choices=tuple(CHILD_MODES),
                      help=argparse.SUPPRESS)
  parser.add_argument("--model-dir", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  args.rss_limit_mb = args.rss_limit_gb * 1024
  if args.child:
    args.rows = parse_rows(args.rows[0])
    return child_main(args)
  sizes = [parse_rows(r) for r in args.rows]
  workdir = tempfile.mkdtemp(prefix="scale_bench_", dir=args.workdir)
  try:
    disk = measure_disk(args.disk_gb, workdir)
    all_results = {}
    for rows in sizes:
      print(f"{rows_label(rows)} rows x {DIMENSION} "
            f"(state {state_bytes(rows, args.optimizer) / 2**30:.2f} GB):",
            flush=True)
      all_results[rows] = run_size(args, rows, workdir)
    print_table(args, all_results, disk)
  finally:
    shutil.rmtree(workdir, ignore_errors=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
