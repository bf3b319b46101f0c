"""The tabular AGRO experiments behind tests/test_agro.py, printed as numbers.

[AGRO] Tang et al., "RL-finetuning LLMs from on- and off-policy data with a single algorithm", 2025,
arXiv:2503.19612.

In 1-2 each arm of a bandit is a one-token "sequence" with its own logit; in 3 responses have
two tokens. Every update is the EXACT expectation of the autograd gradient of agro.py's own loss
functions, over every n-tuple of responses drawn from the data distribution (mu, or the current
policy for on-policy), each group weighted by its probability.

  1. Fig. 1 of the paper: off-policy data from mu in {uniform, pi_ref}; off-policy AGRO vs
     KL-regularised PG; KL(pi || pi*) after 1000 / 5000 steps (6 arms, beta 0.3, lr 0.5, seeds 0-2).
  2. On-policy characterisation: 10 arms, one correct (reward 1) with pi_ref mass 0.05; on-policy
     AGRO with lambda_LR 1 (the paper) and 0; the correct arm's probability and KL(pi || pi*)
     (lr 1, 3000 steps).
  3. Depth-2 tree (two-token responses, 3 tokens, beta 0.3, n 3, on-policy): the exact gradient of
     E[r] - beta KL(pi || pi_ref) beside the expected gradient of AGRO's estimators, the per-token
     KL-PG and the sequence-KL PG (RLOO with the KL in a detached reward). Only the per-token form
     is off, and only on the first token's logits.

Run:  python scripts/agro_tabular.py          (all three; about 1 minute on one core)
      python scripts/agro_tabular.py depth2   (3 only; seconds; fig1 and onpolicy: 1 or 2 only)
"""
import argparse
import itertools
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import agro  # noqa: E402

torch.set_num_threads(1)
f64 = torch.float64


def kl_div(logits, target_logp):
    lp = torch.log_softmax(logits, -1)
    return (lp.exp() * (lp - target_logp)).sum(-1).item()


def expected_grad(theta, ref_logp, r, beta, mu, n, kind, lam=1.0):
    th = theta.clone().requires_grad_(True)
    arms = torch.tensor(list(itertools.product(range(len(r)), repeat=n)))  # [G, n]: every n-tuple
    logp = torch.log_softmax(th, -1)
    prob = (logp.detach().exp() if mu is None else mu)[arms].prod(-1)  # [G]
    G = len(arms)
    lp = (logp[arms] * (prob * G)[:, None]).reshape(-1, 1)  # rows scaled: mean over rows = E
    mask = torch.ones_like(lp)
    if kind == "klpg":
        kl = agro.token_kl(logp[None].expand(G * n, 1, -1),
                           ref_logp[None, None].expand(G * n, 1, -1), mask)
        loss = agro.klpg_loss(lp, mask, r[arms], kl, beta)
    else:
        rpi = agro.regularised_rewards(r[arms], logp[arms] - ref_logp[arms], beta)
        w = (agro.agro_offpolicy_weights(rpi) if kind == "off"
             else agro.agro_onpolicy_weights(rpi, beta, lam, "none"))
        loss = agro.agro_loss(lp, mask, w.reshape(-1))
    loss.backward()
    return th.grad


def fig1():
    beta = 0.3
    print("1. Fig. 1: KL(pi || pi*) with off-policy data (6 arms, beta 0.3, n 2, lr 0.5)")
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        ref, r = torch.randn(6, generator=g, dtype=f64), torch.rand(6, generator=g, dtype=f64)
        ref_logp = torch.log_softmax(ref, -1)
        star = torch.log_softmax(ref_logp + r / beta, -1)
        mus = (("uniform", torch.full((6,), 1 / 6, dtype=f64)), ("pi_ref", ref_logp.exp()))
        for name, mu in mus:
            for kind in ("off", "klpg"):
                theta, kls = ref.clone(), []
                for step in range(1, 5001):
                    theta = theta - 0.5 * expected_grad(theta, ref_logp, r, beta, mu, 2, kind)
                    if step in (1000, 5000):
                        kls.append(kl_div(theta, star))
                low = torch.softmax(theta, -1)[r.argmin()].item()
                label = "AGRO " if kind == "off" else "KL-PG"
                print(f"  seed {seed} mu={name:7s} {label}  KL@1000 {kls[0]:9.2e}  "
                      f"KL@5000 {kls[1]:9.2e}  pi(lowest-reward arm) {low:.1e}")


