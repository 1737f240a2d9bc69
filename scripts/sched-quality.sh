#!/bin/sh
# Replays traces and generated workloads under backfill and shoal and
# prints, per gang-size bucket, the geometric mean over the instances of
# shoal's p99 wait over backfill's (waits under a minute count as a
# minute) and of the mean-JCT ratio, with the issue 15 targets checked per
# instance: p99 <= 1.1x in every bucket, JCT <= 1.05x, 17-64 and 65+
# strictly lower (where backfill's p99 is over a minute).
#
#   scripts/sched-quality.sh [-j N] [-s SET]... [-c 'SHOAL OPTIONS']... [-v] [--fresh] [--json FILE]
#
#   -s SET    mixed600 (mixed:600, 4,000 jobs, seeds 1-20; the default with kalos)
#             mixed1000 (mixed:1000, 8,000 jobs, seeds 1-20)
#             kalos (Kalos on the Alibaba v2026 fleet, 5,000 jobs, seeds 1-3), kalos6 (seeds 1-6)
#             philly8, philly10 (the shipped Philly traces x8, x10), alibaba (v2023 pods)
#             small (mixed:64/128/256, 4,000 jobs, seeds 1-3)
#             ships (philly8 philly10 kalos alibaba), all (everything above)
#             or mixed:NODES:JOBS:A-B, kalos:JOBS:A-B for other sizes and seeds
#   -c OPTS   shoal's `shoal sim` options for one configuration (repeat to
#             compare several side by side; default: shoal's defaults)
#   -j N      parallel replays (default 2), each under nice -n 10
#   -v        also a line per instance (its ratios, and which target it misses)
#   --fresh   rerun backfill too (its results are cached by command line in
#             $SCHED_QUALITY_CACHE, default /tmp/sched-quality-$USER: backfill's
#             decisions never change with shoal's options; the tests check
#             its decision hashes)
#   --json F  every instance's figures as JSON
#
# Needs build/shoal (make -j2 all) and the shared data (SHOAL_SHARED, default ../shared).
cd "$(dirname "$0")/.." || exit 1
exec python3 - "$@" <<'PYEOF'
import glob, hashlib, json, math, os, subprocess, sys
from concurrent.futures import ThreadPoolExecutor

BUCKETS = ["1", "2-4", "5-16", "17-64", "65+"]
SHARED = os.environ.get("SHOAL_SHARED", "../shared")
CACHE = os.environ.get("SCHED_QUALITY_CACHE", "/tmp/sched-quality-%s" % os.environ.get("USER", "u"))
KALOS = ["--fleet", SHARED + "/data/fleets/alibaba-v2026-spot-nodes.csv", "--fleet-format", "alibaba-v2026",
         "--fabric-nodes", "128", "--format", "kalos", "--load", "0.8"]

def usage(msg):
    sys.stderr.write("sched-quality: %s\n(see the top of scripts/sched-quality.sh)\n" % msg)
    sys.exit(2)

def seeds(spec):
    a, _, b = spec.partition("-")
    try:
        a, b = int(a), int(b or a)
    except ValueError:
        usage("seeds \"%s\": give A-B" % spec)
    if a < 1 or b < a:
        usage("seeds \"%s\": give 1 <= A <= B" % spec)
    return range(a, b + 1)

def mixed(nodes, jobs, ss):
    return [("mixed%d-s%d" % (nodes, s), ["--fleet", "mixed:%d" % nodes, "--format", "mixed", "--jobs", str(jobs),
                                          "--load", "0.85", "--seed", str(s)]) for s in ss]

def kalos(jobs, ss):
    return [("kalos%s-s%d" % ("" if jobs == 5000 else jobs, s), KALOS + ["--jobs", str(jobs), "--seed", str(s)]) for s in ss]

def philly(k):
    tr = sorted(glob.glob(SHARED + "/data/traces/philly-gavel/*.trace"))
    if not tr:
        usage("no Philly traces under %s/data/traces/philly-gavel (set SHOAL_SHARED)" % SHARED)
    return [("philly-x%d" % k, ["--fleet", "docs/examples/philly-fleet.csv", "--format", "gavel", "--multi-node", str(k)] + tr)]

def alibaba():
    return [("alibaba-v2023", ["--fleet", SHARED + "/data/fleets/alibaba-v2023-gpu-nodes.csv", "--fleet-format",
                               "alibaba-v2023", "--format", "alibaba-v2023",
                               SHARED + "/data/traces/alibaba-v2023/openb_pod_list_default.csv"])]

def expand(name):
    fixed = {"mixed600": lambda: mixed(600, 4000, range(1, 21)), "mixed1000": lambda: mixed(1000, 8000, range(1, 21)),
             "kalos": lambda: kalos(5000, range(1, 4)), "kalos6": lambda: kalos(5000, range(1, 7)),
             "philly8": lambda: philly(8), "philly10": lambda: philly(10), "alibaba": alibaba,
             "small": lambda: sum((mixed(n, 4000, range(1, 4)) for n in (64, 128, 256)), [])}
    if name in fixed:
        return [(name, fixed[name]())]
    if name == "ships":
        return sum((expand(n) for n in ("philly8", "philly10", "kalos", "alibaba")), [])
    if name == "all":
        return sum((expand(n) for n in ("mixed600", "mixed1000", "kalos6", "philly8", "philly10", "alibaba", "small")), [])
    p = name.split(":")
    try:
        if p[0] == "mixed" and len(p) == 4:
            return [(name, mixed(int(p[1]), int(p[2]), seeds(p[3])))]
        if p[0] == "kalos" and len(p) == 3:
            return [(name, kalos(int(p[1]), seeds(p[2])))]
    except ValueError:
        pass
    usage("unknown set \"%s\"" % name)

