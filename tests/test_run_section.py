"""The run section at the end of each algorithm script: the same code in all five, tested once."""
import argparse
import inspect
import json

import pytest

import agro
import rloo
import sft
import spo
import topr

SCRIPTS = {"sft": sft, "rloo": rloo, "topr": topr, "agro": agro, "spo": spo}


def test_the_closing_lines_are_the_same_code_in_all_five_scripts():
    sources = {name: inspect.getsource(m.closing_lines) for name, m in SCRIPTS.items()}
    assert len(set(sources.values())) == 1, "closing_lines differs between scripts"


ROWS = [  # a run's metrics.jsonl: a start evaluation, a training row, a greedy-only one, the end
    {"step": 0, "time": 0.1, "eval3/greedy/accuracy": 0.5, "eval3/sampled/accuracy": 0.25,
     "eval4/greedy/accuracy": 0.125, "eval4/sampled/accuracy": 0.0625, "pass@8": 0.9},
    {"step": 1, "time": 0.2, "loss": 1.0, "accuracy": 0.99},
    {"step": 2, "time": 0.3, "eval3/greedy/accuracy": 0.75, "eval4/greedy/accuracy": 0.0},
    {"step": 3, "time": 0.4, "eval3/greedy/accuracy": 0.6, "eval3/sampled/accuracy": 0.5,
     "eval4/greedy/accuracy": 0.25, "eval4/sampled/accuracy": 0.0},
]


@pytest.mark.parametrize("name", sorted(SCRIPTS))
@pytest.mark.parametrize("stopped_early", [False, True])
def test_the_closing_lines_say_what_the_run_did_and_what_comes_next(name, stopped_early,
                                                                   tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    args = argparse.Namespace(out=str(out), task="countdown")
    lines = SCRIPTS[name].closing_lines(args, stopped_early)
    assert lines[0] == f"{name}.py done. Held-out accuracy (%), step 0 -> step 3:"
    assert lines[1] == "  size 3: greedy 50.0 -> 60.0 (+10.0), T = 1 25.0 -> 50.0 (+25.0)"
    assert lines[2] == "  size 4: greedy 12.5 -> 25.0 (+12.5), T = 1 6.2 -> 0.0 (-6.2)"
    assert lines[3] == f"run folder: {out} (final model: {out}/final)"
    resume = f"stopped at --time-limit; continue: python {name}.py --resume {out}"
    assert (resume in lines) == stopped_early
    nxt = "topr" if name == "sft" else name
    assert lines[-1] == f"next: python {nxt}.py --task countdown --model {out}/final"
