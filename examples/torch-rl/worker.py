"""A rollout worker (one replica of the elastic job): finds the trainer and
the push root through the run's services, follows the weights with a
shoal.Replica on the push tree, and answers the trainer's requests with
samples of its copy of the policy (shoal.rl.Worker) until the trainer says
STOP."""
import argparse
import os

import torch

import shoal
import shoal.rl
import shoal.run
from policy import Policy, sample


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--max-new", type=int, default=12)
    ap.add_argument("--timeout", type=float, default=300, help="seconds to wait for the trainer's services")
    a = ap.parse_args()
    torch.set_num_threads(1)
    push = shoal.run.lookup("push", timeout=a.timeout)
    addr = shoal.run.lookup("trainer", timeout=a.timeout)
    node = os.environ.get("SHOAL_NODE", "local")
    rep = shoal.Replica(os.path.join(os.environ.get("SHOAL_WORKDIR", "."), "replica"), parents=[push])
    model = Policy().eval()

    def generate(rq, version):
        return sample(model, rq.prompts, rq.group, a.max_new, seed=rq.seed ^ rq.group0 * 1000003)

    w = shoal.rl.Worker(addr, generate, task="code", name=node[:15], replica=rep, model=model, base=1)
    print("worker %s: following %s, serving %s" % (node, push, addr), flush=True)
    served = w.serve()
    print("worker %s: served %d requests, refused %d; ends on version %d (the trainer's last: %s)"
          % (node, served, w.refused, w.version, w.final_version), flush=True)
    w.close()
    rep.close()


if __name__ == "__main__":
    main()
