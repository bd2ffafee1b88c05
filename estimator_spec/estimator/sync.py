"""Synchronous training steps on a between-graph cluster (docs/numerics.md,
'Many machines').

One step, global step g at its start, W training tasks, P ps tasks:

1. Every training task looks up its share of the batch, runs the model and
   its backward pass, and sends its gradients, split by ps task, into its
   own queue on each ps task: one entry of two tensors (docs/cluster.md,
   'Requests per step'): the lookup's request there (the distinct local
   ids of each table partition on that ps), and one float32 tensor (g, the
   float32 gradients of the dense variables on that ps, then the learning
   rate and the gradient sums of each of those partitions); other dense
   gradients (sparse, or of other types) as components of their own.
2. The chief takes one entry per task from every queue (entries of another
   step, left by a task that died or by a restored chief, are dropped), and
   on each ps task sums the embedding gradients per id and runs the
   optimizer once per touched row there (the tables never leave their ps);
   it averages the dense gradients and applies them with the model's own
   optimizer, which advances the global step by one. The two updates run
   side by side, and the optimizer's is built under ps 0's device: its
   join and the step's increment run on ps 0, so once the entries are
   taken nothing waits for a round trip through the chief.
3. The chief then tells every worker that step g is done; a worker's step
   ends when it hears so (or that its entry was dropped: it then reruns).

Each task's loss is the mean over its B/W examples, so its embedding
gradients are W times its share of the global-batch gradient: the chief
scales the per-id sums by 1/W, as `CrossShardOptimizer`'s MEAN reduction
scales each replica's loss on a TPU; the dense gradients are averaged as
`CrossShardOptimizer` averages them. W tasks with B/W examples each thus
train as one process with B examples (up to the order of float32 sums).

The dense gradients are taken where model_fn's optimizer applies them:
while model_fn runs, `tf.compat.v1.train.Optimizer.apply_gradients` records
its arguments and returns an op that stands for the step's update; the
update itself is built after model_fn returns, once the embedding gradients
are known too.

`SyncWatchHook` gives each step a deadline (`ClusterTraining`'s
`step_timeout_secs`) and logs, while a step waits, which tasks have not sent
their gradients; the estimator turns the deadline's error into
`errors.SyncStepTimeoutError` naming them.
"""
import collections
import contextlib
import threading
import time

import tensorflow as tf

from estimator_spec import errors
from estimator_spec.tf_patches import apply_gradients as apply_gradients_patch
from estimator_spec.tf_patches import control_inputs

_DONE = 0      # reply: step (value - 1) is applied
_DROPPED = 1   # reply: the entry of step `value` was dropped; run it again
_PREFIX = "estimator_spec_sync"
_QUEUE_CAPACITY = 8
SUM_REDUCTION_REFUSED = (
    "TPUEstimator: CrossShardOptimizer(reduction=SUM) in synchronous "
    "training on a cluster: the training tasks' gradients are averaged (the "
    "MEAN reduction, CrossShardOptimizer's default); summing them is not "
    "supported. Use the default reduction (and scale the learning rate if "
    "you relied on the sum).")
_REPLY_CAPACITY = 64


# An entry's float32 component starts with the step (int64, its bits as
# two float32 values: a queue, a concat and a slice copy bits unchanged).
_STEP_FLOATS = 2


def _entry_step(entry):
  """The step of an entry (read where the entry is)."""
  return tf.bitcast(entry["floats"][:_STEP_FLOATS], tf.int64)


def _packs(grad, var):
  """Whether a dense gradient travels in its entry's float32 component: a
  float32 tensor of its variable's static shape."""
  return (not isinstance(grad, tf.IndexedSlices) and
          grad.dtype == tf.float32 and var.shape.is_fully_defined())


def _dense_key(call, position):
  """The name of a dense gradient in an entry (sparse: also
  `<name>/indices`): model_fn's `call`-th apply_gradients, `position`-th
  pair."""
  return f"dense/{call}/{position}"


