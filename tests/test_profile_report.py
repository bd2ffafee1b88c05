"""The lookup statistics report (`profiling/summary.py`, `plots.py`,
`page.py`) and `python -m estimator_spec profile`, without a browser.

* The summary's numbers equal what the test counts from the raw ids
  (lookups, examples, hottest ids, coverage, div/mod shard load), and say
  "lower bound" when the heavy-hitter summary has cut counts.
* The page is self-contained (nothing fetched), parses, has the four plots
  per table as well-formed SVG with titled, labelled axes, and its marks
  carry the data (bars add up to the examples and shard loads).
* Degenerate tables (no lookups, one shard, one id, one length) give a note
  or plots with marks, never NaN coordinates or an empty <svg>.
* The command: exit codes and one-line messages for a missing, non-
  directory or empty DIR; a corrupt file skipped with a warning; the page
  path printed last; `describe --profile-dir` shows what the statistics say.
"""
import collections
import html.parser
import os
import re
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from estimator_spec import __main__ as cli
from estimator_spec.profiling import page as report_page
from estimator_spec.profiling import plots as report_plots
from estimator_spec.profiling import statistics as st
from estimator_spec.profiling import store
from estimator_spec.profiling import summary as report_summary
from examples import dlrm

KINDS = ("rank-frequency", "coverage", "shard-load", "ids-per-example")


def settings(table="tbl_items", vocab=2000, shards=4, strategy="div",
             features=(("items", 0),)):
  return {"table": table, "vocabulary_size": vocab,
          "features": [list(f) for f in features],
          "partition_strategy": strategy, "num_shards": shards}


def zipf_batches(seed, vocab, count=5, batch=200, max_length=1,
                 exponent=1.3):
  """[(ids, lengths)]: Zipf ids; 1 id per example, or 0..max_length."""
  rng = np.random.RandomState(seed)
  out = []
  for _ in range(count):
    if max_length == 1:
      lengths = np.ones(batch, np.int64)
    else:
      lengths = rng.randint(0, max_length + 1, batch).astype(np.int64)
    ids = np.minimum(rng.zipf(exponent, int(lengths.sum())) - 1, vocab - 1)
    out.append((ids.astype(np.int64), lengths))
  return out


def observed(table_settings, batches, capacity=st.HEAVY_HITTER_CAPACITY,
             rate=1.0):
  stats = st.TableStatistics(table_settings, rate, capacity)
  for ids, lengths in batches:
    stats.observe(ids, lengths)
  return stats


def div_partition(ids, vocab, shards):
  """Row -> partition under div, written out: the first vocab % shards
  partitions hold one row more."""
  base, extra = divmod(vocab, shards)
  sizes = [base + (1 if s < extra else 0) for s in range(shards)]
  return np.searchsorted(np.cumsum(sizes), ids, side="right")


def _block(text, table):
  """The summary lines of `table`."""
  blocks = text.strip().split("\n\n")
  found = [b for b in blocks if b.splitlines()[0] == f"Table {table}"]
  assert len(found) == 1, text
  return found[0]


def _line(block, label):
  lines = [l for l in block.splitlines() if l.strip().startswith(label)]
  assert len(lines) == 1, (label, block)
  return lines[0]


