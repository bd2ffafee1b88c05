"""Two TPUEstimator programs, run on either stack by tests/test_two_stacks.py.

`python -m tests.two_stacks REQUEST.json RESULT.json` runs the request's
actions in order, in this process, on whatever TensorFlow it has (TF 2.15
with tensorflow-estimator in .venv, TF 2.21 with tf_keras and
TF_USE_LEGACY_KERAS=1 in .venv-tf2), and writes what each gave as JSON.

The programs take every TPU and Estimator name from `estimator_spec` (what
`migrate` writes), so the same file runs on both stacks:

* `dlrm`: the example model (examples/dlrm.py: 26 features in 24 tables,
  sequence and weighted columns, Adagrad with clipping and a learning-rate
  function, `mod` layout over 16 shards, Adam on the dense layers) on
  generated click logs, served through a parsing receiver.
* `tpu_style`: written the way public TPU programs are: tf.Examples read
  from TFRecord files and parsed with `parse_example` (VarLenFeature ids),
  an `input_fn(params)` that shards the files by `params['context']`,
  `use_tpu=True` with `PER_HOST_V2` on 8 emulated cores, shared columns
  with a sequence column, `host_call` writing `tf.compat.v2.summary`
  scalars (`all_v2_summary_ops`), `scaffold_fn` initializing the top layer
  from another checkpoint (`init_from_checkpoint`), `eval_metrics`, a
  `CrossShardOptimizer` around Adam.

The "serve" action loads a SavedModel with TensorFlow alone and runs it
before anything imports this library, and reports whether it got imported.
"""
import collections
import glob
import hashlib
import json
import os
import sys

import numpy as np

Program = collections.namedtuple(
    "Program", ["estimator", "train_input_fn", "eval_input_fn",
                "predict_input_fn", "serving_input_receiver_fn",
                "serving_examples", "digest"])

DLRM_SCALE = 0.02
TPU_STYLE_KEYS = ("user", "item", "history")

# --- data --------------------------------------------------------------------


def write_records(directory, files=2, per_file=64, seed=3):
  """The TFRecord files of tf.Examples `tpu_style` reads (written once by
  the test, read by both stacks)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  rng = np.random.RandomState(seed)
  os.makedirs(directory, exist_ok=True)
  for index in range(files):
    path = os.path.join(directory, f"train-{index:02d}.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
      for _ in range(per_file):
        user, item = int(rng.randint(0, 40)), int(rng.randint(0, 60))
        history = [int(i) for i in rng.randint(0, 60, rng.randint(0, 5))]
        label = float((user + 2 * item) % 3 == 0)
        writer.write(_example({"user": [user], "item": [item],
                               "history": history, "label": [label]}))


def _example(values):
  """A serialized tf.Example of {name: list of ints, floats or bytes}."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  feature = {}
  for name, row in values.items():
    if row and isinstance(row[0], bytes):
      feature[name] = tf.train.Feature(
          bytes_list=tf.train.BytesList(value=row))
    elif row and isinstance(row[0], float):
      feature[name] = tf.train.Feature(
          float_list=tf.train.FloatList(value=row))
    else:
      feature[name] = tf.train.Feature(
          int64_list=tf.train.Int64List(value=row))
  return tf.train.Example(features=tf.train.Features(
      feature=feature)).SerializeToString()


def _dlrm_examples(features, count):
  """Serialized tf.Examples of the first `count` rows of click logs (ids
  without their -1 padding, weights of the present ids only)."""
  examples = []
  for row in range(count):
    values = {}
    for name, array in features.items():
      cells = np.asarray(array)[row].reshape(-1)
      if cells.dtype == object:
        values[name] = [v.encode() for v in cells if v]
      elif np.issubdtype(cells.dtype, np.integer):
        values[name] = [int(v) for v in cells if v >= 0]
      else:
        ids = features.get(name.replace("_term_weights", "_terms"))
        if name.endswith("_term_weights") and ids is not None:
          cells = cells[np.asarray(ids)[row].reshape(-1) >= 0]
        values[name] = [float(v) for v in cells]
    examples.append(_example(values))
  return examples


