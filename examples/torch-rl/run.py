"""Asynchronous GRPO in PyTorch on shoal, end to end on this machine: starts
a local fleet (`shoal up` with examples/fleet-local.csv), submits the
trainer (a 2-rank gang, gloo) and the rollout workers (an elastic job) as
one run with this folder as their --workdir, follows the trainer's lines,
and writes WORKDIR/summary.json.  The job files hold no address and no
secret: the jobs find each other through the run's services.

    python3 examples/torch-rl/run.py            # or: make run-torch
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--workers", type=int, default=2, help="rollout workers (elastic replicas)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--warm", type=int, default=220)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--eval-every", type=int, default=20)
    ap.add_argument("--workdir", help="where the fleet and the summary go (default: a new temporary folder)")
    ap.add_argument("--shoal", default=os.environ.get("SHOAL_BIN") or os.path.join(ROOT, "build", "shoal"))
    ap.add_argument("--timeout", type=float, default=600)
    a = ap.parse_args()
    if a.steps < 1 or a.workers < 1:
        ap.error("--steps and --workers must be at least 1")
    shoal = os.path.abspath(a.shoal)
    if not os.access(shoal, os.X_OK):
        ap.error("--shoal %s is not an executable (run `make` first)" % shoal)
    work = os.path.abspath(a.workdir or tempfile.mkdtemp(prefix="shoal-torch-rl."))
    shutil.rmtree(os.path.join(work, "fleet"), ignore_errors=True)
    os.makedirs(os.path.join(work, "fleet"), exist_ok=True)
    db = os.path.join(work, "fleet", "shoal.db")
    up = subprocess.run([shoal, "up", "--fleet", os.path.join(ROOT, "examples", "fleet-local.csv"), "--db", db, "-d"],
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if up.returncode:
        sys.exit("run.py: shoal up failed:\n" + up.stdout)
    env = dict(os.environ)
    with open(os.path.join(work, "fleet", "env")) as f:
        for line in f:
            line = line.strip()
            if line.startswith("export "):
                k, _, v = line[len("export "):].partition("=")
                env[k] = v.strip("'\"")
    # Where this checkout's package and binary are (no address, no secret).
    job_env = {"PYTHONPATH": os.path.join(ROOT, "python"), "SHOALX": shoal}
    run = "torch-rl-%d" % os.getpid()
    trainer_job = {"name": "grpo-trainer", "kind": "gang", "nodes": 2, "gpus_per_node": 1, "gpu_types": ["H100"],
                   "run": run, "env": job_env,
                   "command": ["python3", "trainer.py", "--steps", str(a.steps), "--seed", str(a.seed),
                               "--warm", str(a.warm), "--prompts", str(a.prompts), "--eval-every", str(a.eval_every)]}
    workers_job = {"name": "grpo-rollouts", "kind": "elastic", "min_nodes": a.workers, "max_nodes": a.workers,
                   "gpus_per_node": 1, "gpu_types": ["A100", "L4"], "run": run, "env": job_env,
                   "command": ["python3", "worker.py"]}
    rc, summary, ids = 1, None, []
    try:
        for name, job in (("trainer", trainer_job), ("workers", workers_job)):
            path = os.path.join(work, name + ".json")
            with open(path, "w") as f:
                json.dump(job, f, indent=1)
            p = subprocess.run([shoal, "submit", path, "--workdir", HERE, "--json"], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
            if p.returncode:
                sys.exit("run.py: submit %s: %s" % (name, p.stdout))
            ids.append(str(json.loads(p.stdout)["id"]))
        print("run.py: trainer job %s, workers job %s, run %s, fleet in %s" % (ids[0], ids[1], run, work), flush=True)
        logs = subprocess.Popen([shoal, "logs", ids[0], "-f"], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        deadline = time.time() + a.timeout
        for line in logs.stdout:
            print(line.rstrip("\n"), flush=True)
            if line.startswith("summary: "):
                summary = json.loads(line[len("summary: "):])
            if time.time() > deadline:
                print("run.py: timed out after %gs" % a.timeout, flush=True)
                logs.kill()
                break
        rc = logs.wait()
        wl = subprocess.run([shoal, "logs", ids[1], "--rank", "all"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
        print(wl.stdout.rstrip("\n"), flush=True)
        if summary is None:
            rc = rc or 1
        else:
            summary.update(workdir=work, trainer_job=ids[0], workers_job=ids[1],
                           job_files=[os.path.join(work, "trainer.json"), os.path.join(work, "workers.json")])
            with open(os.path.join(work, "summary.json"), "w") as f:
                json.dump(summary, f, indent=1)
            print("run.py: held-out reward %.3f -> %.3f in %d steps; workers end on versions %s (the trainer's "
                  "last: %d); summary in %s" % (summary["reward_start"], summary["reward_end"], summary["steps"],
                                                summary["workers_final_versions"], summary["final_version"],
                                                os.path.join(work, "summary.json")), flush=True)
    finally:
        for i in ids[1:]:
            subprocess.run([shoal, "cancel", i], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        subprocess.run([shoal, "down", "--db", db], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    sys.exit(rc)


if __name__ == "__main__":
    main()
