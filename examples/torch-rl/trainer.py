"""One rank of the trainer gang: asynchronous GRPO with the decoupled PPO
loss (shoal.rl.policy_loss), data parallel over gloo.

Rank 0 publishes every version to a store in its work dir, serves it with a
push-tree root (`shoal push serve`), takes rollout workers with a
shoal.rl.Trainer, and publishes both addresses as the run's services
("push", "trainer"); the run's secret, which the workers must prove, comes
from the environment the server gives the run's ranks.  Each step rank 0
collects a batch of whole groups (each at most --max-lag versions old),
sends half of it to rank 1, and both ranks' gradients are all-reduced by
DistributedDataParallel.  Rank 0 prints one line per step and, at the end,
one line `summary: {json}`.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import torch
import torch.distributed as dist

import shoal
import shoal.rl
import shoal.run
from policy import Policy, evaluate, pad, token_logp, warm_start


def args():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--prompts", type=int, default=16, help="prompts a step")
    ap.add_argument("--group", type=int, default=8, help="samples per prompt")
    ap.add_argument("--req-prompts", type=int, default=4, help="prompts per request")
    ap.add_argument("--max-lag", type=int, default=2)
    ap.add_argument("--max-new", type=int, default=12)
    ap.add_argument("--warm", type=int, default=220, help="supervised warm-start steps")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--loss", default="decoupled", choices=["decoupled", "tis"])
    ap.add_argument("--eval-n", type=int, default=128)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--shoal", default=os.environ.get("SHOALX", "shoal"), help="shoal binary (push serve)")
    return ap.parse_args()


def batch_loss(model, b, loss_kind):
    """The decoupled (or TIS) loss of a batch: pi_old is the weights at the
    start of the step, mu the versions that sampled each token."""
    L = int(b["length"].max())
    x = b["tokens"][:, :L]
    mask = torch.zeros(x.shape, dtype=torch.bool)
    for k in range(x.shape[0]):
        mask[k, int(b["prompt_len"][k]):int(b["length"][k])] = True
    adv = shoal.rl.grpo_advantages(b["reward"], b["group"])
    with torch.no_grad():
        old = token_logp(model.module, x)
    lp = token_logp(model, x)
    a = adv.unsqueeze(1).expand(x.shape)
    return shoal.rl.policy_loss(lp[mask], old[mask], b["behav_logp"][:, :L][mask], a[mask], kind=loss_kind)


def main():
    a = args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(a.seed)
    task = shoal.rl.Task("code")
    model = Policy()
    warm_start(model, task, a.warm, a.seed, a.max_new)  # the same on every rank (same seed)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    evset = task.eval_set(a.eval_n)
    tr = root = st = None
    if rank == 0:
        work = os.environ.get("SHOAL_WORKDIR", ".")
        st = shoal.Store(os.path.join(work, "store"))
        st.publish(model.state_dict())  # store version 1 = policy version 0
        addr_file = os.path.join(work, "push.addr")
        root = subprocess.Popen([a.shoal, "push", "serve", "--store", os.path.join(work, "store"),
                                 "--addr-file", addr_file])
        for _ in range(300):
            if os.path.exists(addr_file) and open(addr_file).read().strip():
                break
            time.sleep(0.1)
        tr = shoal.rl.Trainer(task="code", seed=a.seed, group=a.group, max_new=a.max_new, max_len=24,
                              max_lag=a.max_lag)
        tr.set_version(0)
        shoal.run.publish("push", open(addr_file).read().strip())
        shoal.run.publish("trainer", tr.addr)
        r0 = evaluate(model, task, evset, a.max_new)
        print("trainer: 2 ranks (gloo); warm start: held-out reward %.3f; push root %s, trainer %s"
              % (r0, open(addr_file).read().strip(), tr.addr), flush=True)
        curve, asked, t0 = [{"step": 0, "reward": r0}], 0, time.time()
    n = a.prompts * a.group
    for step in range(a.steps):
        if rank == 0:
            # Keep requests for up to max_lag + 1 steps in flight.
            while asked < min(a.steps, step + a.max_lag + 1) * a.prompts:
                tr.ask(a.req_prompts)
                asked += a.req_prompts
            b = tr.collect(n, timeout=300)
            obj = [b]
        else:
            obj = [None]
        dist.broadcast_object_list(obj, src=0)
        b = obj[0]
        half = {k: v[rank * n // world:(rank + 1) * n // world] for k, v in b.items()}
        loss, stats = batch_loss(ddp, half, a.loss)
        opt.zero_grad()
        loss.backward()  # DDP all-reduces the gradients here
        opt.step()
        if rank == 0:
            v = st.publish(model.state_dict()) - 1
            tr.set_version(v)
            last = st.versions()[-1]
            hist = torch.bincount(v - 1 - b["version_start"], minlength=a.max_lag + 1).tolist()
            line = "trainer: step %3d  version %3d  reward %.3f  staleness %s  %s %d bytes  %.1fs" % (
                step + 1, v, float(b["reward"].mean()), "/".join(map(str, hist)), last["kind"], last["size"],
                time.time() - t0)
            if (step + 1) % a.eval_every == 0 or step + 1 == a.steps:
                r = evaluate(model, task, evset, a.max_new)
                curve.append({"step": step + 1, "reward": r})
                line += "  held-out reward %.3f" % r
            print(line, flush=True)
    if rank == 0:
        s = tr.stop(final_version=tr.version, drain=30)
        deltas = [x for x in st.versions() if x["kind"] == "delta"]
        finals = sorted(w["final"]["version"] if w.get("final") else None for w in s["workers"]
                        if not w.get("dropped_for"))
        summary = {"steps": a.steps, "final_version": tr.version, "reward_start": curve[0]["reward"],
                   "reward_end": curve[-1]["reward"], "curve": curve, "staleness_hist": s["staleness_hist"],
                   "workers_final_versions": finals, "worker_joins": s["worker_joins"],
                   "dropped_stale": s["dropped_stale"], "dropped_dead": s["dropped_dead"],
                   "violations": s["workers_dropped_for_violations"],
                   "delta_bytes_mean": sum(x["size"] for x in deltas) / max(1, len(deltas)),
                   "anchor_bytes": st.versions()[0]["size"],
                   "wall_s": time.time() - t0}
        print("summary: " + json.dumps(summary), flush=True)
        tr.close()
        root.terminate()
        root.wait(10)
        st.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
