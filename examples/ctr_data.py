"""Deterministic synthetic click data for the DLRM-style example.

Ids follow Zipf laws (a few ids are frequent, most are rare), as in real
logs. A hidden model gives every id of every feature a weight; an example's
click probability is sigmoid(sum of its ids' weights + a numeric term), so a
model that learns the frequent ids' embeddings beats chance, visibly.

Features come as padded dense arrays: ids padded with -1, strings with "",
weights with 0.0, which feature columns read as "no value here".
"""
import numpy as np

from examples import dlrm

DAYS = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]

# Multi-valued features: (name, maximum ids per example, minimum).
_MULTI = {"query_terms": (5, 1), "clicked_items": (20, 0),
          "recent_queries": (10, 0)}


def _zipf_ids(rng, vocabulary, shape, exponent=1.2):
  """Zipf-distributed ids in [0, vocabulary), rank r scattered by a fixed
  multiplicative hash so frequent ids are spread over the table."""
  ranks = np.minimum(rng.zipf(exponent, size=shape), 10**9).astype(np.int64)
  return (ranks * 2654435761) % vocabulary


def _hidden_weights(name, vocabulary, scale=0.6):
  seed = sum(ord(c) * 31**i for i, c in enumerate(name)) % (2**31)
  return np.random.RandomState(seed).normal(0.0, scale, size=vocabulary)


def vocabularies(scale):
  """{feature: vocabulary size} of the id features at `scale`."""
  columns, _ = dlrm.build_columns(scale)
  sizes = {}
  for column in columns:
    categorical = column.categorical_column
    key = getattr(categorical, "categorical_column", categorical).key
    sizes[key] = column.vocabulary_size
  return sizes


def generate(num_examples, scale, seed=0):
  """(features dict of numpy arrays, labels [N, 1] float32)."""
  features, labels, _ = generate_with_probabilities(num_examples, scale, seed)
  return features, labels


def generate_with_probabilities(num_examples, scale, seed=0):
  """`generate`'s (features, labels) and the hidden click model's
  probability of each example ([N] float64): labels are Bernoulli draws of
  these, so their AUC is the best any model can reach on these examples."""
  rng = np.random.RandomState(seed)
  sizes = vocabularies(scale)
  features = {}
  logit = np.zeros(num_examples)
  for name, vocabulary in sizes.items():
    if name in ("url_domain", "day_of_week"):
      continue
    if name in _MULTI:
      width, low = _MULTI[name]
      ids = _zipf_ids(rng, vocabulary, (num_examples, width))
      lengths = rng.randint(low, width + 1, size=num_examples)
      mask = np.arange(width)[None, :] < lengths[:, None]
      ids = np.where(mask, ids, -1)
      weights = _hidden_weights(name, vocabulary)
      contribution = np.where(mask, weights[np.maximum(ids, 0)], 0.0)
      logit += contribution.sum(1) / np.maximum(lengths, 1)
      features[name] = ids
      if name == "query_terms":
        features["query_term_weights"] = np.where(
            mask, rng.uniform(0.2, 1.0, size=ids.shape), 0.0).astype(
                np.float32)
    else:
      exponent = 1.1 if vocabulary > 1000 else 1.5
      ids = _zipf_ids(rng, vocabulary, (num_examples, 1), exponent)
      logit += _hidden_weights(name, vocabulary)[ids[:, 0]]
      features[name] = ids
  domains = _zipf_ids(rng, 50_000, (num_examples, 1))
  features["url_domain"] = np.char.add("site", domains.astype(str)).astype(
      object)
  logit += _hidden_weights("url_domain", 50_000)[domains[:, 0]]
  day = rng.randint(0, 7, size=(num_examples, 1))
  features["day_of_week"] = np.array(DAYS, dtype=object)[day]
  logit += np.array([0.3, 0.1, 0.0, -0.1, 0.2, 0.5, 0.6])[day[:, 0]]
  numeric = rng.lognormal(0.0, 1.0, size=(num_examples, dlrm.NUM_NUMERIC))
  numeric = np.log1p(numeric).astype(np.float32)
  logit += numeric @ np.linspace(-0.5, 0.5, dlrm.NUM_NUMERIC)
  for i in range(dlrm.NUM_NUMERIC):
    features[f"num_{i}"] = numeric[:, i:i + 1]
  # Centre the logits so clicks are about 30% of examples.
  logit = 1.5 * (logit - logit.mean()) / logit.std() - 0.9
  probabilities = 1 / (1 + np.exp(-logit))
  labels = rng.uniform(size=num_examples) < probabilities
  return features, labels.astype(np.float32).reshape(-1, 1), probabilities
