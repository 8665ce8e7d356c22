"""Fence decisions as metrics: the cross-host table's
``fencecheck_decisions_total{operation, outcome, epoch}`` (docs/design.md
§12), through ``prometheus_client`` or the OpenTelemetry metrics API.

The adapters (``fencecheck.sqlite.fenced_write``,
``fencecheck.postgres.fenced_write`` and ``fenced_execute``) report every
call to the installed ``Signals``, exactly once, with the table's labels:

- ``operation``: ``write`` (``fenced_write``) or ``execute``
  (``fenced_execute``); ``record`` takes any of ``OPERATIONS`` for a
  resource of your own that calls ``Instance.check`` itself.
- ``outcome``: the decision (``applied``, ``duplicate``, ``stale-fence``,
  ``version-conflict``), ``unauthenticated`` (a keyed scope refused the
  token), ``refused`` (any other ``FenceError``: no token, a bad request, a
  damaged state, unusable keys), or ``error`` (anything else raised: the
  guest or the database failed, or the mutation raised; ``applied`` counts
  only a committed write).
- ``epoch``: the presented token's epoch, ``"0"`` to ``"15"``, ``"other"``
  above, ``"none"`` for the zero token (``epoch = counter = 0``, "no token").

No scope is ever a label. Nothing is recorded until one is installed (the
default does nothing), and this package depends on neither library:

>>> import prometheus_client                           # doctest: +SKIP
>>> from fencecheck import signals                     # doctest: +SKIP
>>> signals.install(signals.PrometheusSignals())       # doctest: +SKIP

``install`` is process-wide, like the libraries' own defaults (the
``prometheus_client.REGISTRY``, OpenTelemetry's global meter provider). An
exception raised by a ``Signals`` is logged (logger ``fencecheck.signals``)
and never propagates: a metric must not turn a committed write into a
failure its caller might retry.

The lease rows of the table (acquisition, renewals, lease age, holder loss,
epoch, headroom, coordinator errors) belong to a lease client talking to a
coordinator; this package has none (``Instance.acquire`` and the others are
the lease rule on state bytes, for a coordinator to run), so it records
decisions only.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any, Optional, Protocol, Union, runtime_checkable

from ._types import Applied, Duplicate, FenceError, StaleFence, Token, Unauthenticated, VersionConflict

if TYPE_CHECKING:
    from ._types import Decision

__all__ = [
    "DECISIONS",
    "OPERATIONS",
    "OUTCOMES",
    "MAX_EPOCH_LABEL",
    "Signals",
    "NoSignals",
    "install",
    "installed",
    "record",
    "epoch_label",
    "outcome_label",
    "PrometheusSignals",
    "OpenTelemetrySignals",
]

DECISIONS = "fencecheck_decisions_total"
"""The table's name, as scraped."""

OPERATIONS = ("put", "delete", "write", "publish", "execute", "check")
"""The ``operation`` values ``record`` takes. This package's adapters use
``write`` and ``execute``; ``check`` is for a caller's own resource."""

OUTCOMES = ("applied", "duplicate", "stale-fence", "version-conflict", "refused", "unauthenticated", "error")
"""The table's ``outcome`` values."""

MAX_EPOCH_LABEL = 15
"""Epochs above this share the label ``other``."""

_EPOCHS = tuple(str(e) for e in range(MAX_EPOCH_LABEL + 1))
_HELP = (
    "Fence decisions by operation, outcome and the presented token's epoch "
    "(0-15, other, none): the name every fencecheck host exports (docs/design.md §12)"
)
_LABELS = ("operation", "outcome", "epoch")
_log = logging.getLogger(__name__)


@runtime_checkable
class Signals(Protocol):
    """What the adapters call: one ``decision`` per fenced write, with the
    table's label values (all ``str``). Called on the writing thread, after
    the transaction ended; must be thread-safe and quick."""

    def decision(self, operation: str, outcome: str, epoch: str) -> None: ...


class NoSignals:
    """The default: records nothing."""

    def decision(self, operation: str, outcome: str, epoch: str) -> None:
        pass


_NONE = NoSignals()
_installed: Signals = _NONE
_lock = threading.Lock()


def install(signals: Optional[Signals]) -> Signals:
    """Make ``signals`` receive every decision from now on, process-wide
    (``None``: record nothing). Returns the one installed before, so a test
    or a shutdown can put it back."""
    global _installed
    if signals is not None and not callable(getattr(signals, "decision", None)):
        raise TypeError("signals must have a decision(operation, outcome, epoch) method")
    with _lock:
        previous, _installed = _installed, (_NONE if signals is None else signals)
    return previous


