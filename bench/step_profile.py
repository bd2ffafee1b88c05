"""Where one training step's time goes: TF's own per-op trace of a few
steady-state steps of an e2e_bench workload, as plain-text tables.

A SessionRunHook runs `--warmup` steps untraced, `--timed` untraced steps
whose wall time it measures, then `--traced` steps with
`RunOptions(trace_level=FULL_TRACE)`; the RunMetadata step_stats of the
traced steps give every executed node's start and end. Each node is
attributed to its graph op (op type and name; nodes Grappler made are
matched to the op whose name they extend, else typed from their timeline
label), and each op to a group:

* ours: the embedding engine's ops are tagged by the engine call that
  built them (this script wraps the calls while the graph is built; no
  library code changes): `emb parse` (HostEmbeddingEngine.begin_lookup:
  ids and weights of every feature flattened, negative ids dropped),
  `emb lookup` (LookupStep.table: distinct ids and their rows, the
  combiner), `emb backward` (table_gradients: combiner backward,
  per-id gradient sums), `emb apply` (Updates.update_table: the optimizer on
  touched rows and its writes: the compiled row update, or scatters),
  `emb checks` (the checks' gates, learning-rate and batch checks).
* tf (TF's TPUEstimator(use_tpu=False)): the feature columns' ops are told
  by name: `emb lookup` (the columns' forward: `.../embedding_lookup_sparse`
  and the sparse-id handling of the DenseFeatures layer), `emb backward`
  (their `gradients/...`), `emb apply` (the optimizer's sparse update of a
  table).
* both: `emb checks` also holds every Assert and CheckNumerics op (and the
  engine's compiled checks) and every op that serves checks only (all its
  consumers are checks: a condition, the reductions it compares, a
  message), wherever it was built; `input`
  (the iterator's ops and the DeserializeSparse of its SparseTensors;
  tf.data's own work runs on its threads, outside the step's trace: only
  the wait in IteratorGetNext shows), `dense backward` (`gradients/...`),
  `dense optimizer`
  (`Adagrad/...`, `training/...`), `dense forward` (the rest of model_fn and
  the step's bookkeeping).

Times: an op's self time is its op_end_rel_micros - op_start_rel_micros
(the kernel's compute). With TF's inter-op thread pool (2 threads on this
machine) ops run in parallel, so summed op time and wall time differ:
every table gives both the summed op time per step (and its share of the
step's summed op time, which adds up to 100%) and, per group, the wall
time during which at least one of its ops ran ("busy"). The step's wall
time is given untraced (the hook's clock) and traced (FULL_TRACE adds a
few us per op: with some 1,400 ops a step, the traced step is slower).
FULL_TRACE also changes how ops overlap: in traced steps of peer26 the 26
lookups ran nearly one at a time ("at once" about 1.1), where TF's
profiler (`tf.profiler.experimental`, which records the inter-op threads)
showed untraced steps running them on both inter-op threads (their summed
time 1.6 times their wall time). Read "busy" and "at once" as the traced
step's, not as what an untraced step overlaps.

Usage: .venv/bin/python -m bench.step_profile [--side ours|tf|both]
         [--workload peer26] [--warmup 20] [--timed 50] [--traced 10]
         [--rows 100000] [--tables 26] [--fed]

`--fed` profiles the fed twin (e2e_bench's `peer26-fed`: the same model
with its activations given as an input, no lookup and no update), the
reference of the embedding's cost: what the dense model alone takes.
"""
import argparse
import collections
import contextlib
import functools
import os
import re
import shutil
import tempfile
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from bench import e2e_bench  # pylint: disable=g-import-not-at-top

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

# pylint: disable=g-import-not-at-top
from estimator_spec.engine import backward
from estimator_spec.engine import engine as engine_lib
from estimator_spec.engine import lookup as lookup_lib
from estimator_spec.engine import updates as updates_lib
from estimator_spec.estimator import batch_checks
from tpu_embedding_columns import lookup as column_lookup
# pylint: enable=g-import-not-at-top