def characterisation():
    K = 10
    r = torch.zeros(K, dtype=f64)
    r[0] = 1.0
    ref_p = torch.full((K,), 0.95 / (K - 1), dtype=f64)
    ref_p[0] = 0.05
    ref_logp = ref_p.log()
    print("2. On-policy AGRO, 10 arms, one correct with pi_ref mass 0.05 (n 2, lr 1)")
    for beta in (1.0, 0.3, 0.1):
        star = torch.log_softmax(ref_logp + r / beta, -1)
        for lam in (1.0, 0.0):
            theta, out = ref_logp.clone(), []
            for step in range(1, 3001):
                theta = theta - expected_grad(theta, ref_logp, r, beta, None, 2, "on", lam)
                if step in (100, 1000, 3000):
                    out.append(f"step {step}: pi(correct) {torch.softmax(theta, -1)[0].item():.2e} "
                               f"KL {kl_div(theta, star):.1e}")
            print(f"  beta {beta} lambda_LR {lam}  pi*(correct) {star.exp()[0].item():.4f}   "
                  + "   ".join(out))
    print("   at pi = pi_ref, the correct logit's expected change (lambda_LR 1) vs "
          "p(1-p)(beta - 1/2 + p)/beta:")
    for p in (0.05, 0.2, 0.35, 0.45, 0.6):
        ref_p = torch.full((K,), (1 - p) / (K - 1), dtype=f64)
        ref_p[0] = p
        cells = []
        for beta in (0.05, 0.1, 0.3):
            up = -expected_grad(ref_p.log(), ref_p.log(), r, beta, None, 2, "on", 1.0)[0].item()
            formula = p * (1 - p) * (beta - 0.5 + p) / beta
            cells.append(f"beta {beta}: {up:+.4f} (formula {formula:+.4f})")
        print(f"   p {p:.2f}  " + "  ".join(cells))


