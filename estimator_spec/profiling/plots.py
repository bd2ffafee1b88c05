"""The report's SVG plots of one table, drawn here as text (nothing is
fetched): id frequency by rank (log-log), the share of lookups the k
hottest ids cover, the lookups each shard would carry under `div` and
`mod`, and the ids-per-example histogram. Each takes the table's numbers
(`summary.table_facts`) and returns one <svg class="plot"> whose
`data-plot` is its kind (`PLOT_KINDS`).
"""
import html
import math

from estimator_spec.config import sharding
from estimator_spec.profiling import summary

PLOT_KINDS = ("rank-frequency", "coverage", "shard-load", "ids-per-example")

_WIDTH, _HEIGHT = 480, 300
_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 18, 40, 50
_INSET = 10  # log axes keep points off the frame
_BLUE, _ORANGE, _LIGHT_BLUE = "#2f6db3", "#e07b24", "#bcd3ee"
# Shard-load bars: the configured strategy in full colour, the other pale.
STRATEGY_COLORS = {"div": _BLUE, "mod": _ORANGE}
PALE_COLORS = {"div": "#b9cfe9", "mod": "#f4cda9"}


def _number(value):
  """A coordinate: short, never NaN."""
  if not math.isfinite(value):
    raise ValueError(f"statistics_report: coordinate {value!r}")
  return f"{value:.1f}".rstrip("0").rstrip(".")


def _compact(value):
  """An axis label: 950, 1.5k, 20k, 3M."""
  for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
    if abs(value) >= limit:
      scaled = value / limit
      text = f"{scaled:.1f}".rstrip("0").rstrip(".")
      return text + suffix
  if value == int(value):
    return str(int(value))
  return f"{value:g}"


def _decades(low, high):
  """Powers of ten around [low, high] (low >= 1), at least one decade."""
  start = math.floor(math.log10(max(low, 1.0)))
  stop = math.ceil(math.log10(max(high, 1.0)))
  if stop <= start:
    stop = start + 1
  return start, stop


def _nice_step(span, count=5):
  raw = span / count
  magnitude = 10 ** math.floor(math.log10(raw))
  for factor in (1, 2, 5, 10):
    if factor * magnitude >= raw:
      return factor * magnitude
  return 10 * magnitude


def _linear_ticks(high, integer=True):
  """(top, ticks) of a 0-based axis that shows `high`."""
  high = max(high, 1 if integer else 1e-9)
  step = _nice_step(high)
  if integer:
    step = max(1, round(step))
  top = step * math.ceil(high / step)
  ticks = [step * i for i in range(int(round(top / step)) + 1)]
  return top, ticks


class _Axis:
  """A map from data values to pixels, linear or log10."""

  def __init__(self, low, high, start, stop, log=False):
    self.low, self.high, self.log = low, high, log
    self.start, self.stop = start, stop

  def __call__(self, value):
    if self.log:
      low, high = math.log10(self.low), math.log10(self.high)
      value = math.log10(value)
    else:
      low, high = self.low, self.high
    return self.start + (value - low) / (high - low) * (self.stop - self.start)