EMB_PARSE = "emb parse"
EMB_LOOKUP = "emb lookup"
EMB_BACKWARD = "emb backward"
EMB_APPLY = "emb apply"
EMB_CHECKS = "emb checks"
INPUT = "input"
DENSE_FORWARD = "dense forward"
DENSE_BACKWARD = "dense backward"
DENSE_OPTIMIZER = "dense optimizer"
GROUPS = (EMB_PARSE, EMB_LOOKUP, EMB_BACKWARD, EMB_APPLY, EMB_CHECKS, INPUT,
          DENSE_FORWARD, DENSE_BACKWARD, DENSE_OPTIMIZER)
EMBEDDING_GROUPS = (EMB_PARSE, EMB_LOOKUP, EMB_BACKWARD, EMB_APPLY,
                    EMB_CHECKS)
SMALL_US = 10  # "small" ops: self time under this (us)
# Ops every step runs first, whatever they feed (constants, variable
# handles): a phase's window leaves them out.
BOOKKEEPING_TYPES = ("Const", "VarHandleOp", "NoOp")
CHECK_TYPES = ("Assert", "CheckNumerics", "HostEmbeddingCheckIds",
               "HostEmbeddingCheckAll")
# DeserializeSparse: the SparseTensors of IteratorGetNext's output.
INPUT_TYPES = ("IteratorGetNext", "IteratorV2", "MakeIterator",
               "DeserializeSparse",
               "IteratorToStringHandle", "IteratorGetNextSync",
               "AnonymousIteratorV2", "AnonymousIteratorV3")

# --- tagging ours' engine ops by the call that built them --------------------

# (object, attribute, group): the engine calls whose ops get the group; the
# innermost call wins (a check built inside a lookup is a check).
_TAGGED_CALLS = (
    (engine_lib.HostEmbeddingEngine, "begin_lookup", EMB_PARSE),
    (lookup_lib.LookupStep, "table", EMB_LOOKUP),
    (engine_lib.HostEmbeddingEngine, "table_gradients", EMB_BACKWARD),
    (updates_lib.Updates, "update_table", EMB_APPLY),
    (backward, "learning_rate", EMB_CHECKS),
    (backward, "finite", EMB_CHECKS),
    (column_lookup, "check", EMB_CHECKS),
    (column_lookup, "gate", EMB_CHECKS),
    (batch_checks, "check_lookup_batch", EMB_CHECKS),
)


def _op_count(graph):
  return len(graph.get_operations())


class OpTags:
  """The group of each op built inside a wrapped engine call (see module
  docstring), by the op's position in creation order, for the one graph
  built while `active()`."""

  def __init__(self):
    # (first, end, group): ops created first..end-1 (positions in creation
    # order; ops are never removed from a graph) inside a call of `group`.
    self._spans = []

  def group_of(self, position):
    """The group of the op created `position`-th (from 0), or None."""
    best = None
    for first, end, group in self._spans:
      if first <= position < end and (best is None or
                                      end - first < best[1] - best[0]):
        best = (first, end, group)
    return best[2] if best else None

  def _wrap(self, function, group):

    @functools.wraps(function)
    def wrapped(*args, **kwargs):
      graph = tf.compat.v1.get_default_graph()
      first = _op_count(graph)
      try:
        return function(*args, **kwargs)
      finally:
        self._spans.append((first, _op_count(graph), group))

    return wrapped

  @contextlib.contextmanager
  def active(self):
    saved = []
    try:
      for owner, attribute, group in _TAGGED_CALLS:
        original = getattr(owner, attribute)
        saved.append((owner, attribute, original))
        setattr(owner, attribute, self._wrap(original, group))
      yield self
    finally:
      for owner, attribute, original in reversed(saved):
        setattr(owner, attribute, original)