def installed() -> Signals:
    """The ``Signals`` receiving decisions now (a ``NoSignals`` by default)."""
    return _installed


def epoch_label(token: Optional[Token]) -> str:
    """The ``epoch`` label of a presented token: ``"0"`` to ``"15"``,
    ``"other"`` above, ``"none"`` without one (``None`` or the zero token)."""
    if not isinstance(token, Token) or (token.epoch == 0 and token.counter == 0):
        return "none"
    return _EPOCHS[token.epoch] if token.epoch <= MAX_EPOCH_LABEL else "other"


def outcome_label(result: Union["Decision", BaseException]) -> str:
    """The ``outcome`` label of a fenced write's result: its decision, or
    what it raised (``unauthenticated``, ``refused`` for another
    ``FenceError``, ``error`` for anything else)."""
    if isinstance(result, (Applied, Duplicate, StaleFence, VersionConflict)):
        return result.name
    if isinstance(result, Unauthenticated):
        return "unauthenticated"
    if isinstance(result, FenceError):
        return "refused"
    return "error"


def record(operation: str, token: Optional[Token], result: Union["Decision", BaseException]) -> None:
    """Report one decision to the installed ``Signals``: what the adapters
    call; call it from a resource of your own after its transaction ends,
    with the request's token and the decision (or the exception). An
    ``operation`` outside ``OPERATIONS`` raises ``ValueError``."""
    if operation not in OPERATIONS:
        raise ValueError(f"operation {operation!r} is not one of {OPERATIONS}")
    signals = _installed
    if signals is _NONE:
        return
    try:
        signals.decision(operation, outcome_label(result), epoch_label(token))
    except Exception:
        _log.exception("fencecheck: the installed Signals failed to record a %s decision", operation)


class PrometheusSignals:
    """``fencecheck_decisions_total`` as a ``prometheus_client.Counter`` in
    ``registry`` (default: ``prometheus_client.REGISTRY``). One per
    registry (a second raises prometheus_client's duplicate error).

    prometheus_client names the counter ``fencecheck_decisions`` and exposes
    its samples as ``fencecheck_decisions_total``. In the classic text
    format it also writes a ``fencecheck_decisions_created`` gauge (the
    series' start time; an OpenMetrics scrape carries it inside the counter)
    unless ``prometheus_client.disable_created_metrics()`` was called.
    Works in prometheus_client's multiprocess mode like any Counter."""

    def __init__(self, registry: Any = None) -> None:
        import prometheus_client  # only here: the package does not depend on it

        self.counter = prometheus_client.Counter(
            DECISIONS.removesuffix("_total"),
            _HELP,
            _LABELS,
            registry=prometheus_client.REGISTRY if registry is None else registry,
        )

    def decision(self, operation: str, outcome: str, epoch: str) -> None:
        self.counter.labels(operation, outcome, epoch).inc()


class OpenTelemetrySignals:
    """``fencecheck_decisions_total`` as a counter of an OpenTelemetry
    ``Meter`` (default: ``opentelemetry.metrics.get_meter("fencecheck")``,
    the global meter provider's), attributes ``operation``, ``outcome`` and
    ``epoch``.

    The instrument is named ``fencecheck_decisions_total``, with no unit,
    so that every path to Prometheus gives the table's name: the
    OpenTelemetry Prometheus exporters (Python, JavaScript) and the
    Collector add ``_total`` to a monotonic sum only when it is missing,
    and an OTLP receiver that keeps names as they are keeps this one. With
    the Python ``PrometheusMetricReader`` pass ``scope_info_enabled=False``
    for exactly the table's labels (otherwise it adds ``otel_scope_*``
    labels to every series)."""

    def __init__(self, meter: Any = None) -> None:
        if meter is None:
            from opentelemetry import metrics  # only here: the package does not depend on it

            from . import __version__

            meter = metrics.get_meter("fencecheck", __version__)
        self.counter = meter.create_counter(DECISIONS, description=_HELP)
        self._attributes: dict[tuple[str, str, str], dict[str, str]] = {}

    def decision(self, operation: str, outcome: str, epoch: str) -> None:
        key = (operation, outcome, epoch)
        attributes = self._attributes.get(key)
        if attributes is None:  # a bounded set: operations x outcomes x 18 epochs
            attributes = self._attributes.setdefault(key, dict(zip(_LABELS, key)))
        self.counter.add(1, attributes)
