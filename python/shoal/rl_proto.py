"""The RL protocol from Python: a trainer that asks rollout workers for
groups of trajectories and a worker that answers them, on shoal's own
protocol (docs/rl-protocol.md) through libshoal (src/rl/engine/link.c).
The trainer's end runs the C runtime's checks on every message (tokens,
behaviour log-probabilities, the reward recomputed with the task's hidden
tests, versions), so a Python trainer serves C workers and a C trainer
(`shoal rl trainer`) Python workers, and a worker that breaks a rule is
dropped and its groups asked for again.

    tr = shoal.rl.Trainer(task="code", seed=1, group=8, max_lag=2)
    shoal.run.publish("trainer", tr.addr)
    tr.set_version(0)
    tr.ask(4)                                  # 4 prompts x 8 samples
    batch = tr.collect(32, timeout=60)         # dict of torch tensors

    w = shoal.rl.Worker(addr, generate, replica=rep, model=policy)
    w.serve()                                  # until the trainer says STOP

See docs/python-rl.md.
"""
import ctypes
import time

from . import _lib
from ._lib import check, lib
from .errors import ShoalError

_c = ctypes
MAX_T = 32
MSG_WEIGHTS, MSG_REQUEST, MSG_STOP = 1, 2, 4


class Traj(_c.Structure):
    """Mirror of ``rl_traj`` (include/shoal/rl.h; 296 bytes, the TRAJS
    record of docs/rl-protocol.md)."""
    _fields_ = [("tokens", _c.c_int32 * MAX_T), ("blogp", _c.c_float * MAX_T), ("len", _c.c_int32),
                ("plen", _c.c_int32), ("reward", _c.c_float), ("group", _c.c_int32),
                ("vstart", _c.c_int32), ("vend", _c.c_int32), ("worker", _c.c_int32),
                ("_pad", _c.c_int32), ("problem", _c.c_uint64)]


if lib.rl_traj_sizeof() != _c.sizeof(Traj):
    raise ImportError("shoal: libshoal's rl_traj is %d bytes but python/shoal/rl_proto.py mirrors %d"
                      % (lib.rl_traj_sizeof(), _c.sizeof(Traj)))

ALPHABET = lib.rl_alphabet().decode()
BOS, EOS = 0, 1


def task_id(task):
    """The C task number of "code" or "arith" (an int is taken as is)."""
    if isinstance(task, int):
        return task
    t = _c.c_int()
    check(lib.rl_task_parse(_lib.cstr(task, "task"), _c.byref(t)))
    return t.value


def _secret(secret):
    """None: SHOAL_RUN_SECRET (the library reads it); "": none."""
    return None if secret is None else _lib.cstr(secret, "secret")


def encode(text):
    """Token ids of a string over ALPHABET."""
    try:
        return [ALPHABET.index(ch) for ch in text]
    except ValueError:
        raise ValueError("shoal.rl: %r has a character outside the alphabet %r" % (text, ALPHABET)) from None


def decode(tokens):
    return "".join(ALPHABET[t] for t in tokens)


class Task:
    """The project's tasks (src/rl/engine/tasks.c): problems, their prompts
    and the verifiable reward, computed by libshoal."""

    def __init__(self, task="code"):
        self.id = task_id(task)

    def prompt(self, problem):
        """The prompt of problem id (a string ending in '=')."""
        buf = _c.create_string_buffer(64)
        check(lib.rl_task_prompt(self.id, _lib.u64(problem, "problem"), buf, 64))
        return buf.value.decode()

    def answer(self, problem):
        """A demonstration (reference solution) of problem id, for warm
        starts."""
        buf = _c.create_string_buffer(64)
        check(lib.rl_task_answer(self.id, _lib.u64(problem, "problem"), buf, 64))
        return buf.value.decode()

    def draw(self, n, seed, held_out=False):
        """n problem ids drawn from a generator seeded with seed."""
        rng = _c.c_uint64(_lib.u64(seed, "seed") or 1)
        return [lib.rl_task_draw(self.id, int(bool(held_out)), _c.byref(rng)) for _ in range(n)]

    def eval_set(self, n):
        """The fixed held-out evaluation set's problem ids (rl_eval_set)."""
        ids = (_c.c_uint64 * n)()
        check(lib.rl_task_eval_ids(self.id, n, ids))
        return list(ids)

    def reward(self, problem, response):
        """Reward of response token ids (up to EOS; without EOS: 0)."""
        n = len(response)
        arr = (_c.c_int32 * max(n, 1))(*response)
        out = _c.c_float()
        check(lib.rl_task_reward(self.id, _lib.u64(problem, "problem"), arr, n, _c.byref(out)))
        return out.value


