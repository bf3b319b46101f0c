"""The generated docs agree where they give the same figure of the same runs: README's results block
and docs/RESULTS.md, README's first run and docs/FIRST-RUN.md, the start model in docs/RESULTS.md
(its table and its time block), docs/FIRST-RUN.md and the claims (one machine, one sft.py run, one
evaluation: lab.evaluate), and every claim run from one start model (docs/claims/*.json). A figure
is compared at the precision both docs print it."""
import glob
import json
import os
import re
import statistics
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import compare  # noqa: E402  (README_ROWS: which RESULTS.md row each README row copies)

README_ROWS = {readme: row for row, readme in compare.README_ROWS.items()}


def read(path: str) -> str:
    with open(os.path.join(ROOT, path)) as f:
        return f.read()


def table(text: str, first: str) -> dict:
    """{row name: {column: cell}} of the Markdown table whose header starts with `first`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first} |"))
    header = [c.strip() for c in lines[start].strip("|").split("|")]
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = dict(zip(header, cells))
    return rows


def mean(cell: str) -> float:
    return float(cell.split(" ± ")[0])


def first_run_starts(text: str) -> dict:
    """FIRST-RUN.md's start figures by seed: {seed: (greedy 3, T=1 3, greedy 4, T=1 4)}."""
    starts = {}
    pattern = (r"seed (\d+) \(its start model\) \| \d+ \| 3: ([\d.]+) -> [^,]+, ([\d.]+) -> [^;]+; "
               r"4: ([\d.]+) -> [^,]+, ([\d.]+) ->")
    for seed, *figures in re.findall(pattern, text):
        starts.setdefault(int(seed), set()).add(tuple(map(float, figures)))
    return starts


def test_readmes_results_block_is_docs_results_table():
    readme, results = table(read("README.md"), "script"), table(read("docs/RESULTS.md"),
                                                                "configuration")
    assert set(readme) == set(README_ROWS)
    for name, row in readme.items():
        for n in (3, 4):
            assert row[f"{n} numbers: T = 1"] == results[README_ROWS[name]][f"{n}: T=1 acc"], name
            assert row[f"{n} numbers: greedy"] == results[README_ROWS[name]][f"{n}: greedy acc"]


def test_one_start_model_in_first_run_and_the_readme():
    """Every script's run of one seed in FIRST-RUN.md starts from the same figures, and seed 0's
    are README's first run's (RESULTS.md: the next test)."""
    starts = first_run_starts(read("docs/FIRST-RUN.md"))
    assert starts and all(len(figures) == 1 for figures in starts.values()), starts
    (g3, t3, g4, t4), = starts[0]
    readme = re.findall(r"size (\d): greedy ([\d.]+) -> [\d.]+ \([-+][\d.]+\), T = 1 ([\d.]+) ->",
                        read("README.md"))
    assert {int(n): (float(g), float(t)) for n, g, t in readme} == {3: (g3, t3), 4: (g4, t4)}


def test_every_claim_run_from_one_start_model_starts_from_the_same_figures():
    """Arms with the runs' own evaluation (no --eval-size / --eval-k of their own): seed by seed,
    one start figure on each size in every archived claim."""
    seen = {}
    paths = [p for p in glob.glob(os.path.join(ROOT, "docs", "claims", "*.json"))
             if not os.path.basename(p).startswith("earlier-")]
    if not paths:
        pytest.skip("no claim archived yet")
    for path in paths:
        r = json.load(open(path))
        for arm, command in r["commands"].items():
            if "--eval-size" in command or "--eval-k" in command:
                continue
            for seed, figures in r["figures"].items():
                if arm not in figures:  # a probe arm not run at the seeds added later
                    continue
                start = (round(figures[arm]["start3"], 6), round(figures[arm]["start4"], 6))
                seen.setdefault(seed, {}).setdefault(start, []).append(f"{r['claim']}/{arm}")
    for seed, starts in seen.items():
        assert len(starts) == 1, (seed, starts)


def sd(cell: str) -> float:
    return float(cell.split(" ± ")[1]) if " ± " in cell else 0.0