class _Plot:
  """One <svg class="plot">: frame, grid, ticks, labels and marks."""

  def __init__(self, kind, title, x_label, y_label):
    self.kind = kind
    self.title = title
    self.x_label, self.y_label = x_label, y_label
    self.grid, self.marks, self.labels = [], [], []
    self.x0, self.x1 = _LEFT, _WIDTH - _RIGHT
    self.y0, self.y1 = _HEIGHT - _BOTTOM, _TOP  # bottom, top

  def x_ticks(self, axis, ticks, labels=None, minor=()):
    for value in minor:
      x = _number(axis(value))
      self.grid.append(f'<line class="minor" x1="{x}" y1="{self.y0}" '
                       f'x2="{x}" y2="{self.y0 + 3}"/>')
    for i, value in enumerate(ticks):
      x = _number(axis(value))
      self.grid.append(f'<line class="grid" x1="{x}" y1="{self.y1}" '
                       f'x2="{x}" y2="{self.y0}"/>')
      self.grid.append(f'<line class="tick" x1="{x}" y1="{self.y0}" '
                       f'x2="{x}" y2="{self.y0 + 5}"/>')
      text = labels[i] if labels else _compact(value)
      self.labels.append(f'<text class="tick-label" x="{x}" '
                         f'y="{self.y0 + 17}" text-anchor="middle">'
                         f'{html.escape(text)}</text>')

  def y_ticks(self, axis, ticks, labels=None, minor=()):
    for value in minor:
      y = _number(axis(value))
      self.grid.append(f'<line class="minor" x1="{self.x0 - 3}" y1="{y}" '
                       f'x2="{self.x0}" y2="{y}"/>')
    for i, value in enumerate(ticks):
      y = _number(axis(value))
      self.grid.append(f'<line class="grid" x1="{self.x0}" y1="{y}" '
                       f'x2="{self.x1}" y2="{y}"/>')
      self.grid.append(f'<line class="tick" x1="{self.x0 - 5}" y1="{y}" '
                       f'x2="{self.x0}" y2="{y}"/>')
      text = labels[i] if labels else _compact(value)
      self.labels.append(f'<text class="tick-label" x="{self.x0 - 8}" '
                         f'y="{y}" dy="0.32em" text-anchor="end">'
                         f'{html.escape(text)}</text>')

  def log_x(self, low, high):
    start, stop = _decades(low, high)
    axis = _Axis(10.0**start, 10.0**stop, self.x0 + _INSET,
                 self.x1 - _INSET, log=True)
    self.x_ticks(axis, [10**e for e in range(start, stop + 1)],
                 minor=_minor_ticks(start, stop))
    return axis

  def log_y(self, low, high):
    start, stop = _decades(low, high)
    axis = _Axis(10.0**start, 10.0**stop, self.y0 - _INSET,
                 self.y1 + _INSET, log=True)
    self.y_ticks(axis, [10**e for e in range(start, stop + 1)],
                 minor=_minor_ticks(start, stop))
    return axis

  def render(self):
    parts = [
        f'<svg class="plot" data-plot="{self.kind}" viewBox="0 0 {_WIDTH} '
        f'{_HEIGHT}" width="{_WIDTH}" height="{_HEIGHT}" role="img">',
        f"<title>{html.escape(self.title)}</title>",
        f'<text class="plot-title" x="{_WIDTH / 2:g}" y="20" '
        f'text-anchor="middle">{html.escape(self.title)}</text>',
        *self.grid,
        *self.marks,
        f'<line class="axis" x1="{self.x0}" y1="{self.y0}" x2="{self.x1}" '
        f'y2="{self.y0}"/>',
        f'<line class="axis" x1="{self.x0}" y1="{self.y0}" x2="{self.x0}" '
        f'y2="{self.y1}"/>',
        *self.labels,
        f'<text class="axis-label" x="{(self.x0 + self.x1) / 2:g}" '
        f'y="{_HEIGHT - 10}" text-anchor="middle">'
        f"{html.escape(self.x_label)}</text>",
        f'<text class="axis-label" transform="translate(16 '
        f'{(self.y0 + self.y1) / 2:g}) rotate(-90)" text-anchor="middle">'
        f"{html.escape(self.y_label)}</text>",
        "</svg>",
    ]
    return "\n".join(parts)


def _minor_ticks(start, stop):
  return [m * 10**e for e in range(start, stop) for m in range(2, 10)]


def _log_sample(n, count=240):
  """Up to about `count` indices of 0..n-1, evenly spaced on a log axis
  (a line through many ranks needs no more), first and last included."""
  if n <= count:
    return list(range(n))
  step = math.log(n) / count
  return sorted({min(n - 1, int(math.exp(i * step)) - 1)
                 for i in range(count + 1)} | {0, n - 1})


def _points(xs, ys, axis_x, axis_y):
  return " ".join(f"{_number(axis_x(x))},{_number(axis_y(y))}"
                  for x, y in zip(xs, ys))


def _dots(plot, xs, ys, axis_x, axis_y, color, limit=40):
  """Dots on a line of few points (a single point draws no line)."""
  if len(xs) > limit:
    return
  radius = 5 if len(xs) < 5 else 3.5
  for x, y in zip(xs, ys):
    plot.marks.append(f'<circle cx="{_number(axis_x(x))}" '
                      f'cy="{_number(axis_y(y))}" r="{radius}" '
                      f'fill="{color}"/>')


