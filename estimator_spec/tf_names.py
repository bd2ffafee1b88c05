"""Where each name of TF's TPU embedding and TPUEstimator APIs lives here.

One table (`NAMES`), plain data: `tests/test_tf_names.py` walks TF 2.15's
namespaces against it, `python -m estimator_spec migrate` rewrites programs
by it, and docs/migration.md's table is generated from it
(`markdown_table()`).

A row's `tf` is the name as written under `tensorflow.compat.v1` (TF 1.x's
`tensorflow`), e.g. `tpu.experimental.embedding_column`; its `kind` says
what a program that uses it gets here:

* `ours`: this library's own implementation, at `ours`;
* `re-export`: TF's own object, unchanged, also reachable at `ours`;
* `tf`: stays TF's (it works unchanged with this library); `migrate` keeps
  it (`ours` None) or moves it to where TF 2.15 keeps it (`ours`);
* `refused`: no counterpart here; `note` says what to do instead.

`ALIASES` are the other spellings of those names that programs use (TF 1.x's
`tf.contrib.tpu`, the modules behind the public names); `MODULES` are the TF
modules every public name of which has a counterpart in one of ours, so that
an alias of the whole module can be rewritten as an alias of ours.
"""
import collections

OURS = "ours"
REEXPORT = "re-export"
TF = "tf"
REFUSED = "refused"
KINDS = (OURS, REEXPORT, TF, REFUSED)

Name = collections.namedtuple("Name", ["tf", "ours", "kind", "note"])

_TPU_SYSTEM = ("a TPU system call: a host run has no TPU to set up, so "
               "leave it out of the host program; a TPU run keeps TF's "
               "(estimator_spec.TPUEstimator hands use_tpu=True runs with a "
               "TPU `master` to TF's own TPUEstimator)")
_TPU_TOPOLOGY = ("describes a TPU's cores; a host run has none (it emulates "
                 "the topology `TPUConfig.num_shards` gives); keep TF's for "
                 "a TPU run")
_MID_LEVEL_CONFIG = ("TF's own configuration object: estimator_spec."
                     "HostTPUEmbedding takes it unchanged")

NAMES = (
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
    Name("tpu.experimental.initialize_tpu_system", None, REFUSED,
         _TPU_SYSTEM),
    Name("tpu.experimental.shutdown_tpu_system", None, REFUSED, _TPU_SYSTEM),
    Name("tpu.experimental.DeviceAssignment", None, REFUSED, _TPU_TOPOLOGY),
    Name("tpu.experimental.DeviceOrderMode", None, REFUSED, _TPU_TOPOLOGY),
    Name("tpu.experimental.Topology", None, REFUSED, _TPU_TOPOLOGY),
    Name("tpu.experimental.TPUSystemMetadata", None, REFUSED, _TPU_TOPOLOGY),
    Name("tpu.experimental.HardwareFeature", None, REFUSED, _TPU_TOPOLOGY),
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
    Name("estimator.tpu.RunConfig", "estimator_spec.RunConfig", REEXPORT,
         "TF's class: the estimator reads it as TF's does"),
    Name("estimator.tpu.TPUConfig", "estimator_spec.TPUConfig", REEXPORT,
         "TF's class: the host run emulates the topology it describes"),
    Name("estimator.tpu.InputPipelineConfig",
         "estimator_spec.InputPipelineConfig", REEXPORT,
         "TF's class: its modes deploy input_fn as on a TPU"),
    Name("estimator.tpu.experimental.EmbeddingConfigSpec",
         "estimator_spec.experimental.EmbeddingConfigSpec", OURS,
         "also estimator_spec.EmbeddingConfigSpec"),
)

# TF modules whose every name has a counterpart in one of ours: an alias of
# the module (`from tensorflow.compat.v1.estimator import tpu as
# tpu_estimator`) becomes an alias of ours (`import estimator_spec as
# tpu_estimator`).
MODULES = {
    "estimator.tpu": "estimator_spec",
    "estimator.tpu.experimental": "estimator_spec.experimental",
}

# The TF modules whose public names the table covers (a test walks them).
COVERED_MODULES = ("tpu.experimental", "tpu.experimental.embedding",
                   "estimator.tpu", "estimator.tpu.experimental")

