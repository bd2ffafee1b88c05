"""The TorchRec side of the peer benchmark: the `peer26` workload
(bench/peers/workload.py) on TorchRec's fastest CPU training path. Runs in
.venv-peers (`make venv-peers`: torch CPU, fbgemm-gpu-cpu, torchrec);
bench/peers/compare.py starts it as a subprocess.

* Tables: an EmbeddingBagCollection of the 26 tables (100,000 x 16, sum
  pooling), sharded by DistributedModelParallel on one rank (gloo, world
  size 1, loopback, a free port): table-wise, FBGEMM's fused kernel (one
  table-batched embedding module for all 26 tables, the optimizer applied
  inside the backward pass).
* Table optimizer: FBGEMM's EXACT_ADAGRAD, lr 0.05, eps 0, its per-element
  accumulators filled with 0.1 before the first step: TPU Adagrad's update
  (accumulator += g * g, then w -= lr * g / sqrt(accumulator), per element;
  a row's gradient summed over the batch's ids first, one update per
  unique row). FBGEMM's own defaults differ from TPU Adagrad (eps 1e-8
  added to the square root, accumulators starting at 0); the values here
  remove the difference and cost nothing. `--table-optimizer rowwise`
  takes EXACT_ROWWISE_ADAGRAD instead (one accumulator per row, the mean of
  g * g over the row: less optimizer work, another optimizer; the
  same-work check then says so).
* Dense: the same MLP (416 -> 256 relu -> 128 relu -> 1), wrapped by
  DistributedModelParallel in DistributedDataParallel, trained by
  torch.optim.Adagrad(lr 0.05, initial_accumulator_value 0.1);
  BCEWithLogitsLoss (mean), fp32.
* Data: workload.make_data's batches as KeyedJaggedTensors built once,
  cycled (pre-batched, like the estimator sides).
* `--fed`: the fed twin, for the embedding's cost: the same MLP, dense
  optimizer and loss in DistributedDataParallel (as DistributedModelParallel
  wraps it), trained on workload.fed_activations in place of the
  concatenated embeddings: no table, no lookup, no update.

  python -m bench.peers.torchrec_side --describe
  python -m bench.peers.torchrec_side --steps 80 --warmup 20 [--threads 2]
  python -m bench.peers.torchrec_side --fed --steps 80 --warmup 20

A run's rate: examples of the steps after `--warmup` over their wall time
(each step ends with its loss read). Prints one line `PEER_RESULT {json}`
last.
"""
import argparse
from importlib import metadata
import json
import logging
import os
import resource
import socket
import sys
import time
import warnings

import numpy as np

from bench.peers import workload as peer

# TorchRec's planner and DDP warn about single-host defaults at length
# (some of it while they are imported, hence before the imports below).
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)

import torch
import torch.distributed as dist
from torch import nn
import torchrec
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DistributedModelParallel
from fbgemm_gpu.split_embedding_configs import EmbOptimType

OPTIMIZERS = {"exact": EmbOptimType.EXACT_ADAGRAD,
              "rowwise": EmbOptimType.EXACT_ROWWISE_ADAGRAD}
TABLE_OPTIMIZER_NAMES = {EmbOptimType.EXACT_ADAGRAD: "adagrad",
                         EmbOptimType.EXACT_ROWWISE_ADAGRAD: "rowwise adagrad"}


def _mlp(width):
  """width -> workload.HIDDEN relu layers -> one logit."""
  layers = []
  for out in peer.HIDDEN:
    layers += [nn.Linear(width, out), nn.ReLU()]
    width = out
  return nn.Sequential(*layers, nn.Linear(width, 1))


def _mlp_parameters(model):
  """The parameter count of the model's `mlp` (a wrapper such as
  DistributedDataParallel prefixes its names with `module.`)."""
  return sum(p.numel() for name, p in model.named_parameters()
             if name.removeprefix("module.").startswith("mlp."))


class PeerModel(nn.Module):
  """Sum-pooled tables, concatenated, -> the MLP -> one logit."""

  def __init__(self, names):
    super().__init__()
    # Kept for `describe` (the sharded module replaces `ebc`).
    self.table_configs = [
        torchrec.EmbeddingBagConfig(
            name=f"table_{name}", embedding_dim=peer.DIM,
            num_embeddings=peer.ROWS, feature_names=[name],
            pooling=torchrec.PoolingType.SUM) for name in names
    ]
    self.ebc = torchrec.EmbeddingBagCollection(
        tables=self.table_configs,
        device=torch.device("meta"))  # DMP materializes the shards
    self.mlp = _mlp(len(names) * peer.DIM)

  def forward(self, kjt):
    return self.mlp(self.ebc(kjt).values())


def _free_port():
  with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0))
    return sock.getsockname()[1]


