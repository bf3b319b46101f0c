"""scripts/compare.py: tables, plot, RESULTS.md, bad input (the runs are the scripts' own tests)."""
import json
import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import compare  # noqa: E402
import lab  # noqa: E402


def _fake_run(tmp_path, name, accs):
    run_dir = tmp_path / name
    run_dir.mkdir()
    with open(run_dir / "metrics.jsonl", "w") as f:
        for step, acc in enumerate(accs):
            f.write(json.dumps({"step": step, "time": 10.0 * step, "samples": 256,
                                "eval3/sampled/accuracy": acc, "eval3/sampled/reward": acc}) + "\n")
    return str(run_dir)


def _eval(acc, variants=("original", "A", "B")):
    m = {}
    for n in (3, 4):
        for mode in ("greedy", "sampled", "report-sampled"):
            m[f"eval{n}/{mode}/accuracy"] = acc
            m.update({f"eval{n}/{mode}/reward_{v}": acc for v in variants})
        m.update({f"eval{n}/sampled/format_rate": 1.0, f"eval{n}/pass@8": 0.5,
                  f"eval{n}/sampled/length": 20.0})
    return m


def _results(tmp_path, task="countdown", variants=("original", "A", "B")):
    usage = {"wall_s": 100.0, "peak_rss_mb": 900.0}
    return {"task": task, "variants": list(variants), "runs": {
        "sft": [{"dir": None, "usage": usage, "eval": _eval(0.3, variants)}] * 2,
        "rloo": [{"dir": _fake_run(tmp_path, f"rloo-s{s}", [0.3, acc]), "usage": usage,
                  "eval": _eval(acc, variants)} for s, acc in enumerate([0.4, 0.5])]}}


def test_table_reports_mean_and_spread_over_seeds_and_plot_is_written(tmp_path):
    results = _results(tmp_path)
    text = compare.main_table(results, [3, 4])
    rloo_row = [line for line in text.splitlines() if line.startswith("| rloo")][0]
    assert "45.0 ± 7.1" in rloo_row  # accuracy 40% and 50%: mean 45, sample sd 7.07
    assert "| sft | 30.0 ± 0.0" in text
    results["runs"]["sft"] = [{**r, "usage": {"wall_s": float("nan"), "peak_rss_mb": float("nan")}}
                              for r in results["runs"]["sft"]]  # --sft: not measured here
    assert compare.main_table(results, [3, 4]).splitlines()[2].endswith(" | - | - |")
    assert "0.450 ± 0.071" in rloo_row  # the mean reward under the report's decoding, 3 digits
    assert compare.curve(results["runs"]["rloo"][1]["dir"], "eval3/sampled/accuracy") == (
        [0.0, 10.0], [256, 512], [0.3, 0.5])
    compare.plot(results, 3, "countdown", str(tmp_path / "curves.png"))
    assert os.path.getsize(tmp_path / "curves.png") > 10_000


def test_results_file_names_its_command_commit_and_machine_and_fills_readme_block(tmp_path):
    results = _results(tmp_path)
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- results:start -->\nold table 99.9\n<!-- results:end -->\nend\n")
    argv = ["--seeds", "0,1", "--results", str(tmp_path / "docs" / "RESULTS.md"),
            "--readme", str(readme)]
    args = compare.parse_args(argv)[1]
    text = compare.write_results(results, args, [3, 4], argv)
    assert "python scripts/compare.py --seeds 0,1" in text and "commit " in text and "cores" in text
    assert (tmp_path / "docs" / "RESULTS.md").read_text() == text
    compare.update_readme(str(readme), results, [3, 4], args)
    new = readme.read_text()
    assert "old table 99.9" not in new and "45.0 ± 7.1" in new
    assert new.startswith("intro\n") and new.endswith("end\n")