def _as_tensors(raw, n):
    """n rl_traj records (bytes) as a dict of torch tensors."""
    import torch
    if n == 0:
        raw = bytes(296)
    b = bytearray(raw)
    i32 = torch.frombuffer(b, dtype=torch.int32).view(-1, 74)[:n]
    f32 = torch.frombuffer(b, dtype=torch.float32).view(-1, 74)[:n]
    i64 = torch.frombuffer(b, dtype=torch.int64).view(-1, 37)[:n]
    return {"tokens": i32[:, 0:32].long(), "behav_logp": f32[:, 32:64].clone(), "length": i32[:, 64].long(),
            "prompt_len": i32[:, 65].long(), "reward": f32[:, 66].clone(), "group": i32[:, 67].long(),
            "version_start": i32[:, 68].long(), "version_end": i32[:, 69].long(),
            "worker": i32[:, 70].long(), "problem": i64[:, 36].clone()}


class Trainer:
    """The trainer's end: listens at ``addr`` ("host:port"; port 0 picks
    one), takes rollout workers that prove the run's ``secret`` (None: the
    rank's SHOAL_RUN_SECRET, as shoal.run.secret() gives it; "": none), asks
    them for groups and yields the trajectories that pass the checks.
    Group g's problem is a function of (seed, g) alone; ``group`` samples
    per prompt, ``max_new`` response tokens, ``max_len`` the context (at
    most 32); a group that started more than ``max_lag`` versions before
    the trainer's is dropped and asked for again (bounded staleness)."""

    def __init__(self, task="code", seed=1, group=8, max_new=12, max_len=24, max_lag=2,
                 addr="127.0.0.1:0", secret=None):
        self.task = Task(task)
        self.group, self.max_lag = int(group), int(max_lag)
        h = _c.c_void_p()
        check(lib.rl_link_listen(_lib.cstr(addr, "addr"), _secret(secret), self.task.id,
                                 _lib.u64(seed, "seed"), self.group, int(max_new), int(max_len),
                                 self.max_lag, _c.byref(h)))
        self._h = h
        self.addr = lib.rl_link_addr(h).decode()
        self.version = -1
        self._buf = (Traj * 4096)()

    def _handle(self):
        if self._h is None:
            raise ValueError("shoal.rl.Trainer: used after close()")
        return self._h

    def set_version(self, version):
        """The newest version published (answers are checked against it and
        staleness is counted from it); versions only grow."""
        check(lib.rl_link_set_version(self._handle(), int(version)))
        self.version = int(version)

    def ask(self, nprompts, min_version=None, exact=False):
        """Asks for the next nprompts groups sampled with at least
        ``min_version`` (default: version - max_lag), or, with exact=True,
        exactly that version (a worker that holds another refuses and the
        groups are asked again).  Returns the first group's number."""
        if min_version is None:
            min_version = self.version - self.max_lag
        return check(lib.rl_link_ask(self._handle(), int(nprompts), int(min_version), int(bool(exact))))

    def poll(self, timeout=0.0):
        """Serves the workers for up to timeout seconds; returns the whole
        groups that came in (a dict of tensors, see collect) or None."""
        n = check(lib.rl_link_poll(self._handle(), float(timeout), self._buf, len(self._buf)))
        if n == 0:
            return None
        return _as_tensors(_c.string_at(self._buf, n * 296), n)

    def collect(self, n, timeout=60.0):
        """Waits for n trajectories (whole groups; n a multiple of group)
        and returns them as a dict of torch tensors, one row each: tokens
        (N, 32), behav_logp (N, 32) (of tokens[t] for prompt_len <= t <
        length), length, prompt_len, reward, group, version_start,
        version_end, worker (slot), problem.  Raises shoal.Timeout after
        timeout seconds (the groups received stay buffered)."""
        import torch
        deadline = time.monotonic() + timeout
        parts, got = getattr(self, "_held", []), sum(p["reward"].shape[0] for p in getattr(self, "_held", []))
        self._held = []
        while got < n:
            left = deadline - time.monotonic()
            if left <= 0:
                self._held = parts
                from .errors import Timeout
                raise Timeout(-11, "shoal.rl.Trainer: %d of %d trajectories after %.0f s (%d workers)"
                              % (got, n, timeout, self.workers))
            b = self.poll(min(left, 0.5))
            if b is not None:
                parts.append(b)
                got += b["reward"].shape[0]
        out = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
        if got > n:
            self._held = [{k: v[n:] for k, v in out.items()}]
            out = {k: v[:n] for k, v in out.items()}
        return out

    @property
    def workers(self):
        """Workers connected and past their HELLO."""
        return lib.rl_link_workers(self._handle())

    def stats(self):
        """Counters and per-worker entries (rl_link_stats_json): trajectories,
        dropped_stale, dropped_dead, refused_requests,
        workers_dropped_for_violations, staleness_hist, workers[...]."""
        return _lib.call_json(lib.rl_link_stats_json, self._handle())

    def stop(self, final_version=None, drain=15.0):
        """STOP to every worker (naming the final version, which a push
        worker takes before it answers BYE), then waits up to drain seconds
        for the BYEs.  Returns stats()."""
        v = self.version if final_version is None else int(final_version)
        check(lib.rl_link_stop(self._handle(), v, float(drain)))
        return self.stats()

    def close(self):
        if getattr(self, "_h", None) is not None:
            lib.rl_link_close(self._h)
            self._h = None

    __del__ = close

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Request:
    """A request a worker holds: ``problems`` (ids), ``prompts`` (token ids,
    BOS first), ``group`` samples each, groups ``group0``.., and the version
    constraint (``min_version``, ``exact``)."""

    def __init__(self, info, task):
        self.min_version, self.exact, self.nprompts, self.group, self.group0 = (int(x) for x in info[:5])
        self.seed = info[5] & (1 << 64) - 1
        self.problems = [info[8 + i] & (1 << 64) - 1 for i in range(self.nprompts)]
        self.prompts = [[BOS] + encode(task.prompt(p)) for p in self.problems]

    @property
    def need(self):
        return max(self.min_version, 0)