# --- grouping ops -------------------------------------------------------------


def _is_tf_embedding(name):
  return "_embedding" in name or "embedding_lookup" in name


def group_of(name, op_type, side, tag=None):
  """The group of an op (see module docstring); `tag`: ours' engine tag."""
  if op_type in CHECK_TYPES:
    return EMB_CHECKS
  if tag is not None:
    return tag
  if op_type in INPUT_TYPES or name.startswith("IteratorGetNext"):
    return INPUT
  if name.startswith("gradients/"):
    if side == e2e_bench.TF and _is_tf_embedding(name):
      return EMB_BACKWARD
    return DENSE_BACKWARD
  if name.startswith(("Adagrad/", "training/", "Adam/", "GradientDescent/")):
    if side == e2e_bench.TF and _is_tf_embedding(name):
      return EMB_APPLY
    return DENSE_OPTIMIZER
  if side == e2e_bench.TF and _is_tf_embedding(name):
    return EMB_LOOKUP
  return DENSE_FORWARD


_GRAPPLER = re.compile(r"^(?:[A-Za-z]+Optimizer|ConstantFolding|"
                       r"DependencyOptimizer|Remapper|LoopOptimizer)/")
_LABEL_TYPE = re.compile(r"=\s*([A-Za-z0-9_]+)\(")


def check_only_ops(operations):
  """Names of the ops that serve checks only: those of CHECK_TYPES, and
  ops all of whose consumers (data and control) serve checks only (a
  check's condition, its message, the reductions it compares)."""
  names = set()
  control_consumers = collections.defaultdict(list)
  for op in operations:
    for control_input in op.control_inputs:
      control_consumers[control_input.name].append(op)
  # `operations` in creation order (`Graph.get_operations`), and a consumer
  # is created after what it consumes: newest first.
  for op in reversed(operations):
    consumers = [c for out in op.outputs for c in out.consumers()]
    consumers += control_consumers[op.name]
    if op.type in CHECK_TYPES or (consumers and all(
        c.name in names for c in consumers)):
      names.add(op.name)
  return names


class OpIndex:
  """Node name -> (op name, op type, group) for one graph. Ops that serve
  checks only (`check_only_ops`) are `emb checks` wherever they were
  built."""

  def __init__(self, graph, side, tags=None):
    self.side = side
    self.ops = {}
    operations = graph.get_operations()
    checks = check_only_ops(operations)
    # get_operations() lists the ops in creation order.
    for position, op in enumerate(operations):
      tag = tags.group_of(position) if tags is not None else None
      group = (EMB_CHECKS if op.name in checks else
               group_of(op.name, op.type, side, tag))
      self.ops[op.name] = (op.type, group)
    self._cache = {}

  def resolve(self, node_name, label):
    """(op name, op type, group) of an executed node."""
    key = (node_name, label)
    if key not in self._cache:
      self._cache[key] = self._resolve(node_name, label)
    return self._cache[key]

  def _resolve(self, node_name, label):
    """(op name, op type, group, how): `how` is 'op' (a graph op),
    'rewritten' (a node Grappler made from a graph op) or 'name' (no graph
    op found: grouped by its name alone)."""
    match = _LABEL_TYPE.search(label or "")
    label_type = match.group(1) if match else None
    name = _GRAPPLER.sub("", node_name)
    if name in self.ops:
      op_type, group = self.ops[name]
      op_type = label_type or op_type
      return name, op_type, self._group(op_type, group), "op"
    # A node Grappler made (folded, fused, rewritten or split): the op whose
    # name it extends ('a/b/ConstantFolding/c' -> 'a/b'), or whose name ends
    # its last part ('ReplaceMulWithSquare_mul_3' -> 'mul_3'), typed by the
    # node's own label.
    parts = name.split("/")
    candidates = []
    tokens = parts[-1].split("_")
    for start in range(1, len(tokens)):
      candidates.append("/".join(parts[:-1] + ["_".join(tokens[start:])]))
    candidates += ["/".join(parts[:end]) for end in range(len(parts) - 1, 0,
                                                           -1)]
    for candidate in candidates:
      if candidate in self.ops:
        op_type = label_type or self.ops[candidate][0]
        return name, op_type, self._group(op_type,
                                          self.ops[candidate][1]), "rewritten"
    op_type = label_type or "?"
    return name, op_type, group_of(name, op_type, self.side), "name"

  @staticmethod
  def _group(op_type, group):
    if op_type in CHECK_TYPES:
      return EMB_CHECKS
    if op_type in INPUT_TYPES:
      return INPUT
    return group