def rank_frequency_plot(facts, ranked):
  counts = [count for _, count in ranked]
  ranks = list(range(1, len(counts) + 1))
  bound = 0.0 if facts["counts_exact"] else facts["count_error_bound"]
  kept = _log_sample(len(counts))
  plot = _Plot("rank-frequency", "Lookups of the hottest ids by rank",
               "rank of the id (1 = hottest)", "lookups")
  axis_x = plot.log_x(1, len(counts))
  axis_y = plot.log_y(min(counts), max(counts) + bound)
  ranks, counts = [ranks[i] for i in kept], [counts[i] for i in kept]
  if bound:
    upper = [c + bound for c in counts]
    band = (_points(ranks, upper, axis_x, axis_y) + " " +
            _points(ranks[::-1], counts[::-1], axis_x, axis_y))
    plot.marks.append(f'<polygon class="band" points="{band}" '
                      f'fill="{_LIGHT_BLUE}" fill-opacity="0.6"/>')
  line = _points(ranks, counts, axis_x, axis_y)
  plot.marks.append(f'<polyline points="{line}" fill="none" '
                    f'stroke="{_BLUE}" stroke-width="2.5" '
                    'stroke-linejoin="round"/>')
  _dots(plot, ranks, counts, axis_x, axis_y, _BLUE)
  return plot.render()


def coverage_plot(facts, ranked):
  lookups = facts["lookups"]
  shares, total = [], 0
  for _, count in ranked:
    total += count
    shares.append(total / lookups)
  ks = list(range(1, len(shares) + 1))
  line_at = _log_sample(len(shares))
  prefix = "" if facts["counts_exact"] else "at least "
  plot = _Plot("coverage", "Share of lookups the k hottest ids cover",
               "k hottest ids", f"{prefix}share of lookups")
  axis_x = plot.log_x(1, len(shares))
  axis_y = _Axis(0.0, 1.0, plot.y0, plot.y1)
  ticks = [0.0, 0.25, 0.5, 0.75, 1.0]
  plot.y_ticks(axis_y, ticks, labels=[f"{int(t * 100)}%" for t in ticks])
  line = _points([ks[i] for i in line_at], [shares[i] for i in line_at],
                 axis_x, axis_y)
  area = (f"{_number(axis_x(1))},{_number(axis_y(0))} {line} "
          f"{_number(axis_x(ks[-1]))},{_number(axis_y(0))}")
  plot.marks.append(f'<polygon points="{area}" fill="{_LIGHT_BLUE}" '
                    'fill-opacity="0.6"/>')
  plot.marks.append(f'<polyline points="{line}" fill="none" '
                    f'stroke="{_BLUE}" stroke-width="2.5" '
                    'stroke-linejoin="round"/>')
  _dots(plot, ks, shares, axis_x, axis_y, _BLUE)
  for k in summary.COVERAGE_KS:
    if k > len(shares):
      continue
    x, y = axis_x(k), axis_y(shares[k - 1])
    plot.marks.append(f'<circle cx="{_number(x)}" cy="{_number(y)}" r="4" '
                      f'fill="#fff" stroke="{_BLUE}" stroke-width="2"/>')
    share = summary.percent_text(shares[k - 1])
    plot.labels.append(f'<text class="mark-label" x="{_number(x)}" '
                       f'y="{_number(y + 16)}" text-anchor="middle">'
                       f"{html.escape(share)}</text>")
  return plot.render()


