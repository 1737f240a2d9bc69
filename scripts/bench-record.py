#!/usr/bin/env python3
"""Records `make bench` runs in bench/results/ (bench/results/README.md).

  bench-record.py add FILE.jsonl NAME COMMAND    reads one benchmark's JSON on
                                                 stdin and appends it to FILE
                                                 with command, date, commit,
                                                 machine and load
  bench-record.py render FILE.jsonl              writes FILE.md: one section per
                                                 benchmark, its figures as a table
"""
import datetime
import json
import os
import platform
import subprocess
import sys


def machine():
    cpu = ''
    try:
        for line in open('/proc/cpuinfo'):
            if line.startswith('model name'):
                cpu = line.split(':', 1)[1].strip()
                break
    except OSError:
        pass
    mem = 0
    try:
        for line in open('/proc/meminfo'):
            if line.startswith('MemTotal'):
                mem = int(line.split()[1]) // (1024 * 1024)
    except OSError:
        pass
    return f'{os.cpu_count()} cores, {cpu or platform.machine()}, {mem} GiB, {platform.node()}'


def commit():
    try:
        out = subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], capture_output=True, text=True, check=True)
        dirty = subprocess.run(['git', 'status', '--porcelain', '--untracked-files=no'], capture_output=True,
                               text=True).stdout.strip()
        return out.stdout.strip() + ('+dirty' if dirty else '')
    except (OSError, subprocess.CalledProcessError):
        return 'unknown'


def add(path, name, command):
    text = sys.stdin.read()
    try:
        figures = json.loads(text)
    except ValueError as e:
        sys.exit(f'bench-record: {name}: its --json output is not one JSON object ({e}); first bytes: {text[:200]!r}')
    rec = {'bench': name, 'command': command,
           'date': datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ'),
           'commit': commit(), 'machine': machine(), 'load': os.getloadavg()[0], 'figures': figures}
    with open(path, 'a') as f:
        f.write(json.dumps(rec, sort_keys=True) + '\n')


def flatten(obj, prefix='', depth=0, out=None):
    out = [] if out is None else out
    if isinstance(obj, dict) and depth < 3:
        for k in obj:
            flatten(obj[k], f'{prefix}{k}.', depth + 1, out)
    elif isinstance(obj, list):
        out.append((prefix[:-1], f'[{len(obj)} items]'))
    else:
        v = obj
        if isinstance(v, float):
            v = f'{v:.6g}'
        out.append((prefix[:-1], v))
    return out


def render(path):
    recs = [json.loads(line) for line in open(path) if line.strip()]
    lines = [f'# `make bench`, {os.path.basename(path)[:-6]}', '']
    for r in recs:
        lines += [f'## {r["bench"]}', '', f'    {r["command"]}', '',
                  f'{r["date"]}, commit {r["commit"]}, {r["machine"]}, load average {r["load"]:.1f}.', '',
                  '| figure | value |', '|---|---|']
        lines += [f'| {k} | {v} |' for k, v in flatten(r['figures'])]
        lines.append('')
    out = path[:-6] + '.md'
    with open(out, 'w') as f:
        f.write('\n'.join(lines))
    print(f'bench-record: wrote {out}')


def main(argv):
    if len(argv) == 5 and argv[1] == 'add':
        return add(argv[2], argv[3], argv[4])
    if len(argv) == 3 and argv[1] == 'render':
        return render(argv[2])
    sys.exit(__doc__)


if __name__ == '__main__':
    main(sys.argv)