# --- tracing ------------------------------------------------------------------


class TraceHook(tf.compat.v1.train.SessionRunHook):
  """Untraced steps (warm-up, then timed), then traced steps (FULL_TRACE);
  keeps the traced steps' step_stats and every step's wall time."""

  def __init__(self, warmup, timed, traced, side, tags=None):
    self.warmup, self.timed, self.traced = warmup, timed, traced
    self.side = side
    self.tags = tags
    self.step = 0
    self.untraced_s = []
    self.traced_s = []
    self.step_stats = []
    self.index = None
    self._start = None

  def begin(self):
    self.index = OpIndex(tf.compat.v1.get_default_graph(), self.side,
                         self.tags)

  def _tracing(self):
    return self.step >= self.warmup + self.timed

  def before_run(self, run_context):
    self._start = time.perf_counter()
    if self._tracing():
      return tf.compat.v1.train.SessionRunArgs(
          fetches=None,
          options=tf.compat.v1.RunOptions(
              trace_level=tf.compat.v1.RunOptions.FULL_TRACE))
    return None

  def after_run(self, run_context, run_values):
    elapsed = time.perf_counter() - self._start
    if self._tracing():
      self.traced_s.append(elapsed)
      self.step_stats.append(run_values.run_metadata.step_stats)
    elif self.step >= self.warmup:
      self.untraced_s.append(elapsed)
    self.step += 1


def _union_us(intervals):
  total, end = 0, None
  for a, b in sorted(intervals):
    if end is None or a > end:
      total += b - a
      end = b
    elif b > end:
      total += b - end
      end = b
  return total