def test_summary_numbers_equal_counts_of_the_raw_ids():
  vocab, shards = 2000, 4
  batches = zipf_batches(0, vocab, max_length=6)
  stats = observed(settings(vocab=vocab, shards=shards), batches)
  ids = np.concatenate([i for i, _ in batches])
  lengths = np.concatenate([l for _, l in batches])
  counts = collections.Counter(ids.tolist())
  assert len(counts) < st.HEAVY_HITTER_CAPACITY  # every count is exact
  ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
  ordered = [c for _, c in ranked]
  div = np.bincount(div_partition(ids, vocab, shards), minlength=shards)
  mod = np.bincount(ids % shards, minlength=shards)

  block = _block(report_summary.summary([stats]), "tbl_items")
  assert f"{ids.size:,} lookups in {lengths.size:,} examples" in block
  assert f"{ids.size / lengths.size:.2f} on average" in _line(
      block, "ids per example")
  hottest = ", ".join(f"{k} ({c:,})" for k, c in ranked[:5])
  assert _line(block, "hottest ids").split("hottest ids")[1].strip() == (
      hottest)
  coverage = " / ".join(f"{100 * sum(ordered[:k]) / ids.size:.1f}%"
                        for k in (10, 100, 1000))
  assert f"{coverage} of lookups" in _line(block, "top 10/100/1000 ids")
  assert (f"max/mean over {shards} shards: div "
          f"{div.max() / div.mean():.2f}, mod {mod.max() / mod.mean():.2f}"
          in _line(block, "shard load"))
  # Zipf ids crowd the first rows: div is configured and worse than mod.
  assert div.max() / div.mean() > 1.1 * (mod.max() / mod.mean())
  assert "configured 'div' ('mod' would spread" in _line(
      block, "partitioning")
  distinct = float(_line(block, "distinct ids").split("~")[1].split()[0]
                   .replace(",", ""))
  assert abs(distinct - len(counts)) <= 0.05 * len(counts)
  assert "\u00b11.6%" in _line(block, "distinct ids")
  assert f"{100 * distinct / vocab:.1f}% of the vocabulary" in block
  assert "vocabulary           2,000 rows" in block
  assert "sampling rate 100%" in block

  facts = report_summary.table_facts(stats)
  assert facts["counts_exact"]
  assert facts["coverage"] == {k: sum(ordered[:k]) / ids.size
                               for k in (10, 100, 1000)}
  assert facts["shard_load"] == {"div": div.tolist(), "mod": mod.tolist()}


def test_cut_counts_are_reported_as_lower_bounds():
  vocab, capacity = 5000, 16
  batches = zipf_batches(1, vocab, count=8, batch=500, exponent=1.2)
  stats = observed(settings(vocab=vocab), batches, capacity=capacity)
  ids = np.concatenate([i for i, _ in batches])
  ordered = sorted(collections.Counter(ids.tolist()).values(), reverse=True)
  bound = ids.size / (capacity + 1)
  facts = report_summary.table_facts(stats)
  assert not facts["counts_exact"]
  assert facts["count_error_bound"] == pytest.approx(bound)
  for k in (10, 100, 1000):
    true_share = sum(ordered[:k]) / ids.size
    assert facts["coverage"][k] <= true_share
    assert facts["coverage"][k] >= true_share - min(k, capacity) * bound / (
        ids.size)
  block = _block(report_summary.summary([stats]), "tbl_items")
  assert _line(block, "top 10/100/1000").count(">=") == 3
  assert f"counts at most {int(bound):,} low" in _line(block, "hottest ids")
  page = report_page.render_html([stats])
  assert "lower bound" in page and "at least share of lookups" in page
  assert "Only the tracked hottest ids are shown: 16 of at most 16" in page
  assert f"lookups/(capacity+1) = {bound:,.1f} below the true count" in page


def test_summary_of_several_tables_and_sampling():
  one = observed(settings("b_users", strategy="mod", shards=3),
                 zipf_batches(2, 2000), rate=0.25)
  two = observed(settings("a_ads", vocab=500, shards=2,
                          features=(("ads", 0), ("history", 20))),
                 zipf_batches(3, 500, max_length=20))
  text = report_summary.summary([one, two])
  assert [b.splitlines()[0] for b in text.strip().split("\n\n")] == [
      "Table b_users", "Table a_ads"]
  assert "sampling rate 25%" in _block(text, "b_users")
  assert "ads, history (sequence of 20)" in _block(text, "a_ads")
  assert "configured 'mod'" in _block(text, "b_users")
  assert report_summary.summary([]) == ""


# --- the page -----------------------------------------------------------------


class _Page(html.parser.HTMLParser):
  """Sections, their <svg class="plot"> and what the page would load."""

  def __init__(self):
    super().__init__()
    self.sections = []  # [(data-table, [svg attrs], [note texts])]
    self.tags = collections.Counter()
    self.urls = []
    self.svg_children = []  # per svg: the first child's tag
    self._in_note = False
    self._first_child = False

  def handle_starttag(self, tag, attrs):
    attrs = dict(attrs)
    self.tags[tag] += 1
    for key in ("src", "href", "xlink:href"):
      if key in attrs and not attrs[key].startswith("#"):
        self.urls.append(attrs[key])
    if self._first_child:
      self.svg_children.append(tag)
      self._first_child = False
    if tag == "section":
      self.sections.append((attrs.get("data-table"), [], []))
    elif tag == "svg":
      self.sections[-1][1].append(attrs)
      self._first_child = True
    elif tag == "p" and "note" in attrs.get("class", ""):
      self._in_note = True

  def handle_data(self, data):
    if self._in_note:
      self.sections[-1][2].append(data)
      self._in_note = False


