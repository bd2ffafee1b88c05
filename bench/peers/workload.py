"""The peer workload (`peer26`), shared by every side: its sizes, its data
and the same-work check. Imports only numpy, so that the project's
environment (ours, TF) and .venv-peers (TorchRec) generate the same ids
and labels from the same code.

Workload: 26 features, each its own table of 100,000 x 16; per example
and feature 1-3 ids (uniform, mean 2), Zipf-distributed (exponent 1.1,
scattered over the rows by a multiplicative hash), fixed seed; combiner
'sum' (TorchRec's EmbeddingBagCollection pools by sum); the 26 embeddings
concatenated (416) -> Dense 256 relu -> 128 relu -> 1, sigmoid
cross-entropy; batch 1024; Adagrad (lr 0.05, initial accumulator 0.1) on
the tables and on the dense variables; fp32.

Ids are padded arrays [N, MAX_IDS] with -1 after an example's ids (what
`examples.dlrm.as_sparse` turns into SparseTensors); `jagged` gives the
same ids as values and lengths (a KeyedJaggedTensor's parts).
"""
import numpy as np

FEATURES = 26
ROWS = 100_000
DIM = 16
MIN_IDS, MAX_IDS = 1, 3
ZIPF_EXPONENT = 1.1
HIDDEN = (256, 128)
BATCH = 1024
BATCHES = 32            # pre-batched, cycled
LEARNING_RATE = 0.05
INITIAL_ACCUMULATOR = 0.1
SEED = 0
CHECKED_BATCHES = 4     # batches the same-work check compares


def feature_names(count=FEATURES):
  return [f"f{i:02d}" for i in range(count)]


def zipf_ids(rng, vocabulary, shape, exponent):
  """Zipf ranks scattered over [0, vocabulary) by a multiplicative hash."""
  ranks = np.minimum(rng.zipf(exponent, size=shape), 10**9).astype(np.int64)
  return (ranks * 2654435761) % vocabulary


def make_data(num_examples=BATCHES * BATCH, features=FEATURES, rows=ROWS,
              seed=SEED):
  """({name: [N, MAX_IDS] int64 ids, -1 padded}, [N, 1] float32 labels).

  Labels come from a hidden per-id weight (summed over an example's ids)."""
  rng = np.random.RandomState(seed)
  data = {}
  logit = np.zeros(num_examples)
  positions = np.arange(MAX_IDS)
  for name in feature_names(features):
    lengths = rng.randint(MIN_IDS, MAX_IDS + 1, size=num_examples)
    ids = zipf_ids(rng, rows, (num_examples, MAX_IDS), ZIPF_EXPONENT)
    ids[positions[None, :] >= lengths[:, None]] = -1
    data[name] = ids
    weight = rng.normal(0.0, 0.5, size=rows)
    logit += np.where(ids >= 0, weight[np.maximum(ids, 0)], 0.0).sum(axis=1)
  logit = (logit - logit.mean()) / max(logit.std(), 1e-9) - 0.9
  labels = rng.uniform(size=num_examples) < 1 / (1 + np.exp(-logit))
  return data, labels.astype(np.float32).reshape(-1, 1)


def fed_activations(num_examples=BATCHES * BATCH, seed=SEED):
  """[N, FEATURES x DIM] float32: what the concatenated embeddings would
  give, at a table's scale, for the fed twins (the same dense model with
  its activations as an input: no lookup, no update)."""
  rng = np.random.RandomState(seed)
  return rng.normal(0.0, 0.05, size=(num_examples, FEATURES * DIM)).astype(
      np.float32)


def batch_slices(num_examples, batch=BATCH):
  """The consecutive whole batches the sides cycle through."""
  return [slice(b * batch, (b + 1) * batch)
          for b in range(num_examples // batch)]


def jagged(ids):
  """[n, MAX_IDS] padded ids -> (values, lengths): the present ids in
  example order and the count per example."""
  present = ids >= 0
  return ids[present], present.sum(axis=1)


def mlp_parameters(inputs=FEATURES * DIM, hidden=HIDDEN):
  """Weights and biases of inputs -> hidden... -> 1."""
  total, width = 0, inputs
  for out in tuple(hidden) + (1,):
    total += width * out + out
    width = out
  return total


# --- the same-work check ---------------------------------------------------


def batch_work(batch_ids):
  """What one batch asks of the tables: {name: [ids looked up, unique rows
  touched]} from that batch's ids of each feature (1-D arrays of present
  ids, any order)."""
  return {name: [int(np.size(ids)), int(np.unique(ids).size)]
          for name, ids in sorted(batch_ids.items())}


def work(tables, batches, batch_size, combiner, mlp, table_optimizer,
         dense_optimizer, **extra):
  """One side's description of its work, as plain JSON-able data.

  tables: {name: [rows, dim]} as the side built them; batches: a list of
  `batch_work` dicts (its first batches, as it feeds them); mlp: parameter
  count of its dense layers; the optimizers: names of what trains the
  tables and the dense variables; extra: facts printed, not compared."""
  return dict(tables={k: list(v) for k, v in sorted(tables.items())},
              batches=batches, batch_size=int(batch_size), combiner=combiner,
              mlp=int(mlp), table_optimizer=table_optimizer,
              dense_optimizer=dense_optimizer, **extra)


def expected_work(data, batches=CHECKED_BATCHES):
  """The work the data and the workload's sizes define (the reference the
  sides are checked against)."""
  return work(
      tables={name: [ROWS, DIM] for name in data},
      batches=[batch_work({n: ids[s][ids[s] >= 0] for n, ids in data.items()})
               for s in batch_slices(len(next(iter(data.values()))))[:batches]],
      batch_size=BATCH, combiner="sum", mlp=mlp_parameters(),
      table_optimizer="adagrad", dense_optimizer="adagrad")


COMPARED = ("tables", "batch_size", "combiner", "batches", "mlp",
            "table_optimizer", "dense_optimizer")


def differences(a, b, names=("a", "b")):
  """The compared facts where two work descriptions differ, as lines."""
  lines = []
  for key in COMPARED:
    if a.get(key) != b.get(key):
      lines.append(f"{key}: {names[0]} {_short(a.get(key))} != {names[1]} "
                   f"{_short(b.get(key))}")
  return lines


def summary(w):
  """One line of a work description's compared facts."""
  rows = sorted({tuple(v) for v in w["tables"].values()})
  lookups = [sum(v[0] for v in b.values()) for b in w["batches"]]
  unique = [sum(v[1] for v in b.values()) for b in w["batches"]]
  return (f"{len(w['tables'])} tables {' '.join(f'{r:,}x{d}' for r, d in rows)}"
          f", batch {w['batch_size']}, combiner {w['combiner']}, ids per "
          f"batch {lookups}, unique rows per batch {unique}, MLP "
          f"{w['mlp']:,} parameters, tables {w['table_optimizer']}, dense "
          f"{w['dense_optimizer']}")


def _short(value):
  text = repr(value)
  return text if len(text) <= 120 else text[:117] + "..."