def _init_process_group():
  os.environ["MASTER_ADDR"] = "127.0.0.1"
  os.environ["MASTER_PORT"] = str(_free_port())
  os.environ.setdefault("LOCAL_WORLD_SIZE", "1")
  dist.init_process_group("gloo", rank=0, world_size=1)


def _batches(data, labels):
  """[(KeyedJaggedTensor, labels)] of the data's whole batches."""
  names = list(data)
  result = []
  for part in peer.batch_slices(len(labels)):
    values, lengths = zip(*(peer.jagged(data[name][part]) for name in names))
    kjt = torchrec.KeyedJaggedTensor(
        keys=names, values=torch.from_numpy(np.concatenate(values)),
        lengths=torch.from_numpy(np.concatenate(lengths).astype(np.int64)))
    result.append((kjt, torch.from_numpy(labels[part])))
  return result


def _table_modules(model):
  """FBGEMM's table-batched embedding modules inside the sharded EBC."""
  # TorchRec offers no public handle on them (they are not among the
  # model's modules()): its lookups hold them.
  sharded = model.module.ebc
  return [group.emb_module for lookup in sharded._lookups
          for group in lookup._emb_modules]


def build(optimizer):
  """(DistributedModelParallel model, dense optimizer, batches)."""
  data, labels = peer.make_data()
  sharder = EmbeddingBagCollectionSharder(fused_params={
      "optimizer": OPTIMIZERS[optimizer],
      "learning_rate": peer.LEARNING_RATE,
      "eps": 0.0,
  })
  model = DistributedModelParallel(PeerModel(list(data)),
                                   device=torch.device("cpu"),
                                   sharders=[sharder])
  with torch.no_grad():
    for module in _table_modules(model):
      # TPU Adagrad's initial accumulator (FBGEMM starts from 0).
      module.momentum1_host.fill_(peer.INITIAL_ACCUMULATOR)
  dense = [p for name, p in model.named_parameters() if ".ebc." not in
           f".{name}"]
  dense_optimizer = torch.optim.Adagrad(
      dense, lr=peer.LEARNING_RATE,
      initial_accumulator_value=peer.INITIAL_ACCUMULATOR)
  return model, dense_optimizer, _batches(data, labels)


class FedModel(nn.Module):
  """The fed twin: the MLP alone, on the activations as an input."""

  def __init__(self):
    super().__init__()
    self.mlp = _mlp(peer.FEATURES * peer.DIM)

  def forward(self, activations):
    return self.mlp(activations)


def build_fed():
  """(the fed twin in DistributedDataParallel, dense optimizer, batches of
  (activations, labels))."""
  _, labels = peer.make_data()
  activations = torch.from_numpy(peer.fed_activations(len(labels)))
  model = nn.parallel.DistributedDataParallel(FedModel())
  dense_optimizer = torch.optim.Adagrad(
      model.parameters(), lr=peer.LEARNING_RATE,
      initial_accumulator_value=peer.INITIAL_ACCUMULATOR)
  batches = [(activations[part], torch.from_numpy(labels[part]))
             for part in peer.batch_slices(len(labels))]
  return model, dense_optimizer, batches


def _threads():
  return (f"torch intra-op {torch.get_num_threads()}, inter-op "
          f"{torch.get_num_interop_threads()}")


def _version():
  return (f"torch {torch.__version__}, fbgemm-gpu-cpu "
          f"{metadata.version('fbgemm-gpu-cpu')}, torchrec "
          f"{metadata.version('torchrec')}")


def describe(model, dense_optimizer, batches, count=peer.CHECKED_BATCHES):
  """The work as built: tables from the sharded module's weights, ids from
  the KeyedJaggedTensors fed, the MLP's parameters, the optimizers."""
  configs = model.module.table_configs
  weights = dict(model.named_parameters())
  tables, combiners = {}, set()
  for config in configs:
    (name,) = config.feature_names
    rows, dim = weights[f"ebc.embedding_bags.{config.name}.weight"].shape
    tables[name] = [int(rows), int(dim)]
    combiners.add(config.pooling.name.lower())
  modules = _table_modules(model)
  kinds = {module.optimizer for module in modules}
  fed = []
  for kjt, _ in batches[:count]:
    fed.append(peer.batch_work(
        {name: jt.values().numpy() for name, jt in kjt.to_dict().items()}))
  mlp = _mlp_parameters(model)
  momentum = modules[0].momentum1_host
  return peer.work(
      tables=tables, batches=fed, batch_size=len(batches[0][1]),
      combiner=combiners.pop() if len(combiners) == 1 else sorted(combiners),
      mlp=mlp,
      table_optimizer=(TABLE_OPTIMIZER_NAMES.get(kinds.pop(), "other")
                       if len(kinds) == 1 else "mixed"),
      dense_optimizer=type(dense_optimizer).__name__.lower(),
      table_optimizer_detail=(
          f"FBGEMM fused {modules[0].optimizer.name} in "
          f"{len(modules)} table-batched module(s), lr "
          f"{modules[0].get_learning_rate():g}, eps "
          f"{modules[0].optimizer_args.eps:g}, accumulators "
          f"{momentum.numel():,} (one per "
          f"{'element' if momentum.numel() == len(tables) * peer.ROWS * peer.DIM else 'row'}"
          f") starting at {float(momentum[0]):g}"),
      dense_optimizer_detail="torch.optim.Adagrad(lr 0.05, "
      "initial_accumulator_value 0.1)",
      sharding=f"DistributedModelParallel, world size "
      f"{dist.get_world_size()}, gloo",
      threads=_threads(), version=_version())