class Profile:
  """Per-step totals of the traced steps (see `summarize`)."""

  def __init__(self, side, workload, hook):
    self.side = side
    self.workload = workload
    self.steps = len(hook.step_stats)
    self.untraced_ms = (float(np.median(hook.untraced_s)) * 1e3
                        if hook.untraced_s else None)
    self.traced_ms = float(np.median(hook.traced_s)) * 1e3
    # {key: [count, self us]} summed over the traced steps
    self.by_type = collections.defaultdict(lambda: [0, 0])
    self.by_group = collections.defaultdict(lambda: [0, 0])
    self.by_group_type = collections.defaultdict(lambda: [0, 0])
    self.by_scope = collections.defaultdict(lambda: [0, 0])
    self.group_busy_us = collections.defaultdict(int)
    # {group: [(first start, last end) per step]}, us from the step's first
    # op, of the group's ops of at least SMALL_US (where it has none: of its
    # ops other than BOOKKEEPING_TYPES)
    self.windows_us = collections.defaultdict(list)
    self.span_us = 0
    self.busy_us = 0  # wall time with at least one op running
    self.devices = set()
    self.small = [0, 0]  # op runs of self time < SMALL_US: count, us
    self.matched = collections.Counter()  # how nodes were matched to ops
    self.unmatched = collections.Counter()  # names of 'name' nodes
    for stats in hook.step_stats:
      intervals = collections.defaultdict(list)
      work = collections.defaultdict(list)
      starts, ends = [], []
      for device in stats.dev_stats:
        self.devices.add(device.device)
        for node in device.node_stats:
          if node.node_name in ("_SOURCE", "_SINK"):
            continue
          name, op_type, group, how = hook.index.resolve(
              node.node_name, node.timeline_label)
          self.matched[how] += 1
          if how == "name":
            self.unmatched[name] += 1
          us = max(0, node.op_end_rel_micros - node.op_start_rel_micros)
          if us < SMALL_US:
            self.small[0] += 1
            self.small[1] += us
          start = node.all_start_micros + node.op_start_rel_micros
          end = node.all_start_micros + max(node.op_end_rel_micros,
                                            node.op_start_rel_micros)
          starts.append(node.all_start_micros)
          ends.append(node.all_start_micros + node.all_end_rel_micros)
          intervals[group].append((start, end))
          if op_type not in BOOKKEEPING_TYPES:
            work[group].append((start, end))
          scope = _scope(name)
          for table, key in ((self.by_type, op_type), (self.by_group, group),
                             (self.by_group_type, (group, op_type)),
                             (self.by_scope, (group, scope))):
            table[key][0] += 1
            table[key][1] += us
      for group, spans in intervals.items():
        self.group_busy_us[group] += _union_us(spans)
      origin = min(starts, default=0)
      for group, spans in work.items():
        spans = [(a, b) for a, b in spans if b - a >= SMALL_US] or spans
        self.windows_us[group].append(
            (min(a for a, _ in spans) - origin, max(b for _, b in spans) -
             origin))
      self.busy_us += _union_us(
          [span for spans in intervals.values() for span in spans])
      if starts:
        self.span_us += max(ends) - min(starts)

  def window_ms(self, group):
    """(from, to): the median over the traced steps of when the group's
    first op starts and its last op ends (of its ops of SMALL_US or more,
    if it has any), in ms from the step's first op; None when none of its
    ops ran."""
    spans = self.windows_us.get(group)
    if not spans:
      return None
    return (float(np.median([a for a, _ in spans])) / 1e3,
            float(np.median([b for _, b in spans])) / 1e3)

  @property
  def ops_per_step(self):
    return sum(c for c, _ in self.by_group.values()) / self.steps

  @property
  def summed_ms(self):
    return sum(us for _, us in self.by_group.values()) / self.steps / 1e3

  def group_shares(self):
    """{group: share of summed op time}, adding up to 1."""
    total = sum(us for _, us in self.by_group.values()) or 1
    return {g: us / total for g, (_, us) in self.by_group.items()}


def _scope(name):
  """The op's name scope (path without its last part; numbers, such as
  per-table and per-feature ones, read N) or, for a top-level op, its name
  with a `_<number>` suffix read `_N`."""
  if "/" in name:
    return re.sub(r"\d+", "N", name.rsplit("/", 1)[0])[:60]
  return re.sub(r"_\d+$", "_N", name)


def profile(job, warmup=20, timed=20, traced=5):
  """Trains `job` (an e2e_bench job: workload, side, batch, ...) for
  warmup + timed + traced steps in a fresh model_dir; returns its
  `Profile`."""
  warnings.filterwarnings("ignore", category=UserWarning)
  tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
  root = tempfile.mkdtemp(prefix="step_profile_")
  try:
    tags = OpTags() if job["side"] == e2e_bench.OURS else None
    estimator, input_fn = e2e_bench.build_estimator(
        dict(job, model_dir=os.path.join(root, job["side"])))
    hook = TraceHook(warmup, timed, traced, job["side"], tags)
    with (tags.active() if tags else contextlib.nullcontext()):
      estimator.train(input_fn, steps=warmup + timed + traced, hooks=[hook])
    return Profile(job["side"], job["workload"], hook)
  finally:
    shutil.rmtree(root, ignore_errors=True)


# --- text ---------------------------------------------------------------------


def _row(cells, widths):
  return "  ".join(str(c).rjust(w) if i else str(c).ljust(w)
                   for i, (c, w) in enumerate(zip(cells, widths)))