# Other spellings of the names above, as full dotted paths (prefixes end in
# '.'): TF 1.x's `tf.contrib.tpu`, and the modules behind the public names
# that programs import directly.
ALIASES = {
    "tensorflow.contrib.tpu.TPUEstimator": "estimator.tpu.TPUEstimator",
    "tensorflow.contrib.tpu.TPUEstimatorSpec":
        "estimator.tpu.TPUEstimatorSpec",
    "tensorflow.contrib.tpu.RunConfig": "estimator.tpu.RunConfig",
    "tensorflow.contrib.tpu.TPUConfig": "estimator.tpu.TPUConfig",
    "tensorflow.contrib.tpu.InputPipelineConfig":
        "estimator.tpu.InputPipelineConfig",
    "tensorflow_estimator.python.estimator.tpu.tpu_estimator.":
        "estimator.tpu.",
    "tensorflow_estimator.python.estimator.tpu.tpu_config.": "estimator.tpu.",
    "tensorflow_estimator.python.estimator.tpu._tpu_estimator_embedding.":
        "estimator.tpu.experimental.",
    "tensorflow.python.tpu.tpu_embedding.": "tpu.experimental.",
    "tensorflow.python.tpu.feature_column_v2.embedding_column_v2":
        "tpu.experimental.embedding_column",
    "tensorflow.python.tpu.feature_column_v2.shared_embedding_columns_v2":
        "tpu.experimental.shared_embedding_columns",
    "tensorflow.python.tpu.tpu_embedding_v2.TPUEmbedding":
        "tpu.experimental.embedding.TPUEmbedding",
    "tensorflow.python.tpu.tpu_embedding_v1.TPUEmbeddingV0":
        "tpu.experimental.embedding.TPUEmbeddingV0",
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

# `tf.contrib.tpu` names that TF 2.15 keeps under `tf.compat.v1.tpu`: TF 1.x
# programs use them beside the estimator; `migrate` moves them there.
CONTRIB_TPU_IN_COMPAT_V1 = (
    "CrossShardOptimizer", "batch_parallel", "bfloat16_scope", "core",
    "cross_replica_sum", "initialize_system", "outside_compilation",
    "replicate", "rewrite", "shard", "shutdown_system")

_BY_TF = {name.tf: name for name in NAMES}
_LEGACY_BY_TF = {name.tf: name for name in LEGACY}


def canonical(dotted):
  """The table's spelling of a full dotted TF name (`tensorflow.compat.v1.
  estimator.tpu.RunConfig` -> `estimator.tpu.RunConfig`), or None when it
  is not a TF name."""
  for prefix, replacement in ALIASES.items():
    if prefix.endswith("."):
      if dotted.startswith(prefix):
        return replacement + dotted[len(prefix):]
      if dotted == prefix[:-1]:  # the module itself
        return replacement[:-1]
    elif dotted == prefix or dotted.startswith(prefix + "."):
      return replacement + dotted[len(prefix):]
  for prefix in ("tensorflow.compat.v1.", "tensorflow.compat.v2.",
                 "tensorflow."):
    if dotted.startswith(prefix):
      return dotted[len(prefix):]
  return None


def lookup(dotted):
  """The `Name` row of a full dotted TF name, a module counterpart (a
  `Name` whose `tf` is the module), or None."""
  if dotted in _LEGACY_BY_TF:
    return _LEGACY_BY_TF[dotted]
  name = canonical(dotted)
  if name is None:
    return None
  if name in _BY_TF:
    return _BY_TF[name]
  if name in MODULES:
    return Name(name, MODULES[name], OURS, "every name of the module")
  head, _, last = name.rpartition(".")
  if head == "contrib.tpu" and last in CONTRIB_TPU_IN_COMPAT_V1:
    return Name(name, "tensorflow.compat.v1.tpu." + last, TF,
                "TF 2.15 keeps it in tf.compat.v1.tpu")
  return None


def is_tpu_name(dotted):
  """Whether a full dotted TF name lies in a namespace this table covers
  (so that an unknown name there is worth a line in migrate's report)."""
  name = canonical(dotted)
  if name is None:
    return False
  return any(name.startswith(prefix + ".") for prefix in
             COVERED_MODULES + ("contrib.tpu",))


def markdown_table():
  """docs/migration.md's table of names, generated from `NAMES`."""
  lines = ["| TF name (`tf.compat.v1.` ...) | here | kind | note |",
           "| --- | --- | --- | --- |"]
  for name in NAMES + LEGACY:
    ours = "—" if name.ours is None else f"`{name.ours}`"
    if name.kind == TF and name.ours is None:
      ours = "TF's own, unchanged"
    note = name.note.replace("|", "\\|")
    lines.append(f"| `{name.tf}` | {ours} | {name.kind} | {note} |")
  return "\n".join(lines) + "\n"