def _ps_of_variable(variable):
  """The ps task of a dense variable: its device, which Estimator's replica
  device setter chose (the placement decides table partitions only)."""
  spec = tf.DeviceSpec.from_string(variable.device or "")
  if spec.job == "ps" and spec.task is not None:
    return int(spec.task)
  return 0


def _packed_dense(ps, dense):
  """[(call, position, variable, gradient, offset, size)] of the dense
  gradients on `ps` that travel in the float32 component (after the step),
  and where the rest of that component starts."""
  packed, offset = [], _STEP_FLOATS
  for c, k, var, grad, p in dense:
    if p == ps and _packs(grad, var):
      size = var.shape.num_elements()
      packed.append((c, k, var, grad, offset, size))
      offset += size
  return packed, offset


def _joined(entries, name):
  """Component `name` of every task's entry, concatenated."""
  return tf.concat([e[name] for e in entries], axis=0)


class _Call(collections.namedtuple(
    "_Call",
    ["optimizer", "grads_and_vars", "global_step", "name", "op", "scope"])):
  """One call of `Optimizer.apply_gradients` made by model_fn (`scope`: the
  name scope it was made in)."""

  def apply(self, original, grads_and_vars):
    """The optimizer's own update with `grads_and_vars`, built in the name
    scope of the call (non-slot variables such as Adam's `beta1_power` are
    named by it, as in one process)."""
    with tf.compat.v1.name_scope(self.scope + "/" if self.scope else None):
      return original(self.optimizer, grads_and_vars, self.global_step,
                      self.name)


