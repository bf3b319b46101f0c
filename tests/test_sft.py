"""sft.py: first the paper's claims on pure functions (-m paper), then the data, learning, an
end-to-end run, resume, and bad input.

Graded (a teacher blanks these in sft.py; the -m paper tests grade a student's version):
sft_loss ([CR] Eq. 1) and lr_lambda ([CR] §4.4's schedule). The expected values are written out
in the tests, never computed with a function of sft.py; a blank function fails with a message
naming its equation (GRADED, tests/conftest.py); python tests/grading_check.py sft lists which
tests catch which likely mistake."""
import json
import math
import os
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM

import sft
from conftest import (fit, fuzz_flag, kill_when, logged_lines, metrics_rows, run_until_killed,
                      saved_step)
from tasks import countdown

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The functions a student writes: (equation, whether its result carries the gradient)
GRADED = (sft, {"sft_loss": ("[CR] Eq. 1", True),
                "lr_lambda": ("[CR] §4.4's warm-up and cosine decay", False)})


# ---- The paper's claims on pure functions: no model, seconds (pytest tests/test_sft.py -m paper)
@pytest.mark.paper
def test_eq1_counts_completion_tokens_only_and_normalises_by_tokens_or_sequences():
    """[CR] Eq. 1, L = -(1/N) sum_i log P(y_i | x_i): padding is masked out, whatever it holds;
    `token` divides the sum by the completion tokens, `seq` (Eq. 1 as written) by the sequences."""
    logprobs = torch.tensor([[-1.0, -2.0, 0.0], [-3.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    token, seq = sft.sft_loss(logprobs, mask, "token").item(), sft.sft_loss(logprobs, mask, "seq")
    assert token == pytest.approx(6 / 3), (
        f"sft_loss(norm='token') = {token}: Eq. 1's NLL summed over the 3 completion tokens, "
        "divided by 3, is 2 (a sign flipped gives -2)")
    assert seq.item() == pytest.approx((3 + 3) / 2), (
        f"sft_loss(norm='seq') = {seq.item()}: Eq. 1 as written, the mean over the 2 sequences of "
        "each one's NLL, is 3")
    # padding positions carry garbage on purpose: the mask must remove them
    assert sft.sft_loss(logprobs + (1 - mask) * -50, mask, "token").item() == pytest.approx(2.0)


@pytest.mark.paper
def test_eq1_per_sequence_is_length_times_per_token_for_equal_lengths():
    """[CR] Eq. 1: with every completion L tokens long, the `seq` loss is L times the `token`
    loss."""
    logprobs, mask = -torch.rand(4, 7), torch.ones(4, 7)
    assert sft.sft_loss(logprobs, mask, "seq").item() == pytest.approx(
        7 * sft.sft_loss(logprobs, mask, "token").item())


@pytest.mark.paper
def test_lr_warms_up_linearly_then_decays_by_cosine_to_zero():
    """[CR] §4.4, 500 warm-up steps then cosine annealing: lr(s) = peak s / 500 for s < 500, then
    peak (1 + cos(pi (s - 500) / (total - 500))) / 2, 0 at the last step."""
    lr = [1e-5 * sft.lr_lambda(s, 500, 5000) for s in (0, 250, 500, 1625, 2750, 5000)]
    quarter = 0.5e-5 * (1 + math.cos(math.pi / 4))  # a quarter of the way down: cosine, not linear
    assert lr == pytest.approx([0.0, 5e-6, 1e-5, quarter, 5e-6, 0.0], abs=1e-12), (
        f"lr_lambda: lr at steps 0, 250, 500, 1625, 2750, 5000 is {lr}")


@pytest.mark.paper
def test_eq1_gradient_is_minus_one_over_the_count_on_each_completion_token():
    """[CR] Eq. 1's gradient: d L / d log P(y_t) = -1/(completion tokens) for `token`, -1/N for
    `seq`, on every completion token, and 0 on padding, whatever it holds (here -50)."""
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    for norm, per_token in (("token", -1 / 4), ("seq", -1 / 2)):
        logprobs = (-torch.rand(2, 4) + (1 - mask) * -50).requires_grad_(True)
        sft.sft_loss(logprobs, mask, norm).backward()
        assert torch.allclose(logprobs.grad, per_token * mask), (
            f"sft_loss(norm={norm!r}): gradient {logprobs.grad.tolist()}, Eq. 1 gives {per_token} "
            "on each completion token and 0 on padding")


@pytest.mark.paper
def test_lr_at_every_step_is_linear_then_a_half_cosine():
    """[CR] §4.4 written out at every step of a short run (10 warm-up steps of 110): s/10 while
    s < 10, then (1 + cos(pi (s - 10)/100)) / 2: 1 at the end of the warm-up, 0 at the last step."""
    def written_out(s):
        return s / 10 if s < 10 else 0.5 * (1 + math.cos(math.pi * (s - 10) / 100))
    for s in range(111):
        assert sft.lr_lambda(s, 10, 110) == pytest.approx(written_out(s), abs=1e-12), (
            f"lr_lambda at step {s} of 110 (10 warm-up steps): {sft.lr_lambda(s, 10, 110)}, "
            f"§4.4 gives {written_out(s)}")


# ---- The rest: the data, learning, runs, resume and bad input ------------------------------------
def test_tiny_model_memorises_four_examples(tiny):
    model, tok = tiny
    model.train()
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    prompts = [enc(p) for p in ["3 5 7=22:", "2 4=8:", "9 1 1=10:", "6 6 6=36:"]]
    completions = [enc(c) + [tok.eos_token_id] for c in
                   ["<answer>3*5+7</answer>", "<answer>2*4</answer>", "<answer>9+1</answer>",
                    "<answer>6*6</answer>"]]
    loss = fit(model, tok, prompts, completions, steps=300, lr=3e-3, stop_below=0.05)
    assert loss < 0.05, f"loss {loss:.3f} after 300 steps"


TINY_RUN = ["--steps", "6", "--eval-every", "3", "--save-every", "3", "--eval-size", "4",
            "--train-size", "40", "--batch-size", "8", "--eval-k", "2", "--max-new-tokens", "12",
            "--threads", "1", "--warmup", "2"]


def test_end_to_end_run_writes_metrics_checkpoint_and_final_model(tmp_path):
    out = sft.main(TINY_RUN + ["--out", str(tmp_path / "run")])
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    start, rows = rows[0], rows[1:]  # step 0: the start model's evaluation, greedy and sampled
    assert start["step"] == 0 and "eval4/sampled/accuracy" in start and "loss" not in start
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert "eval3/greedy/accuracy" in rows[2] and "eval4/sampled/accuracy" in rows[5]
    assert "eval3/sampled/accuracy" not in rows[2]  # periodic evaluations are greedy only
    assert all(r["loss"] > 0 for r in rows) and rows[-1]["loss"] < rows[0]["loss"]
    assert torch.load(os.path.join(out, "checkpoint.pt"), weights_only=False)["step"] == 6
    # what the RL scripts load
    model = AutoModelForCausalLM.from_pretrained(os.path.join(out, "final"))
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
    assert steps == [0, 1, 2, 3, 4, 5, 6]


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("args,message", [
    (["--task", "nope"], "unknown task"),
    (["--model", "./does/not/exist"], "no such model folder"),
    (["--batch-size", "0"], "positive integer"),
    (["--reward", "Z"], "unknown --reward"),
    (["--sizes", "3,x"], "--sizes"),
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
    ('{"nums": [1, 2], "target": 3, "completion": "b"}\nnot json\n', ":2: bad JSON"),
    ('{"nums": [1, 2], "target": 3, "completion": "b"}\n{"nums": [1, 2', ":2: bad JSON (truncated"),
    ('{"prompt": "a", "completion": "b"}\n', "example 1: expected an object with fields 'nums'"),
    ('{"nums": [1, 2], "target": 3}\n', "example 1: needs a string field 'completion'"),
    ('{"nums": [1, "2"], "target": 3, "completion": "b"}\n', "example 1: 'nums' must be"),
])
def test_bad_data_files_give_one_line_and_status_2(content, message, tmp_path, capsys):
    data = _write(tmp_path, "data.jsonl", content)
    with pytest.raises(SystemExit) as e:
        sft.main(["--data", data, "--out", str(tmp_path / "run")])
    assert e.value.code == 2
    assert message in capsys.readouterr().err.strip().splitlines()[-1]


def test_data_file_rows_give_problems_and_completions(tmp_path):
    data = _write(tmp_path, "d.jsonl",
                  '{"nums": [1, 2], "target": 3, "completion": "<answer>1+2</answer>"}'
                  '\n\n{"nums": [2, 2], "target": 4, "query": "x", "completion": "c"}\n')
    problems, completions, given = sft.read_data(countdown, data)
    assert problems == [{"nums": [1, 2], "target": 3}, {"nums": [2, 2], "target": 4}]
    assert completions == ["<answer>1+2</answer>", "c"] and given == [None, "x"]


def test_command_line_error_has_no_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "sft.py", "--model", str(tmp_path / "missing")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("sft.py: error: no such model folder")


@pytest.mark.slow
@pytest.mark.parametrize("moment", ["after_a_checkpoint", "mid_step"])
def test_sigkill_then_resume_ends_with_the_uninterrupted_metrics(moment, tmp_path):
    """A real process killed (SIGKILL) right after its step-3 checkpoint, or during step 5, then
    `--resume`d: every logged metric (losses, held-out accuracies) equals the uninterrupted
    run's."""
    straight = sft.main(TINY_RUN + ["--out", str(tmp_path / "a")])
    run = str(tmp_path / "b")
    ready = ((lambda: saved_step(run) == 3) if moment == "after_a_checkpoint"
             else (lambda: logged_lines(run) >= 5))  # rows of steps 0-4 written
    assert kill_when(["sft.py", *TINY_RUN, "--out", run], ready) == -9  # killed, not finished
    assert not os.path.exists(os.path.join(run, "final"))
    proc = subprocess.run([sys.executable, "sft.py", "--resume", run], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert metrics_rows(run) == metrics_rows(straight)


# CLI fuzz: every flag that takes a value, given a wrong type, a negative, zero, nan, an empty
# string or a missing path: exit 2 with one line, or a normal start. Runs up to the model load only.
SFT_FLAGS = ["--task", "--model", "--data", "--out", "--resume", "--steps", "--batch-size",
             "--grad-accum", "--lr", "--warmup", "--weight-decay", "--clip", "--loss-norm",
             "--max-len", "--sizes", "--train-size", "--eval-sizes", "--eval-every",
             "--save-every", "--eval-size", "--eval-k", "--max-new-tokens", "--reward", "--engine",
             "--seed", "--threads"]


@pytest.mark.parametrize("flag", SFT_FLAGS)
def test_cli_fuzz(flag, tiny_path, tmp_path, monkeypatch, capsys):
    fuzz_flag(sft.main, ["--model", tiny_path, "--train-size", "4", "--batch-size", "2",
                         "--eval-size", "1"], flag, tmp_path, monkeypatch, capsys)


def test_nonfinite_loss_stops_before_the_weights_change(tiny, monkeypatch, capsys):
    """A nan loss: exit status 1, one line naming the step and the values, weights untouched."""
    model, tok = tiny
    _, args = sft.parse_args(["--grad-accum", "2"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    batch = [sft.Example(tok("12+3=", add_special_tokens=False)["input_ids"],
                         tok("15", add_special_tokens=False)["input_ids"])] * 2
    before = [w.detach().clone() for w in model.parameters()]
    monkeypatch.setattr(sft, "sft_loss", lambda lp, mask, norm: (lp * mask).sum() * float("nan"))
    with pytest.raises(SystemExit) as e:
        sft.sft_step(model, optimizer, scheduler, batch, args, tok.pad_token_id, step=4)
    assert e.value.code == 1
    assert "step 5: non-finite loss=nan" in capsys.readouterr().err.strip().splitlines()[-1]
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
