"""Where each name of TF's TPU embedding and TPUEstimator APIs, and of the
`tf.estimator` names a TPUEstimator program uses beside them, lives here.

One table (`NAMES`), plain data: `tests/test_tf_names.py` walks TF 2.15's
namespaces against it, `python -m estimator_spec migrate` rewrites programs
by it, and docs/migration.md's table is generated from it
(`markdown_table()`).

A row's `tf` is the name as written under `tensorflow.compat.v1` (TF 1.x's
`tensorflow`; for the few `tf.estimator.experimental` names only TF2's
`tensorflow` has, under that), e.g. `tpu.experimental.embedding_column`, or
in full for the names outside those (`LEGACY`, `PRIVATE`); its `kind` says
what a program that uses it gets here:

* `ours`: this library's own implementation, at `ours`;
* `framework`: the Estimator framework's object, at `ours`: on TF 2.15
  tensorflow-estimator's own (the library stands on it there), on current
  TF (no tensorflow-estimator) this library's (`estimator/framework/`);
* `tf`: stays TF's (it works unchanged with this library); `migrate` keeps
  it (`ours` None) or moves it to where TF keeps it (`ours`);
* `refused`: no counterpart here; `note` says what to do instead;
* `tpu-only`: TF's own, which needs a TPU (a resolver, a strategy,
  `rewrite`, the TPU system calls): `migrate` keeps it (or moves it to
  where TF keeps it, `ours`) and reports it, `note` saying what a host run
  does instead.

`ALIASES` are the other spellings of those names that programs use (TF 1.x's
`tf.contrib.tpu` and `tensorflow.python.estimator`, the modules behind the
public names, the `tensorflow_estimator` package); `MODULES` are the TF
modules that have a counterpart module of ours, so that an alias of the
whole module can become an alias of ours.
"""
import collections

from estimator_spec import tf1_names

OURS = "ours"
FRAMEWORK = "framework"
TF = "tf"
REFUSED = "refused"
TPU_ONLY = "tpu-only"
KINDS = (OURS, FRAMEWORK, TF, REFUSED, TPU_ONLY)
OUR_KINDS = (OURS, FRAMEWORK)  # the kinds `migrate` rewrites to `ours`

Name = collections.namedtuple("Name", ["tf", "ours", "kind", "note"])

_TPU_SYSTEM = ("a TPU system call: a host run has no TPU to set up, so "
               "leave it out of the host program; a TPU run keeps TF's "
               "(estimator_spec.TPUEstimator hands use_tpu=True runs with a "
               "TPU `master` to TF's own TPUEstimator)")
_TPU_COMPUTATION = ("compiles a computation for the TPU's cores; on a host "
                    "call the computation itself (TPUEstimator's model_fn "
                    "needs neither: estimator_spec.TPUEstimator runs it)")
_TPU_RESOLVER = ("finds a Cloud TPU by asking the TPU's service, so on a "
                 "host it fails (a network error); leave it out there: "
                 "give RunConfig no `cluster` or `master`, and "
                 "estimator_spec.TPUEstimator emulates the TPU "
                 "(docs/migration.md, 'TPU-only calls')")
_TPU_STRATEGY = ("a TPU distribution strategy needs a TPU; on a host leave "
                 "it out (TF's default strategy) and use "
                 "estimator_spec.HostTPUEmbedding for the embedding "
                 "(docs/mid_level.md)")
_TPU_TOPOLOGY = ("describes a TPU's cores; a host run has none (it emulates "
                 "the topology `TPUConfig.num_shards` gives); keep TF's for "
                 "a TPU run")
_MID_LEVEL_CONFIG = ("TF's own configuration object: estimator_spec."
                     "HostTPUEmbedding takes it unchanged")

