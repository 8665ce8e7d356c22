"""fencecheck.signals: real decisions through the SQLite adapter, exported by
prometheus_client and by the OpenTelemetry SDK (its in-memory reader and its
Prometheus exporter), each held to the metric table of docs/design.md §12:
names, types, label names and values, and the exact count of each decision."""

from __future__ import annotations

import logging
import sqlite3

import prometheus_client
import pytest
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import Gauge, Histogram, InMemoryMetricReader, Sum
from prometheus_client.parser import text_string_to_metric_families

import fencecheck as fc
from fencecheck import signals
from fencecheck.sqlite import fenced_write, install, set_keys
from metric_table import Series, check, decisions, table

SECRET = bytes(range(32))


def publish(conn: sqlite3.Connection, applied: fc.Applied) -> None:
    conn.execute("INSERT INTO catalog VALUES (?)", (applied.version,))


def fail(conn: sqlite3.Connection, applied: fc.Applied) -> None:
    raise RuntimeError("the mutation failed")


def drive(path, guest: fc.Instance) -> dict[tuple[str, str, str], int]:
    """One write of every outcome through fenced_write; what it must count."""
    conn = sqlite3.connect(path, timeout=5)
    conn.execute("CREATE TABLE catalog (version INTEGER)")
    install(conn)
    set_keys(conn, "signed/", [fc.GrantKey(1, SECRET)])

    def write(token: fc.Token, mutate=publish, scope="report/july", **kw):
        return fenced_write(conn, guest, fc.Request(scope, token, **kw), mutate)

    assert isinstance(write(fc.Token(0, 0, 42)), fc.Applied)
    assert isinstance(write(fc.Token(0, 0, 41)), fc.StaleFence)  # the paused writer
    first = write(fc.Token(0, 0, 43), policy=fc.Policy.ALLOW_EQUAL, op_id="a")
    assert isinstance(first, fc.Applied)
    assert write(fc.Token(0, 0, 43), policy=fc.Policy.ALLOW_EQUAL, op_id="a") == fc.Duplicate(first.version)
    assert isinstance(write(fc.Token(0, 0, 44), expected_version=99), fc.VersionConflict)
    with pytest.raises(fc.InvalidRequest):
        write(fc.Token(0, 0, 0))  # no token
    assert isinstance(write(fc.Token(0, 3, 1)), fc.Applied)  # after a restore: epoch 3
    with pytest.raises(RuntimeError):
        write(fc.Token(0, 20, 1), fail)  # epoch 20: "other"; the mutation raised
    with pytest.raises(fc.Unauthenticated):
        write(fc.Token(0, 0, 1), scope="signed/x")  # a keyed scope, an unsigned token
    assert conn.execute("SELECT count(*) FROM catalog").fetchone() == (3,)
    conn.close()
    return {
        ("write", "applied", "0"): 2,
        ("write", "stale-fence", "0"): 1,
        ("write", "duplicate", "0"): 1,
        ("write", "version-conflict", "0"): 1,
        ("write", "refused", "none"): 1,
        ("write", "applied", "3"): 1,
        ("write", "error", "other"): 1,
        ("write", "unauthenticated", "0"): 1,
    }


@pytest.fixture(autouse=True)
def restore_signals():
    """Each test installs what it needs; the one installed before is put back."""
    before = signals.installed()
    yield
    signals.install(before)


def scrape(registry) -> list[Series]:
    """Every fencecheck_* sample of a classic text exposition."""
    text = prometheus_client.generate_latest(registry).decode()
    return [
        Series(s.name, f.type, tuple(sorted(s.labels.items())), s.value)
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name.startswith("fencecheck_")
    ]


def test_prometheus_client_exports_the_tables_decisions(tmp_path, guest):
    """Real decisions, a real registry, generate_latest: the table's name,
    type and labels, one count per write (one stale-fence for the one stale
    write), and only prometheus_client's own _created companion beside it."""
    # The example of host/python/README.md:
    registry = prometheus_client.CollectorRegistry()
    signals.install(signals.PrometheusSignals(registry))

    expected = drive(tmp_path / "db.sqlite", guest)
    series = scrape(registry)
    assert decisions(check(series, table(), created_companions=True)) == expected
    assert {s.name for s in series} == {"fencecheck_decisions_total", "fencecheck_decisions_created"}


def test_without_created_series_the_exposition_is_exactly_the_table(tmp_path, guest):
    """prometheus_client.disable_created_metrics(): nothing but the table."""
    prometheus_client.disable_created_metrics()
    try:
        registry = prometheus_client.CollectorRegistry()
        signals.install(signals.PrometheusSignals(registry))
        expected = drive(tmp_path / "db.sqlite", guest)
        series = scrape(registry)
    finally:
        prometheus_client.enable_created_metrics()
    assert {s.name for s in series} == {"fencecheck_decisions_total"}
    assert decisions(check(series, table())) == expected


