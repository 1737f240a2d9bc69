#!/usr/bin/env python3
"""Checks the layering that docs/architecture.md draws.

Reads every source and header under src/, bench/ and include/shoal/ and fails when
  * a file includes a header of a component it may not use (ALLOWED below),
  * a file calls a function of a component it may not use (found by the
    component's name prefix: `store_`, `delta_`, ...),
  * two library sources share a file name (ar keeps one object per name),
  * a file outside src/net sets UCX up (ucp_init, ucp_worker_create,
    ucp_listener_create, ucp_ep_create, ...),
  * a component includes another component's private header (`*_int.h`)
    other than those PRIVATE_OK names, or
  * the calls between the files of one component form a circle that is not
    in scripts/layers-known-cycles.txt (the ones still to be untangled; a
    circle may shrink or go, never grow or appear), or
  * a file of a component with LAYERS (below) calls a function of, or
    includes a header of, a layer above its own, or is in no layer.
Prints one line per finding and exits 1, or prints a summary and exits 0.
"""
import collections
import glob
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# component -> components it may use (common is always allowed)
ALLOWED = {
    'common': set(),
    'net': set(),
    'sched': set(),
    'nn': set(),
    'push': {'net'},
    'ckpt': set(),
    'delta': {'ckpt'},
    'store': {'ckpt', 'delta', 'push', 'net'},
    'rl': {'nn', 'delta', 'ckpt', 'net'},
    'sim': {'sched', 'push'},
    'server': {'sched'},
    'client': set(),              # the HTTP client of the server's API, not the server
    'agent': {'client'},          # the agent talks to the server through the client
    'fleet': {'server', 'client'},  # a local fleet: the server here, agents as processes
    'mainjob': {'rl', 'nn', 'store', 'delta', 'ckpt', 'push', 'sim', 'sched', 'server', 'client',
                'fleet', 'net'},
    'cli': {'common', 'net', 'sched', 'sim', 'server', 'client', 'agent', 'ckpt', 'delta', 'store',
            'push', 'nn', 'rl', 'mainjob', 'fleet'},
}
ALLOWED['bench'] = ALLOWED['cli'] | {'cli'}
# private headers another component may include: (user, header)
PRIVATE_OK = {
    ('cli', 'app/mainjob/mainjob.h'),
    ('cli', 'app/mainjob/trainer/trainer_int.h'),   # rl trainer: one rank of the gang
    ('cli', 'app/mainjob/worker/worker_int.h'),     # rl worker
    ('cli', 'app/mainjob/report/report_int.h'),     # rl sweep's plots
    ('cli', 'control/sim/sim_push_int.h'),
    ('bench', 'app/mainjob/ring/ring_int.h'),       # bench push measures the ring
    ('bench', 'control/sim/sim_push_int.h'),
    ('bench', 'cli/cli_int.h'),
}
# The layers inside a component, bottom first (docs/architecture.md): a file
# may call the functions and include the headers of its own layer and of the
# layers below it only.  Every .c and .h file of the component is in one.
LAYERS = {
    'sched': [
        ('model', {'model_int.h', 'model.c', 'jobmap.c', 'queue.c'}),
        ('ledger', {'ledger_int.h', 'ledger.c'}),
        ('place', {'place_int.h', 'place.c'}),
        ('room', {'room_int.h', 'room.c'}),
        ('cycle', {'cycle_int.h', 'cycle.c', 'events.c', 'restore.c'}),
        ('query', {'query_int.h', 'info.c', 'why.c', 'check.c'}),
        ('sched', {'sched.c'}),   # sched_new, sched_free: make and free every layer
    ],
    # The server's straight stack: http (transport, auth, routing, start and
    # stop) -> loop (the scheduler thread) -> handlers -> the cycle's
    # decisions carried out -> provider -> state (the only code that changes
    # the model) -> seam (tells the core) -> db (stores rows) -> base.
    'server': [
        ('base', {'srv_int.h', 'srv_check.c', 'srv_model.c', 'hist.c'}),   # the model's types, checks, lookups
        ('db', {'db_int.h', 'db.c', 'db_pg.c', 'db_sqlite.c', 'leader.c'}),
        ('seam', {'seam_int.h', 'seam.c'}),
        ('state', {'state_int.h', 'state.c'}),
        ('provider', {'provider_int.h', 'provider.c'}),
        ('carry', {'carry_int.h', 'carry.c'}),
        ('files', {'files_int.h', 'logfile.c', 'runs.c', 'uploads.c'}),       # rank logs, runs, work-dir archives
        ('handlers', {'handlers_int.h', 'api.c', 'agentapi.c', 'metrics.c'}),
        ('loop', {'loop_int.h', 'loop.c'}),
        ('http', {'http.c'}),
    ],
}
# Headers of a component with LAYERS that every layer includes, in no layer:
# their declarations are not calls (the layers are checked at the .c files).
SHARED = {}
HEADER_COMP = {'common': 'common', 'fleetfile': 'common', 'sched': 'sched', 'sim': 'sim',
               'server': 'server', 'client': 'client', 'agent': 'agent', 'ckpt': 'ckpt', 'delta': 'delta',
               'store': 'store', 'bcast': 'push', 'nn': 'nn', 'rl': 'rl', 'net': 'net', 'fleet': 'fleet'}