TPU_NAMES = (
    # tf.compat.v1.tpu.experimental: the columns and their optimizers.
    Name("tpu.experimental.embedding_column",
         "tpu_embedding_columns.embedding_column", OURS, ""),
    Name("tpu.experimental.shared_embedding_columns",
         "tpu_embedding_columns.shared_embedding_columns", OURS, ""),
    Name("tpu.experimental.AdagradParameters",
         "tpu_embedding_columns.AdagradParameters", OURS,
         "also estimator_spec.AdagradParameters"),
    Name("tpu.experimental.AdamParameters",
         "tpu_embedding_columns.AdamParameters", OURS,
         "also estimator_spec.AdamParameters"),
    Name("tpu.experimental.FtrlParameters",
         "tpu_embedding_columns.FtrlParameters", OURS,
         "also estimator_spec.FtrlParameters"),
    Name("tpu.experimental.StochasticGradientDescentParameters",
         "tpu_embedding_columns.StochasticGradientDescentParameters", OURS,
         "also estimator_spec.StochasticGradientDescentParameters"),
    Name("tpu.experimental.initialize_tpu_system", None, TPU_ONLY,
         _TPU_SYSTEM),
    Name("tpu.experimental.shutdown_tpu_system", None, TPU_ONLY,
         _TPU_SYSTEM),
    Name("tpu.experimental.DeviceAssignment", None, TPU_ONLY, _TPU_TOPOLOGY),
    Name("tpu.experimental.DeviceOrderMode", None, TPU_ONLY, _TPU_TOPOLOGY),
    Name("tpu.experimental.Topology", None, TPU_ONLY, _TPU_TOPOLOGY),
    Name("tpu.experimental.TPUSystemMetadata", None, TPU_ONLY,
         _TPU_TOPOLOGY),
    Name("tpu.experimental.HardwareFeature", None, TPU_ONLY, _TPU_TOPOLOGY),
    # tf.tpu.experimental.embedding: TF2's mid-level API.
    Name("tpu.experimental.embedding.TPUEmbedding",
         "estimator_spec.HostTPUEmbedding", OURS,
         "the same arguments and methods, trained on the host"),
    Name("tpu.experimental.embedding.TPUEmbeddingV0",
         "estimator_spec.HostTPUEmbedding", OURS,
         "called directly, its lookups are differentiable with respect to "
         "`embedding_tables` (docs/mid_level.md, 'TPUEmbeddingV0')"),
    Name("tpu.experimental.embedding.TPUEmbeddingForServing",
         None, TF,
         "TF's own class already runs off the TPU"),
    Name("tpu.experimental.embedding.serving_embedding_lookup",
         None, TF,
         "TF's own function already runs off the TPU"),
    Name("tpu.experimental.embedding.TableConfig",
         None, TF, _MID_LEVEL_CONFIG),
    Name("tpu.experimental.embedding.FeatureConfig",
         None, TF, _MID_LEVEL_CONFIG),
    Name("tpu.experimental.embedding.SGD",
         None, TF, _MID_LEVEL_CONFIG),
    Name("tpu.experimental.embedding.Adagrad",
         None, TF, _MID_LEVEL_CONFIG),
    Name("tpu.experimental.embedding.AdagradMomentum",
         None, TF, _MID_LEVEL_CONFIG),
    Name("tpu.experimental.embedding.Adam",
         None, TF, _MID_LEVEL_CONFIG),
    Name("tpu.experimental.embedding.FTRL",
         None, TF, _MID_LEVEL_CONFIG),
    Name("tpu.experimental.embedding.QuantizationConfig", None, REFUSED,
         "quantized TPU lookups: HostTPUEmbedding refuses a TableConfig "
         "with a quantization_config; leave it out for a host run"),
    # tf.compat.v1.estimator.tpu and its experimental module.
    Name("estimator.tpu.TPUEstimator", "estimator_spec.TPUEstimator", OURS,
         ""),
    Name("estimator.tpu.TPUEstimatorSpec", "estimator_spec.TPUEstimatorSpec",
         OURS, ""),
    Name("estimator.tpu.RunConfig", "estimator_spec.RunConfig", FRAMEWORK,
         "the estimator reads it as TF's does"),
    Name("estimator.tpu.TPUConfig", "estimator_spec.TPUConfig", FRAMEWORK,
         "the host run emulates the topology it describes"),
    Name("estimator.tpu.InputPipelineConfig",
         "estimator_spec.InputPipelineConfig", FRAMEWORK,
         "its modes deploy input_fn as on a TPU"),
    Name("estimator.tpu.experimental.EmbeddingConfigSpec",
         "estimator_spec.experimental.EmbeddingConfigSpec", OURS,
         "also estimator_spec.EmbeddingConfigSpec"),
)