def _digest(arrays):
  """A digest of generated arrays: equal on both stacks when the data is."""
  digest = hashlib.sha256()
  for key in sorted(arrays):
    digest.update(key.encode())
    digest.update(np.asarray(arrays[key]).astype(str).tobytes())
  return digest.hexdigest()


# --- the programs ------------------------------------------------------------


def dlrm_program(model_dir, data_dir=None, init_checkpoint=None):
  del data_dir, init_checkpoint
  import estimator_spec  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from examples import ctr_data  # pylint: disable=g-import-not-at-top
  from examples import dlrm  # pylint: disable=g-import-not-at-top
  train_x, train_y = ctr_data.generate(512, DLRM_SCALE, seed=0)
  eval_x, eval_y = ctr_data.generate(128, DLRM_SCALE, seed=1)
  columns, numeric = dlrm.build_columns(DLRM_SCALE)
  estimator = estimator_spec.TPUEstimator(
      model_fn=dlrm.model_fn_for(columns, numeric),
      config=estimator_spec.RunConfig(
          model_dir=model_dir, tf_random_seed=11, save_checkpoints_steps=100,
          tpu_config=estimator_spec.TPUConfig(num_shards=16)),
      use_tpu=False, train_batch_size=64, eval_batch_size=64,
      predict_batch_size=16,
      embedding_config_spec=dlrm.build_spec(DLRM_SCALE,
                                            partition_strategy="mod"))
  export = estimator_spec.estimator.export
  serving = export.build_parsing_serving_input_receiver_fn(
      tf.compat.v1.feature_column.make_parse_example_spec(columns + numeric))
  head = {k: v[:16] for k, v in eval_x.items()}
  return Program(
      estimator, dlrm.input_fn_for(train_x, train_y, shuffle=False),
      dlrm.input_fn_for(eval_x, eval_y, shuffle=False, repeat=False),
      dlrm.input_fn_for(head, eval_y[:16], shuffle=False, repeat=False),
      serving, _dlrm_examples(eval_x, 16),
      _digest(dict(train_x, labels=train_y)))


def _tpu_style_columns():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tpu_embedding_columns  # pylint: disable=g-import-not-at-top
  fc = tf.feature_column
  user = tpu_embedding_columns.embedding_column(
      fc.categorical_column_with_identity("user", 40), dimension=4)
  item, history = tpu_embedding_columns.shared_embedding_columns(
      [fc.categorical_column_with_identity("item", 60),
       fc.sequence_categorical_column_with_identity("history", 60)],
      dimension=4, max_sequence_lengths=[0, 4])
  return user, item, history


def _parse(serialized):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  spec = {key: tf.io.VarLenFeature(tf.int64) for key in TPU_STYLE_KEYS}
  spec["label"] = tf.io.FixedLenFeature([1], tf.float32)
  features = tf.io.parse_example(serialized, spec)
  return features, features.pop("label")


def _tpu_style_input_fn(data_dir, repeat=True):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  def input_fn(params):
    files = sorted(glob.glob(os.path.join(data_dir, "train-*.tfrecord")))
    context = params.get("context")
    if context is not None:  # this host's share of the files
      _, host, hosts, _ = context.current_input_fn_deployment()
      files = files[host::hosts]
    dataset = tf.data.Dataset.from_tensor_slices(files).interleave(
        tf.data.TFRecordDataset, cycle_length=1)
    if repeat:
      dataset = dataset.repeat()
    dataset = dataset.batch(params["batch_size"], drop_remainder=True)
    return dataset.map(_parse)

  return input_fn