PREFIX_COMP = {'client_': 'client', 'net_': 'net', 'sched_': 'sched', 'sim_': 'sim', 'srv_': 'server', 'agent_': 'agent',
               'ckpt_': 'ckpt', 'delta_': 'delta', 'store_': 'store', 'bcast_': 'push',
               'nn_': 'nn', 'rl_': 'rl', 'mj_': 'mainjob', 'fleet_': 'fleet'}
FOLDER_COMP = {'engine': 'rl'}


def component(path):
    """The component a file under src/ or include/shoal/ belongs to."""
    parts = path.split('/')
    if parts[0] == 'bench':
        return 'bench'
    if parts[0] == 'include':
        return HEADER_COMP.get(os.path.basename(path)[:-2])
    if parts[1] in ('common', 'cli', 'net'):
        return parts[1]
    return FOLDER_COMP.get(parts[2], parts[2])


def strip_comments(text):
    text = re.sub(r'/\*.*?\*/', lambda m: '\n' * m.group(0).count('\n'), text, flags=re.S)
    text = re.sub(r'//[^\n]*', '', text)
    return re.sub(r'"(?:\\.|[^"\\\n])*"', '""', text)


DEF_RE = re.compile(r'^[A-Za-z_][\w \*]*?\b([a-z_][a-z0-9_]*)\s*\([^;{]*\)\s*\{', re.M)


def layer_findings(comp, texts, raws=None):
    """Calls and includes against LAYERS[comp]; texts: base name -> code
    without comments (strings emptied); raws: the same files as written,
    where the includes are read (texts when None)."""
    raws = raws or texts
    rank = {}
    for i, (_, names) in enumerate(LAYERS[comp]):
        for n in names:
            rank[n] = i
    name_of = lambda i: LAYERS[comp][i][0]
    out = []
    exported = {}   # function -> file that defines it where other files can call it
    local = collections.defaultdict(set)
    for f, code in texts.items():
        for m in DEF_RE.finditer(code):
            local[f].add(m.group(1))
            if f.endswith('.h') or not m.group(0).startswith('static'):
                exported.setdefault(m.group(1), f)
    for f, code in sorted(texts.items()):
        if f in SHARED.get(comp, ()):
            continue
        if f not in rank:
            out.append(f'{comp}: {f} is in no layer of LAYERS[{comp!r}]')
            continue
        for m in re.finditer(r'^\s*#\s*include\s+"(?:[\w/]*/)?([\w]+\.h)"', raws[f], re.M):
            h = m.group(1)
            if h in rank and rank[h] > rank[f]:
                line = raws[f][:m.start()].count('\n') + 1
                out.append(f'{comp}/{f}:{line}: includes {h}: the {name_of(rank[f])} layer may not use '
                           f'the {name_of(rank[h])} layer above it')
        for m in re.finditer(r'\b([a-z_][a-z0-9_]*)\s*\(', code):
            g = exported.get(m.group(1))
            if not g or g == f or m.group(1) in local[f] or g not in rank or rank[g] <= rank[f]:
                continue
            line = code[:m.start()].count('\n') + 1
            out.append(f'{comp}/{f}:{line}: calls {m.group(1)} ({g}): the {name_of(rank[f])} layer may '
                       f'not call the {name_of(rank[g])} layer above it')
    return sorted(set(out))