def _rows(module, names, ours, kind, note):
  """One row per name of `module`: `ours` is the module holding our
  counterparts (None for none)."""
  return tuple(Name(f"{module}.{name}", ours and f"{ours}.{name}", kind, note)
               for name in names)


_ESTIMATOR = "estimator_spec.estimator"

# tf.estimator (tf.compat.v1.estimator: the same names but for a few
# experimental ones) and its modules: what a TPUEstimator program uses beside
# tf.compat.v1.estimator.tpu.
_FRAMEWORK_NAMES = (
    Name("estimator.Estimator", f"{_ESTIMATOR}.Estimator", FRAMEWORK,
         "TF2's tf.estimator.Estimator (EstimatorV2) migrates to it too"),
    Name("estimator.EstimatorSpec", f"{_ESTIMATOR}.EstimatorSpec", FRAMEWORK,
         ""),
    Name("estimator.ModeKeys", f"{_ESTIMATOR}.ModeKeys", FRAMEWORK, ""),
    Name("estimator.RunConfig", f"{_ESTIMATOR}.RunConfig", FRAMEWORK,
         "the plain RunConfig; the TPU one is estimator_spec.RunConfig"),
    Name("estimator.TrainSpec", f"{_ESTIMATOR}.TrainSpec", FRAMEWORK, ""),
    Name("estimator.EvalSpec", f"{_ESTIMATOR}.EvalSpec", FRAMEWORK, ""),
    Name("estimator.train_and_evaluate", f"{_ESTIMATOR}.train_and_evaluate",
         FRAMEWORK, ""),
    Name("estimator.WarmStartSettings", f"{_ESTIMATOR}.WarmStartSettings",
         FRAMEWORK, ""),
)
_IN_TF_TRAIN = (
    "CheckpointSaverHook", "CheckpointSaverListener", "FeedFnHook",
    "FinalOpsHook", "GlobalStepWaiterHook", "LoggingTensorHook",
    "NanLossDuringTrainingError", "NanTensorHook", "ProfilerHook",
    "SecondOrStepTimer", "SessionRunArgs", "SessionRunContext",
    "SessionRunHook", "SessionRunValues", "StepCounterHook", "StopAtStepHook",
    "SummarySaverHook", "VocabInfo")
_CANNED = (
    "BaselineClassifier", "BaselineEstimator", "BaselineRegressor",
    "DNNClassifier", "DNNEstimator", "DNNLinearCombinedClassifier",
    "DNNLinearCombinedEstimator", "DNNLinearCombinedRegressor",
    "DNNRegressor", "LinearClassifier", "LinearEstimator", "LinearRegressor")
_HEADS = (
    "Head", "BinaryClassHead", "LogisticRegressionHead", "MultiClassHead",
    "MultiHead", "MultiLabelHead", "PoissonRegressionHead", "RegressionHead")
_EXPORTERS = ("Exporter", "LatestExporter", "FinalExporter", "BestExporter")
_EXPORT_NAMES = (
    "ExportOutput", "PredictOutput", "ClassificationOutput",
    "RegressionOutput", "ServingInputReceiver", "TensorServingInputReceiver",
    "build_parsing_serving_input_receiver_fn",
    "build_raw_serving_input_receiver_fn")
_EXPERIMENTAL_CANNED = ("KMeans", "LinearSDCA", "RNNClassifier",
                        "RNNEstimator")
_LOGIT_FNS = ("call_logit_fn", "dnn_logit_fn_builder",
              "linear_logit_fn_builder")
_STOP_HOOKS = (
    "InMemoryEvaluatorHook", "make_early_stopping_hook",
    "make_stop_at_checkpoint_step_hook", "stop_if_higher_hook",
    "stop_if_lower_hook", "stop_if_no_decrease_hook",
    "stop_if_no_increase_hook")

