"""The lookup statistics report as one self-contained HTML page.

`write_html(stats_list, path)` writes one page (inline CSS and the SVG of
`plots`; nothing is fetched) with, per table, the summary numbers
(`summary.fact_rows`) and four plots. A table without sampled lookups gets
a note instead of plots.
"""
import html

from estimator_spec import files
from estimator_spec.profiling import plots
from estimator_spec.profiling import statistics
from estimator_spec.profiling import summary

_STYLE = """
body { font-family: sans-serif; margin: 24px auto; max-width: 1020px;
       color: #222; background: #fff; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; }
h2 { font-size: 1.25em; border-bottom: 1px solid #ccc; padding-bottom: 4px;
     margin-top: 2em; }
.source { color: #555; margin-top: 0; }
nav ul { padding-left: 1.2em; }
table.facts { border-collapse: collapse; margin: 8px 0 16px; }
table.facts th { text-align: left; font-weight: normal; color: #555;
                 padding: 2px 16px 2px 0; vertical-align: top; }
table.facts td { padding: 2px 0; }
.plots { display: grid; grid-template-columns: repeat(2, 490px);
         gap: 16px 24px; }
figure { margin: 0; }
figcaption { font-size: 0.85em; color: #444; margin-top: 2px; }
.note { background: #fff6d6; border: 1px solid #e6cf7a; padding: 8px 12px; }
svg.plot { display: block; background: #fff; }
svg.plot text { font-family: sans-serif; fill: #222; }
svg.plot .plot-title { font-size: 14px; font-weight: bold; }
svg.plot .tick-label, svg.plot .legend, svg.plot .mark-label
  { font-size: 11px; }
svg.plot .axis-label { font-size: 12px; }
svg.plot .axis { stroke: #333; stroke-width: 1.2; }
svg.plot .tick, svg.plot .minor { stroke: #333; stroke-width: 1; }
svg.plot .grid { stroke: #e4e4e4; stroke-width: 1; }
svg.plot .mean { stroke: #555; stroke-width: 1.2; stroke-dasharray: 5 4; }
"""


def _anchor(index):
  return f"table-{index + 1}"


def _table_section(index, stats):
  facts = summary.table_facts(stats)
  name = html.escape(facts["table"])
  rows = "\n".join(f"<tr><th>{html.escape(label)}</th>"
                   f"<td>{html.escape(text)}</td></tr>"
                   for label, text in summary.fact_rows(facts))
  parts = [f'<section class="table" id="{_anchor(index)}" '
           f'data-table="{name}">',
           f"<h2>Table {name}</h2>",
           f'<table class="facts">\n{rows}\n</table>']
  if not facts["lookups"]:
    parts.append('<p class="note">No lookups sampled for this table: '
                 "nothing to plot.</p>")
  else:
    ranked = stats.hottest()
    if facts["counts_exact"]:
      count_note = ("Every id sampled is tracked, so these counts are "
                    "exact.")
    else:
      count_note = (
          "Counts are lower bounds: each is at most lookups/(capacity+1) = "
          f"{facts['count_error_bound']:,.1f} below the true count (shaded: "
          "where the true count lies).")
    captions = [
        (plots.rank_frequency_plot(facts, ranked),
         _tracked_text(len(ranked), facts["capacity"]) + " " + count_note),
        (plots.coverage_plot(facts, ranked),
         "Share of the sampled lookups that go to the k hottest tracked ids"
         + _circles_text(len(ranked)) + "."
         + ("" if facts["counts_exact"] else " A lower bound, like the "
            "counts.")),
        (plots.shard_load_plot(facts),
         f"Lookups each of the {facts['num_partitions']} shard(s) would "
         "serve under div (contiguous rows) and mod (row % shards); the "
         f"configured strategy, {facts['strategy']}, in full colour."),
        (plots.ids_per_example_plot(stats, facts),
         "How many examples had n ids of this table (per feature)."
         + (f" The last bar holds {statistics.MAX_IDS_PER_EXAMPLE} or more."
            if statistics.MAX_IDS_PER_EXAMPLE in stats.ids_per_example
            else "")),
    ]
    parts.append('<div class="plots">')
    for svg, caption in captions:
      parts.append(f"<figure>\n{svg}\n<figcaption>{html.escape(caption)}"
                   "</figcaption>\n</figure>")
    parts.append("</div>")
  parts.append("</section>")
  return "\n".join(parts)


def _tracked_text(tracked, capacity):
  return ("Only the tracked hottest ids are shown: "
          f"{summary.integer_text(tracked)} of at most "
          f"{summary.integer_text(capacity)} (the summary's capacity).")


def _circles_text(tracked):
  marked = [str(k) for k in summary.COVERAGE_KS if k <= tracked]
  return f"; circles at k = {', '.join(marked)}" if marked else ""


def render_html(stats_list, source=None):
  """The report page as a string (see `write_html`)."""
  if not stats_list:
    raise ValueError("statistics_report: no statistics to report")
  heading = "Lookup statistics"
  title = heading + (f": {source}" if source else "")
  links = "\n".join(
      f'<li><a href="#{_anchor(i)}">{html.escape(s.settings["table"])}</a>'
      "</li>" for i, s in enumerate(stats_list))
  count = len(stats_list)
  parts = [
      "<!DOCTYPE html>",
      '<html lang="en">',
      "<head>",
      '<meta charset="utf-8">',
      f"<title>{html.escape(title)}</title>",
      f"<style>{_STYLE}</style>",
      "</head>",
      "<body>",
      f"<h1>{heading}</h1>",
      f'<p class="source">{count} table{"s" if count != 1 else ""}'
      + (f" from {html.escape(source)}" if source else "") + ".</p>",
      f"<nav><ul>\n{links}\n</ul></nav>",
  ]
  parts += [_table_section(i, s) for i, s in enumerate(stats_list)]
  parts += ["</body>", "</html>", ""]
  return "\n".join(parts)


def write_html(stats_list, path, source=None):
  """Writes the report page of `stats_list` to `path`; returns `path`.
  `source` (e.g. the statistics directory) is named in the page's title.
  The page is written atomically, with the user's umask, and a symbolic
  link at `path` is replaced, never written through
  (`files.write_atomic`)."""
  page = render_html(stats_list, source)
  return files.write_atomic(path, page)