def selftest():
    """The layer check must catch a planted upward call and include."""
    texts = {'model.c': '#include "cycle_int.h"\nint f(void)\n{\n    return sched__step_x(1);\n}\n',
             'cycle.c': 'int sched__step_x(int a)\n{\n    return f();\n}\n'}
    got = layer_findings('sched', {f: strip_comments(t) for f, t in texts.items()}, texts)
    want = ['calls sched__step_x', 'includes cycle_int.h']
    missed = [w for w in want if not any(w in g for g in got)]
    ok = not missed and not any('cycle.c' in g.split(':')[0] for g in got)
    out = [] if ok else [f'self-test: the layer check missed {missed or "nothing"} or blamed cycle.c: {got}']
    body = 'static int f(int a,\n                int b)\n{\n' + '    a++;\n' * 58 + '    return a;\n}\n'
    if len(long_functions('x.c', body, 60)) != 1 or long_functions('x.c', body, 63):
        out.append('self-test: the length check does not count a 63-line function')
    return out


# The command line parses, calls the library and prints (docs/architecture.md):
# no function of src/cli (nor of bench/, the bench commands) is longer than
# this many lines, signature to brace.
CLI_MAX_LINES = 60


def long_functions(path, text, limit):
    """Functions of text longer than limit lines: 'path:line: name is N lines'.
    A function starts at a line that begins a definition at column 0 and
    ends at the first '}' at column 0 after it."""
    out, start, name = [], None, None
    lines = text.split('\n')
    for n, line in enumerate(lines, 1):
        m = re.match(r'[A-Za-z_][\w \*]*?\b([a-z_][a-z0-9_]*)\s*\(', line)
        if start is None and m and not line.rstrip().endswith(';') and not line.startswith(('typedef', 'return')):
            # a definition: its body opens before the next ';'
            rest = '\n'.join(lines[n - 1:n + 8])
            if rest.find('{') != -1 and (rest.find(';') == -1 or rest.find('{') < rest.find(';')):
                start, name = n, m.group(1)
        elif start is not None and line.startswith('}'):
            if n - start + 1 > limit:
                out.append(f'{path}:{start}: {name} is {n - start + 1} lines ({os.path.dirname(path)}: at most {limit}; '
                           f'move parsing, work and printing into functions of their own)')
            start = None
    return out


