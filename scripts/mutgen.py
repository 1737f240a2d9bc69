#!/usr/bin/env python3
"""Generated mutants: `make mutants-gen` (docs/testing.md).

tests/mutants.txt holds the mistakes people thought of.  This script makes
the others mechanically: it walks the source files that tests/mutgen.txt
lists (every file on an integrity or isolation path), and inside each
function body produces every mutant of these kinds:

  rel     a relational or equality operator shifted or flipped
          (< <=, > >=, == !=)
  const   an integer constant plus or minus one
  logic   a condition's || and && swapped, or one of its operands dropped
  ret     an early `return X;` or `goto L;` on an if's branch removed, or an
          SH_TRY(x) whose result is ignored
  call    a call whose result is checked replaced by success (verify,
          check, *_eq, cmp, auth, limit and write calls), memcmp's length
          halved
  drop    a write to a limit or a flag dropped (an assignment whose target
          names a limit, a flag, a mode..., or a call statement that sets one)

Each mutant has an id FILE:LINE:KIND:HASH; the hash covers the kind, the
line's text before and after and which occurrence of that pair it is, so the
same mutant has the same hash after unrelated edits move it (the
equivalents list matches on FILE, KIND and HASH).

For each mutant the file is mutated in a private copy of the tree
(build/mutgen/tree-N, one per job; the working tree is never touched), the
library, `shoal` and the mapped test binaries are rebuilt there (make
recompiles the one file and relinks), and the mapped tests run with their
time limit.  Results:

  KILLED      a mapped test failed, crashed or ran past its limit
  SURVIVED    every mapped test passed: a test is missing
  EQUIVALENT  it survived and tests/mutgen-equivalent.txt says why no test
              can tell
  INVALID     the mutated file does not compile (not counted in the rate)
  UNTESTED    it survived, and one of its tests fails on the unmutated tree

Usage:
  scripts/mutgen.py [--seed N [--count N] [--pin] | --full] [-j N] [--only ID,...]
                    [--files GLOB,...] [--list] [--report FILE]
Without --seed, --full or --only it runs the checked-in sample,
tests/mutgen-sample.txt: the same mutants at every commit (a drawn sample
would change whenever a mutant is added anywhere), so that a survivor
reproduces and runs can be compared.
Exit status 0 only when no mutant SURVIVED (or was UNTESTED) and none is a
GAP; a survivor that tests/mutgen-equivalent.txt explains is EQUIVALENT, or
GAP when its reason starts "gap:" (a test could tell, none does yet: shown
apart, and still a failure, as a known missing test).
"""
import argparse
import concurrent.futures
import fnmatch
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mutants  # noqa: E402  (the private-tree build and the test runner)

ROOT = mutants.ROOT
WORK = os.path.join(ROOT, "build", "mutgen")
MAP = os.path.join(ROOT, "tests", "mutgen.txt")
EQUIV = os.path.join(ROOT, "tests", "mutgen-equivalent.txt")
SAMPLE = os.path.join(ROOT, "tests", "mutgen-sample.txt")
KINDS = ("rel", "const", "logic", "ret", "call", "drop")


def die(msg):
    print("mutgen: " + msg, file=sys.stderr)
    sys.exit(2)


# ---- The map: files in scope and the tests that cover them -----------------

def parse_map(path):
    """tests/mutgen.txt: `FILE TEST...` lines, each followed by optional
    indented `FUNCTION TEST...` lines for the functions a narrower set of
    tests covers; `timeout=N` among the tests sets the seconds per test
    binary (default 60).  `#` starts a comment."""
    files, cur = [], None
    with open(path) as f:
        for no, line in enumerate(f, 1):
            text = line.split("#", 1)[0].rstrip()
            if not text.strip():
                continue
            words = text.split()
            timeout, only, nocov = None, None, False
            tests = []
            for w in words[1:]:
                if w.startswith("timeout="):
                    timeout = int(w[len("timeout="):])
                elif w == "nocov":
                    nocov = True
                elif w.startswith("only="):
                    only = set(w[len("only="):].split(","))
                else:
                    tests.append(w)
            if text[0] in " \t":
                if cur is None:
                    die(f"{path}:{no}: a function line before any file line")
                cur["fns"][words[0]] = {"tests": tests, "timeout": timeout or cur["timeout"]}
                continue
            if not tests:
                die(f"{path}:{no}: {words[0]} names no test")
            cur = {"file": words[0], "tests": tests, "timeout": timeout or 60, "fns": {}, "line": no,
                   "only": only, "nocov": nocov}
            files.append(cur)
    return files


def parse_equiv(path):
    """tests/mutgen-equivalent.txt: `ID  reason` lines; the id's line number
    and folder are ignored when matching (see key_of)."""
    eq = {}
    if not os.path.exists(path):
        return eq
    with open(path) as f:
        for no, line in enumerate(f, 1):
            if not line.strip() or line.startswith("#"):
                continue
            parts = line.split(None, 1)
            if len(parts) < 2 or not parts[1].strip():
                die(f"{path}:{no}: expected `ID reason`")
            eq[key_of(parts[0])] = parts[1].strip()
    return eq


def judge(reason):
    """An equivalents entry whose reason starts "gap:" is a known test gap
    (explained, not equivalent: a test could tell, none does yet)."""
    if reason.lower().startswith("gap:"):
        return "GAP", reason[4:].strip()
    return "EQUIVALENT", reason


def key_of(mid):
    """FILE:KIND:HASH of an id, FILE without its folder: the line may move,
    and the file may move to another folder (file names are unique)."""
    f, _, rest = mid.rpartition(":")  # hash
    f2, _, kind = f.rpartition(":")
    path, _, _line = f2.rpartition(":")
    return f"{os.path.basename(path)}:{kind}:{rest}"


# ---- A small C tokenizer ---------------------------------------------------

TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<comment>/\*.*?\*/|//[^\n]*)
  | (?P<str>"(?:\\.|[^"\\\n])*")
  | (?P<chr>'(?:\\.|[^'\\\n])*')
  | (?P<num>(?:0[xX][0-9a-fA-F]+|\d+\.\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|\d+(?:[eE][-+]?\d+)?)[uUlLfF]*)
  | (?P<id>[A-Za-z_]\w*)
  | (?P<op>\.\.\.|<<=|>>=|->|\+\+|--|<<|>>|<=|>=|==|!=|&&|\|\||[-+*/%&|^!~<>=]=?|[()\[\]{};,.?:#])
""", re.S | re.X)


class Tok:
    __slots__ = ("kind", "text", "start", "end", "line")

    def __init__(self, kind, text, start, end, line):
        self.kind, self.text, self.start, self.end, self.line = kind, text, start, end, line


def tokenize(src):
    toks, pos, line, bol = [], 0, 1, True
    n = len(src)
    while pos < n:
        if bol:
            # A preprocessor line (and its continuations) is skipped whole.
            m = re.match(r"[ \t]*#", src[pos:pos + 200])
            if m:
                end = pos
                while True:
                    nl = src.find("\n", end)
                    if nl < 0:
                        end = n
                        break
                    if src[nl - 1] == "\\":
                        end = nl + 1
                        continue
                    end = nl
                    break
                line += src.count("\n", pos, end)
                pos = end
                continue
        m = TOKEN.match(src, pos)
        if not m:
            raise ValueError(f"line {line}: cannot read {src[pos:pos + 20]!r}")
        kind = m.lastgroup
        text = m.group(0)
        if kind not in ("ws", "comment"):
            toks.append(Tok(kind, text, pos, m.end(), line))
        nls = text.count("\n")
        if nls:
            line += nls
            bol = kind == "ws" and text.endswith("\n") or (kind == "ws" and text[text.rfind("\n") + 1:].strip() == "")
        elif kind != "ws":
            bol = False
        pos = m.end()
    return toks


def match_brackets(toks):
    pair, stack = {}, []
    opens = {"(": ")", "[": "]", "{": "}"}
    for i, t in enumerate(toks):
        if t.kind != "op":
            continue
        if t.text in opens:
            stack.append(i)
        elif t.text in (")", "]", "}"):
            if not stack:
                raise ValueError(f"line {t.line}: unbalanced {t.text}")
            j = stack.pop()
            pair[i], pair[j] = j, i
    return pair


def functions(toks, pair):
    """(name, first body token, last body token) of each function body: a
    `{` at file level right after a parameter list's `)`."""
    out, i, depth = [], 0, 0
    while i < len(toks):
        t = toks[i]
        if t.text == "{" and t.kind == "op":
            if i > 0 and toks[i - 1].text == ")":
                j = pair[i - 1]
                if j > 0 and toks[j - 1].kind == "id":
                    out.append((toks[j - 1].text, i, pair[i]))
            i = pair[i] + 1
            continue
        i += 1
    return out


# ---- The mutation operators --------------------------------------------------

LOGGING = {"sh_debug", "sh_info", "sh_warn", "sh_log", "fprintf", "printf", "sh_err", "sh_err_errno",
           "sh_err_wrap", "snprintf", "sh_buf_printf", "assert", "perror", "fputs", "puts"}
TYPES = {"int", "char", "long", "short", "unsigned", "signed", "double", "float", "size_t", "ssize_t",
         "uint8_t", "uint16_t", "uint32_t", "uint64_t", "int8_t", "int16_t", "int32_t", "int64_t",
         "const", "static", "struct", "enum", "bool", "void", "off_t", "pid_t", "uid_t", "gid_t",
         "time_t", "volatile", "register"}
REL = {"<": "<=", "<=": "<", ">": ">=", ">=": ">", "==": "!=", "!=": "=="}
CHECK_CALL = re.compile(r"(verify|check|_eq$|cmp|auth|allowed|permit|owns|valid|_ok$|^is_|_is_|limit|rule_add"
                        r"|rlimit|prctl|seccomp|write|chmod|chown|mount|unshare|setgroups|setuid|setgid|digest"
                        r"|match|same)", re.I)
TRUE_CALL = re.compile(r"(_eq$|allowed|permit|owns|valid|_ok$|^is_|_is_|match|same|^has_|_has_)", re.I)
DROP_LHS = re.compile(r"(limit|max|min|flag|quota|cap|bound|stale|mode|allow|deny|readonly|nosuid|noexec|secure"
                      r"|verified|valid|ok$|^ok|writable|tenant|owner|role|lag|perm|strict|required|policy)", re.I)
DROP_CALL = re.compile(r"(limit|rule_add|rlimit|prctl|seccomp|mount|unshare|setgroups|setuid|setgid|chmod"
                       r"|cg_|cgroup|quota|set_)", re.I)


class Gen:
    def __init__(self, path, src, fn_of):
        self.path, self.src = path, src
        self.toks = tokenize(src)
        self.pair = match_brackets(self.toks)
        self.fns = functions(self.toks, self.pair)
        self.out = []
        self.logging = self._logging_spans()

    def _logging_spans(self):
        bad = set()
        for i, t in enumerate(self.toks):
            if t.kind == "id" and t.text in LOGGING and i + 1 < len(self.toks) and self.toks[i + 1].text == "(":
                for k in range(i, self.pair[i + 1] + 1):
                    bad.add(k)
        return bad

    def add(self, kind, fn, a, b, repl, tline):
        """Replace the text of tokens a..b (inclusive) with repl."""
        s, e = self.toks[a].start, self.toks[b].end
        self.out.append({"kind": kind, "fn": fn, "start": s, "end": e, "to": repl, "line": tline})

    def add_span(self, kind, fn, s, e, repl, tline):
        self.out.append({"kind": kind, "fn": fn, "start": s, "end": e, "to": repl, "line": tline})

    def stmt_start(self, i, lo):
        """Index of the first token of the statement holding token i."""
        k = i - 1
        while k > lo:
            t = self.toks[k]
            if t.text in (";", "{", "}") and t.kind == "op":
                if t.text == "}" or t.text == "{":
                    return k + 1
                return k + 1
            if t.text == ")" and t.kind == "op":
                j = self.pair[k]
                if j > 0 and self.toks[j - 1].text in ("if", "while", "for", "switch"):
                    return k + 1
                k = j - 1
                continue
            if t.text == "(" and t.kind == "op":
                return None  # inside parentheses: not a statement
            if t.text == "]" and t.kind == "op":
                k = self.pair[k] - 1
                continue
            if t.text in ("else", "do") or (t.text == ":" and k > 0 and (self.toks[k - 2].text == "case"
                                                                      or self.toks[k - 1].kind == "id"
                                                                      and self.toks[k - 2].text in (";", "{", "}"))):
                return k + 1
            k -= 1
        return lo + 1

    def stmt_end(self, i, hi):
        k = i
        while k < hi:
            t = self.toks[k]
            if t.kind == "op" and t.text in ("(", "[", "{"):
                k = self.pair[k] + 1
                continue
            if t.kind == "op" and t.text == ";":
                return k
            if t.kind == "op" and t.text == "}":
                return None
            k += 1
        return None

    def in_if_branch(self, s, lo):
        """The statement starting at s is the body of an if, or inside an
        if's braces."""
        p = self.toks[s - 1] if s > 0 else None
        if p is None:
            return False
        if p.text == ")" and p.kind == "op":
            j = self.pair[s - 1]
            return j > 0 and self.toks[j - 1].text == "if"
        if p.text == "else":
            return True
        # Inside braces: find the enclosing '{'.
        k, depth = s - 1, 0
        while k > lo:
            t = self.toks[k]
            if t.kind == "op" and t.text == "}":
                k = self.pair[k] - 1
                continue
            if t.kind == "op" and t.text == "{":
                q = self.toks[k - 1]
                if q.text == "else":
                    return True
                if q.text == ")":
                    j = self.pair[k - 1]
                    return j > 0 and self.toks[j - 1].text == "if"
                return False
            k -= 1
        return False

    def run(self):
        T = self.toks
        for fn, lo, hi in self.fns:
            for i in range(lo + 1, hi):
                if i in self.logging:
                    continue
                t = T[i]
                ln = t.line
                if t.kind == "op" and t.text in REL:
                    self.add("rel", fn, i, i, REL[t.text], ln)
                    if t.text in ("<", "<=", ">", ">="):
                        flip = {"<": ">=", "<=": ">", ">": "<=", ">=": "<"}[t.text]
                        self.add("rel", fn, i, i, flip, ln)
                elif t.kind == "num" and re.fullmatch(r"(0[xX][0-9a-fA-F]+|\d+)[uUlL]*", t.text):
                    self.const(fn, i, ln)
                elif t.kind == "op" and t.text in ("&&", "||"):
                    self.logic(fn, i, lo, hi, ln)
                elif t.kind == "id" and t.text in ("return", "goto"):
                    self.ret(fn, i, lo, hi, ln)
                elif t.kind == "id" and t.text == "SH_TRY" and i + 1 < hi and T[i + 1].text == "(":
                    c = self.pair[i + 1]
                    inner = self.src[T[i + 2].start:T[c - 1].end] if c > i + 2 else ""
                    self.add("ret", fn, i, c, f"(void)({inner})", ln)
                elif t.kind == "id" and i + 1 < hi and T[i + 1].text == "(" and T[i - 1].text not in (".", "->"):
                    self.call(fn, i, lo, hi, ln)
                elif t.kind == "op" and t.text in ("=", "|=", "&=", "+=", "-="):
                    self.drop(fn, i, lo, hi, ln)
        return self.out

    def const(self, fn, i, ln):
        T = self.toks
        t = T[i]
        # Array sizes in declarations (`char buf[256]`, `char *v[8]`) and
        # case labels: changing them is noise or does not compile.
        if T[i - 1].text == "[" and T[i + 1].text == "]":
            s = self.stmt_start(i, 0)
            if s is not None and (T[s].text in TYPES or T[s].kind == "id" and T[s + 1].kind == "id"):
                return
        if T[i - 1].text == "case":
            return
        m = re.fullmatch(r"(0[xX][0-9a-fA-F]+|\d+)([uUlL]*)", t.text)
        digits, suf = m.group(1), m.group(2)
        if digits.lower().startswith("0x"):
            v, fmt = int(digits, 16), (lambda x: hex(x) + suf)
        elif len(digits) > 1 and digits.startswith("0"):
            v, fmt = int(digits, 8), (lambda x: "0" + oct(x)[2:] + suf)
        else:
            v, fmt = int(digits), (lambda x: str(x) + suf)
        self.add("const", fn, i, i, fmt(v + 1), ln)
        if v > 0:
            self.add("const", fn, i, i, fmt(v - 1), ln)

    def operand_bounds(self, i, lo, hi):
        T = self.toks
        stop = {"(", ",", "||", "&&", "=", "?", ":", "return", ";", "{", "}", "!"}
        a = i - 1
        while a > lo:
            t = T[a]
            if t.kind == "op" and t.text in (")", "]"):
                a = self.pair[a] - 1
                continue
            if t.text in stop and not (t.text == "!" and True):
                break
            if t.text == "!":
                a -= 1
                continue
            a -= 1
        left = a + 1
        b = i + 1
        stop2 = {")", ",", "||", "&&", ";", "?", ":", "]", "}"}
        while b < hi:
            t = T[b]
            if t.kind == "op" and t.text in ("(", "["):
                b = self.pair[b] + 1
                continue
            if t.text in stop2:
                break
            b += 1
        right = b - 1
        return left, right

    def logic(self, fn, i, lo, hi, ln):
        T = self.toks
        self.add("logic", fn, i, i, "&&" if T[i].text == "||" else "||", ln)
        left, right = self.operand_bounds(i, lo, hi)
        if left <= i - 1 and right >= i + 1:
            # Drop the right operand: keep text up to the end of the left one.
            self.add_span("logic", fn, T[i - 1].end, T[right].end, "", ln)
            # Drop the left operand.
            self.add_span("logic", fn, T[left].start, T[i + 1].start, "", ln)

    def ret(self, fn, i, lo, hi, ln):
        T = self.toks
        end = self.stmt_end(i, hi)
        if end is None:
            return
        s = self.stmt_start(i, lo)
        if s != i:
            return
        val = self.src[T[i + 1].start:T[end].start].strip() if end > i + 1 else ""
        if T[i].text == "return" and val in ("0", "SH_OK", "true", "NULL", "1"):
            return
        if not self.in_if_branch(i, lo):
            return
        self.add("ret", fn, i, end, "{}", ln)

    def call(self, fn, i, lo, hi, ln):
        T = self.toks
        name = T[i].text
        c = self.pair[i + 1]
        if name in LOGGING or name in ("sizeof", "if", "while", "for", "switch", "return"):
            return
        prev = T[i - 1]
        is_stmt = prev.text in (";", "{", "}") or (prev.text == ")" and self.toks[self.pair[i - 1] - 1].text
                                                   in ("if", "while", "for")) or prev.text == "else"
        is_stmt = is_stmt and c + 1 < hi and T[c + 1].text == ";"
        if name == "memcmp":
            args = self.split_args(i + 1, c)
            if len(args) == 3:
                a, b = args[2]
                n = self.src[T[a].start:T[b].end]
                self.add_span("call", fn, T[a].start, T[b].end, f"({n}) / 2", ln)
        if is_stmt:
            if DROP_CALL.search(name):
                self.add("drop", fn, i, c + 1, ";", ln)
            return
        if CHECK_CALL.search(name) or name in ("memcmp", "strcmp", "strncmp"):
            self.add("call", fn, i, c, "1" if TRUE_CALL.search(name) else "0", ln)

    def split_args(self, o, c):
        T, args, a, k = self.toks, [], o + 1, o + 1
        while k < c:
            if T[k].kind == "op" and T[k].text in ("(", "[", "{"):
                k = self.pair[k] + 1
                continue
            if T[k].text == ",":
                args.append((a, k - 1))
                a = k + 1
            k += 1
        if a < c:
            args.append((a, c - 1))
        return args

    def drop(self, fn, i, lo, hi, ln):
        T = self.toks
        s = self.stmt_start(i, lo)
        if s is None:
            return
        end = self.stmt_end(i, hi)
        if end is None:
            return
        lhs = T[s:i]
        if not lhs or lhs[0].text in TYPES or lhs[0].text in ("return", "for", "case"):
            return
        for a, b in zip(lhs, lhs[1:]):
            if a.kind == "id" and b.kind == "id":
                return  # a declaration
            if a.kind == "id" and b.text == "*" and a.text[0].isupper():
                return
        if not any(t.kind == "id" and DROP_LHS.search(t.text) for t in lhs):
            return
        self.add("drop", fn, s, end, ";", T[s].line)


def line_text(src, pos):
    a = src.rfind("\n", 0, pos) + 1
    b = src.find("\n", pos)
    return a, (len(src) if b < 0 else b)


def generate(entry, root):
    path = entry["file"]
    full = os.path.join(root, path)
    try:
        src = open(full).read()
    except OSError as e:
        die(f"{MAP}:{entry['line']}: cannot read {path}: {e.strerror} (update the scope list)")
    try:
        raw = Gen(path, src, None).run()
    except ValueError as e:
        die(f"{path}: {e}")
    seen, out, occ = set(), [], {}
    if entry["only"]:
        have = {m["fn"] for m in raw}
        missing = entry["only"] - have
        if missing:
            die(f"{MAP}:{entry['line']}: only= names {', '.join(sorted(missing))}, not functions of {path} "
                "with mutants (update the list)")
        raw = [m for m in raw if m["fn"] in entry["only"]]
    for m in raw:
        new = src[:m["start"]] + m["to"] + src[m["end"]:]
        if new == src:
            continue
        h = hashlib.sha1(new.encode()).hexdigest()
        if h in seen:
            continue
        seen.add(h)
        a, _ = line_text(src, m["start"])
        _, b = line_text(src, m["end"])
        before = src[a:b]
        after = new[a:b + len(new) - len(src)]
        pairkey = (m["kind"], " ".join(before.split()), " ".join(after.split()))
        n = occ.get(pairkey, 0)
        occ[pairkey] = n + 1
        digest = hashlib.sha1(repr(pairkey + (n,)).encode()).hexdigest()[:8]
        fnmap = entry["fns"].get(m["fn"])
        out.append({
            "id": f"{path}:{m['line']}:{m['kind']}:{digest}",
            "file": path, "line": m["line"], "kind": m["kind"], "fn": m["fn"],
            "start": m["start"], "end": m["end"], "to": m["to"],
            "before": before.strip(), "after": after.strip(),
            "tests": (fnmap or entry)["tests"], "timeout": (fnmap or entry)["timeout"],
            "nocov": entry["nocov"],
        })
    return out


# ---- Running ---------------------------------------------------------------

def seed_tree(tree):
    """A new private tree starts as a copy of the working tree's sources and
    build outputs with their times kept, so that make rebuilds nothing that
    is up to date (a fresh build takes minutes on 2 cores)."""
    if os.path.isdir(os.path.join(tree, "build")):
        return
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                           check=True, capture_output=True).stdout.split(b"\0")
    for rel in files:
        if not rel:
            continue
        rel = rel.decode()
        src, dst = os.path.join(ROOT, rel), os.path.join(tree, rel)
        if not os.path.isfile(src) or os.path.islink(src):
            continue
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copy2(src, dst)
    b = os.path.join(ROOT, "build")
    for sub in ("gen", "obj", "pic", "tests", "libshoal.a", "shoal", "shoal-core"):
        s = os.path.join(b, sub)
        d = os.path.join(tree, "build", sub)
        if os.path.isdir(s):
            shutil.copytree(s, d, symlinks=True, dirs_exist_ok=True)
        elif os.path.exists(s):
            os.makedirs(os.path.dirname(d), exist_ok=True)
            shutil.copy2(s, d)


def prune_tree(tree):
    """Removes the sources a private tree holds that the working tree no
    longer has (a file moved or deleted since the tree was made): the
    Makefile builds every src/*/*.c it finds."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                           check=True, capture_output=True).stdout.split(b"\0")
    keep = {f.decode() for f in files if f}
    for top in ("src", "include", "tests", "fuzz"):
        for d, _, names in os.walk(os.path.join(tree, top)):
            for n in names:
                rel = os.path.relpath(os.path.join(d, n), tree)
                if rel not in keep and not rel.startswith("tests/browser/"):
                    os.unlink(os.path.join(tree, rel))


def binaries(tests):
    return sorted({"build/tests/" + t.split(":")[0] for t in tests})


_USES = {}


def uses_shoal(test):
    """Whether a test binary runs the shoal binary ($SHOAL_BIN: a server,
    an agent, a command); when it does not, a mutant is linked into the test
    binary alone and build/shoal-core is not relinked."""
    name = test.split(":")[0]
    if name not in _USES:
        try:
            src = open(os.path.join(ROOT, "tests", name + ".c")).read()
        except OSError:
            src = "tu_shoal"
        _USES[name] = bool(re.search(r"tu_shoal|fleet_util\.h|SHOAL_BIN|test_python", src)) or \
            name.startswith("test_python")
    return _USES[name]


# ---- Coverage: a mutant on a line no mapped test executes --------------------

COV = os.path.join("build", "mutgen", "cov")  # relative to ROOT: its own BUILD


def coverage(specs, files, logdir):
    """Builds the mapped tests once with --coverage (BUILD=build/mutgen/cov,
    -O0), runs every spec once, and returns {file: (executed, unexecuted)}
    line sets from gcov, and {spec: (result, seconds)}.  gcov counts the
    server and agent processes the tests start too (they exit on SIGTERM,
    which writes their counts; a forked child writes its own before exec)."""
    log = os.path.join(logdir, "coverage.log")
    covdir = os.path.join(ROOT, COV)
    for d, _, names in os.walk(covdir):
        for n in names:
            if n.endswith(".gcda"):
                os.unlink(os.path.join(d, n))
    need = [COV + "/tests/" + t for t in sorted({s.split(":")[0] for s in specs})]
    cmd = ["make", "--no-print-directory", "-j" + str(os.cpu_count() or 2), "BUILD=" + COV,
           "OPTFLAGS=-O0 -g --coverage", COV + "/shoal"] + need
    with open(log, "a") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        if subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT).returncode:
            die(f"the coverage build failed; see {log}")
    runs = {}
    for spec, to in sorted(specs.items()):
        t = time.time()
        r = mutants.run_test(spec, to, log, tree=ROOT, bindir=covdir)
        runs[spec] = (r, time.time() - t)
    return gcov_lines(files), runs


def gcov_lines(files):
    """{file: (executed, unexecuted)} line sets from the coverage build's
    counts (gcov -t)."""
    covdir = os.path.join(ROOT, COV)
    lines = {}
    for path in files:
        obj = os.path.join(covdir, "pic", os.path.dirname(path))
        out = subprocess.run(["gcov", "-t", "-o", obj, path], cwd=ROOT, capture_output=True, text=True).stdout
        ex, unex = set(), set()
        mine = False  # gcov -t prints the headers the file includes after it
        for ln in out.splitlines():
            parts = ln.split(":", 3)
            if len(parts) < 3:
                continue
            cnt, no = parts[0].strip().rstrip("*"), parts[1].strip()
            if no == "0" and parts[2] == "Source":
                mine = os.path.normpath(parts[3].strip()) == os.path.normpath(path)
                continue
            if not mine or not no.isdigit() or cnt == "-":
                continue
            (unex if cnt in ("#####", "=====") else ex).add(int(no))
        if ex:  # no counts at all: no gcda (nothing ran it), judge nothing
            lines[path] = (ex, unex)
    return lines


def uncovered(m, lines, srcs):
    """The mutant's lines hold executable code and none of it ran."""
    cov = lines.get(m["file"])
    if not cov or m.get("nocov"):
        return False
    src = srcs.setdefault(m["file"], open(os.path.join(ROOT, m["file"])).read())
    a = src.count("\n", 0, m["start"]) + 1
    b = src.count("\n", 0, max(m["start"], m["end"] - 1)) + 1
    span = range(a, b + 1)
    return not any(n in cov[0] for n in span) and any(n in cov[1] for n in span)


class Runner:
    def __init__(self, jobs, logdir, work):
        self.jobs = jobs
        self.logdir = logdir
        self.trees = [os.path.join(work, f"tree-{k}") for k in range(jobs)]
        self.free = list(self.trees)
        self.lock = threading.Lock()
        self.broken = set()
        self.limit = {}  # spec -> seconds: about 3x its baseline

    def prepare(self, tests):
        for tree in self.trees:
            seed_tree(tree)
            mutants.sync_tree(tree)
            prune_tree(tree)
        base = os.path.join(self.logdir, "baseline.log")
        open(base, "w").close()
        need = binaries(tests)
        for tree in self.trees:
            if not mutants.build(need, base, tree=tree, jobs=max(1, (os.cpu_count() or 2) // self.jobs)):
                die(f"the unmutated tree does not build; see {base}")

    def baseline(self, specs, runs=None):
        """Runs every spec on the unmutated tree (or takes the coverage run's
        results): a spec that fails there judges no mutant, and each spec's
        time limit becomes 3x its time plus 10 s, at most the map's."""
        base = os.path.join(self.logdir, "baseline.log")
        for spec, to in sorted(specs.items()):
            if runs and spec in runs:
                r, dt = runs[spec]
            else:
                t = time.time()
                r = mutants.run_test(spec, to, base, tree=self.trees[0])
                dt = time.time() - t
            self.limit[spec] = min(to, 3 * dt + 10)
            if r != "pass":
                self.broken.add(spec)
                print(f"BASELINE   {spec}: {r} on the unmutated tree (see {base})", flush=True)
            else:
                print(f"baseline   {spec}: {dt:.1f}s, limit {self.limit[spec]:.0f}s", flush=True)

    def one(self, m):
        with self.lock:
            tree = self.free.pop()
        try:
            return self._one(m, tree)
        finally:
            with self.lock:
                self.free.append(tree)

    def _one(self, m, tree):
        log = os.path.join(self.logdir, re.sub(r"[^\w.-]", "_", m["id"]) + ".log")
        with open(log, "w") as f:
            f.write(f"{m['id']} in {m['fn']}()\n- {m['before']}\n+ {m['after']}\n")
        path = os.path.join(tree, m["file"])
        orig = open(path).read()
        t1 = time.time()
        try:
            with open(path, "w") as f:
                f.write(orig[:m["start"]] + m["to"] + orig[m["end"]:])
            # Each test binary is linked just before it runs: most mutants
            # die in the first, and a link costs seconds on a busy machine.
            if not mutants.build(binaries(m["tests"][:1]), log, tree=tree, jobs=1,
                                 shoal=uses_shoal(m["tests"][0])):
                return "INVALID", "does not compile", time.time() - t1
            result, why = "SURVIVED", "every mapped test passed"
            for t in m["tests"]:
                if t in self.broken:
                    continue
                if not mutants.build(binaries([t]), log, tree=tree, jobs=1, shoal=uses_shoal(t)):
                    return "INVALID", f"{t.split(':')[0]} does not link", time.time() - t1
                r = mutants.run_test(t, self.limit.get(t, m["timeout"]), log, tree=tree)
                if r == "nomatch":
                    return "INVALID", f"filter of {t} matches no test", time.time() - t1
                if r != "pass":
                    return "KILLED", f"by {t}" + (" (time limit)" if r == "timeout" else ""), time.time() - t1
            # A survivor is judged only by all its tests: one that fails on
            # the unmutated tree (a half-edited test) could have killed it.
            broken = [t for t in m["tests"] if t in self.broken]
            if broken:
                return "UNTESTED", (f"{', '.join(broken)} fail{'s' if len(broken) == 1 else ''} on the unmutated "
                                    "tree" + ("" if len(broken) == len(m["tests"]) else
                                              "; every other mapped test passed")), time.time() - t1
            return result, why, time.time() - t1
        finally:
            with open(path, "w") as f:
                f.write(orig)


def main():
    signal.signal(signal.SIGTERM, mutants.on_term)  # the mutated file is put back on the way out
    ap = argparse.ArgumentParser(description="generated mutants on the integrity and isolation paths")
    ap.add_argument("--seed", type=int,
                    help="draw a new seeded sample instead of running the checked-in one (tests/mutgen-sample.txt)")
    ap.add_argument("--count", type=int, default=400, help="mutants in a drawn sample (default 400)")
    ap.add_argument("--pin", action="store_true",
                    help="with --seed: write the drawn sample to tests/mutgen-sample.txt (and run nothing)")
    ap.add_argument("--full", action="store_true", help="every mutant, no sample")
    ap.add_argument("-j", "--jobs", type=int, default=1)
    ap.add_argument("--only", help="comma-separated mutant ids (a survivor's id reproduces it)")
    ap.add_argument("--files", help="comma-separated globs: only these source files")
    ap.add_argument("--kinds", help="comma-separated kinds: " + ",".join(KINDS))
    ap.add_argument("--list", action="store_true", help="print the chosen mutants and stop")
    ap.add_argument("--counts", action="store_true", help="print the mutants per file and kind and stop")
    ap.add_argument("--report", help="also write the per-file table (markdown) here")
    ap.add_argument("--json", help="also write every result (JSON) here")
    ap.add_argument("--work", default=WORK, help="folder for the private trees and logs (default build/mutgen)")
    ap.add_argument("--no-coverage", action="store_true",
                    help="build and test every mutant, also those on lines no mapped test executes")
    ap.add_argument("--time-budget", type=float, default=0,
                    help="stop starting new mutants after this many seconds (the rest are reported NOTRUN)")
    ap.add_argument("--resume", metavar="JSON",
                    help="take the results a run wrote with --json here for its mutants instead of running them "
                         "again, and write the whole run back to it (a sample finished over several runs)")
    ap.add_argument("--merge", nargs="+", metavar="JSON",
                    help="judge the results of earlier runs (--json files; a later file's result for a mutant "
                         "replaces an earlier one's) against the current equivalents list, and report")
    a = ap.parse_args()
    entries = parse_map(MAP)
    if a.merge:
        return merge(a, entries)
    if a.files:
        globs = a.files.split(",")
        entries = [e for e in entries if any(fnmatch.fnmatch(e["file"], g) for g in globs)]
    equiv = parse_equiv(EQUIV)
    allm = []
    for e in entries:
        allm.extend(generate(e, ROOT))
    if a.kinds:
        ks = set(a.kinds.split(","))
        allm = [m for m in allm if m["kind"] in ks]
    if a.counts:
        per = {}
        for m in allm:
            per.setdefault(m["file"], {}).setdefault(m["kind"], 0)
            per[m["file"]][m["kind"]] += 1
        for f, d in per.items():
            print(f"{f:34} {sum(d.values()):5}  " + " ".join(f"{k}={d.get(k, 0)}" for k in KINDS))
        print(f"{len(allm)} mutants in {len(per)} files")
        return 0
    if a.only:
        want = a.only.split(",")
        bykey = {key_of(m["id"]): m for m in allm}
        chosen = []
        for w in want:
            m = bykey.get(key_of(w))
            if not m:
                die(f"no such mutant: {w}")
            chosen.append(m)
    elif a.full:
        chosen = list(allm)
    elif a.seed is not None:
        rng = random.Random(a.seed)
        chosen = rng.sample(allm, min(a.count, len(allm)))
        if a.pin:
            return pin_sample(chosen, a.seed, len(allm))
    else:
        chosen = pinned_sample(allm, a.files)
    # In blocks of 2 mutants of one file, the files taken in turn: a block
    # rebuilds one object, and a run cut short by --time-budget has still
    # sampled every file.
    order = {e["file"]: k for k, e in enumerate(entries)}
    chosen.sort(key=lambda m: (order.get(m["file"], 0), m["start"], m["id"]))
    byfile = {}
    for m in chosen:
        byfile.setdefault(m["file"], []).append(m)
    blocks = [[ms[k:k + 2] for k in range(0, len(ms), 2)] for ms in byfile.values()]
    chosen = [m for rnd in range(max((len(b) for b in blocks), default=0))
              for b in blocks if rnd < len(b) for m in b[rnd]]
    if a.list:
        for m in chosen:
            print(f"{m['id']:50} {m['fn']:28} {m['before'][:60]!r} -> {m['after'][:60]!r}")
        print(f"{len(chosen)} of {len(allm)} mutants")
        return 0
    prior = []
    if a.resume:
        a.json = a.json or a.resume
        done = {}
        if os.path.exists(a.resume):
            for r in json.load(open(a.resume)):
                if r["result"] != "NOTRUN":
                    done[key_of(r["id"])] = r
        for m in chosen:
            r = done.get(key_of(m["id"]))
            if r:
                res, why = r["result"], r["why"]
                if res in ("SURVIVED", "EQUIVALENT", "GAP"):  # judged by today's list
                    k = key_of(m["id"])
                    res, why = judge(equiv[k]) if k in equiv else ("SURVIVED", "every mapped test passed")
                prior.append((m, res, why, r["seconds"]))
        chosen = [m for m in chosen if key_of(m["id"]) not in done]
        print(f"mutgen: {len(prior)} mutants of the sample taken from {a.resume}", flush=True)
    a.work = os.path.abspath(a.work)
    logdir = os.path.join(a.work, "log")
    shutil.rmtree(logdir, ignore_errors=True)
    os.makedirs(logdir)
    t0 = time.time()
    runner = Runner(max(1, a.jobs), logdir, a.work)
    specs = {}
    for m in chosen:
        for t in m["tests"]:
            specs[t] = max(specs.get(t, 0), m["timeout"])
    runs = None
    if not a.no_coverage and chosen:
        tc = time.time()
        lines, runs = coverage(specs, sorted({m["file"] for m in chosen}), logdir)
        srcs = {}
        unc = [m for m in chosen if uncovered(m, lines, srcs)]
        for m in unc:
            chosen.remove(m)
            k = key_of(m["id"])
            res, why = judge(equiv[k]) if k in equiv else \
                ("SURVIVED", "uncovered: no mapped test executes its line (coverage run)")
            prior.append((m, res, why, 0.0))
            print(f"{res:10} {m['id']:48} {why}", flush=True)
            if res == "SURVIVED":
                print(f"             in {m['fn']}(): {m['before'][:100]!r}\n"
                      f"                     -> {m['after'][:100]!r}", flush=True)
        print(f"mutgen: coverage in {time.time() - tc:.0f}s: {len(unc)} mutants on lines no mapped test "
              f"executes (judged without a build)", flush=True)
    runner.prepare(list(specs))
    runner.baseline(specs, runs)
    print(f"mutgen: {len(chosen)} of {len(allm)} mutants ({'full' if a.full else 'only' if a.only else f'seed {a.seed}' if a.seed is not None else 'the checked-in sample'}), "
          f"{a.jobs} job(s); baseline in {time.time() - t0:.0f}s", flush=True)
    stop = threading.Event()

    def task(m):
        if stop.is_set() or (a.time_budget and time.time() - t0 > a.time_budget):
            return m, "NOTRUN", "past the time budget", 0.0
        return (m,) + runner.one(m)

    results = list(prior)
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, a.jobs)) as ex:
        futs = [ex.submit(task, m) for m in chosen]
        try:
            for fu in concurrent.futures.as_completed(futs):
                m, res, why, dt = fu.result()
                if res == "SURVIVED" and key_of(m["id"]) in equiv:
                    res, why = judge(equiv[key_of(m["id"])])
                results.append((m, res, why, dt))
                if a.json:  # after each mutant: an interrupted run keeps what it found
                    write_json(a.json, results)
                if res != "NOTRUN":
                    print(f"{res:10} {m['id']:48} {why}  [{dt:.0f}s]", flush=True)
                    if res == "SURVIVED":
                        print(f"             in {m['fn']}(): {m['before'][:100]!r}\n"
                              f"                     -> {m['after'][:100]!r}", flush=True)
        except BaseException:
            # Interrupted (^C, SIGTERM): the mutants not started yet are
            # dropped; the running one puts its file back on the way out.
            stop.set()
            for fu in futs:
                fu.cancel()
            raise
    # The trees' objects are rebuilt from the restored files on the next run.
    return summarise(results, entries, a, time.time() - t0, len(allm))


def report_header(a):
    """Command, date, commit, machine and load, as bench/results/ entries
    state them."""
    import datetime
    import importlib.util
    spec = importlib.util.spec_from_file_location("bench_record", os.path.join(ROOT, "scripts", "bench-record.py"))
    br = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(br)
        machine = br.machine()
    except Exception:
        machine = f"{os.cpu_count()} cores"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    cmd = "python3 scripts/mutgen.py " + " ".join(sys.argv[1:])
    return (f"- command: `{cmd}`\n- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC\n"
            f"- commit: {commit}\n- machine: {machine}; load average at the end {load}\n\n")


def pin_sample(chosen, seed, total):
    """Writes a drawn sample to SAMPLE, so that later runs judge the same
    mutants whatever code moves or is added around them."""
    head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip() or "unknown"
    with open(SAMPLE + ".tmp", "w") as f:
        f.write("# The sample `make mutants-gen` runs (scripts/mutgen.py; docs/testing.md).\n"
                f"# Drawn with `python3 scripts/mutgen.py --seed {seed} --count {len(chosen)} --pin`\n"
                f"# at commit {head}: {len(chosen)} of its {total} mutants.  One id per line;\n"
                "# matching ignores the line number and the folder, as for the\n"
                "# equivalents list.\n")
        for m in chosen:
            f.write(m["id"] + "\n")
    os.replace(SAMPLE + ".tmp", SAMPLE)
    print(f"mutgen: {len(chosen)} mutants written to {os.path.relpath(SAMPLE, ROOT)}")
    return 0


def pinned_sample(allm, files):
    """The checked-in sample.  A mutant whose line has changed since it was
    drawn no longer exists; it is replaced by the mutant of the same file
    that a hash of its id ranks first among those not in the sample, so the
    sample keeps its size and still reproduces."""
    try:
        lines = open(SAMPLE).read().splitlines()
    except OSError as e:
        die(f"{SAMPLE}: {e.strerror}; draw one with --seed N --pin, or pass --seed N")
    ids = [l.split()[0] for l in lines if l.strip() and not l.startswith("#")]
    bykey = {key_of(m["id"]): m for m in allm}
    chosen, gone = [], []
    for i in ids:
        m = bykey.get(key_of(i))
        if m:
            chosen.append(m)
        elif not files or any(fnmatch.fnmatch(i.split(":")[0], g) for g in files.split(",")):
            gone.append(i)
    taken = {key_of(m["id"]) for m in chosen}
    rank = lambda m: hashlib.sha1(key_of(m["id"]).encode()).hexdigest()
    for i in gone:
        f = i.split(":")[0]
        pool = sorted((m for m in allm if m["file"] == f and key_of(m["id"]) not in taken), key=rank)
        if pool:
            chosen.append(pool[0])
            taken.add(key_of(pool[0]["id"]))
            print(f"mutgen: {i} of the sample no longer exists (its line changed); "
                  f"{pool[0]['id']} takes its place", flush=True)
    return chosen


def write_json(path, results):
    with open(path + ".tmp", "w") as f:
        json.dump([{"id": m["id"], "fn": m["fn"], "result": res, "why": why, "seconds": round(dt, 1),
                    "before": m["before"], "after": m["after"]} for m, res, why, dt in results], f, indent=1)
    os.replace(path + ".tmp", path)


def merge(a, entries):
    equiv = parse_equiv(EQUIV)
    # The first file is the run being judged; later ones (re-runs of some
    # of its mutants, e.g. after a test was added) replace their results.
    byid, order = {}, []
    for i, path in enumerate(a.merge):
        for r in json.load(open(path)):
            k = key_of(r["id"])
            if k not in byid:
                if i:
                    continue
                order.append(k)
            elif r["result"] in ("NOTRUN", "INVALID"):
                continue
            byid[k] = r
    results = []
    known = {os.path.basename(e["file"]): e["file"] for e in entries}
    for k in order:
        r = byid[k]
        res, why = r["result"], r["why"]
        if res in ("SURVIVED", "EQUIVALENT", "GAP"):
            res, why = judge(equiv[k]) if k in equiv else ("SURVIVED", "every mapped test passed")
        path = r["id"].split(":")[0]
        m = {"id": r["id"], "file": known.get(os.path.basename(path), path), "fn": r["fn"], "before": r["before"],
             "after": r["after"]}
        if res == "SURVIVED":
            print(f"SURVIVED   {r['id']:48} in {r['fn']}(): {r['before'][:70]!r} -> {r['after'][:70]!r}")
        results.append((m, res, why, r["seconds"]))
    return summarise(results, entries, a, sum(r["seconds"] for r in byid.values()), len(results))


def summarise(results, entries, a, elapsed, total):
    cols = ("KILLED", "SURVIVED", "EQUIVALENT", "GAP", "INVALID", "UNTESTED", "NOTRUN")
    per = {}
    for m, res, why, dt in results:
        d = per.setdefault(m["file"], {k: 0 for k in cols})
        d[res] += 1
    order = [e["file"] for e in entries if e["file"] in per] + sorted(f for f in per if f not in
                                                                       {e["file"] for e in entries})
    tot = {k: sum(per[f][k] for f in order) for k in cols}
    lines = ["| file | killed | survived | equivalent | known gap | invalid | not run | killed of the non-equivalent |",
             "|---|---|---|---|---|---|---|---|"]
    for f in order + ["total"]:
        d = tot if f == "total" else per[f]
        judged = d["KILLED"] + d["SURVIVED"] + d["GAP"] + d["UNTESTED"]
        score = f"{100.0 * d['KILLED'] / judged:.0f}%" if judged else "-"
        lines.append(f"| {f} | {d['KILLED']} | {d['SURVIVED'] + d['UNTESTED']} | {d['EQUIVALENT']} | {d['GAP']} | "
                     f"{d['INVALID']} | {d['NOTRUN']} | {score} |")
    print("\n".join(lines))
    summary = (f"mutgen: {len(results)} of {total} mutants in {elapsed:.0f}s: "
               + ", ".join(f"{tot[k]} {k.lower()}" for k in cols))
    print(summary)
    if a.report:
        with open(a.report, "w") as f:
            f.write(report_header(a) + "\n".join(lines) + "\n\n" + summary + "\n")
    if a.json and not a.merge:
        write_json(a.json, results)
    return 1 if tot["SURVIVED"] or tot["UNTESTED"] or tot["GAP"] else 0


if __name__ == "__main__":
    sys.exit(main())