_WRITE_A_MODEL_FN = ("a canned estimator: no counterpart here; write a "
                     "model_fn for estimator_spec.estimator.Estimator (or "
                     "TPUEstimator)")
ESTIMATOR_NAMES = (
    _FRAMEWORK_NAMES +
    _rows("estimator", _IN_TF_TRAIN, "tensorflow.compat.v1.train", TF,
          "TF's own, which tf.estimator re-exported from tf.compat.v1."
          "train, where TF 2.15 and current TF keep it") +
    _rows("estimator", _CANNED, None, REFUSED, _WRITE_A_MODEL_FN) +
    _rows("estimator", _HEADS, None, REFUSED,
          "a canned estimator's head: no counterpart here; write a model_fn "
          "that computes the loss, predictions and metrics itself") +
    _rows("estimator", ("add_metrics",), None, REFUSED,
          "adds metrics to a canned estimator: no counterpart here; write a "
          "model_fn whose EstimatorSpec returns them (`eval_metric_ops`)") +
    _rows("estimator", ("classifier_parse_example_spec",
                        "regressor_parse_example_spec"), None, REFUSED,
          "a canned estimator's parsing spec: no counterpart here; write a "
          "model_fn, and parse with TF's own "
          "tf.feature_column.make_parse_example_spec") +
    _rows("estimator", _EXPORTERS, None, REFUSED,
          "no counterpart here: export with `estimator.export_saved_model` "
          "after `evaluate`, or pass to `EvalSpec(exporters=...)` an object "
          "with a `name` and an `export(estimator, export_path, "
          "checkpoint_path, eval_result, is_the_final_export)` method") +
    _rows("estimator.export", _EXPORT_NAMES, f"{_ESTIMATOR}.export",
          FRAMEWORK, "") +
    _rows("estimator.export", ("EvalOutput",), None, REFUSED,
          "the framework exports serving graphs only (no eval graph): "
          "export one with `export_saved_model` and a serving input "
          "receiver") +
    _rows("estimator.experimental", _EXPERIMENTAL_CANNED, None, REFUSED,
          _WRITE_A_MODEL_FN) +
    _rows("estimator.experimental", _LOGIT_FNS, None, REFUSED,
          "builds a canned estimator's logits: no counterpart here; "
          "compute the logits in your model_fn") +
    _rows("estimator.experimental", _STOP_HOOKS, None, REFUSED,
          "tf.estimator.experimental's hook: no counterpart here; stop with "
          "`max_steps`, or with a tf.compat.v1.train.SessionRunHook of your "
          "own that calls `run_context.request_stop()`") +
    _rows("estimator.experimental",
          ("build_raw_supervised_input_receiver_fn",), None, REFUSED,
          "a receiver for training and eval graphs: the framework exports "
          "serving graphs only; use estimator.export."
          "build_raw_serving_input_receiver_fn") +
    _rows("estimator.inputs", ("numpy_input_fn", "pandas_input_fn"), None,
          REFUSED, "builds an input_fn from in-memory data: no counterpart "
          "here; return `tf.data.Dataset.from_tensor_slices(...)` from your "
          "input_fn"))

NAMES = TPU_NAMES + ESTIMATOR_NAMES

# TF modules that have a counterpart module of ours: an alias of the module
# (`from tensorflow.compat.v1.estimator import tpu as tpu_estimator`) becomes
# an alias of ours (`import estimator_spec as tpu_estimator`) when every name
# the program uses through it is in ours under the same name. The root of the
# `tensorflow_estimator` package is spelled in full.
MODULES = {
    "estimator.tpu": "estimator_spec",
    "estimator.tpu.experimental": "estimator_spec.experimental",
    "estimator": _ESTIMATOR,
    "estimator.export": f"{_ESTIMATOR}.export",
    "tensorflow_estimator": "estimator_spec",
}
# Those of them some of whose names have no counterpart: the module itself
# (passed around as a value) is not replaced by ours.
PARTIAL_MODULES = ("estimator", "estimator.export", "tensorflow_estimator")