class SyncStep:
  """The synchronous machinery of one TRAIN model_fn call on a cluster.

  Use: `with step.recording(): <model_fn>`, then
  `step.finish(spec, step_value, embedding)`.

  Args:
    placement: the estimator's `placement.Placement` (the cluster, and
      which ps task holds each table partition).
    options: the `ClusterTraining`.
    reports: the list where the watch hook leaves its last report.
  """

  def __init__(self, placement, options, reports):
    self._placement = placement
    self._cluster = placement.cluster
    self._options = options
    self._reports = reports  # where the watch hook leaves its last report
    self._local = set()
    self._calls = []
    self._original_apply = None
    self._late_replies = None  # the chief's replies, sent by a hook
    self._resources = {}  # queues and the contributions table, built once
    self._ids_dtype = None  # of the lookup's requests (`engine.requests`)

  def add_local_variables(self, variables):
    """Variables of this task only (never sent, applied by the chief as
    model_fn's optimizer gives them)."""
    self._local.update(id(v) for v in variables)

  @contextlib.contextmanager
  def recording(self):
    """Inside: model_fn's `apply_gradients` calls are recorded, not run
    (`tf_patches.apply_gradients`)."""
    calls = self._calls

    def apply_gradients(optimizer, grads_and_vars, global_step=None,
                        name=None):
      grads_and_vars = tuple(grads_and_vars)
      scope = tf.compat.v1.get_default_graph().get_name_scope()
      op = tf.no_op(name="synchronous_apply_gradients")
      calls.append(_Call(optimizer, grads_and_vars, global_step, name, op,
                         scope))
      return op

    graph = tf.compat.v1.get_default_graph()
    first = len(graph.get_operations())
    with apply_gradients_patch.replaced(apply_gradients) as original:
      self._original_apply = original
      yield
    _refuse_own_step_increments(graph.get_operations()[first:])

  def finish(self, spec, step_value, embedding=None, engine=None):
    """`spec` with a train op that runs the synchronous step and a
    `SyncWatchHook`.

    Args:
      spec: model_fn's EstimatorSpec (TRAIN).
      step_value: the global step read at the start of the step.
      embedding: the step's `engine.StepGradients`, or None.
      engine: the `HostEmbeddingEngine` (with `embedding`).
    """
    if not self._calls:
      raise ValueError(
          "TPUEstimator: synchronous training on a cluster averages the dense "
          "gradients where model_fn's optimizer applies them, but model_fn "
          "did not call `apply_gradients` (or `minimize`) of a "
          "tf.compat.v1.train optimizer. Train the dense model with one "
          "(wrapping it in tf.compat.v1.tpu.CrossShardOptimizer is fine), or "
          "pass cluster_training=estimator_spec.ClusterTraining("
          "asynchronous=True).")
    step = tf.cast(step_value, tf.int64)
    if embedding is not None:
      self._ids_dtype = embedding.requests.dtype
    cluster = self._cluster
    dense = self._dense_entries()
    tables = (self._placement.partitions(engine.model)
              if embedding is not None else [])
    with tf.compat.v1.name_scope("synchronous_step"):
      pushes, steps = self._push(step, dense, tables, embedding)
      if cluster.is_chief:
        done = self._chief_step(steps, pushes, dense, tables, embedding,
                                engine)
      else:
        done = self._await_chief(steps[0], pushes)
    if not cluster.is_chief:
      # A worker builds (never runs) the update too, so that it creates the
      # optimizer's slot variables as the chief does: a replica device
      # setter places variables round-robin in creation order, so every
      # task's graph must create the same variables in the same order.
      for call in self._calls:
        self._update(call, call.grads_and_vars)
    for call in self._calls:
      # model_fn's train op holds the stand-ins, built before `done`.
      control_inputs.add_control_input(call.op, done)
    hooks = list(spec.training_hooks) + [
        SyncWatchHook(cluster, self._options, self._contributions(),
                      self._reports)
    ]
    if self._late_replies is not None:
      hooks.append(_ReplyHook(self._late_replies))
    return spec._replace(train_op=tf.group(spec.train_op, done),
                         training_hooks=hooks)

  # --- what is sent ------------------------------------------------------------

  def _dense_entries(self):
    """[(call index, position, variable, gradient, ps index)] of every
    gradient model_fn's optimizer would apply to a shared variable."""
    entries = []
    for c, call in enumerate(self._calls):
      for position, (grad, var) in enumerate(call.grads_and_vars):
        if grad is None or id(var) in self._local:
          continue
        entries.append((c, position, var, grad, _ps_of_variable(var)))
    return entries

  def _components(self, ps, dense, tables):
    """{component name: dtype} of an entry in a queue on `ps`: `ids`, the
    lookup's request of the table partitions there (`engine.requests`),
    `floats`: the step, the float32 dense gradients of the variables there
    (`_packed_dense`) and the update request of the table partitions
    there; the other dense gradients there (indices and values when
    sparse). The one description of an entry: the queue, the sender and
    the chief use it."""
    components = {}
    if any(where == ps for _, _, where in tables):
      components["ids"] = self._ids_dtype
    components["floats"] = tf.float32
    for c, k, var, grad, p in dense:
      if p == ps and not _packs(grad, var):
        if isinstance(grad, tf.IndexedSlices):
          components[_dense_key(c, k) + "/indices"] = tf.int64
          components[_dense_key(c, k)] = grad.values.dtype
        else:
          components[_dense_key(c, k)] = grad.dtype
    return components

  def _queue(self, task, ps, dense, tables):
    """`task`'s gradient queue on `ps` (one op per graph)."""
    key = ("gradients", task, ps)
    if key not in self._resources:
      components = self._components(ps, dense, tables)
      with tf.compat.v1.device(self._cluster.ps_device(ps)):
        self._resources[key] = tf.compat.v1.FIFOQueue(
            _QUEUE_CAPACITY, list(components.values()),
            names=list(components),
            shared_name=f"{_PREFIX}/gradients/task_{task}/ps_{ps}",
            name=f"gradients_task_{task}_ps_{ps}")
    return self._resources[key]

  def _reply_queue(self, task):
    """The chief's replies to `task` (on ps 0; one op per graph)."""
    key = ("replies", task)
    if key not in self._resources:
      with tf.compat.v1.device(self._cluster.ps_device(0)):
        self._resources[key] = tf.compat.v1.FIFOQueue(
            _REPLY_CAPACITY, [tf.int64, tf.int64], shapes=[[], []],
            shared_name=f"{_PREFIX}/replies/task_{task}",
            name=f"replies_task_{task}")
    return self._resources[key]

  def _contributions(self):
    """{training task index: last step it sent} (a hash table on ps 0;
    one op per graph)."""
    if "contributions" not in self._resources:
      with tf.compat.v1.device(self._cluster.ps_device(0)):
        self._resources["contributions"] = tf.raw_ops.MutableHashTableV2(
            key_dtype=tf.int64, value_dtype=tf.int64,
            shared_name=f"{_PREFIX}/contributions", name="contributions")
    return self._resources["contributions"]

  def _push(self, step, dense, tables, embedding):
    """Sends this task's gradients of the step: one entry per ps task.
    Returns (the ops, [the step as each ps task received it]): a task
    sends its step once per ps task, in the entry."""
    cluster = self._cluster
    values = {}
    for c, k, var, grad, _ in dense:
      if isinstance(grad, tf.IndexedSlices):
        values[_dense_key(c, k) + "/indices"] = tf.cast(grad.indices,
                                                       tf.int64)
        values[_dense_key(c, k)] = grad.values
      elif not _packs(grad, var):
        values[_dense_key(c, k)] = grad
    pushes, steps = [], []
    for ps in range(cluster.num_ps):
      components = self._components(ps, dense, tables)
      entry = {name: values[name] for name in components
               if name in values}
      entry["floats"] = self._floats(ps, step, dense, embedding,
                                     "ids" in components)
      if "ids" in components:
        entry["ids"] = embedding.requests.ids(cluster.ps_device(ps))
      queue = self._queue(cluster.index, ps, dense, tables)
      with tf.compat.v1.device(cluster.ps_device(ps)):
        pushes.append(queue.enqueue({name: entry[name]
                                     for name in components}))
        steps.append(_entry_step(entry))
    with tf.control_dependencies(pushes), tf.compat.v1.device(
        cluster.ps_device(0)):
      record = tf.raw_ops.LookupTableInsertV2(
          table_handle=self._contributions(),
          keys=tf.constant([cluster.index], tf.int64),
          values=tf.reshape(steps[0], [1]))
    return pushes + [record], steps

  def _floats(self, ps, step, dense, embedding, has_tables):
    """The float32 component of this task's entry on `ps` (see
    `_components`), built on this task."""
    pieces = [tf.bitcast(step, tf.float32)]
    for _, _, _, grad, _, _ in _packed_dense(ps, dense)[0]:
      pieces.append(tf.reshape(grad, [-1]))
    if has_tables:
      with tf.control_dependencies([embedding.gate]):
        pieces.append(embedding.requests.gradients(
            self._cluster.ps_device(ps), embedding.grads, embedding.rates))
    return tf.concat(pieces, axis=0)

  # --- the chief ---------------------------------------------------------------

  def _take(self, task, ps, step, dense, tables):
    """The entry of `step` from `task`'s queue on `ps` (dropping others)."""
    queue = self._queue(task, ps, dense, tables)
    reply = self._reply_queue(task) if task and ps == 0 else None

    def stale(entry):
      return tf.not_equal(_entry_step(entry), step)

    def next_entry(entry):
      ops = []
      if reply is not None:
        # Only ps 0 answers for a dropped entry: one answer per entry.
        ops.append(reply.enqueue([tf.constant(_DROPPED, tf.int64),
                                  _entry_step(entry)]))
      with tf.control_dependencies(ops):
        return (queue.dequeue(),)

    with tf.compat.v1.device(self._cluster.ps_device(ps)):
      first = queue.dequeue()
      (entry,) = tf.while_loop(
          stale, next_entry, (first,),
          shape_invariants=(
              {name: tf.TensorShape(None) for name in first},),
          back_prop=False, name=f"take_task_{task}")
    return entry

  def _chief_step(self, steps, pushes, dense, tables, embedding, engine):
    """The chief's part of the step (`steps`: its value on each ps task):
    takes every task's entry on each ps, updates the table partitions
    there and applies the averaged dense gradients, then replies to the
    workers. Returns the op of the step."""
    cluster = self._cluster
    updates = []
    averaged = {}
    for ps in range(cluster.num_ps):
      # Each task's entry on a ps is sent after the task received the rows
      # it looked up there (`StepRequests.gradients`): once every entry
      # there is taken, pipelining may apply the previous step's held
      # update.
      with tf.control_dependencies([pushes[ps]]):
        entries = [self._take(task, ps, steps[ps], dense, tables)
                   for task in range(cluster.num_training_tasks)]
      with tf.compat.v1.device(cluster.ps_device(ps)):
        with tf.control_dependencies([_entry_step(e) for e in entries]):
          done = self._table_updates(ps, entries, dense, embedding, engine)
          # One op per ps that the others wait for.
          updates.append(tf.group(*done, name=f"table_updates_ps_{ps}"))
        averaged.update(self._dense_averages(ps, entries, dense))
    applied = self._apply_dense(averaged)
    pipelined = (engine is not None and
                 engine.model.pipeline_execution_with_tensor_core)
    # The step ends once every update and this task's record of what it
    # sent (`pushes[-1]`, which the watch hook reads) are done.
    return self._reply(steps[0], applied + updates + pushes[-1:], pipelined)

  def _table_updates(self, ps, entries, dense, embedding, engine):
    """The update of each table partition on `ps` from every task's ids and
    gradients (`engine.requests`: each entry's `ids` and the rest of its
    `floats`), at the chief's learning rates: the engine sums them per id,
    scaled by 1/W (see module)."""
    if "ids" not in entries[0]:
      return []
    scale = 1.0 / self._cluster.num_training_tasks
    device = self._cluster.ps_device(ps)
    _, start = _packed_dense(ps, dense)
    tasks = [embedding.requests.unpack(device, e["ids"], e["floats"][start:])
             for e in entries]
    updates = []
    for k, (name, p, _, _, lr) in enumerate(tasks[0]):
      ids = tf.concat([task[k][2] for task in tasks], axis=0)
      grads = tf.concat([task[k][3] for task in tasks], axis=0)
      updates.append(engine.update_partition_contributions(
          name, p, ids, grads, lr, scale=scale))
    return updates

  def _dense_averages(self, ps, entries, dense):
    """{(call, position): the average over the tasks of the gradient} of
    each dense variable on `ps`."""
    scale = 1.0 / self._cluster.num_training_tasks
    averaged = {}
    for c, k, var, _, offset, size in _packed_dense(ps, dense)[0]:
      total = tf.math.add_n([
          tf.reshape(e["floats"][offset:offset + size], var.shape)
          for e in entries])
      averaged[(c, k)] = total * tf.cast(scale, total.dtype)
    for c, k, var, grad, p in dense:
      if p != ps or _packs(grad, var):
        continue
      name = _dense_key(c, k)
      if isinstance(grad, tf.IndexedSlices):
        values = _joined(entries, name)
        averaged[(c, k)] = tf.IndexedSlices(
            values * tf.cast(scale, values.dtype),
            _joined(entries, name + "/indices"), grad.dense_shape)
      else:
        total = tf.math.add_n([e[name] for e in entries])
        averaged[(c, k)] = tf.ensure_shape(
            total * tf.cast(scale, total.dtype), grad.shape)
    return averaged

  def _apply_dense(self, averaged):
    """model_fn's optimizer updates with the `averaged` gradients of the
    shared variables and this task's own of its local ones. They run beside
    the table updates: the step's replies wait for both."""
    applied = []
    for c, call in enumerate(self._calls):
      grads_and_vars = [
          (averaged[(c, k)] if (c, k) in averaged else grad, var)
          for k, (grad, var) in enumerate(call.grads_and_vars)
          if (c, k) in averaged or (grad is not None and
                                   id(var) in self._local)
      ]
      applied.append(self._update(call, grads_and_vars))
    return applied

  def _update(self, call, grads_and_vars):
    """model_fn's optimizer update of `call` with `grads_and_vars`, built
    under ps 0's device (the same on every task, so that every task's graph
    places the optimizer's variables alike): the op that joins its
    per-device updates then runs on ps 0, beside the global step it
    advances and the replies that wait for it, not on this task."""
    with tf.compat.v1.device(self._cluster.ps_device(0)):
      return call.apply(self._original_apply, grads_and_vars)

  def _reply(self, step, done, pipelined):
    """The op of the chief's step (`done`: its updates), which tells the
    workers that step `step` (read on ps 0) is done; with pipelining, the
    telling is left to `_ReplyHook`."""
    cluster = self._cluster
    workers = range(1, cluster.num_training_tasks)
    if pipelined:
      # With pipelining, the chief may apply the held update between steps
      # (before a checkpoint): the workers may start their next lookups only
      # after that, so the chief tells them after its checkpoint hook has
      # run (`_ReplyHook`), not in the step.
      with tf.control_dependencies(None), tf.compat.v1.device(
          cluster.ps_device(0)):
        now = tf.cast(tf.compat.v1.train.get_global_step().read_value(),
                      tf.int64)
        self._late_replies = tf.group(*[
            self._reply_queue(task).enqueue([tf.constant(_DONE, tf.int64),
                                             now])
            for task in workers
        ], name="synchronous_step_replies")
    if pipelined or not workers:
      return tf.group(*done, name="synchronous_step_done")
    with tf.control_dependencies(done), tf.compat.v1.device(
        cluster.ps_device(0)):
      replies = [
          self._reply_queue(task).enqueue(
              [tf.constant(_DONE, tf.int64), step + 1])
          for task in workers
      ]
    # The replies wait for every update: the step's op is theirs, one op
    # on ps 0 (a group that also named the updates elsewhere would wait
    # for them there, a round trip between the ps tasks).
    with tf.compat.v1.device(cluster.ps_device(0)):
      return tf.group(*replies, name="synchronous_step_done")

  # --- a worker ----------------------------------------------------------------

  def _await_chief(self, step, pushes):
    reply = self._reply_queue(self._cluster.index)

    def waiting(kind, value):
      done = tf.logical_and(tf.equal(kind, _DONE), value > step)
      dropped = tf.logical_and(tf.equal(kind, _DROPPED), tf.equal(value, step))
      return tf.logical_not(tf.logical_or(done, dropped))

    def next_reply(kind, value):
      del kind, value
      return reply.dequeue()

    with tf.control_dependencies(pushes), tf.compat.v1.device(
        self._cluster.ps_device(0)):
      kind, value = reply.dequeue()
      answer = tf.while_loop(waiting, next_reply, [kind, value],
                             back_prop=False, name="await_chief")
    return tf.group(*answer, name="synchronous_step_done")