def format_profile(p, top=15, per_group=6, scopes=15):
  """The tables of one `Profile` as text."""
  n = p.steps
  total_us = sum(us for _, us in p.by_group.values()) or 1
  lines = [
      f"== {p.workload} / {p.side}: {n} traced steps "
      f"(devices: "
      f"{', '.join(sorted(d.rsplit('/', 1)[-1] for d in p.devices))})",
      f"step wall time: untraced {p.untraced_ms:.1f} ms (median), traced "
      f"{p.traced_ms:.1f} ms (median), traced span of the ops "
      f"{p.span_us / n / 1e3:.1f} ms" if p.untraced_ms is not None else
      f"step wall time: traced {p.traced_ms:.1f} ms (median)",
      f"ops per step: {p.ops_per_step:.0f}; summed op self time per step: "
      f"{p.summed_ms:.1f} ms (= {p.summed_ms / (p.span_us / n / 1e3):.2f} x "
      "the traced span: ops overlap on the inter-op threads)",
      f"small ops (self time < {SMALL_US} us): {p.small[0] / n:.0f} per step, "
      f"{p.small[1] / n / 1e3:.2f} ms summed; "
      f"wall time of the span with no op running: "
      f"{(p.span_us - p.busy_us) / n / 1e3:.2f} ms; "
      f"{os.cpu_count()} threads x span - summed op time: "
      f"{(os.cpu_count() * p.span_us - total_us) / n / 1e3:.1f} ms "
      "(idle threads and executor overhead)",
      f"nodes matched to graph ops: {p.matched['op'] / n:.0f} by name, "
      f"{p.matched['rewritten'] / n:.0f} Grappler rewrites, "
      f"{p.matched['name'] / n:.0f} unmatched (grouped by name: "
      f"{', '.join(sorted(p.unmatched))[:200] or '-'})",
      "",
      "groups (ms/step = summed self time; busy = wall time with one of the "
      "group's ops running)",
  ]
  widths = (16, 8, 10, 7, 10)
  lines.append(_row(("group", "ops/step", "ms/step", "share", "busy ms"),
                    widths))
  embedding = [0, 0]
  for group in GROUPS + tuple(sorted(set(p.by_group) - set(GROUPS))):
    if group not in p.by_group:
      continue
    count, us = p.by_group[group]
    if group in EMBEDDING_GROUPS:
      embedding[0] += count
      embedding[1] += us
    lines.append(_row((group, f"{count / n:.0f}", f"{us / n / 1e3:.2f}",
                       f"{100 * us / total_us:.1f}%",
                       f"{p.group_busy_us[group] / n / 1e3:.2f}"), widths))
  lines.append(_row(("(embedding)", f"{embedding[0] / n:.0f}",
                     f"{embedding[1] / n / 1e3:.2f}",
                     f"{100 * embedding[1] / total_us:.1f}%", ""), widths))
  lines.append(_row(("(all)", f"{p.ops_per_step:.0f}",
                     f"{total_us / n / 1e3:.2f}", "100.0%",
                     f"{p.span_us / n / 1e3:.2f}"), widths))
  lines += ["", "phases: when each group runs in the step (ms from the "
            f"step's first op to the first and last of its ops of {SMALL_US} "
            "us or more, medians); at once = summed ms / busy ms"]
  widths = (16, 8, 8, 8)
  lines.append(_row(("group", "from", "to", "at once"), widths))
  windows = [(group, p.window_ms(group)) for group in p.by_group]
  for group, window in sorted((gw for gw in windows if gw[1]),
                              key=lambda gw: gw[1]):
    busy = p.group_busy_us[group]
    lines.append(_row((group, f"{window[0]:.2f}", f"{window[1]:.2f}",
                       f"{p.by_group[group][1] / busy:.2f}" if busy else "-"),
                      widths))
  lines += ["", f"top {top} op types by summed self time"]
  widths = (28, 8, 10, 7, 8, 30)
  lines.append(_row(("op type", "ops/step", "ms/step", "share", "us/op",
                     "mostly in"), widths))
  ranked = sorted(p.by_type.items(), key=lambda kv: -kv[1][1])
  for op_type, (count, us) in ranked[:top]:
    groups = sorted(((g, v[1]) for (g, t), v in p.by_group_type.items()
                     if t == op_type), key=lambda gv: -gv[1])
    where = ", ".join(f"{g} {100 * u / max(us, 1):.0f}%" for g, u in groups[:2])
    lines.append(_row((op_type, f"{count / n:.0f}", f"{us / n / 1e3:.2f}",
                       f"{100 * us / total_us:.1f}%",
                       f"{us / max(count, 1):.0f}", where), widths))
  lines += ["", f"per group: top {per_group} op types"]
  widths = (16, 28, 8, 10, 7)
  lines.append(_row(("group", "op type", "ops/step", "ms/step", "share"),
                    widths))
  for group in GROUPS:
    items = sorted(((t, v) for (g, t), v in p.by_group_type.items()
                    if g == group), key=lambda tv: -tv[1][1])
    for op_type, (count, us) in items[:per_group]:
      lines.append(_row((group, op_type, f"{count / n:.0f}",
                         f"{us / n / 1e3:.2f}",
                         f"{100 * us / total_us:.1f}%"), widths))
  lines += ["", f"top {scopes} name scopes (numbers read N: per-table and "
            "per-feature scopes merged)"]
  widths = (16, 56, 8, 10, 7)
  lines.append(_row(("group", "scope", "ops/step", "ms/step", "share"),
                    widths))
  ranked = sorted(p.by_scope.items(), key=lambda kv: -kv[1][1])
  for (group, scope), (count, us) in ranked[:scopes]:
    lines.append(_row((group, scope, f"{count / n:.0f}",
                       f"{us / n / 1e3:.2f}", f"{100 * us / total_us:.1f}%"),
                      widths))
  return "\n".join(lines)