def parsed(page):
  parser = _Page()
  parser.feed(page)
  parser.close()
  return parser


def svgs(page):
  """Each <svg>...</svg> of the page, parsed as XML (well-formed)."""
  found = re.findall(r"<svg\b.*?</svg>", page, flags=re.S)
  return [ET.fromstring(text) for text in found]


def _numbers(element):
  """Every number in the element's geometry attributes."""
  values = []
  for node in element.iter():
    for key in ("x", "y", "x1", "x2", "y1", "y2", "cx", "cy", "r", "width",
                "height", "points"):
      if key in node.attrib:
        values += [float(v) for v in re.split(r"[ ,]+",
                                              node.attrib[key].strip())]
  return values


def _three_tables():
  return [
      observed(settings("tbl_items", vocab=2000, shards=4),
               zipf_batches(4, 2000)),
      observed(settings("tbl_history", vocab=800, shards=3, strategy="mod",
                        features=(("history", 20),)),
               zipf_batches(5, 800, max_length=20)),
      observed(settings("tbl_big", vocab=10**6, shards=8),
               zipf_batches(6, 10**6, count=10, batch=1000, exponent=1.1),
               capacity=64),
  ]


def test_page_is_self_contained_and_has_four_plots_per_table(tmp_path):
  tables = _three_tables()
  path = report_page.write_html(tables, str(tmp_path / "report.html"),
                                source="dir")
  page = open(path, encoding="utf-8").read()
  for needle in ("http://", "https://", "<link", "<script", "@import",
                 "url(", "<img", "<iframe"):
    assert needle not in page
  result = parsed(page)
  assert result.urls == []
  assert [name for name, _, _ in result.sections] == [
      "tbl_items", "tbl_history", "tbl_big"]
  for _, plots, notes in result.sections:
    assert [p.get("data-plot") for p in plots] == list(KINDS)
    assert all(p.get("class") == "plot" for p in plots)
    assert notes == []
  assert result.svg_children == ["title"] * 12  # <title> first in each
  for svg in svgs(page):
    assert len([t for t in svg.iter("text")
                if t.get("class") == "axis-label"]) == 2
    assert all(np.isfinite(_numbers(svg)))
  assert len(page) < 200_000  # no per-id dump beyond the plotted lines


def test_plot_marks_carry_the_data():
  stats = _three_tables()[1]  # mod, 3 shards, 0..20 ids per example
  page = report_page.render_html([stats])
  plots = {svg.get("data-plot"): svg for svg in svgs(page)}
  bars = [r for r in plots["shard-load"].iter("rect")
          if "bar" in r.get("class", "")]
  assert len(bars) == 2 * 3
  loads = collections.defaultdict(list)
  for bar in bars:
    strategy = bar.get("class").split()[1]
    loads[strategy].append(int(bar.find("title").text.split(": ")[1]
                               .split()[0].replace(",", "")))
    assert bar.get("fill") == (report_plots.STRATEGY_COLORS[strategy]
                               if strategy == "mod" else
                               report_plots.PALE_COLORS[strategy])
  assert dict(loads) == {s: stats.shard_load[s].tolist() for s in ("div",
                                                                   "mod")}
  title = plots["shard-load"].find("title").text
  assert f"div {stats.imbalance('div'):.2f}" in title
  assert f"mod {stats.imbalance('mod'):.2f}" in title
  histogram = {}
  for bar in plots["ids-per-example"].iter("rect"):
    n, examples = bar.find("title").text.split(" ids: ")
    histogram[int(n)] = int(examples.split()[0].replace(",", ""))
  assert histogram == stats.ids_per_example
  assert len(list(plots["rank-frequency"].iter("polyline"))) == 1