def _refuse_own_step_increments(ops):
  """In a synchronous step only the chief's update advances the global step
  (through the optimizer's `global_step` argument); model_fn writing it
  itself would advance it once per task."""
  step = tf.compat.v1.train.get_global_step()
  if step is None:
    return
  handle = (step.handle if hasattr(step, "handle") else step.op.outputs[0])
  writes = [
      op.name for op in ops
      if op.type in ("AssignAddVariableOp", "AssignVariableOp", "AssignAdd",
                     "Assign") and op.inputs and op.inputs[0].name == handle.name
  ]
  if writes:
    raise ValueError(
        "TPUEstimator: model_fn writes the global step itself (ops "
        f"{writes}); in synchronous training on a cluster every task runs "
        "model_fn's train op, so the step would advance once per task. Pass "
        "it to the optimizer instead (`minimize(loss, global_step=...)`), "
        "which advances it once per synchronous step, or use "
        "ClusterTraining(asynchronous=True).")


class _ReplyHook(tf.compat.v1.train.SessionRunHook):
  """The chief's "step done" to the workers, after each step's hooks that
  come before it (Estimator runs the chief's checkpoint hook, whose
  listeners apply a held pipelined update, before the model's hooks)."""

  def __init__(self, replies):
    self._replies = replies

  def after_run(self, run_context, run_values):
    del run_values
    run_context.session.run(self._replies)