def depth2(seed=0, V=3, beta=0.3, n=3):
    g = torch.Generator().manual_seed(seed)
    t1, t2 = torch.randn(V, generator=g, dtype=f64), torch.randn(V, V, generator=g, dtype=f64)
    ref1 = torch.log_softmax(torch.randn(V, generator=g, dtype=f64), -1)
    ref2 = torch.log_softmax(torch.randn(V, V, generator=g, dtype=f64), -1)
    r = torch.rand(V, V, generator=g, dtype=f64)
    seqs = torch.tensor(list(itertools.product(range(V), repeat=2)))  # every response (a, b)

    def per_token(th1, th2):  # log pi(a), log pi(b|a): [V^2, 2];  distributions [V^2, 2, V]
        l1, l2 = torch.log_softmax(th1, -1), torch.log_softmax(th2, -1)
        lp = torch.stack([l1[seqs[:, 0]], l2[seqs[:, 0], seqs[:, 1]]], -1)
        return lp, torch.stack([l1.expand(len(seqs), V), l2[seqs[:, 0]]], 1)

    def leaves():
        return t1.clone().requires_grad_(True), t2.clone().requires_grad_(True)

    ref_lp, ref_all = per_token(ref1, ref2)
    rew = r[seqs[:, 0], seqs[:, 1]]
    th = leaves()
    logp = per_token(*th)[0].sum(-1)
    pi = logp.exp()
    rows = {"exact grad of E[r] - beta KL(pi || pi_ref)": torch.autograd.grad(
        (pi * (rew - beta * (logp - ref_lp.sum(-1)))).sum(), th)}
    groups = torch.tensor(list(itertools.product(range(len(seqs)), repeat=n)))  # [G, n]
    G, flat = len(groups), groups.reshape(-1)
    scale = (pi.detach()[groups].prod(-1) * G).repeat_interleave(n)[:, None]  # mean over rows = E
    mask = torch.ones(G * n, 2, dtype=f64)
    online = torch.ones(G, dtype=torch.bool)
    losses = {
        "AGRO Eq. 4 weights on these samples (--lambda-lr 0)": lambda lp, kl, rg, h: agro.agro_loss(
            lp, mask,
            agro.agro_offpolicy_weights(agro.regularised_rewards(rg, h, beta)).reshape(-1)),
        "per-token KL-PG (differentiated along the path)": lambda lp, kl, rg, h: agro.klpg_loss(
            lp, mask, rg, kl, beta),
        "sequence-KL PG (RLOO, agro.py --loss klpg on-policy)":
            lambda lp, kl, rg, h: agro.klpg_loss(lp, mask, rg, kl, beta, h=h, online=online),
    }
    for name, loss_of in losses.items():
        th = leaves()
        lp, lp_all = per_token(*th)
        kl = agro.token_kl(lp_all[flat], ref_all[flat], mask)
        h = (lp.sum(-1) - ref_lp.sum(-1))[groups]
        loss = loss_of(lp[flat] * scale, kl * scale, rew[groups], h)
        rows[name] = tuple(-x for x in torch.autograd.grad(loss, th))
    exact = rows["exact grad of E[r] - beta KL(pi || pi_ref)"]
    print(f"3. Depth-2 tree: {V} tokens at each of 2 positions, beta {beta}, n {n} samples from pi "
          f"(seed {seed}); expected ascent directions, by enumeration of all {G} groups")
    print("| | first-token logits (d theta_1) | max err, 1st token | max err, 2nd token |")
    print("|---|---|---|---|")
    for name, (d1, d2) in rows.items():
        cells = ", ".join(f"{x:+.6f}" for x in d1.tolist())
        e1, e2 = (d1 - exact[0]).abs().max().item(), (d2 - exact[1]).abs().max().item()
        print(f"| {name} | {cells} | {e1:.1e} | {e2:.1e} |")
    # on-policy AGRO (lambda_LR 1) follows -(1/beta) grad L_on, L_on = 1/2 Var_pi[r_pi]: another
    # direction, with the same fixed point pi*
    th = leaves()
    logp = per_token(*th)[0].sum(-1)
    pi, rpi = logp.exp(), rew - beta * (logp - ref_lp.sum(-1))
    l_on = 0.5 * (pi * (rpi - (pi * rpi).sum()) ** 2).sum()
    target = [-x / beta for x in torch.autograd.grad(l_on, th)]
    th = leaves()
    lp, _ = per_token(*th)
    h = (lp.sum(-1) - ref_lp.sum(-1))[groups]
    w = agro.agro_onpolicy_weights(agro.regularised_rewards(rew[groups], h, beta), beta, 1.0, "var")
    loss = agro.agro_loss(lp[flat] * scale, mask, w.reshape(-1))
    got = [-x for x in torch.autograd.grad(loss, th)]
    err = max((a - b).abs().max().item() for a, b in zip(got, target))
    print("on-policy AGRO (Eqs. 5-6, lambda_LR 1, v = var): d theta_1 = "
          + ", ".join(f"{x:+.6f}" for x in got[0].tolist())
          + f"; max err vs -(1/beta) grad L_on {err:.1e} (not grad J: same optimum, other path)")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("experiment", nargs="?", choices=["fig1", "onpolicy", "depth2"], default=None,
                   help="fig1: 1, onpolicy: 2, depth2: 3 of the docstring; default: all three")
    which = p.parse_args(argv).experiment
    for name, run in [("fig1", fig1), ("onpolicy", characterisation), ("depth2", depth2)]:
        if which in (None, name):
            run()


if __name__ == "__main__":
    main()