def test_another_task_gets_its_own_files_and_reward_and_none_of_the_reports_rows(tmp_path,
                                                                                  capsys):
    """On coins: the report's rows, decoding and figures (Countdown's) are left out, the table shows
    the task's default reward at T = 1, and the files default to RESULTS-coins.md, no README."""
    args = compare.parse_args(["--task", "coins"])[1]
    assert (args.out, args.results, args.readme) == ("runs/compare-coins",
                                                     "docs/RESULTS-coins.md", "")
    args = compare.parse_args(["--task", "coins", "--results", str(tmp_path / "R.md")])[1]
    results = _results(tmp_path, "coins", ("graded", "binary"))
    table = compare.main_table(results, [3, 4])
    assert "3: T=1 reward graded" in table.splitlines()[0] and "[CR]" not in table
    text = compare.write_results(results, args, [3, 4], ["--task", "coins"])
    assert "# Results: coins" in text and "[CR]" not in text and "report" not in text
    with pytest.raises(SystemExit) as e:
        compare.main(["--task", "coins", "--rows", "rloo,topr (report: A)",
                      "--out", str(tmp_path / "c")])
    assert e.value.code == 2 and "countdown only" in capsys.readouterr().err


def test_ordering_note_says_where_our_order_differs_from_the_reports(tmp_path):
    def runs(**rewards):
        key = "eval3/report-sampled/reward_original"
        return {"runs": {n: [{"eval": {key: r}}] for n, r in rewards.items()}}
    same = runs(sft=0.3, rloo=0.2)  # [CR] Table 1: sft 0.3385 > rloo 0.2140
    assert "is the report's" in compare.ordering_note(same, 3)
    flipped = runs(sft=0.2, rloo=0.3)
    note = compare.ordering_note(flipped, 3)
    assert "differ" in note and "Ours" in note and "rloo > sft" in note


@pytest.mark.parametrize("args,message", [
    (["--rows", "rloo,ppo"], "unknown ppo"),
    (["--seeds", "0,x"], "--seeds"),
    (["--sft", "/nonexistent"], "no such checkpoint"),
    (["--time-limit", "0"], "positive"),
])
def test_bad_input_gives_one_line_and_status_2(args, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        compare.main(args + ["--out", str(tmp_path / "c")])
    assert e.value.code == 2
    assert message in capsys.readouterr().err.strip().splitlines()[-1]


def test_out_folder_made_with_other_settings_is_not_reused(tmp_path, capsys):
    out = str(tmp_path / "c")
    args = compare.parse_args(["--out", out, "--time-limit", "3"])[1]
    compare.check_out_folder(args)  # a new folder: settings written
    args = compare.parse_args(["--out", out, "--time-limit", "2"])[1]
    with pytest.raises(ValueError, match="time_limit 3.0 \\(now 2.0\\)"):
        compare.check_out_folder(args)
    (tmp_path / "c" / "settings.json").write_text('{"task": "countd')  # truncated by a kill
    with pytest.raises(ValueError, match="settings.json there is unreadable"):
        compare.check_out_folder(args)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="not a comparison's folder"):
        compare.check_out_folder(compare.parse_args(["--out", str(tmp_path / "d")])[1])


def test_results_name_the_commit_that_kept_runs_were_made_at(tmp_path, monkeypatch):
    args = compare.parse_args(["--out", str(tmp_path / "c")])[1]
    monkeypatch.setattr(compare, "commit", lambda: "aaaaaaa")
    compare.check_out_folder(args)  # a new folder: the runs are made now
    assert compare.runs_commit(args) == ""
    monkeypatch.setattr(compare, "commit", lambda: "bbbbbbb")
    compare.check_out_folder(args)  # reused by later code: the runs' commit is kept
    assert compare.read_json(str(tmp_path / "c" / "settings.json"))["commit"] == "aaaaaaa"
    assert compare.runs_commit(args) == "; runs made at commit aaaaaaa"


def test_a_corrupt_evaluation_file_is_named_in_one_line(tmp_path):
    bad = tmp_path / "eval.json"
    bad.write_text('{"eval3/greedy/accuracy": 0.')
    with pytest.raises(SystemExit, match="eval.json is unreadable"):
        lab.evaluate_kept(str(bad), "unused", "countdown", [3], None, 0)


