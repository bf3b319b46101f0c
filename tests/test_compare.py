"""scripts/compare.py: the table, the plot and bad input (the runs themselves are the scripts' own tests)."""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
import compare  # noqa: E402


def _fake_run(tmp_path, name, accs):
    run_dir = tmp_path / name
    run_dir.mkdir()
    with open(run_dir / "metrics.jsonl", "w") as f:
        for step, acc in enumerate(accs):
            f.write(json.dumps({"step": step, "time": 10.0 * step, "samples": 256,
                                "eval3/sampled/accuracy": acc, "eval3/sampled/reward": acc}) + "\n")
    return str(run_dir)


def _eval(acc):
    m = {}
    for n in (3, 4):
        m.update({f"eval{n}/greedy/accuracy": acc, f"eval{n}/sampled/accuracy": acc})
    m.update({"eval3/sampled/format_rate": 1.0, "eval3/pass@8": 0.5, "eval3/sampled/length": 20.0, "eval3/sampled/reward": acc,
              **{f"eval3/sampled/reward_{v}": acc for v in ("original", "A", "B")}})
    return m


def test_table_reports_mean_and_spread_over_seeds_and_plot_is_written(tmp_path):
    usage = {"wall_s": 100.0, "peak_rss_mb": 900.0}
    results = {"variants": ["original", "A", "B"], "runs": {
        "sft": [{"dir": None, "usage": usage, "eval": _eval(0.3)}] * 2,
        "rloo": [{"dir": _fake_run(tmp_path, f"rloo-s{s}", [0.3, acc]), "usage": usage, "eval": _eval(acc)}
                 for s, acc in enumerate([0.4, 0.5])]}}
    args = compare.parse_args(["--seeds", "0,1"])[1]
    text = compare.write_table(results, args, [3, 4], str(tmp_path / "results.md"))
    rloo_row = [line for line in text.splitlines() if line.startswith("| rloo")][0]
    assert "45.0 ± 7.1" in rloo_row  # accuracy 40% and 50%: mean 45, sample sd 7.07
    assert "| sft | 30.0 ± 0.0" in text
    assert compare.curve(results["runs"]["rloo"][1]["dir"], "eval3/sampled/accuracy") == ([0.0, 10.0], [256, 512], [0.3, 0.5])
    compare.plot(results, 3, str(tmp_path / "curves.png"))
    assert os.path.getsize(tmp_path / "curves.png") > 10_000


@pytest.mark.parametrize("args,message", [
    (["--algorithms", "rloo,ppo"], "unknown ppo"),
    (["--seeds", "0,x"], "--seeds"),
    (["--sft", "/nonexistent"], "no such checkpoint"),
    (["--time-limit", "0"], "positive"),
])
def test_bad_input_gives_one_line_and_status_2(args, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        compare.main(args + ["--out", str(tmp_path / "c")])
    assert e.value.code == 2
    assert message in capsys.readouterr().err.strip().splitlines()[-1]