def _tpu_style_model_fn(columns):
  import estimator_spec  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  user, item, history = columns
  mode_keys = estimator_spec.estimator.ModeKeys

  def model_fn(features, labels, mode, params):
    flat = tf.compat.v1.keras.layers.DenseFeatures([user, item])(features)
    sequence, lengths = tf.keras.experimental.SequenceFeatures([history])(
        features)
    pooled = tf.reduce_sum(sequence, 1) / tf.maximum(
        tf.cast(lengths, tf.float32), 1.0)[:, None]
    hidden = tf.compat.v1.layers.dense(tf.concat([flat, pooled], 1), 8,
                                       tf.nn.relu, name="hidden")
    logits = tf.compat.v1.layers.dense(hidden, 1, name="top")
    if mode == mode_keys.PREDICT:
      return estimator_spec.TPUEstimatorSpec(
          mode, predictions={"probability": tf.sigmoid(logits)})
    loss = tf.compat.v1.losses.sigmoid_cross_entropy(labels, logits)
    optimizer = tf.compat.v1.tpu.CrossShardOptimizer(
        tf.compat.v1.train.AdamOptimizer(0.01))
    step = tf.compat.v1.train.get_global_step()
    train_op = optimizer.minimize(loss, step)
    return estimator_spec.TPUEstimatorSpec(
        mode, loss=loss, train_op=train_op,
        eval_metrics=(_metric_fn, [labels, logits]),
        host_call=(_host_call_fn(params["model_dir"]),
                   [tf.reshape(step, [1]), tf.reshape(loss, [1])]),
        scaffold_fn=_scaffold_fn(params.get("init_checkpoint")))

  return model_fn


def _metric_fn(labels, logits):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return {"auc": tf.compat.v1.metrics.auc(labels, tf.sigmoid(logits)),
          "mean_label": tf.compat.v1.metrics.mean(labels)}


def _host_call_fn(model_dir):
  def host_call_fn(global_step, loss):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    summary = tf.compat.v2.summary
    writer = summary.create_file_writer(os.path.join(model_dir, "host"))
    with writer.as_default(), summary.record_if(True):
      summary.scalar("host_loss", loss[0], step=global_step[0])
      return tf.compat.v1.summary.all_v2_summary_ops()
  return host_call_fn


def _scaffold_fn(init_checkpoint):
  if not init_checkpoint:
    return None

  def scaffold_fn():
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    tf.compat.v1.train.init_from_checkpoint(init_checkpoint, {"top/": "top/"})
    return tf.compat.v1.train.Scaffold()
  return scaffold_fn


def tpu_style_program(model_dir, data_dir=None, init_checkpoint=None):
  import estimator_spec  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  columns = _tpu_style_columns()
  config = estimator_spec.RunConfig(
      model_dir=model_dir, tf_random_seed=5, save_checkpoints_steps=100,
      tpu_config=estimator_spec.TPUConfig(
          num_shards=8, iterations_per_loop=4,
          per_host_input_for_training=(
              estimator_spec.InputPipelineConfig.PER_HOST_V2)))
  estimator = estimator_spec.TPUEstimator(
      model_fn=_tpu_style_model_fn(columns), config=config, use_tpu=True,
      train_batch_size=32, eval_batch_size=32, predict_batch_size=8,
      params={"model_dir": model_dir, "init_checkpoint": init_checkpoint},
      embedding_config_spec=estimator_spec.EmbeddingConfigSpec(
          feature_columns=list(columns),
          optimization_parameters=estimator_spec.AdagradParameters(0.1)))
  spec = {key: tf.io.VarLenFeature(tf.int64) for key in TPU_STYLE_KEYS}
  export = estimator_spec.estimator.export
  serving = export.build_parsing_serving_input_receiver_fn(spec)
  records = sorted(glob.glob(os.path.join(data_dir, "train-*.tfrecord")))
  examples = tf.data.TFRecordDataset(records[:1]).take(8)
  return Program(estimator, _tpu_style_input_fn(data_dir),
                 _tpu_style_input_fn(data_dir, repeat=False),
                 _tpu_style_input_fn(data_dir, repeat=False), serving,
                 [bytes(e) for e in examples.as_numpy_iterator()],
                 _digest({"files": [os.path.basename(r) for r in records]}))