FUZZ = {"--time-limit": ["x", "-1", "0", "nan", "inf", ""], "--jobs": ["x", "-1", "0", "1.5", ""],
        "--threads": ["x", "0", ""], "--eval-size": ["0", "nan", ""], "--eval-k": ["-2", ""],
        "--seeds": ["x", "", "1,,2"], "--sizes": ["x", "3,y"], "--rows": ["ppo", "rloo,x"],
        "--engine": ["fast", ""], "--task": ["nope", ""], "--sft": ["/nonexistent", ""]}


@pytest.mark.parametrize("flag,value", [(f, v) for f, vs in FUZZ.items() for v in vs])
def test_cli_fuzz_every_bad_value_is_one_line_and_status_2(flag, value, tmp_path, capsys,
                                                            monkeypatch):
    def no_run(*a):
        raise AssertionError(f"{flag} {value!r} was accepted and a run started")
    monkeypatch.setattr(lab, "run_script", no_run)  # lab's runner: sft.py's run and every row's
    with pytest.raises(SystemExit) as e:
        compare.main([flag, value, "--out", str(tmp_path / "c")])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and not any("Traceback" in line for line in err)
    assert ": error: " in err[-1] and flag.lstrip("-").split("-")[0] in err[-1].replace("_", "-")


# ---- scripts/sweep.py: the sweeps' tables from finished runs, and bad input ---------------------
import sweep  # noqa: E402


def _sweep_results(names, accs):
    """Finished runs as sweep.run_all returns them: each row's first and last evaluation."""
    keys = [k for k, _ in sweep.KEYS + sweep.PASS_KEYS]
    return {name: [{"first": {"step": 0, **dict.fromkeys(keys, 0.3)},
                    "last": {"step": 9, "kl_to_ref": 0.5, **dict.fromkeys(keys, acc)},
                    "steps": 9, "curve": [], "out": f"/runs/{name}"}] for name, acc in
            zip(names, accs)}


def test_sweep_writes_each_rows_gain_as_a_share_of_rloos(tmp_path, monkeypatch):
    monkeypatch.setattr(sweep, "run_all", lambda names, seeds, args: _sweep_results(
        names, [0.5, 0.4]))  # rloo gains 20 points, spo-b0.2 10
    (tmp_path / "sft").mkdir()
    (tmp_path / "sft" / "config.json").write_text("{}")
    doc = tmp_path / "doc.md"
    sweep.main(["agro-spo", "--sft", str(tmp_path / "sft"), "--rows", "rloo,spo-b0.2", "--out",
                str(tmp_path / "out"), "--doc", str(doc)])
    lines = doc.read_text().splitlines()
    assert lines[2].startswith("Generated by `python scripts/sweep.py agro-spo --sft SFT --seeds 0 "
                               "--minutes 5`")
    assert re.match(r"Commit \w+.*, 20\d\d-\d\d-\d\d \d\d:\d\d \w+; machine: \d+ cores \(",
                    lines[4]), lines[4]  # which code, when and where: a doc names its machine
    sft = next(line for line in lines if line.startswith("| SFT (start) |"))
    assert sft.split(" | ")[1:7] == ["30.0"] * 6
    rows = {}  # the table's rows
    for line in lines:
        rows.setdefault(line.split(" | ")[0], line.split(" | ")[1:])
    assert rows["| rloo"] == ["50.0"] * 6 + ["100 / 100", "9", "0.50", "the reference |"]
    assert rows["| spo-b0.2"][:9] == ["40.0"] * 6 + ["50 / 50", "9", "0.50"]
    assert "- spo-b0.2: `python spo.py --beta 0.2`" in lines