class SyncWatchHook(tf.compat.v1.train.SessionRunHook):
  """Gives every training step a deadline and, while a step waits, logs
  which training tasks have not sent their gradients for it."""

  def __init__(self, cluster, options, contributions, reports):
    self._cluster = cluster
    self._options = options
    self._reports = reports
    self._export = tf.raw_ops.LookupTableExportV2(
        table_handle=contributions, Tkeys=tf.int64, Tvalues=tf.int64)
    self._global_step = tf.compat.v1.train.get_global_step()
    self._session = None
    # One watcher thread per session, woken by each step: starting a thread
    # per step costs more than 100 us and waits for the new thread to be
    # scheduled, on every task's step.
    self._condition = threading.Condition()
    self._deadline = None  # when the running step is next reported, or None
    self._started = None   # when the running step started
    self._closed = True
    self._watcher = None

  def after_create_session(self, session, coord):
    del coord
    with self._condition:
      self._session = session
      self._closed = False
      if self._watcher is None or not self._watcher.is_alive():
        self._watcher = threading.Thread(
            target=self._watch, name="synchronous_step_watch", daemon=True)
        self._watcher.start()

  def before_run(self, run_context):
    del run_context
    with self._condition:
      self._started = time.monotonic()
      self._deadline = self._started + self._options.report_after_secs
      self._condition.notify()
    options = tf.compat.v1.RunOptions(
        timeout_in_ms=int(self._options.step_timeout_secs * 1000))
    return tf.compat.v1.train.SessionRunArgs(None, options=options)

  def after_run(self, run_context, run_values):
    del run_context, run_values
    with self._condition:
      self._deadline = None

  def end(self, session):
    del session
    with self._condition:
      self._deadline = None
      self._closed = True
      self._condition.notify()

  def _watch(self):
    """The watcher thread: reports a step that runs past its deadline, then
    again every `report_after_secs` while it still runs; ends with the
    session, or when a report cannot be read."""
    with self._condition:
      while not self._closed:
        if self._deadline is None:
          self._condition.wait()
          continue
        remaining = self._deadline - time.monotonic()
        if remaining > 0:
          self._condition.wait(remaining)
          continue
        self._deadline += self._options.report_after_secs
        started, session = self._started, self._session
        self._condition.release()
        try:
          reported = self._report(started, session)
        finally:
          self._condition.acquire()
        if not reported:
          # The step's state cannot be read: its session is most likely
          # gone (a failed step does not end the hook), and with it this
          # thread; a new session starts another.
          self._deadline = None
          return

  def _report(self, started, session):
    """Logs which tasks the running step waits for; False when that cannot
    be read."""
    # Whatever the read raises means it cannot be read: the step ended or
    # the session closed meanwhile.
    try:
      step, names = self.waiting_for(session)
    except Exception:
      return False
    self._reports.append((step, names))
    waited = time.monotonic() - started
    tf.compat.v1.logging.warning(
        "Synchronous step %d has waited %.0f s for gradients from: %s "
        "(the step fails after %.0f s: ClusterTraining(step_timeout_secs)).",
        step, waited, ", ".join(names) or "none (the chief is applying it)",
        self._options.step_timeout_secs)
    return True

  def waiting_for(self, session):
    """(step, [names of training tasks that have not sent it])."""
    step, (keys, values) = session.run([self._global_step, self._export])
    sent = dict(zip(keys.tolist(), values.tolist()))
    names = []
    for index in range(self._cluster.num_training_tasks):
      last = sent.get(index)
      if last is None or last < step:
        name = self._cluster.training_task_name(index)
        names.append(name + (" (nothing sent yet)" if last is None else
                             f" (last sent step {last})"))
    return step, names


def timeout_error(reports, error):
  """A `errors.SyncStepTimeoutError` for a step's DeadlineExceededError;
  `reports`: what the watch hooks reported, [(step, [task names])]."""
  report = reports[-1] if reports else None
  detail = (f"; step {report[0]} was waiting for: " + ", ".join(report[1])
            if report and report[1] else "")
  return errors.SyncStepTimeoutError(
      "A synchronous training step did not complete within "
      f"ClusterTraining(step_timeout_secs) seconds{detail}. A training task "
      "stopped sending gradients: restart it (it rejoins), or raise "
      f"step_timeout_secs. ({error.message})")
