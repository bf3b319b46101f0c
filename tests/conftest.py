"""Shared fixtures. Tests run on one torch thread: two threads on a busy 2-core machine were 10-50x
slower."""
import json
import os
import sys

import pytest
import torch

os.environ.setdefault("TORCH_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import common  # noqa: E402


@pytest.fixture(scope="session")
def tiny_path(tmp_path_factory):
    """The built-in tiny model with random weights, built once per test session."""
    return common.build_tiny_model(str(tmp_path_factory.mktemp("tiny") / "model"), seed=0)


@pytest.fixture
def tiny(tiny_path):
    common.setup(0)
    return common.load_model(tiny_path)


def fit(model, tok, prompts, completions, steps, lr, stop_below=None):
    """Full-batch SFT steps with sft.py's loss on token ids; returns the last loss."""
    import sft
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        lp, mask = common.completion_logprobs(model, prompts, completions, tok.pad_token_id)
        loss = sft.sft_loss(lp, mask)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if stop_below is not None and loss.item() < stop_below:
            break
    return loss.item()


# Easy Countdown sets for the RL scripts' short runs: all 2-number sums, and four of them.
SUMS = [{"nums": [a, b], "target": a + b} for a in range(1, 10) for b in range(1, 10)]
FOUR = [{"nums": [3, 5], "target": 8}, {"nums": [7, 2], "target": 9}, {"nums": [4, 4], "target": 8},
        {"nums": [6, 1], "target": 7}]


@pytest.fixture(scope="session")
def weak_sft(tiny_path, tmp_path_factory):
    """The tiny model after a deliberately short SFT on 2-number sums: mostly formatted, rarely
    right."""
    from tasks import countdown
    common.setup(0, 1)
    model, tok = common.load_model(tiny_path)
    prompts = common.encode_prompts(countdown, SUMS, tok, "compact")
    completions = [tok(countdown.demonstration(p), add_special_tokens=False)["input_ids"]
                   + [tok.eos_token_id]
                   for p in SUMS]
    fit(model, tok, prompts, completions, steps=80, lr=2e-3)
    path = str(tmp_path_factory.mktemp("weak") / "final")
    common.save_checkpoint(path, model, tok)
    return path


def sampled(path, problems, samples=64) -> dict:
    """common.evaluate's sampled metrics (T=1) of the model in `path` on `problems`, with a fixed
    seed."""
    from tasks import countdown
    common.setup(1, 1)
    model, tok = common.load_model(path)
    prompts = common.encode_prompts(countdown, problems, tok, "compact")
    return common.evaluate(common.HFEngine(model, tok), countdown, problems, prompts, k=samples,
                           greedy=False, max_new_tokens=32)


def write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def run_until_killed(main, argv, monkeypatch, step):
    """Run a script's main(argv) and interrupt it (KeyboardInterrupt) as it logs `step`: a run
    killed mid-way."""
    real_log = common.Run.log

    def dies(self, s, metrics):
        if s == step:
            raise KeyboardInterrupt
        real_log(self, s, metrics)
    monkeypatch.setattr(common.Run, "log", dies)
    with pytest.raises(KeyboardInterrupt):
        main(argv)
    monkeypatch.setattr(common.Run, "log", real_log)
