"""sft.py: the loss, the schedule, learning, an end-to-end run, resume, and bad input."""
import json
import os
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM

import common
import sft
from conftest import fit, run_until_killed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_loss_on_hand_computed_tensors():
    logprobs = torch.tensor([[-1.0, -2.0, 0.0], [-3.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert sft.sft_loss(logprobs, mask, "token").item() == pytest.approx(6 / 3)
    assert sft.sft_loss(logprobs, mask, "seq").item() == pytest.approx((3 + 3) / 2)
    # padding positions carry garbage on purpose: the mask must remove them
    assert sft.sft_loss(logprobs + (1 - mask) * -50, mask, "token").item() == pytest.approx(2.0)


def test_seq_is_length_times_token_for_equal_lengths():
    logprobs, mask = -torch.rand(4, 7), torch.ones(4, 7)
    assert sft.sft_loss(logprobs, mask, "seq").item() == pytest.approx(7 * sft.sft_loss(logprobs, mask, "token").item())


def test_schedule_matches_the_report():
    lr = [1e-5 * sft.lr_lambda(s, 500, 5000) for s in (0, 250, 500, 2750, 5000)]
    assert lr == pytest.approx([0.0, 5e-6, 1e-5, 5e-6, 0.0], abs=1e-12)


def test_tiny_model_memorises_four_examples(tiny):
    model, tok = tiny
    model.train()
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    prompts = [enc(p) for p in ["3 5 7=22:", "2 4=8:", "9 1 1=10:", "6 6 6=36:"]]
    completions = [enc(c) + [tok.eos_token_id] for c in
                   ["<answer>3*5+7</answer>", "<answer>2*4</answer>", "<answer>9+1</answer>", "<answer>6*6</answer>"]]
    loss = fit(model, tok, prompts, completions, steps=300, lr=3e-3, stop_below=0.05)
    assert loss < 0.05, f"loss {loss:.3f} after 300 steps"


TINY_RUN = ["--steps", "6", "--eval-every", "3", "--eval-size", "4", "--train-size", "40", "--batch-size", "8",
            "--eval-k", "2", "--max-new-tokens", "12", "--threads", "1", "--warmup", "2"]


def test_end_to_end_run_writes_metrics_checkpoint_and_final_model(tmp_path):
    out = sft.main(TINY_RUN + ["--out", str(tmp_path / "run")])
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert "eval3/greedy/accuracy" in rows[2] and "eval4/sampled/accuracy" in rows[5]
    assert "eval3/sampled/accuracy" not in rows[2]  # periodic evaluations are greedy only
    assert all(r["loss"] > 0 for r in rows) and rows[-1]["loss"] < rows[0]["loss"]
    assert common.load_trainer_state(os.path.join(out, "checkpoint"))["step"] == 6
    model = AutoModelForCausalLM.from_pretrained(os.path.join(out, "final"))  # what the RL scripts load
    assert model.config.prompt_style == "compact"


def test_interrupted_then_resumed_run_equals_an_uninterrupted_one(tmp_path, monkeypatch):
    straight = sft.main(TINY_RUN + ["--out", str(tmp_path / "a")])

    run_until_killed(sft.main, TINY_RUN + ["--out", str(tmp_path / "b")], monkeypatch, step=5)
    resumed = sft.main(["--resume", str(tmp_path / "b")])  # restarts from the step-3 checkpoint

    a = AutoModelForCausalLM.from_pretrained(os.path.join(straight, "final")).state_dict()
    b = AutoModelForCausalLM.from_pretrained(os.path.join(resumed, "final")).state_dict()
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-6), k
    steps = [json.loads(line)["step"] for line in open(os.path.join(resumed, "metrics.jsonl"))]
    assert steps == [1, 2, 3, 4, 5, 6]


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("args,message", [
    (["--task", "nope"], "unknown task"),
    (["--model", "./does/not/exist"], "no such model folder"),
    (["--batch-size", "0"], "positive integer"),
    (["--reward", "Z"], "unknown --reward"),
    (["--num-numbers", "3,x"], "--num-numbers"),
    (["--resume", "/nonexistent/run"], "config.json"),
])
def test_bad_flags_give_one_line_and_status_2(args, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        sft.main(args + ["--out", str(tmp_path / "run")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1] and err[-1].startswith("usage:") is False
    assert not os.path.exists(tmp_path / "run")  # nothing was created


@pytest.mark.parametrize("content,message", [
    ("", "holds no examples"),
    ('{"prompt": "a", "completion": "b"}\nnot json\n', ":2: not valid JSON"),
    ('{"prompt": "a"}\n', "needs string fields"),
])
def test_bad_data_files_give_one_line_and_status_2(content, message, tmp_path, capsys):
    data = _write(tmp_path, "data.jsonl", content)
    with pytest.raises(SystemExit) as e:
        sft.main(["--data", data, "--out", str(tmp_path / "run")])
    assert e.value.code == 2
    assert message in capsys.readouterr().err.strip().splitlines()[-1]


def test_prompt_completion_file_loads(tmp_path):
    data = _write(tmp_path, "d.jsonl", '{"prompt": "1 2=3:", "completion": "<answer>1+2</answer>"}\n\n'
                                       '{"query": "2 2=4:", "completion": "<answer>2+2</answer>"}\n')
    assert sft.load_pairs(data) == [("1 2=3:", "<answer>1+2</answer>"), ("2 2=4:", "<answer>2+2</answer>")]


def test_command_line_error_has_no_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "sft.py", "--model", str(tmp_path / "missing")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("sft.py: error: no such model folder")