def main():
    os.chdir(ROOT)
    files = sorted(glob.glob('src/**/*.[ch]', recursive=True) + glob.glob('include/shoal/*.h') +
                   glob.glob('bench/*.[ch]'))
    bad = []
    defs = {}          # function name -> file that defines it
    local_defs = collections.defaultdict(set)   # file -> names it defines
    extern_defs = {}   # function name -> file that defines it where other files can call it
    texts = {}
    for f in files:
        raw = open(f, encoding='utf-8').read()
        texts[f] = (raw, strip_comments(raw))
        for m in re.finditer(r'^[A-Za-z_][\w \*]*?\b([a-z_][a-z0-9_]*)\s*\([^;{]*\)\s*\{',
                             texts[f][1], flags=re.M):
            defs.setdefault(m.group(1), f)
            local_defs[f].add(m.group(1))
            if f.endswith('.h') or not m.group(0).startswith('static'):
                extern_defs.setdefault(m.group(1), f)
    for f in files:
        me = component(f)
        if me is None:
            bad.append(f'{f}: not in any component of docs/architecture.md')
            continue
        ok = ALLOWED[me] | {me, 'common'}
        raw, code = texts[f]
        for n, line in enumerate(raw.split('\n'), 1):
            m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
            if not m:
                continue
            inc = m.group(1)
            if inc.startswith('shoal/'):
                dep = HEADER_COMP.get(inc[6:-2])
            elif '/' in inc and not inc.startswith('..'):
                dep = component('src/' + inc)
                if dep != me and (me, inc) not in PRIVATE_OK:
                    bad.append(f'{f}:{n}: includes {inc}, a private header of {dep}')
            else:
                continue
            if dep is not None and dep not in ok:
                bad.append(f'{f}:{n}: includes {inc}: {me} may not use {dep}')
        own = set(re.findall(r'\b([a-z_][a-z0-9_]*)\s*\(', code)) & local_defs[f]
        for m in re.finditer(r'\b((?:client|net|sched|sim|srv|agent|ckpt|delta|store|bcast|nn|rl|mj|fleet)_)[a-z0-9_]*\s*\(', code):
            dep = PREFIX_COMP[m.group(1)]
            if m.group(0)[:-1].strip() in own:
                continue
            if dep not in ok:
                line = code[:m.start()].count('\n') + 1
                bad.append(f'{f}:{line}: calls {m.group(0)[:-1].strip()}: {me} may not use {dep}')
    # No two sources share a file name: `ar` keeps one object per name, so
    # the second would silently drop out of libshoal.a.
    seen = {}
    for f in files:
        if f.endswith('.c') and f.startswith('src/') and not f.startswith('src/cli/'):
            b = os.path.basename(f)
            if b in seen:
                bad.append(f'{f}: has the name of {seen[b]} (libshoal.a would keep only one of them)')
            seen.setdefault(b, f)
    # UCX set-up lives in net only.
    for f in files:
        if component(f) == 'net':
            continue
        for m in re.finditer(r'\b(ucp_init|ucp_config_read|ucp_worker_create|ucp_listener_create|ucp_ep_create|'
                             r'ucp_cleanup|ucp_worker_destroy)\s*\(', texts[f][1]):
            line = texts[f][1][:m.start()].count('\n') + 1
            bad.append(f'{f}:{line}: calls {m.group(1)}: UCX set-up belongs to src/net')
    # Circles between the files of one component (sched and server).
    known = set()
    kpath = os.path.join('scripts', 'layers-known-cycles.txt')
    if os.path.exists(kpath):
        for line in open(kpath):
            line = line.split('#')[0].strip()
            if line:
                known.add(frozenset(line.split()))
    cycles = []
    for comp in ('sched', 'server'):
        cfiles = [f for f in files if f.startswith('src/') and component(f) == comp and f.endswith('.c')]
        graph = collections.defaultdict(set)
        for f in cfiles:
            code = texts[f][1]
            for name in set(re.findall(r'\b([a-z_][a-z0-9_]*)\s*\(', code)) - local_defs[f]:
                g = extern_defs.get(name)   # a static function is no other file's to call
                if g and g != f and g in cfiles:
                    graph[f].add(g)
        for scc in sccs(cfiles, graph):
            if len(scc) > 1:
                s = frozenset(os.path.basename(x) for x in scc)
                cycles.append((comp, s))
                if not any(s <= k for k in known):
                    bad.append(f'{comp}: the files {" ".join(sorted(s))} call each other in a circle')
    for comp in LAYERS:
        cfiles = [f for f in files if f.startswith('src/') and component(f) == comp]
        bad += layer_findings(comp, {os.path.basename(f): texts[f][1] for f in cfiles},
                              {os.path.basename(f): texts[f][0] for f in cfiles})
    for f in files:
        if f.startswith(('src/cli/', 'bench/')) and f.endswith('.c'):
            bad += long_functions(f, texts[f][1], CLI_MAX_LINES)
    bad += selftest()
    for line in bad:
        print('check-layers: ' + line)
    if bad:
        print(f'check-layers: {len(bad)} finding(s) against docs/architecture.md')
        return 1
    open_c = ', '.join(f'{c}: {len(s)} files' for c, s in cycles) or 'none'
    print(f'check-layers: {len(files)} files follow docs/architecture.md (known circles left: {open_c})')
    return 0


def sccs(nodes, graph):
    """Tarjan's strongly connected components, iteratively."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]; counter[0] += 1
        stack.append(root); on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]; counter[0] += 1
                    stack.append(w); on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop(); on.discard(w); comp.append(w)
                    if w == v:
                        break
                out.append(comp)
    return out


if __name__ == '__main__':
    sys.exit(main())