PROGRAMS = {"dlrm": dlrm_program, "tpu_style": tpu_style_program}

# --- actions -----------------------------------------------------------------


def _program(action):
  return PROGRAMS[action["program"]](
      action["model_dir"], data_dir=action.get("data_dir"),
      init_checkpoint=action.get("init_checkpoint"))


def _train(action):
  program = _program(action)
  program.estimator.train(program.train_input_fn, steps=action["steps"])
  return {"step": int(program.estimator.get_variable_value("global_step")),
          "digest": program.digest}


def _variables(action):
  """Every variable of a checkpoint, saved to an .npz file (names with '/'
  written as '|')."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  path = action.get("checkpoint") or tf.train.latest_checkpoint(
      action["model_dir"])
  reader = tf.train.load_checkpoint(path)
  values = {name.replace("/", "|"): reader.get_tensor(name)
            for name in reader.get_variable_to_shape_map()}
  np.savez(action["out"], **values)
  return {"checkpoint": path, "count": len(values)}


def _evaluate(action):
  program = _program(action)
  metrics = program.estimator.evaluate(
      program.eval_input_fn, steps=action.get("steps"),
      checkpoint_path=action.get("checkpoint_path"), name=action.get("name"))
  return {key: float(value) for key, value in metrics.items()}


def _predict(action):
  program = _program(action)
  predictions = program.estimator.predict(program.predict_input_fn)
  return [{key: np.asarray(value).tolist() for key, value in p.items()}
          for _, p in zip(range(action.get("count", 16)), predictions)]


def _export(action):
  program = _program(action)
  path = program.estimator.export_saved_model(
      os.path.join(action["model_dir"], "export"),
      program.serving_input_receiver_fn)
  with open(action["examples_out"], "w", encoding="utf-8") as out:
    json.dump([e.hex() for e in program.serving_examples], out)
  return {"export_dir": path.decode()}


def _serve(action):
  """Runs the SavedModel's default signature on the examples with
  TensorFlow alone; says whether this library got imported meanwhile."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  with open(action["examples"], encoding="utf-8") as examples:
    serialized = [bytes.fromhex(e) for e in json.load(examples)]
  with tf.Graph().as_default(), tf.compat.v1.Session() as session:
    meta_graph = tf.compat.v1.saved_model.load(
        session, [tf.saved_model.SERVING], action["export_dir"])
    signature = meta_graph.signature_def["serving_default"]
    outputs = {key: value.name for key, value in signature.outputs.items()}
    values = session.run(outputs, {
        signature.inputs["examples"].name: serialized})
  return {"outputs": {k: np.asarray(v).tolist() for k, v in values.items()},
          "library_imported": any(name.split(".")[0] in (
              "estimator_spec", "tpu_embedding_columns")
                                  for name in sys.modules)}


def _events(action):
  """{tag: [steps]} of the scalar summaries in a directory's events."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  found = {}
  for path in sorted(glob.glob(os.path.join(action["dir"], "events.out*"))):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        found.setdefault(value.tag, []).append(int(event.step))
  return {tag: sorted(steps) for tag, steps in found.items()}


ACTIONS = {"train": _train, "variables": _variables, "evaluate": _evaluate,
           "predict": _predict, "export": _export, "serve": _serve,
           "events": _events}


def main(argv):
  request_path, result_path = argv[1], argv[2]
  with open(request_path, encoding="utf-8") as request:
    actions = json.load(request)["actions"]
  results = []
  try:
    for action in actions:
      results.append(ACTIONS[action["do"]](action))
  finally:
    with open(result_path, "w", encoding="utf-8") as out:
      json.dump({"results": results}, out)


if __name__ == "__main__":
  main(sys.argv)