def test_the_start_model_is_one_evaluation_in_results_first_run_and_the_claims():
    """docs/RESULTS.md's sft row (lab.evaluate: each seed's held-out problems, the scripts' draws)
    is the mean ± sd over its seeds of FIRST-RUN.md's start figures (each run's step 0), and its
    T = 1 figures are every archived claim's start row (the runs' own step 0, seeds 0-2): one start
    model, one set of numbers, within the rounding of the docs (0.05 a mean, 0.1 an sd)."""
    starts = first_run_starts(read("docs/FIRST-RUN.md"))
    sft = table(read("docs/RESULTS.md"), "configuration")["sft"]
    seeds = (0, 1, 2)
    for n, label, i in ((3, "greedy", 0), (3, "T=1", 1), (4, "greedy", 2), (4, "T=1", 3)):
        values = [next(iter(starts[s]))[i] for s in seeds]
        cell = sft[f"{n}: {label} acc"]
        assert abs(mean(cell) - statistics.mean(values)) <= 0.05 + 1e-9, (n, label, cell, values)
        assert abs(sd(cell) - statistics.stdev(values)) <= 0.1 + 1e-9, (n, label, cell, values)
    for path in glob.glob(os.path.join(ROOT, "docs", "claims", "[!e]*.json")):
        r = json.load(open(path))
        arm = next((a for a, c in r["commands"].items()
                    if "--eval-size" not in c and "--eval-k" not in c), None)
        if arm is None:  # every arm evaluates its own way (spo-fig1: pass@20 of 50 problems)
            continue
        for n in (3, 4):
            start = statistics.mean(r["figures"][str(s)][arm][f"start{n}"] for s in seeds)
            assert abs(mean(sft[f"{n}: T=1 acc"]) - start) <= 0.05 + 1e-9, (r["claim"], n, start)


def test_the_time_blocks_minute_0_is_the_start_model_of_first_run():
    """docs/RESULTS.md's time-to-accuracy block starts every row at the start model (minute 0,
    lab.evaluate at the block's seeds): FIRST-RUN.md's T = 1 start figures, mean ± sd over those
    seeds, within the rounding of the docs."""
    text = read("docs/RESULTS.md")
    block = text[text.index("<!-- time-to-accuracy:start -->"):]
    seeds = [int(s) for s in re.search(r"seeds\s+([\d,]+)\.", block).group(1).split(",")]
    starts = first_run_starts(read("docs/FIRST-RUN.md"))
    for row in table(block, "script").values():
        for n, i in ((3, 1), (4, 3)):
            values = [next(iter(starts[s]))[i] for s in seeds]
            cell = row[f"{n}: 0 min"]
            assert abs(mean(cell) - statistics.mean(values)) <= 0.05 + 1e-9, (n, cell, values)
            assert abs(sd(cell) - statistics.stdev(values)) <= 0.1 + 1e-9, (n, cell, values)


def test_claims_verdicts_in_the_doc_and_the_readme_are_the_archived_results():
    """docs/CLAIMS.md's main table gives every run claim the verdict claims.py computes from its
    result in docs/claims/ (one of the five labels), a claim registered as not testable here is
    never in the paper's direction, and README's claims line leads with the scale and counts the
    same verdicts as the doc."""
    import claims
    doc, readme = read("docs/CLAIMS.md"), read("README.md")
    rows = {}
    for line in doc.splitlines():
        if m := re.match(r"\| \[\[[^]]*\][^]]*\]\(#([\w-]+)\) \|", line):
            rows[m.group(1)] = re.findall(r"\| \*\*([^*]+)\*\*", line)[-1]
    runnable = [c for c, v in claims.CLAIMS.items() if v.get("runs", True)]
    assert sorted(rows) == sorted(runnable)
    kept = {f[:-5]: json.load(open(os.path.join(ROOT, "docs", "claims", f)))
            for f in os.listdir(os.path.join(ROOT, "docs", "claims")) if f.endswith(".json")}
    for cid in runnable:  # a claim made of other claims' runs: its result composed from theirs
        r = kept[cid] if cid in kept else claims.composed(cid, kept)
        if r is None:  # registered, its runs still to come
            assert rows[cid] == "not run yet", cid
            continue
        assert rows[cid] == claims.primary_of(cid, r)["verdict"], cid
        assert rows[cid] in claims.VERDICTS, cid
    for cid in claims.UNTESTABLE:  # the ceiling, the collapsed arm (agro-fig4's comparator)
        assert rows[cid] == "not testable here", cid
    scale = "a 1M-parameter character model on Countdown, lr 100x [TOPR]'s and 1,000x [SPO]'s"
    line = readme[readme.index("<!-- claims:start -->"):readme.index("<!-- claims:end -->")]
    assert line.split("\n")[1].startswith(f"At the scale of {scale}")
    counts = claims.summary([v for v in rows.values() if v != "not run yet"], len(runnable))
    line = " ".join(line.split())  # the block is wrapped at 100 columns
    assert "one primary contrast per claim, judged by the mean over" in line
    assert f"95% interval: {counts}, and" in line
    assert f"Primary contrasts: {counts};" in " ".join(doc.split())
    assert doc.index(scale) < doc.index("| claim |")