# The TF modules whose public names the table covers (a test walks them
# under tf.compat.v1); TF2's `tf.estimator` modules, walked too, hold the
# same names but for a few experimental ones.
COVERED_MODULES = ("tpu.experimental", "tpu.experimental.embedding",
                   "estimator", "estimator.tpu", "estimator.tpu.experimental",
                   "estimator.export", "estimator.experimental",
                   "estimator.inputs")
TF2_COVERED_MODULES = ("estimator", "estimator.export",
                       "estimator.experimental")

# Other spellings of the names above, as full dotted paths (prefixes end in
# '.'; the longest that matches applies, and a spelling it gives in full is
# resolved again): TF 1.x's `tf.contrib.tpu` and `tensorflow.python.
# estimator`, the modules behind the public names that programs import
# directly, and the `tensorflow_estimator` package.
_TFE = "tensorflow_estimator.python.estimator."
_LOAD_GLOBAL_STEP = "_load_global_step_from_checkpoint_dir"
ALIASES = {
    "tensorflow.contrib.tpu.TPUEstimator": "estimator.tpu.TPUEstimator",
    "tensorflow.contrib.tpu.TPUEstimatorSpec":
        "estimator.tpu.TPUEstimatorSpec",
    "tensorflow.contrib.tpu.RunConfig": "estimator.tpu.RunConfig",
    "tensorflow.contrib.tpu.TPUConfig": "estimator.tpu.TPUConfig",
    "tensorflow.contrib.cluster_resolver.TPUClusterResolver":
        "distribute.cluster_resolver.TPUClusterResolver",
    "tensorflow.contrib.distribute.TPUStrategy":
        "distribute.experimental.TPUStrategy",
    "tensorflow.contrib.tpu.InputPipelineConfig":
        "estimator.tpu.InputPipelineConfig",
    _TFE + "tpu.tpu_estimator.": "estimator.tpu.",
    _TFE + "tpu.tpu_config.": "estimator.tpu.",
    _TFE + "tpu._tpu_estimator_embedding.": "estimator.tpu.experimental.",
    "tensorflow.python.tpu.tpu_embedding.": "tpu.experimental.",
    "tensorflow.python.tpu.feature_column_v2.embedding_column_v2":
        "tpu.experimental.embedding_column",
    "tensorflow.python.tpu.feature_column_v2.shared_embedding_columns_v2":
        "tpu.experimental.shared_embedding_columns",
    "tensorflow.python.tpu.tpu_embedding_v2.TPUEmbedding":
        "tpu.experimental.embedding.TPUEmbedding",
    "tensorflow.python.tpu.tpu_embedding_v1.TPUEmbeddingV0":
        "tpu.experimental.embedding.TPUEmbeddingV0",
    # tf.estimator's modules, and TF 1.x's copies of them.
    "tensorflow_estimator.estimator.": "estimator.",
    _TFE + "estimator.": "estimator.",
    _TFE + "estimator.EstimatorV2": "estimator.Estimator",
    _TFE + "model_fn.": "estimator.",
    _TFE + "run_config.": "estimator.",
    _TFE + "training.": "estimator.",
    _TFE + "mode_keys.": "estimator.",
    _TFE + "export.export.": "estimator.export.",
    _TFE + "export.export_lib.": "estimator.export.",
    _TFE + "export.export_output.": "estimator.export.",
    # (TF 2.15's tpu_estimator lacks it, but programs call it there.)
    _TFE + "tpu.tpu_estimator." + _LOAD_GLOBAL_STEP:
        _TFE + "estimator." + _LOAD_GLOBAL_STEP,
    "tensorflow.python.estimator.": _TFE,
}