def otel_series(data) -> list[Series]:
    out = []
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if isinstance(m.data, Sum):
                    kind = "counter" if m.data.is_monotonic else "gauge"
                elif isinstance(m.data, Histogram):
                    kind = "histogram"
                else:
                    assert isinstance(m.data, Gauge), m
                    kind = "gauge"
                for p in m.data.data_points:
                    value = p.count if kind == "histogram" else p.value
                    out.append(Series(m.name, kind, tuple(sorted(p.attributes.items())), value))
    return out


def test_opentelemetry_exports_the_tables_decisions(tmp_path, guest):
    """The OpenTelemetry SDK's in-memory reader: one monotonic sum named as
    the table, with exactly its attributes and counts."""
    # The example of host/python/README.md:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    signals.install(signals.OpenTelemetrySignals(provider.get_meter("fencecheck")))

    expected = drive(tmp_path / "db.sqlite", guest)
    series = otel_series(reader.get_metrics_data())
    assert {s.name for s in series} == {"fencecheck_decisions_total"}
    assert decisions(check(series, table())) == expected
    provider.shutdown()


def test_opentelemetry_through_its_prometheus_exporter_is_the_table(tmp_path, guest):
    """The name chosen for the OpenTelemetry counter survives the
    OpenTelemetry Prometheus exporter: its exposition is the table's name
    (not ``…_total_total``), labels and counts."""
    registry = prometheus_client.CollectorRegistry()
    reader = PrometheusMetricReader(disable_target_info=True, scope_info_enabled=False, registry=registry)
    provider = MeterProvider(metric_readers=[reader])
    signals.install(signals.OpenTelemetrySignals(provider.get_meter("fencecheck")))
    expected = drive(tmp_path / "db.sqlite", guest)
    series = scrape(registry)
    assert {s.name for s in series} == {"fencecheck_decisions_total"}
    assert decisions(check(series, table())) == expected
    provider.shutdown()


class Recording:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str]] = []

    def decision(self, operation: str, outcome: str, epoch: str) -> None:
        self.calls.append((operation, outcome, epoch))


def test_the_default_records_nothing_and_install_returns_the_previous(tmp_path, guest):
    recording = Recording()
    assert isinstance(signals.installed(), signals.NoSignals)
    signals.install(recording)
    assert signals.installed() is recording
    assert signals.install(None) is recording
    drive(tmp_path / "db.sqlite", guest)
    assert recording.calls == []
    assert isinstance(signals.installed(), signals.NoSignals)
    with pytest.raises(TypeError):
        signals.install(object())


def test_a_failing_signals_never_fails_the_write(tmp_path, guest, caplog):
    """An exception from the installed Signals is logged; the committed write
    still returns Applied."""

    class Broken:
        def decision(self, operation, outcome, epoch):
            raise ValueError("the metrics backend is down")

    signals.install(Broken())
    conn = sqlite3.connect(tmp_path / "db.sqlite")
    install(conn)
    with caplog.at_level(logging.ERROR, logger="fencecheck.signals"):
        d = fenced_write(conn, guest, fc.Request("s", fc.Token(0, 0, 1)), lambda c, a: None)
    assert isinstance(d, fc.Applied)
    assert [r.exc_info[1].args for r in caplog.records] == [("the metrics backend is down",)]


def test_labels():
    """The epoch label is bounded; outcomes map onto the table's; record
    takes only the table's operations, all of which the table lists."""
    assert signals.epoch_label(None) == "none"
    assert signals.epoch_label(fc.Token(7, 0, 0)) == "none"  # the zero token is "no token"
    assert signals.epoch_label(fc.Token(0, 0, 1)) == "0"
    assert signals.epoch_label(fc.Token(0, 15, 1)) == "15"
    assert signals.epoch_label(fc.Token(0, 16, 0)) == "other"
    assert signals.epoch_label(fc.Token(0, 2**64 - 1, 1)) == "other"
    assert signals.outcome_label(fc.StaleFence(fc.Token(0, 0, 1), fc.Token(0, 0, 2))) == "stale-fence"
    assert signals.outcome_label(fc.Unauthenticated("unsigned")) == "unauthenticated"
    assert signals.outcome_label(fc.InvalidKeys("no-keys")) == "refused"
    assert signals.outcome_label(fc.CorruptState("truncated")) == "refused"
    assert signals.outcome_label(fc.GuestTrapped("check", "out of fuel")) == "error"
    assert signals.outcome_label(OSError()) == "error"
    with pytest.raises(ValueError):
        signals.record("upload", None, OSError())
    row = table()[signals.DECISIONS]
    for operation in signals.OPERATIONS:
        assert row.labels["operation"].allows(operation), operation
    assert set(signals.OUTCOMES) == row.labels["outcome"].values
