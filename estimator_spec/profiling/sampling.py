"""How often training samples its lookups (`profile_sampling_rate`)."""

# A TPU samples about 3% of its inputs; one step in 50 keeps the host's
# cost within 2% of step time (bench/profile_bench.py).
DEFAULT_SAMPLING_RATE = 0.02


def sampling_period(rate, owner="profile_sampling_rate"):
  """The steps between two sampled steps for a sampling rate in (0, 1]:
  round(1 / rate) (rate 1: every step; the default 0.02: every 50th)."""
  if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not (
      0.0 < rate <= 1.0):
    raise ValueError(
        f"{owner} must be a number in (0, 1] (the share of training steps "
        f"whose lookups are sampled); got {rate!r}.")
  return max(1, int(round(1.0 / rate)))
