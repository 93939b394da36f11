"""How a served app logs what failed: each kind once, then counted, its secrets redacted.

An app can fail the same way on every request for as long as a bug or an outage lasts: a
traceback per request buries the log. And what an app raises may quote a key (a URL with
``?api_key=``, an upstream's error body). So every failure a served app logs goes through
its `AppFailures`: the first of a kind whole, then one counted line at most once a minute
(`synth_deploy.logs.CoalescedLog`), with the app's keys, and the request's own when there
is one, masked in everything said, tracebacks included.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from synth_deploy.env import redact, redact_userinfo
from synth_deploy.logs import CoalescedLog

logger = logging.getLogger("synth_deploy.taskapp")


class AppFailures:
    """``secret_values``: what must never be logged (the app's keys, the vendor keys)."""

    def __init__(self, secret_values: Sequence[str]) -> None:
        self.secret_values = list(secret_values)
        self._errors = CoalescedLog(logger)
        self._warnings = CoalescedLog(logger, level=logging.WARNING, tracebacks=False)

    def redacted(self, text: str, extra_secrets: Sequence[str] = ()) -> str:
        """``text`` with every secret value masked (``extra_secrets``: a request's own), and
        the credentials of every URL in it (`redact_userinfo`)."""
        return redact(redact_userinfo(text), [*self.secret_values, *extra_secrets])

    def error(self, exc: BaseException, message: str, *args: object,
              extra_secrets: Sequence[str] = ()) -> None:
        """The app's own failure: logged with its traceback, a kind per line that raised
        (one bug, whatever its messages say: a seed, a run id)."""
        self._errors.error(exc, message, *args, kind=_raised_at(exc),
                           redact=lambda text: self.redacted(text, extra_secrets))

    def warning(self, exc: BaseException, message: str, *args: object,
                extra_secrets: Sequence[str] = ()) -> None:
        """A failure outside the app (its policy endpoint): the message alone, a kind per
        message (which host, what it answered)."""
        self._warnings.error(exc, message, *args,
                             redact=lambda text: self.redacted(text, extra_secrets))


def _raised_at(exc: BaseException) -> str:
    """Where ``exc`` was raised: file:line of its innermost frame."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return "?" if tb is None else f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}"


__all__ = ["AppFailures"]
