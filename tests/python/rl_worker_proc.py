"""A rollout worker process for tests/python/test_rl_proto.py: a shoal.rl
Worker whose policy is a fixed random torch policy (each token from a
softmax over seeded logits), answering honestly or, with --cheat, breaking
one rule: a reward the task does not give (reward), a version older than
asked (version), or a first answer then death (die)."""
import argparse
import json
import math
import os
import sys
import time

import torch

import shoal
import shoal.rl


def make_generate(max_new, vocab):
    def generate(rq, version):
        out = []
        for gi in range(rq.nprompts):
            for j in range(rq.group):
                g = torch.Generator().manual_seed((rq.seed ^ (rq.group0 + gi) * 1000003 + j) & 0x7fffffff)
                logits = torch.randn(vocab, generator=g)
                logits[shoal.rl.EOS] += 1.5
                lp = torch.log_softmax(logits, 0)
                toks, lps = [], []
                for _ in range(max_new):
                    t = int(torch.multinomial(lp.exp(), 1, generator=g))
                    toks.append(t)
                    lps.append(float(lp[t]))
                    if t == shoal.rl.EOS:
                        break
                out.append((toks, lps))
        return out
    return generate


class Cheat(shoal.rl.Worker):
    def __init__(self, how, *a, **k):
        super().__init__(*a, **k)
        self.how = how

    def records(self, rq, outputs, version):
        recs = super().records(rq, outputs, version)
        if self.how == "reward":
            recs[1].reward = recs[1].reward + 0.5
        elif self.how == "version":
            for r in recs:
                r.vstart = r.vend = rq.need - 1
        return recs

    def send(self, recs):
        super().send(recs)
        if self.how == "die":
            os._exit(0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--addr")
    ap.add_argument("--trainer-json", help="read the address from `shoal rl trainer`'s trainer.json")
    ap.add_argument("--name", default="py")
    ap.add_argument("--cheat", default="")
    ap.add_argument("--max-new", type=int, default=8)
    ap.add_argument("--store", help="follow this store with a shoal.Replica (push worker)")
    ap.add_argument("--rep-dir")
    ap.add_argument("--task", default="code")
    ap.add_argument("--result", required=True)
    a = ap.parse_args()
    torch.set_num_threads(1)
    addr = a.addr
    if a.trainer_json:
        for _ in range(600):
            try:
                with open(a.trainer_json) as f:
                    j = json.load(f)
                if j.get("state") == "running" and j.get("addr"):
                    addr = j["addr"]
                    break
            except (OSError, ValueError):
                pass
            time.sleep(0.1)
    rep = shoal.Replica(a.rep_dir, store=a.store, poll_s=0.05) if a.store else None
    model = torch.nn.Linear(2, 2) if rep else None
    gen = make_generate(a.max_new, len(shoal.rl.ALPHABET))
    w = (Cheat(a.cheat, addr, gen, task=a.task, name=a.name, replica=rep, model=None, min_wait=1.0) if a.cheat
         else shoal.rl.Worker(addr, gen, task=a.task, name=a.name, replica=rep, model=None, min_wait=1.0))
    try:
        served = w.serve()
        res = {"served": served, "refused": w.refused, "version": w.version, "final": w.final_version}
    except shoal.ShoalError as e:
        res = {"error": str(e), "served": w.served, "refused": w.refused}
    with open(a.result, "w") as f:
        json.dump(res, f)


if __name__ == "__main__":
    main()