# TF 1.x's own columns (`tensorflow.python.tpu.feature_column`, which TF 1.x
# exported as `tf.compat.v1.tpu.experimental`): their counterparts keep
# TF 1.x's variable names (docs/migration.md, 'TF 1.x columns').
LEGACY = (
    Name("tensorflow.python.tpu.feature_column.embedding_column",
         "tpu_embedding_columns.legacy.embedding_column", OURS,
         "TF 1.x's column"),
    Name("tensorflow.python.tpu.feature_column.shared_embedding_columns",
         "tpu_embedding_columns.legacy.shared_embedding_columns", OURS,
         "TF 1.x's columns: one `embedding_weights` variable in the scope "
         "of the shared collection name"),
)

# TF's calls that need a TPU, outside the modules the table covers
# (tf.compat.v1.tpu, tf.distribute): `migrate` reports each one it leaves.
TPU_ONLY_NAMES = (
    Name("tpu.rewrite", "tensorflow.compat.v1.tpu.rewrite", TPU_ONLY,
         _TPU_COMPUTATION),
    Name("tpu.replicate", "tensorflow.compat.v1.tpu.replicate", TPU_ONLY,
         _TPU_COMPUTATION),
    Name("tpu.shard", "tensorflow.compat.v1.tpu.shard", TPU_ONLY,
         _TPU_COMPUTATION),
    Name("tpu.batch_parallel", "tensorflow.compat.v1.tpu.batch_parallel",
         TPU_ONLY, _TPU_COMPUTATION),
    Name("tpu.initialize_system", "tensorflow.compat.v1.tpu."
         "initialize_system", TPU_ONLY, _TPU_SYSTEM),
    Name("tpu.shutdown_system", "tensorflow.compat.v1.tpu.shutdown_system",
         TPU_ONLY, _TPU_SYSTEM),
    Name("distribute.cluster_resolver.TPUClusterResolver",
         "tensorflow.compat.v1.distribute.cluster_resolver."
         "TPUClusterResolver", TPU_ONLY, _TPU_RESOLVER),
    Name("distribute.TPUStrategy", None, TPU_ONLY, _TPU_STRATEGY),
    Name("distribute.experimental.TPUStrategy",
         "tensorflow.compat.v1.distribute.experimental.TPUStrategy",
         TPU_ONLY, _TPU_STRATEGY),
)

# `tf.contrib.tpu` names that TF 2.15 keeps under `tf.compat.v1.tpu`: TF 1.x
# programs use them beside the estimator; `migrate` moves them there.
# (Those that need a TPU have their rows in TPU_ONLY_NAMES, as `tpu.X`.)
CONTRIB_TPU_IN_COMPAT_V1 = (
    "CrossShardOptimizer", "bfloat16_scope", "core", "cross_replica_sum",
    "outside_compilation")

# Names outside TF's public API that public TPU programs call.
PRIVATE = (
    Name(_TFE + "estimator." + _LOAD_GLOBAL_STEP,
         f"{_ESTIMATOR}.load_global_step_from_checkpoint_dir", OURS,
         "the global step of the latest checkpoint, 0 without one; public "
         "TPU programs call it through tensorflow.python.estimator.estimator "
         "or tpu_estimator"),
)

_BY_TF = {name.tf: name for name in NAMES + LEGACY + PRIVATE +
          TPU_ONLY_NAMES}
# Spellings in full: the rows outside tf.compat.v1, the package root.
_FULL = {name.tf for name in LEGACY + PRIVATE} | {
    module for module in MODULES if module.startswith("tensorflow")}
_TF_ROOTS = ("tensorflow", "tensorflow_estimator")


def _replaced(alias, dotted):
  """`dotted` with the alias `alias` replaced, or None when it does not
  apply."""
  if alias.endswith("."):
    if dotted.startswith(alias):
      return ALIASES[alias] + dotted[len(alias):]
    if dotted == alias[:-1]:  # the module itself
      return ALIASES[alias][:-1]
  elif dotted == alias or dotted.startswith(alias + "."):
    return ALIASES[alias] + dotted[len(alias):]
  return None