class Worker:
    """A rollout worker's end: connects to the trainer at ``addr``, then
    serve() answers its requests with ``generate`` until STOP.

    ``generate(request, version)`` samples ``request.group`` responses to
    each of ``request.prompts`` (groups adjacent) with the weights of
    ``version`` and returns a list of (response token ids, their log-probs
    under the sampling policy), EOS included when the response ended.  The
    worker fills in the rest (prompt, reward recomputed with the task,
    versions, problem).

    Weights: with ``replica`` (a shoal.Replica on the push tree) and
    ``model``, the worker loads the replica's version into model
    (Replica.load_into) before each request; policy version = store version
    - ``base``.  A request for a version it cannot get within ``min_wait``
    seconds, or an exact version it is past, is refused.  Without a replica
    the trainer's WEIGHTS come on the link (the direct transport of `shoal
    rl trainer`); ``on_weights(version, image_bytes)`` may load them."""

    def __init__(self, addr, generate, task="code", secret=None, name="torch", replica=None, model=None,
                 base=1, min_wait=5.0, on_weights=None):
        self.task = Task(task)
        self.generate, self.replica, self.model = generate, replica, model
        self.base, self.min_wait, self.on_weights = int(base), float(min_wait), on_weights
        h = _c.c_void_p()
        check(lib.rl_link_connect(_lib.cstr(addr, "addr"), _secret(secret), _lib.cstr(name, "name"),
                                  int(replica is not None), _c.byref(h)))
        self._h = h
        self.version = -1
        self._queue = []
        self._info = (_c.c_int64 * (8 + 4096))()
        self.served = self.refused = 0
        self.final_version = None

    # -- weights
    def _held(self):
        """The policy version the replica holds now (-1: none)."""
        return self.replica.version - self.base if self.replica.version else -1

    def _load(self, exact=None):
        """Loads the replica's newest version (or exactly `exact`) into the
        model; returns the policy version loaded."""
        store_v = (exact + self.base) if exact is not None else self.replica.version
        if store_v <= 0:
            return self.version
        if exact is None and store_v - self.base <= self.version:
            return self.version
        if self.model is not None:
            with self.replica.lease(min_version=store_v, exact_version=store_v if exact is not None else 0) as lease:
                self.replica.load_into(self.model, min_version=lease.version)
                store_v = lease.version
        self.version = store_v - self.base
        return self.version

    def _next(self, timeout):
        t = check(lib.rl_link_next(self._h, float(timeout), self._info, len(self._info)))
        if t == MSG_REQUEST:
            self._queue.append(Request(list(self._info[:8 + self._info[2]]), self.task))
        elif t == MSG_WEIGHTS:
            self.version = int(self._info[0])
            if self.on_weights is not None:
                data, size = _c.c_void_p(), _c.c_size_t()
                lib.rl_link_image(self._h, _c.byref(data), _c.byref(size))
                self.on_weights(self.version, _c.string_at(data, size.value))
        elif t == MSG_STOP:
            self.final_version = int(self._info[0])
        return t

    def _ready_for(self, rq):
        """Brings the weights to what rq asks for; False: refuse it."""
        need = rq.need
        if self.replica is None:  # the direct transport: weights come in order on the link
            while self.version < need and self.final_version is None:
                self._next(1.0)
            return self.version == need if rq.exact else self.version >= need
        if self._held() < need:
            try:
                self.replica.wait(need + self.base, timeout=self.min_wait)
            except ShoalError:
                pass
        if rq.exact:
            if self._held() != need or self.version > need:
                return False
            try:
                return self._load(exact=need) == need
            except ShoalError:
                return False
        self._load()
        return self.version >= need

    def records(self, rq, outputs, version):
        """The TRAJS records of rq's answer (a ctypes array of Traj)."""
        n = rq.nprompts * rq.group
        if len(outputs) != n:
            raise ValueError("shoal.rl.Worker: generate returned %d responses for %d prompts x %d"
                             % (len(outputs), rq.nprompts, rq.group))
        recs = (Traj * n)()
        for k, (resp, logps) in enumerate(outputs):
            gi = k // rq.group
            prompt = rq.prompts[gi]
            resp = [int(t) for t in resp]
            if len(prompt) + len(resp) > MAX_T or len(logps) != len(resp):
                raise ValueError("shoal.rl.Worker: response %d: %d tokens after a %d-token prompt (at most %d "
                                 "in all), %d log-probs" % (k, len(resp), len(prompt), MAX_T, len(logps)))
            r = recs[k]
            seq = prompt + resp
            for j, t in enumerate(seq):
                r.tokens[j] = t
            for j, lp in enumerate(logps):
                r.blogp[len(prompt) + j] = float(lp)
            r.len, r.plen = len(seq), len(prompt)
            r.reward = self.task.reward(rq.problems[gi], resp)
            r.group, r.problem = rq.group0 + gi, rq.problems[gi]
            r.vstart = r.vend = version
        return recs

    def send(self, recs):
        """Sends the answer to the oldest request."""
        check(lib.rl_link_send(self._h, recs, len(recs)))

    def serve(self, max_requests=None):
        """Answers requests until STOP (answered with BYE, after taking the
        final version) or until max_requests were served.  Returns the
        number of requests served."""
        while self.final_version is None:
            if max_requests is not None and self.served + self.refused >= max_requests:
                return self.served
            if not self._queue:
                self._next(0.5)
                continue
            rq = self._queue[0]
            if not self._ready_for(rq):
                self._queue.pop(0)
                check(lib.rl_link_refuse(self._h, self.version))
                self.refused += 1
                continue
            if self.final_version is not None:
                break
            self._queue.pop(0)
            outputs = self.generate(rq, self.version)
            self.send(self.records(rq, outputs, self.version))
            self.served += 1
            while self._next(0) and self.final_version is None:  # take what came meanwhile
                pass
        self._bye()
        return self.served

    def _bye(self):
        v = self.final_version
        if self.replica is not None:
            if v is not None and v > self.version:
                try:
                    self.replica.wait(v + self.base, timeout=15.0)
                except ShoalError:
                    pass
            self._load()
            if self.version >= 0:
                with self.replica.lease(min_version=self.version + self.base) as lease:
                    p = lease._lh.p.contents
                    check(lib.rl_link_bye(self._h, self.version, p.data, p.size))
                    return
            check(lib.rl_link_bye(self._h, self.version, None, 0))
            return
        check(lib.rl_link_bye(self._h, self.version, None, 0))

    def close(self):
        if getattr(self, "_h", None) is not None:
            lib.rl_link_close(self._h)
            self._h = None

    __del__ = close

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
