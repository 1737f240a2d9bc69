"""Exceptions: every failure in libshoal surfaces as a ShoalError whose
message is shoal's own (it names the object and the rule broken)."""

# The SH_E* codes of include/shoal/common.h.
CODES = {
    -1: "EINVAL", -2: "EIO", -3: "ENOMEM", -4: "EFORMAT", -5: "EMISMATCH", -6: "ENOENT",
    -7: "ENOSPC", -8: "EAGAIN", -9: "ERANGE", -10: "EEXIST", -11: "ETIMEDOUT", -12: "EPERM",
    -13: "EINTERNAL",
}


class ShoalError(Exception):
    """A failed shoal call.  ``code`` is the negative SH_E* code, ``name`` its
    short name ("EFORMAT", ...), ``message`` shoal's message."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.name = CODES.get(code, "E%d" % code)
        self.message = message


class NotFound(ShoalError, LookupError):
    """SH_ENOENT: a named thing (file, run, version, tensor) does not exist."""


class Timeout(ShoalError, TimeoutError):
    """SH_ETIMEDOUT: a deadline passed (Replica.wait)."""


class Unavailable(ShoalError):
    """SH_EAGAIN: not possible yet (e.g. the replica holds no version)."""


def error_for(code, message):
    cls = {-6: NotFound, -11: Timeout, -8: Unavailable}.get(code, ShoalError)
    return cls(code, message)