args = sys.argv[1:]
jobs, sets, configs, verbose, fresh, json_out = 2, [], [], False, False, None
while args:
    a = args.pop(0)
    if a in ("-j", "-s", "-c", "--json") and not args:
        usage("%s needs a value" % a)
    if a == "-j":
        try:
            jobs = int(args.pop(0))
        except ValueError:
            usage("-j: give a count")
        if jobs < 1:
            usage("-j: give a count >= 1")
    elif a == "-s": sets += expand(args.pop(0))
    elif a == "-c": configs.append(args.pop(0))
    elif a == "-v": verbose = True
    elif a == "--fresh": fresh = True
    elif a == "--json": json_out = args.pop(0)
    elif a in ("-h", "--help"):
        subprocess.call(["sed", "-n", "2,28p", "scripts/sched-quality.sh"])
        sys.exit(0)
    else: usage("unknown argument \"%s\"" % a)
if not sets:
    sets = expand("mixed600") + expand("kalos")
if not configs:
    configs = [""]
if not os.access("build/shoal", os.X_OK):
    usage("no build/shoal: run make -j2 all")
os.makedirs(CACHE, exist_ok=True)

def replay(argv, cache):
    cmd = ["nice", "-n", "10", "build/shoal", "sim", "--json", "--no-estimates"] + argv
    key = os.path.join(CACHE, hashlib.sha1("\0".join(cmd).encode()).hexdigest() + ".json")
    if cache and not fresh and os.path.exists(key):
        with open(key) as f:
            return json.load(f)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode:
        sys.stderr.write("sched-quality: %s failed:\n%s" % (" ".join(cmd), p.stderr))
        sys.exit(1)
    r = json.loads(p.stdout)
    if cache:
        with open(key + ".tmp", "w") as f:
            json.dump(r, f)
        os.replace(key + ".tmp", key)
    return r

work = []
for _, insts in sets:
    for name, argv in insts:
        work.append((name, "backfill", argv + ["--policy", "backfill"], True))
        for c in configs:
            work.append((name, c, argv + ["--policy", "shoal"] + c.split(), False))
done, n = {}, 0
with ThreadPoolExecutor(max_workers=jobs) as ex:
    futs = {ex.submit(replay, w[2], w[3]): w for w in work}
    for f in futs:
        w = futs[f]
        done[(w[0], w[1])] = f.result()
        n += 1
        if sys.stderr.isatty():
            sys.stderr.write("\r%d/%d replays" % (n, len(work)))
if sys.stderr.isatty():
    sys.stderr.write("\r" + " " * 30 + "\r")

def floor(v):
    return None if v is None else max(v, 60.0)

def ratios(b, s):
    """Per bucket ratio (floored waits), JCT ratio, and the targets missed."""
    out, miss = {}, []
    for k in BUCKETS:
        bv, sv = b["wait_p99_s_by_nodes"].get(k), s["wait_p99_s_by_nodes"].get(k)
        if bv is None or sv is None:
            continue
        r = floor(sv) / floor(bv)
        out[k] = r
        if r > 1.1 + 1e-9:
            miss.append(k)
        elif k in ("17-64", "65+") and bv > 60 and not sv < bv:
            miss.append(k + "=")
    out["jct"] = s["jct_mean_s"] / b["jct_mean_s"]
    if out["jct"] > 1.05 + 1e-9:
        miss.append("jct")
    if s["jobs_completed"] != b["jobs_completed"]:
        miss.append("done %d/%d" % (s["jobs_completed"], b["jobs_completed"]))
    return out, miss

def gmean(v):
    v = [x for x in v if x is not None]
    return math.exp(sum(math.log(x) for x in v) / len(v)) if v else None

def fmt(v, w=6):
    return ("%*.2f" % (w, v)) if v is not None else " " * (w - 1) + "-"

cols = BUCKETS + ["jct"]
report = []
print("shoal p99 wait / backfill's per gang-size bucket (waits < 60 s count as 60 s), mean JCT ratio;")
print("geometric means over the instances; miss: instances missing a target (p99 > 1.1x, JCT > 1.05x, 17+ not lower)")
print("%-34s %s %s  %s" % ("config / set", " ".join("%6s" % c for c in BUCKETS), "%6s" % "JCT", "miss"))
for c in configs:
    print("[%s]" % (c or "shoal defaults"))
    for sname, insts in sets:
        rows = []
        for name, _ in insts:
            r, m = ratios(done[(name, "backfill")], done[(name, c)])
            rows.append((name, r, m))
            report.append({"config": c, "set": sname, "instance": name, "ratios": r, "missed": m,
                           "backfill": done[(name, "backfill")], "shoal": done[(name, c)]})
        g = {k: gmean([r.get(k) for _, r, _ in rows]) for k in cols}
        nm = sum(1 for _, _, m in rows if m)
        print("  %-32s %s %s  %d/%d" % (sname, " ".join(fmt(g[k]) for k in BUCKETS), fmt(g["jct"], 6), nm, len(rows)))
        if verbose:
            for name, r, m in rows:
                print("    %-30s %s %s  %s" % (name, " ".join(fmt(r.get(k)) for k in BUCKETS), fmt(r["jct"], 6),
                                               " ".join(m) or "met"))
if json_out:
    with open(json_out + ".tmp", "w") as f:
        json.dump(report, f, indent=1)
    os.replace(json_out + ".tmp", json_out)
PYEOF