def test_sweep_rows_are_read_from_docs_sweeps_toml_with_the_reports_setting_first():
    rows = sweep.SWEEPS["topr-report"]["rows"]
    assert rows["report: A"] == ("topr.py", ["--report-variant", "A"], "[CR] Table 1 row")
    assert rows["exp 1: wrong = 0 (reward B)"][:2] == ("topr.py", sweep.REPORT + ["--reward", "B"])
    assert "--lr=0.0001" in sweep.REPORT  # [CR] §4.1's setting, topr.py's REPORT_SETTING
    assert sweep.SWEEPS["agro-spo"]["minutes"] == 5 and "minutes" not in sweep.SWEEPS["topr-report"]


@pytest.mark.parametrize("args,message", [
    (["agro-spo", "--rows", "spo-b0.2"], "(rloo included)"),
    (["topr-report", "--rows", "nope"], "unknown ['nope']"),
    (["topr-report", "--sft", "/nonexistent"], "no model there"),
])
def test_sweep_bad_input_gives_one_line_and_status_2(args, message, tmp_path, capsys):
    (tmp_path / "config.json").write_text("{}")
    sft = [] if "--sft" in args else ["--sft", str(tmp_path)]
    with pytest.raises(SystemExit) as e:
        sweep.main(args + sft + ["--out", str(tmp_path / "out")])
    assert e.value.code == 2
    assert message in capsys.readouterr().err.strip().splitlines()[-1]


# ---- scripts/first_run.py: the closing lines it reads ------------------------------------------
def test_first_run_reads_the_gains_from_the_closing_lines_the_scripts_print(tmp_path):
    """first_run.py's pattern on topr.py's own closing lines: start, end and gain, greedy and T = 1
    (a change of their wording fails here rather than in a 20-minute benchmark)."""
    import argparse

    import common
    import first_run
    rows = [{"step": 0, "eval3/greedy/accuracy": 0.5, "eval3/sampled/accuracy": 0.25},
            {"step": 9, "eval3/greedy/accuracy": 0.625, "eval3/sampled/accuracy": 0.125}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    lines = common.closing_lines(argparse.Namespace(out=str(tmp_path), task="countdown"), False,
                                 "topr.py")
    found = [m.groups() for m in first_run.LINE.finditer("\n".join(lines))]
    assert found == [("3", "50.0", "62.5", "+12.5", "25.0", "12.5", "-12.5")]


def test_an_evaluation_gives_a_pretrained_model_the_scripts_512_new_tokens_and_tiny_64():
    """compare.py, time_to_accuracy.py and claims.py evaluate with lab.eval_tokens: a real chat
    model's answers do not fit the tiny model's 64 tokens."""
    import lab
    from types import SimpleNamespace
    assert lab.eval_tokens(SimpleNamespace(config=SimpleNamespace(prompt_style="compact"))) == 64
    assert lab.eval_tokens(SimpleNamespace(config=SimpleNamespace())) == 512


def test_the_experiments_evaluation_of_a_start_model_is_a_runs_step_0(weak_sft, tmp_path):
    """lab.evaluate (compare.py's and time_to_accuracy.py's evaluation) of a start model gives a
    seed-s run's step-0 figures, key for key: the problems --seed s holds out, the T = 1 draws of
    the scripts' EVAL_SEED. So the start model has one set of figures in every doc; another seed's
    problems give others."""
    import lab
    import rloo
    from conftest import metrics_rows
    run = tmp_path / "run"
    rloo.main(["--model", weak_sft, "--seed", "1", "--steps", "1", "--prompts", "2",
               "--group-size", "2", "--eval-size", "6", "--eval-k", "3", "--threads", "1",
               "--out", str(run)])
    step0 = metrics_rows(run)[0]
    assert step0["step"] == 0
    keys = [k for k in step0 if k.startswith("eval") and ("/greedy/" in k or "/sampled/" in k)]
    assert any(k.endswith("/sampled/length") for k in keys), keys  # draws that differ by seed
    ours = lab.evaluate(weak_sft, "countdown", 1, k=3, size=6, threads=1)
    assert {k: ours[k] for k in keys} == {k: step0[k] for k in keys}
    other = lab.evaluate(weak_sft, "countdown", 0, k=3, size=6, threads=1)
    assert any(other[k] != step0[k] for k in keys)
