"""The lookup statistics report's numbers and its text summary.

* `table_facts(stats)`: the numbers the report shows for one table
  (`statistics.TableStatistics`), as a dict; the summary and the page
  (`page`) both print these, through the same rows (`fact_rows`).
* `summary(stats_list)`: a text summary, one block per table.

Heavy-hitter counts are Misra-Gries lower bounds (at most
lookups / (capacity + 1) below the true count); when the tracked counts add
up to every lookup, nothing was ever cut and they are exact. Shares computed
from them (coverage) are lower bounds in the same way and are marked ">=".
"""
import math

from estimator_spec.config import sharding

TOP_IDS = 5
COVERAGE_KS = (10, 100, 1000)
DISTINCT_ERROR = "\u00b11.6%"  # HyperLogLog relative standard error


def table_facts(stats):
  """The numbers the report shows for `stats` (see module docstring)."""
  settings = stats.settings
  lookups = int(stats.lookups)
  ranked = stats.hottest()
  tracked_total = sum(count for _, count in ranked)
  exact = tracked_total == lookups
  vocabulary = int(settings["vocabulary_size"])
  distinct = stats.distinct_ids() if lookups else 0.0
  coverage = {}
  for k in COVERAGE_KS:
    covered = sum(count for _, count in ranked[:k])
    coverage[k] = covered / lookups if lookups else 0.0
  shard_load = {s: [int(x) for x in stats.shard_load[s]]
                for s in sharding.STRATEGIES}
  return {
      "table": settings["table"],
      "vocabulary_size": vocabulary,
      "features": [(str(name), int(length))
                   for name, length in settings["features"]],
      "runs": int(stats.runs),
      "sampling_rate": float(stats.sampling_rate),
      "lookups": lookups,
      "examples": int(stats.examples),
      "mean_ids_per_example": (lookups / stats.examples
                               if stats.examples else 0.0),
      "distinct_ids": distinct,
      "vocabulary_touched": min(1.0, distinct / vocabulary),
      "hottest": ranked[:TOP_IDS],
      "tracked_ids": len(ranked),
      "capacity": int(stats.capacity),
      "counts_exact": exact,
      "count_error_bound": lookups / (stats.capacity + 1),
      "coverage": coverage,
      "num_shards": int(settings["num_shards"]),
      "num_partitions": len(shard_load["div"]),
      "shard_load": shard_load,
      "imbalance": {s: stats.imbalance(s) for s in sharding.STRATEGIES},
      "strategy": settings["partition_strategy"],
  }


def integer_text(value):
  return f"{int(value):,}"


def percent_text(share):
  if 0 < share < 0.001:
    return "<0.1%"
  return f"{100 * share:.1f}%"


def _features_text(features):
  parts = []
  for name, length in features:
    parts.append(f"{name} (sequence of {length})" if length else name)
  return ", ".join(parts) or "-"


def _rate_text(rate):
  return f"{100 * rate:g}%"


def fact_rows(facts):
  """[(label, text)]: the summary of one table, shared by text and HTML."""
  rows = [
      ("vocabulary", f"{integer_text(facts['vocabulary_size'])} "
                     f"row{'s' if facts['vocabulary_size'] != 1 else ''}"),
      ("features", _features_text(facts["features"])),
      ("runs", f"{facts['runs']}, sampling rate "
               f"{_rate_text(facts['sampling_rate'])}"),
      ("sampled", f"{integer_text(facts['lookups'])} lookups in "
                  f"{integer_text(facts['examples'])} examples"),
  ]
  if not facts["lookups"]:
    rows.append(("lookups", "no lookups sampled"))
    rows.append(("partitioning", _strategy_text(facts)))
    return rows
  rows += [
      ("ids per example", f"{facts['mean_ids_per_example']:.2f} on average"),
      ("distinct ids", f"~{integer_text(round(facts['distinct_ids']))} "
                       f"{DISTINCT_ERROR}, "
                       f"{percent_text(facts['vocabulary_touched'])} of the "
                       "vocabulary touched"),
      ("hottest ids", _hottest_text(facts)),
      ("top " + "/".join(str(k) for k in COVERAGE_KS) + " ids",
       " / ".join(_coverage_text(facts, k) for k in COVERAGE_KS)
       + " of lookups"),
      ("shard load", _imbalance_text(facts)),
      ("partitioning", _strategy_text(facts)),
  ]
  return rows


def _hottest_text(facts):
  text = ", ".join(f"{key} ({integer_text(count)})"
                   for key, count in facts["hottest"])
  if not facts["counts_exact"]:
    bound = math.floor(facts["count_error_bound"])
    text += f"; counts at most {integer_text(bound)} low"
  return text


def _coverage_text(facts, k):
  prefix = "" if facts["counts_exact"] else ">="
  return prefix + percent_text(facts["coverage"][k])


def _imbalance_text(facts):
  shards = facts["num_partitions"]
  return (f"max/mean over {shards} shard{'s' if shards != 1 else ''}: "
          f"div {facts['imbalance']['div']:.2f}, "
          f"mod {facts['imbalance']['mod']:.2f}")


def _strategy_text(facts):
  configured = facts["strategy"]
  text = f"configured {configured!r}"
  other = "mod" if configured == "div" else "div"
  if facts["lookups"] and (facts["imbalance"][other] <
                           0.9 * facts["imbalance"][configured]):
    text += f" ({other!r} would spread these lookups more evenly)"
  return text


def summary(stats_list):
  """A text summary of each table's statistics, for a terminal."""
  blocks = []
  for stats in stats_list:
    facts = table_facts(stats)
    rows = fact_rows(facts)
    width = max(len(label) for label, _ in rows)
    lines = [f"Table {facts['table']}"]
    lines += [f"  {label:<{width}}  {text}" for label, text in rows]
    blocks.append("\n".join(lines))
  return "\n\n".join(blocks) + ("\n" if blocks else "")