def _degenerate_tables():
  no_lookups = st.TableStatistics(settings("t_unused", vocab=10, shards=2),
                                  1.0)
  no_lookups.observe([], [0, 0, 0])  # examples without ids of this table
  one_id = observed(settings("t_country", vocab=1, shards=1),
                    [(np.zeros(40, np.int64), np.ones(40, np.int64))])
  same_length = observed(  # every example 3 ids, one shard, mod
      settings("t_one_shard", vocab=50, shards=1, strategy="mod"),
      [(np.arange(60) % 50, np.full(20, 3))])
  long_examples = observed(  # the last bucket: MAX_IDS_PER_EXAMPLE or more
      settings("t_long", vocab=100, shards=2),
      [(np.arange(st.MAX_IDS_PER_EXAMPLE + 10) % 100,
        np.array([st.MAX_IDS_PER_EXAMPLE + 5, 5]))])
  return [no_lookups, one_id, same_length, long_examples]


def test_degenerate_tables_give_a_note_or_plots_with_marks(tmp_path):
  tables = _degenerate_tables()
  text = report_summary.summary(tables)
  assert "no lookups sampled" in _line(_block(text, "t_unused"), "lookups")
  assert "3 examples" in _block(text, "t_unused")
  assert "100.0% / 100.0% / 100.0% of lookups" in _block(text, "t_country")
  assert "over 1 shard: div 1.00, mod 1.00" in _block(text, "t_one_shard")
  assert "vocabulary           1 row\n" in _block(text, "t_country") + "\n"

  page = open(report_page.write_html(tables, str(tmp_path / "r.html")),
              encoding="utf-8").read()
  result = parsed(page)
  by_table = {name: (plots, notes) for name, plots, notes in result.sections}
  assert by_table["t_unused"] == (
      [], ["No lookups sampled for this table: nothing to plot."])
  for name in ("t_country", "t_one_shard", "t_long"):
    plots, notes = by_table[name]
    assert [p["data-plot"] for p in plots] == list(KINDS) and not notes
  parsed_svgs = svgs(page)
  assert len(parsed_svgs) == 12  # the table without lookups has none
  for svg in parsed_svgs:
    numbers = _numbers(svg)
    assert numbers and all(np.isfinite(numbers))
    marks = [e for e in svg.iter() if e.tag in ("circle", "polyline")
             or "bar" in e.get("class", "")]
    assert marks, svg.get("data-plot")
    for element in svg.iter("rect"):
      assert float(element.get("width")) > 0
      assert float(element.get("height")) >= 0
  # One id: a dot in the rank and coverage plots (a line of one point
  # draws nothing), inside the plot area.
  for svg in parsed_svgs[0:2]:
    frame_left = min(float(line.get("x1")) for line in svg.iter("line")
                     if line.get("class") == "axis")
    dots = list(svg.iter("circle"))
    assert dots and all(frame_left < float(c.get("cx")) <
                        float(svg.get("width")) for c in dots)
  # One length: one bar, not wider than a tenth of the axis.
  (bar,) = [r for r in parsed_svgs[7].iter("rect")]
  assert float(bar.get("width")) < 0.1 * 480
  assert bar.find("title").text == "3 ids: 20 examples"
  assert f"{st.MAX_IDS_PER_EXAMPLE} or more" in page


def test_names_are_escaped():
  stats = observed(settings('<b>&"t"', features=(("<i>f</i>", 0),)),
                   zipf_batches(7, 2000, count=1))
  page = report_page.render_html([stats], source="<dir>")
  result = parsed(page)
  assert result.tags["b"] == 0 and result.tags["i"] == 0
  assert [name for name, _, _ in result.sections] == ['<b>&"t"']
  assert "&lt;b&gt;&amp;&quot;t&quot;" in page
  assert "&lt;i&gt;f&lt;/i&gt;" in page and "&lt;dir&gt;" in page
  for svg in svgs(page):  # well-formed XML despite the names
    assert svg.find("title").text


def test_no_statistics_is_an_error_not_an_empty_page(tmp_path):
  with pytest.raises(ValueError, match="no statistics"):
    report_page.write_html([], str(tmp_path / "r.html"))
  assert not (tmp_path / "r.html").exists()


# --- the command --------------------------------------------------------------


def _run(capsys, *argv):
  code = cli.main(list(argv))
  out, err = capsys.readouterr()
  return code, out, err


