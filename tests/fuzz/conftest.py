"""Hostile-input suite (issue 12): Hypothesis fuzzing of every public input, slowloris and oversized input.

The Hypothesis profile is deterministic (``derandomize``: the same examples on every run and on both CI
configurations, so a failure reproduces) and small (each fuzz file takes seconds; the CI budget is tight).
``HYPOTHESIS_PROFILE=fuzz-long`` runs many more examples by hand.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "fuzz-ci",
    derandomize=True,  # no seed to carry around: the examples are a function of the test
    database=None,  # nothing written to .hypothesis/ in the work tree
    deadline=None,  # a loaded 2-core machine makes per-example timings meaningless
    max_examples=40,
    print_blob=False,
)
settings.register_profile("fuzz-long", parent=settings.get_profile("fuzz-ci"), max_examples=2000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fuzz-ci"))

# For @given tests that deliberately share one function-scoped fixture (a live connection, a server, a
# log capture) across examples: the point is that the same peer survives every hostile input in turn.
SHARED_FIXTURE = settings(suppress_health_check=[HealthCheck.function_scoped_fixture])


class ErrorRecords(logging.Handler):
    """Every ERROR (or worse) log record, from any logger, while installed."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def since(self, mark: int) -> list[str]:
        return [f"{r.name}: {r.getMessage()}" + (f"\n{logging.Formatter().formatException(r.exc_info)}"
                                                  if r.exc_info else "") for r in self.records[mark:]]


@pytest.fixture
def error_log() -> Iterator[ErrorRecords]:
    """Captures ERROR records on the root logger and on every logger that does not propagate to it."""
    handler = ErrorRecords()
    loggers = [logging.getLogger()] + [logging.getLogger(name) for name, logger in
                                       logging.root.manager.loggerDict.items()
                                       if isinstance(logger, logging.Logger) and not logger.propagate]
    for logger in loggers:
        logger.addHandler(handler)
    yield handler
    for logger in loggers:
        logger.removeHandler(handler)