def shard_load_plot(facts):
  loads = facts["shard_load"]
  shards = len(loads["div"])
  configured = facts["strategy"]
  imbalance = facts["imbalance"]
  title = (f"Lookups per shard: max/mean div {imbalance['div']:.2f}, "
           f"mod {imbalance['mod']:.2f}")
  plot = _Plot("shard-load", title, "shard", "lookups")
  top, ticks = _linear_ticks(max(max(loads["div"]), max(loads["mod"])))
  axis_y = _Axis(0, top, plot.y0, plot.y1)
  plot.y_ticks(axis_y, ticks)
  slot = (plot.x1 - plot.x0) / shards
  bar = min(slot * 0.8 / 2, 36)
  every = max(1, math.ceil(shards / 16))
  for shard in range(shards):
    left = plot.x0 + (shard + 0.5) * slot - bar
    for i, strategy in enumerate(sharding.STRATEGIES):
      load = loads[strategy][shard]
      y = axis_y(load)
      palette = STRATEGY_COLORS if strategy == configured else PALE_COLORS
      color = palette[strategy]
      plot.marks.append(
          f'<rect class="bar {strategy}" x="{_number(left + i * bar)}" '
          f'y="{_number(y)}" width="{_number(max(bar, 0.5))}" '
          f'height="{_number(plot.y0 - y)}" fill="{color}"><title>'
          f"{strategy}, shard {shard}: {summary.integer_text(load)} lookups"
          "</title></rect>")
    if shard % every == 0:
      center = _number(plot.x0 + (shard + 0.5) * slot)
      plot.labels.append(f'<text class="tick-label" x="{center}" '
                         f'y="{plot.y0 + 17}" text-anchor="middle">{shard}'
                         "</text>")
  mean = sum(loads["div"]) / shards
  y = _number(axis_y(mean))
  plot.marks.append(f'<line class="mean" x1="{plot.x0}" y1="{y}" '
                    f'x2="{plot.x1}" y2="{y}"/>')
  plot.labels.append(_mean_legend(plot.x0 + 4))
  for i, strategy in enumerate(sharding.STRATEGIES):
    palette = STRATEGY_COLORS if strategy == configured else PALE_COLORS
    color = palette[strategy]
    label = strategy + (" (configured)" if strategy == configured else "")
    x = plot.x0 + 80 + i * 120
    plot.labels.append(f'<rect x="{x}" y="{_TOP - 13}" width="11" '
                       f'height="11" fill="{color}"/>')
    plot.labels.append(f'<text class="legend" x="{x + 15}" y="{_TOP - 3}">'
                       f"{html.escape(label)}</text>")
  return plot.render()


def _mean_legend(x, text="mean"):
  return (f'<line class="mean" x1="{x}" y1="{_TOP - 7}" x2="{x + 22}" '
          f'y2="{_TOP - 7}"/><text class="legend" x="{x + 27}" '
          f'y="{_TOP - 3}">{html.escape(text)}</text>')


def ids_per_example_plot(stats, facts):
  histogram = sorted(stats.ids_per_example.items())
  low, high = histogram[0][0], histogram[-1][0]
  width = max(1, math.ceil((high - low + 1) / 50))
  bins = {}
  for n, examples in histogram:
    start = low + (n - low) // width * width
    bins[start] = bins.get(start, 0) + examples
  plot = _Plot("ids-per-example", "Ids per example", "ids per example",
               "examples")
  slots = math.ceil((high - low + 1) / width)
  pad_left = pad_right = 0
  if slots < 12:  # a few bars: room around them, not one wide block
    pad_left = min(low, (12 - slots) // 2)
    pad_right = 12 - slots - pad_left
  first_n, last_n = low - pad_left, low + (slots + pad_right) * width - 1
  axis_x = _Axis(first_n - 0.5, last_n + 0.5, plot.x0 + 6, plot.x1 - 6)
  step = max(1, round(_nice_step(last_n - first_n + 1)))
  first = math.ceil(first_n / step) * step
  plot.x_ticks(axis_x, list(range(first, last_n + 1, step)))
  top, ticks = _linear_ticks(max(bins.values()))
  axis_y = _Axis(0, top, plot.y0, plot.y1)
  plot.y_ticks(axis_y, ticks)
  for start, examples in sorted(bins.items()):
    left, right = axis_x(start - 0.5), axis_x(start + width - 0.5)
    gap = min(1.0, (right - left) * 0.1)
    y = axis_y(examples)
    label = (f"{start}" if width == 1 else f"{start}..{start + width - 1}")
    plot.marks.append(
        f'<rect class="bar" x="{_number(left + gap)}" y="{_number(y)}" '
        f'width="{_number(max(right - left - 2 * gap, 0.5))}" '
        f'height="{_number(plot.y0 - y)}" fill="{_BLUE}"><title>'
        f"{label} ids: {summary.integer_text(examples)} examples"
        "</title></rect>")
  mean = facts["mean_ids_per_example"]
  if axis_x.low <= mean <= axis_x.high:
    x = _number(axis_x(mean))
    plot.marks.append(f'<line class="mean" x1="{x}" y1="{plot.y0}" '
                      f'x2="{x}" y2="{plot.y1}"/>')
    plot.labels.append(_mean_legend(plot.x1 - 110, f"mean {mean:.2f}"))
  return plot.render()