@pytest.mark.parametrize("case", ["missing", "file", "empty", "only_junk"])
def test_profile_refuses_a_directory_without_statistics(tmp_path, capsys,
                                                        case):
  target = tmp_path / "profiles"
  if case == "file":
    target.write_text("not a directory")
  elif case in ("empty", "only_junk"):
    target.mkdir()
    (target / "notes.txt").write_text("not statistics")
    if case == "only_junk":
      (target / "junk.json").write_text("{not json")
  code, out, err = _run(capsys, "profile", str(target))
  assert code == 2 and out == ""
  errors = [l for l in err.splitlines() if ": error: " in l]
  assert len(errors) == 1
  expected = {"missing": "does not exist", "file": "is not a directory",
              "empty": "no lookup statistics files",
              "only_junk": "no lookup statistics files"}[case]
  assert expected in errors[0] and str(target) in errors[0]
  assert errors[0].startswith("python -m estimator_spec profile: error: ")
  if target.is_dir():
    assert not (target / "report.html").exists()
  warned = [l for l in err.splitlines() if ": warning: " in l]
  assert len(warned) == (1 if case == "only_junk" else 0)


def test_profile_reports_the_good_files_and_skips_a_corrupt_one(tmp_path,
                                                                capsys):
  for stats in _three_tables():
    store.save(str(tmp_path), stats)
  (tmp_path / "junk.json").write_text("{not json")
  code, out, err = _run(capsys, "profile", str(tmp_path))
  assert code == 0
  page_path = str(tmp_path / "report.html")
  assert out.splitlines()[-1] == page_path
  assert [l for l in out.splitlines() if l.startswith("Table ")] == [
      "Table tbl_big", "Table tbl_history", "Table tbl_items"]
  (warning,) = err.splitlines()
  assert warning.startswith("python -m estimator_spec profile: warning: ")
  assert "junk.json is skipped" in warning
  page = open(page_path, encoding="utf-8").read()
  assert len(parsed(page).sections) == 3
  # Again: the page itself is not read as statistics, and is replaced.
  code, out2, err2 = _run(capsys, "profile", str(tmp_path))
  assert (code, out2, err2) == (0, out, err)
  assert open(page_path, encoding="utf-8").read() == page


def test_profile_output_option_and_unwritable_output(tmp_path, capsys):
  store.save(str(tmp_path), _three_tables()[0])
  target = tmp_path / "elsewhere.html"
  code, out, _ = _run(capsys, "profile", str(tmp_path), "--output",
                      str(target))
  assert code == 0 and out.splitlines()[-1] == str(target)
  assert target.exists() and not (tmp_path / "report.html").exists()
  code, out, err = _run(capsys, "profile", str(tmp_path), "--output",
                        str(tmp_path / "missing" / "r.html"))
  assert code == 2 and out == ""
  assert "cannot write" in err and len(err.splitlines()) == 1


def test_profile_needs_a_directory_argument(capsys):
  with pytest.raises(SystemExit) as exit_info:
    cli.main(["profile"])
  assert exit_info.value.code == 2
  assert "DIR" in capsys.readouterr().err


def test_describe_shows_the_statistics_of_a_profile_dir(tmp_path, capsys):
  model = dlrm.build_spec().model
  shards = 4  # --num-hosts 2 --cores-per-host 2
  table = sorted(model.tables)[0]
  vocabulary = model.tables[table].vocabulary_size
  stats = st.TableStatistics(st.table_settings(model, table, shards), 1.0)
  # Every lookup on the first rows: div puts them all on shard 0.
  ids = np.arange(400) % 7
  stats.observe(ids, np.ones(ids.size, np.int64))
  store.save(str(tmp_path), stats)
  argv = ["describe", "examples.dlrm:build_spec", "--num-hosts", "2",
          "--cores-per-host", "2"]
  code, plain, _ = _run(capsys, *argv)
  assert code == 0 and "Lookup statistics" not in plain
  code, out, _ = _run(capsys, *argv, "--profile-dir", str(tmp_path))
  assert code == 0 and out.startswith(plain.rstrip("\n"))
  section = out[len(plain.rstrip("\n")):]
  assert "Lookup statistics (sampled while training)" in section
  (row,) = [line for line in section.splitlines()
            if line.split()[:1] == [table]]
  mod_loads = np.bincount(ids % shards, minlength=shards)
  assert row.split()[1:] == [
      "1", "400", "7", f"{shards:.2f}",
      f"{mod_loads.max() / mod_loads.mean():.2f}"]
  assert vocabulary > 7 * shards
  assert "div (configured): busiest shard 4.00x the mean load" in section