def canonical(dotted):
  """The table's spelling of a full dotted TF name (`tensorflow.compat.v1.
  estimator.tpu.RunConfig` -> `estimator.tpu.RunConfig`), or None when it
  is not a TF name."""
  if dotted in _FULL:
    return dotted
  matching = [alias for alias in ALIASES if _replaced(alias, dotted)]
  if matching:
    new = _replaced(max(matching, key=len), dotted)
    return canonical(new) if new.split(".")[0] in _TF_ROOTS else new
  if not dotted.startswith("tensorflow."):
    return None
  name = dotted[len("tensorflow."):]
  # `tf.compat.v1.X`, and `tf.compat.v1.compat.v1.X` under `import
  # tensorflow.compat.v1 as tf`, are `X`.
  while name.startswith(("compat.v1.", "compat.v2.")):
    name = name[len("compat.v1."):]
  return name


def lookup(dotted):
  """The `Name` row of a full dotted TF name, a module counterpart (a
  `Name` whose `tf` is the module), or None."""
  name = canonical(dotted)
  if name is None:
    return None
  if name in _BY_TF:
    return _BY_TF[name]
  if name in PARTIAL_MODULES:
    return Name(name, MODULES[name], REFUSED,
                f"the module itself: only some of its names are in "
                f"{MODULES[name]}; use those by name")
  if name in MODULES:
    return Name(name, MODULES[name], OURS, "every name of the module")
  head, _, last = name.rpartition(".")
  if head == "contrib.tpu" and "tpu." + last in _BY_TF:
    return _BY_TF["tpu." + last]
  if head == "contrib.tpu" and last in CONTRIB_TPU_IN_COMPAT_V1:
    return Name(name, "tensorflow.compat.v1.tpu." + last, TF,
                "TF 2.15 keeps it in tf.compat.v1.tpu")
  return None


def _is_estimator_module(dotted):
  """Whether a full dotted TF name lies in tensorflow-estimator's modules
  (TF 2.16 and later have none of them)."""
  if dotted.split(".")[0] == "tensorflow_estimator" or (
      dotted + ".").startswith("tensorflow.python.estimator."):
    return True
  name = canonical(dotted) or ""
  return name == "estimator" or name.startswith("estimator.")


def is_covered(dotted):
  """Whether a full dotted TF name lies in a namespace this table covers
  (so that an unknown name there is worth a line in migrate's report)."""
  if _is_estimator_module(dotted):
    return True
  name = canonical(dotted)
  return name is not None and any(
      name.startswith(prefix + ".") for prefix in
      COVERED_MODULES + ("contrib.tpu",))


# Modules some TF version lacks, beside tensorflow-estimator's, with the
# words of migrate's report.
_MISSING_MODULES = {
    "tensorflow.contrib": "TF 2.15 has no tensorflow.contrib",
    "tensorflow.python.tpu.tpu_embedding":
        "current TF has no tensorflow.python.tpu.tpu_embedding",
}


def missing_from(dotted):
  """Which TF versions lack the module of a full dotted TF name, as words
  for migrate's report (a program that still imports it fails there), or
  None."""
  for module, words in _MISSING_MODULES.items():
    if (dotted + ".").startswith(module + "."):
      return words
  if _is_estimator_module(dotted):
    return "TF 2.16 and later have no tf.estimator (tensorflow-estimator)"
  relative = dotted[len("tensorflow."):] if dotted.startswith(
      "tensorflow.") else ""
  prefix = (relative.split(".")[0] not in ("compat", "python") and
            tf1_names.tf1_prefix(relative))
  if prefix:
    return f"TF 2 has no tf.{prefix} (TF 1.x's)"
  return None


def markdown_table():
  """docs/migration.md's table of names, generated from `NAMES`."""
  lines = ["| TF name (`tf.compat.v1.` or `tf.` ...) | here | kind | note |",
           "| --- | --- | --- | --- |"]
  for name in NAMES + LEGACY + PRIVATE + TPU_ONLY_NAMES:
    ours = "—" if name.ours is None else f"`{name.ours}`"
    if name.kind == TF and name.ours is None:
      ours = "TF's own, unchanged"
    note = name.note.replace("|", "\\|")
    lines.append(f"| `{name.tf}` | {ours} | {name.kind} | {note} |")
  return "\n".join(lines) + "\n"
