"""The run a job belongs to: its services and its secret.

The jobs of one tenant whose job files name the same ``"run"`` form a run
(docs/job-format.md).  Their ranks find each other through the server:

    import shoal.run
    shoal.run.publish("push", "10.0.0.1:4000")          # on the push root's rank
    addr = shoal.run.lookup("push", timeout=120)        # on a follower's rank
    secret = shoal.run.secret()                          # the same in every rank of the run

Inside a rank nothing needs configuring: the server gives each rank of a run
``SHOAL_RUN``, ``SHOAL_RUN_TOKEN`` and ``SHOAL_RUN_SECRET``, and its agent
``SHOAL_SERVER``.  The token reaches only this run's services, and only while
a job of the run is pending or running.  The calls are plain HTTP requests to
the server's ``/v1/runs/RUN/services`` (docs/server-api.md, "Runs"); the CLI
equivalent is ``shoal service publish|lookup|ls``.
"""
import json
import os
import time
import urllib.error
import urllib.request

from .errors import NotFound, ShoalError, Timeout

__all__ = ["publish", "lookup", "services", "secret", "name"]


def _env(key, given):
    v = given if given is not None else os.environ.get(key)
    if not v:
        raise ShoalError(-1, "shoal.run: %s is not set (is this a rank of a job whose job file names a"
                             " \"run\"?); pass it as an argument outside one" % key)
    return v


def name(run=None):
    """This rank's run (``SHOAL_RUN``)."""
    return _env("SHOAL_RUN", run)


def secret():
    """The run's secret, 32 hex digits (``SHOAL_RUN_SECRET``): the same in
    every rank of the run, generated once by the server, in no job file."""
    return _env("SHOAL_RUN_SECRET", None)


def _call(method, service, body=None, run=None, server=None, token=None):
    url = "%s/v1/runs/%s/services%s" % (_env("SHOAL_SERVER", server).rstrip("/"), name(run),
                                         "/" + service if service else "")
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Authorization", "Bearer " + (token or os.environ.get("SHOAL_RUN_TOKEN")
                                                 or _env("SHOAL_TOKEN", None)))
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read().decode())
    except urllib.error.HTTPError as e:
        try:
            msg = json.loads(e.read().decode()).get("error", str(e))
        except ValueError:
            msg = str(e)
        if e.code == 404:
            raise NotFound(-6, msg) from None
        raise ShoalError(-12 if e.code in (401, 403) else -1, "%s (HTTP %d from %s)" % (msg, e.code, url)) from None
    except urllib.error.URLError as e:
        raise ShoalError(-2, "%s: %s" % (url, e.reason)) from None


def publish(service, value, run=None, server=None, token=None):
    """Sets the run's service ``service`` (1 to 63 of A-Z a-z 0-9 . _ -) to
    ``value`` (a string of at most 4096 bytes, e.g. "10.0.0.1:4000"),
    replacing what it held.  Durable: the server keeps it across restarts."""
    if not isinstance(value, str):
        raise TypeError("shoal.run.publish: value must be a str, got %s" % type(value).__name__)
    return _call("PUT", service, {"value": value}, run, server, token)["value"]


def lookup(service, timeout=0.0, run=None, server=None, token=None):
    """The value of the run's service, waiting up to ``timeout`` seconds for
    it to be published.  Raises shoal.Timeout when it is not there in time
    (shoal.NotFound with timeout 0)."""
    deadline = time.monotonic() + timeout
    pause = 0.05
    while True:
        try:
            return _call("GET", service, None, run, server, token)["value"]
        except NotFound as e:
            if time.monotonic() >= deadline:
                if timeout > 0:
                    raise Timeout(-11, "run %s: service \"%s\" was not published within %g s (%s)"
                                  % (name(run), service, timeout, e.message)) from None
                raise
        time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        pause = min(pause * 2, 0.5)


def services(run=None, server=None, token=None):
    """Every service of the run, as a dict name -> value."""
    return _call("GET", None, None, run, server, token)["services"]
