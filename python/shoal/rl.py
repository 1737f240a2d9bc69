"""Asynchronous RL in PyTorch on shoal's recipe: the policy-gradient losses
with off-policy corrections that src/rl/engine/loss.c computes for the C
miniature, as torch functions with autograd.

Three policies meet in each loss (docs/rl.md): ``behav_logp`` (mu), the
policy version that sampled a token, perhaps several versions old;
``old_logp`` (pi_old), the trainer's weights at the start of the step
(AReaL's proximal policy, recomputed by the trainer); and ``logp`` (pi),
the weights being optimised, the only input that carries a gradient.

The trainer and rollout workers that move requests and trajectories on
shoal's protocol (``Trainer``, ``Worker``, ``Task``) are in rl_proto.py and
importable from here; docs/python-rl.md describes both halves.

    loss, stats = shoal.rl.policy_loss(logp, old_logp, behav_logp, adv, kind="decoupled")
    loss.backward()

Each loss is the token mean of a PPO clipped surrogate against pi_old,
weighted by the behaviour weight w = pi_old / mu:

| kind | w | |
|---|---|---|
| ``"tis"`` | ``min(w, tis_cap)`` | truncated importance sampling |
| ``"mis"`` | ``w`` inside ``[mis_lo, mis_hi]``, else the token is masked | IcePop; masked tokens leave the mean's denominator too; ``mis_seq=True`` masks whole sequences by their geometric-mean w |
| ``"decoupled"`` | ``w`` (``min(w, dec_cap)`` when ``dec_cap > 0``) | AReaL's decoupled PPO |
| ``"ppo"`` | 1, clipped against mu instead of pi_old | |
| ``"naive"`` | 1, clipped against pi_old | uncorrected |
| ``"pg"`` | REINFORCE: ``-adv * logp`` | |

The value and the gradient with respect to ``logp`` are the C
implementation's (tests/python/test_rl_loss.py checks them against
``rl_loss`` in libshoal on shared fixtures, to 1e-6); the C code is the
reference, this is the same arithmetic in float64.
"""

from .rl_proto import ALPHABET, BOS, EOS, Request, Task, Traj, Trainer, Worker, decode, encode

KINDS = ("pg", "ppo", "tis", "mis", "decoupled", "naive")

__all__ = ["KINDS", "policy_loss", "grpo_advantages", "Trainer", "Worker", "Task", "Request", "Traj",
           "ALPHABET", "BOS", "EOS", "encode", "decode"]


def _ppo_term(torch, logp, base, adv, eps, w):
    """-w * min(r A, clip(r) A) per token, r = exp(logp - base); the clipped
    branch carries no gradient (loss.c: ppo_term)."""
    r = torch.exp(logp - base)
    rc = torch.clamp(r.detach(), 1 - eps, 1 + eps)
    un, cl = r * adv, rc * adv
    clipped = cl < un.detach()
    return torch.where(clipped, -w * cl, -w * un), clipped


def policy_loss(logp, old_logp, behav_logp, adv, kind="decoupled", seq=None, clip=0.2, tis_cap=2.0,
                mis_lo=0.5, mis_hi=2.0, mis_seq=False, dec_cap=0.0):
    """The token-mean loss over the response tokens of a batch.

    ``logp``, ``old_logp``, ``behav_logp`` and ``adv`` are 1-D tensors of the
    same length (one entry per response token; ``adv`` is the token's
    sequence's advantage); ``seq`` (int tensor, the token's sequence index)
    is needed by ``kind="mis"`` with ``mis_seq=True``.  Returns ``(loss,
    stats)``: a float64 scalar with a gradient to ``logp``, and a dict
    {"tokens", "clipped", "masked"} of ints."""
    import torch

    if kind not in KINDS:
        raise ValueError("shoal.rl.policy_loss: kind \"%s\": expected one of %s" % (kind, ", ".join(KINDS)))
    n = logp.shape[0]
    for name, t in (("old_logp", old_logp), ("behav_logp", behav_logp), ("adv", adv)):
        if t.shape != logp.shape:
            raise ValueError("shoal.rl.policy_loss: %s has shape %s, logp %s" % (name, tuple(t.shape), tuple(logp.shape)))
    stats = {"tokens": int(n), "clipped": 0, "masked": 0}
    # The C configuration holds float32s: round alike, so that the bounds match.
    clip, tis_cap, mis_lo, mis_hi, dec_cap = (float(torch.tensor(v, dtype=torch.float32))
                                              for v in (clip, tis_cap, mis_lo, mis_hi, dec_cap))
    if n == 0:
        return logp.sum().double() * 0, stats
    # The C code takes float32 inputs and computes in double.
    lp = logp.float().double()
    lold = old_logp.detach().float().double()
    lmu = behav_logp.detach().float().double()
    a = adv.detach().float().double()
    w_old = torch.exp(lold - lmu)
    if kind == "pg":
        return (-a * lp).sum() / n, stats
    keep = None
    if kind == "mis":
        if mis_seq:
            if seq is None:
                raise ValueError("shoal.rl.policy_loss: kind \"mis\" with mis_seq needs seq")
            seq = seq.long()
            nseq = int(seq.max().item()) + 1
            sums = torch.zeros(nseq, dtype=torch.float64).index_add_(0, seq, lold - lmu)
            cnt = torch.zeros(nseq, dtype=torch.float64).index_add_(0, seq, torch.ones_like(lold))
            g = torch.where(cnt > 0, torch.exp(sums / cnt.clamp(min=1)), torch.ones_like(sums))
            keep = ((g >= mis_lo) & (g <= mis_hi))[seq]
        else:
            keep = (w_old >= mis_lo) & (w_old <= mis_hi)
        stats["masked"] = int((~keep).sum().item())
        denom = int(keep.sum().item())
        w = w_old
    else:
        denom = n
        w = {"tis": torch.clamp(w_old, max=tis_cap), "decoupled": torch.clamp(w_old, max=dec_cap) if dec_cap > 0 else w_old,
             "ppo": torch.ones_like(w_old), "naive": torch.ones_like(w_old)}[kind]
    base = lmu if kind == "ppo" else lold
    term, clipped = _ppo_term(torch, lp, base, a, clip, w)
    if keep is not None:
        term = torch.where(keep, term, torch.zeros_like(term))
        clipped = clipped & keep
    stats["clipped"] = int(clipped.sum().item())
    if denom == 0:
        return lp.sum() * 0, stats
    return term.sum() / denom, stats


def grpo_advantages(rewards, group):
    """GRPO: per sequence, (r - mean of its group) / (std of its group + 1e-6),
    0 for a group whose rewards are all equal (rl_grpo_advantages in C).
    ``rewards`` and ``group`` are 1-D tensors; a group's sequences need not
    be adjacent here."""
    import torch

    r = rewards.double()
    g = group.long()
    out = torch.zeros_like(r)
    for k in torch.unique(g):
        m = g == k
        mean = r[m].mean()
        sd = torch.sqrt(((r[m] - mean) ** 2).mean())
        out[m] = 0.0 if sd < 1e-9 else (r[m] - mean) / (sd + 1e-6)
    return out.float()