def _step(model, dense_optimizer, loss_fn, inputs, labels):
  loss = loss_fn(model(inputs), labels)
  dense_optimizer.zero_grad()
  loss.backward()  # the fused optimizer updates the tables here
  dense_optimizer.step()
  return loss.item()


def update_check(model, dense_optimizer, batches):
  """One step, then the first table's rows against TPU Adagrad's update:
  each touched element moved by lr * g / sqrt(acc) with acc = 0.1 + g * g
  (g recovered from the move and the accumulator), untouched rows and
  accumulators unchanged. Returns the largest relative error. The step's
  loss is summed over the batch, not averaged, so that g * g stands well
  above the float32 resolution of an accumulator near 0.1."""
  module = _table_modules(model)[0]
  kjt, labels = batches[0]
  touched = np.unique(kjt.to_dict()[kjt.keys()[0]].values().numpy())
  weights = module.split_embedding_weights()[0]
  before = weights.detach().clone()
  _step(model, dense_optimizer, nn.BCEWithLogitsLoss(reduction="sum"), kjt,
        labels)
  after = weights.detach()
  acc = module.split_optimizer_states()[0][0].detach().reshape(after.shape)
  untouched = np.setdiff1d(np.arange(peer.ROWS), touched)
  if not (torch.equal(before[untouched], after[untouched]) and torch.all(
      acc[untouched] == peer.INITIAL_ACCUMULATOR)):
    raise AssertionError("the fused Adagrad changed rows no id touched")
  moved = (before[touched] - after[touched]).double()
  acc = acc[touched].double()
  grad = moved * acc.sqrt() / peer.LEARNING_RATE
  squares = acc - peer.INITIAL_ACCUMULATOR
  error = float((grad * grad - squares).abs().max() /
                squares.abs().max().clamp_min(1e-30))
  if error > 1e-3:
    raise AssertionError(f"the fused Adagrad's update is not TPU Adagrad's "
                         f"(relative error {error:.2g})")
  return error


def timed(model, dense_optimizer, batches, steps, warmup):
  loss_fn = nn.BCEWithLogitsLoss()
  model.train()
  times = []
  for step in range(steps):
    inputs, labels = batches[step % len(batches)]
    _step(model, dense_optimizer, loss_fn, inputs, labels)
    times.append(time.perf_counter())
  steady = np.diff(times[warmup:])
  mlp = _mlp_parameters(model)
  return {"examples_per_s": peer.BATCH * len(steady) / float(steady.sum()),
          "median_step_ms": float(np.median(steady)) * 1e3,
          "max_rss_mb": resource.getrusage(
              resource.RUSAGE_SELF).ru_maxrss / 1024.0,
          "mlp": int(mlp), "threads": _threads(), "version": _version()}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--describe", action="store_true")
  parser.add_argument("--steps", type=int, default=80)
  parser.add_argument("--warmup", type=int, default=20)
  parser.add_argument("--threads", type=int, default=os.cpu_count(),
                      help="torch.set_num_threads (default: the CPUs)")
  parser.add_argument("--table-optimizer", choices=sorted(OPTIMIZERS),
                      default=None, help="default: exact")
  parser.add_argument("--fed", action="store_true",
                      help="time the fed twin (the MLP on fed activations)")
  args = parser.parse_args()
  if args.fed and (args.describe or args.table_optimizer):
    parser.error("--fed has no tables: --describe and --table-optimizer do "
                 "not apply")
  args.table_optimizer = args.table_optimizer or "exact"
  torch.set_num_threads(args.threads)
  _init_process_group()
  try:
    model, dense_optimizer, batches = (build_fed() if args.fed else
                                       build(args.table_optimizer))
    if args.describe:
      result = describe(model, dense_optimizer, batches)
      if args.table_optimizer == "exact":
        result["update_check"] = (
            "one step's moves and accumulators of the first table's rows "
            "are TPU Adagrad's (relative error "
            f"{update_check(model, dense_optimizer, batches):.1g}), "
            "untouched rows unchanged")
    else:
      result = timed(model, dense_optimizer, batches, args.warmup + args.steps,
                     args.warmup)
  finally:
    dist.destroy_process_group()
  print("PEER_RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
  sys.exit(main())