def parse(argv=None):
  """The command line's arguments and the e2e_bench jobs they ask for."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--side", default=e2e_bench.OURS,
                      choices=e2e_bench.SIDES + ("both",))
  parser.add_argument("--workload", default="peer26", choices=("peer26",))
  parser.add_argument("--warmup", type=int, default=20)
  parser.add_argument("--timed", type=int, default=50)
  parser.add_argument("--traced", type=int, default=10)
  parser.add_argument("--top", type=int, default=15)
  parser.add_argument("--rows", type=int, default=None,
                      help="rows per table (default the peer's 100,000)")
  parser.add_argument("--tables", type=int, default=None,
                      help="the 26 features share this many tables "
                      "(default 26; e2e_bench's `vocab` runs use 2)")
  parser.add_argument("--fed", action="store_true",
                      help="the fed twin: activations as an input")
  args = parser.parse_args(argv)
  if args.fed and (args.rows is not None or args.tables is not None):
    parser.error("--fed has no tables: --rows and --tables do not apply")
  jobs = []
  for side in e2e_bench.SIDES if args.side == "both" else (args.side,):
    job = dict(e2e_bench.peer26_job(0, 0), side=side, fed=args.fed)
    job.update({key: value for key, value in
                (("rows", args.rows), ("tables", args.tables))
                if value is not None})
    jobs.append(job)
  return args, jobs


def main():
  args, jobs = parse()
  print(f"step_profile: {os.cpu_count()} CPUs, TF {tf.__version__}, "
        f"load average {os.getloadavg()[0]:.2f}", flush=True)
  for job in jobs:
    p = profile(job, args.warmup, args.timed, args.traced)
    print(format_profile(p, top=args.top), flush=True)
    print(f"(load average after this side: {os.getloadavg()[0]:.2f})\n",
          flush=True)


if __name__ == "__main__":
  main()
