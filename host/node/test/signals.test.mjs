// fencecheck/signals: real decisions through fencedWrite (better-sqlite3,
// real files), exported by prom-client and by the OpenTelemetry SDK (its
// in-memory exporter and its Prometheus exporter, scraped over HTTP), each
// held to the metric table of docs/design.md §12: names, types, label names
// and values, and the exact count of each decision.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createServer } from 'node:http';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import Database from 'better-sqlite3';
import client from 'prom-client';
import { metrics } from '@opentelemetry/api';
import {
  AggregationTemporality, DataPointType, InMemoryMetricExporter, MeterProvider, PeriodicExportingMetricReader,
} from '@opentelemetry/sdk-metrics';
import { PrometheusExporter } from '@opentelemetry/exporter-prometheus';
import { FenceError, Runtime, token } from '../src/index.js';
import { fencedWrite, install, setKeys } from '../src/sqlite.js';
import {
  DECISIONS, OPERATIONS, OUTCOMES, OpenTelemetrySignals, PrometheusSignals, epochLabel, installSignals, installedSignals,
  outcomeLabel, recordDecision,
} from '../src/signals.js';

const DESIGN = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..', 'docs', 'design.md');
const runtime = new Runtime();

// -- the table: name -> {type, labels: label -> {values, open}}

function table() {
  const section = readFileSync(DESIGN, 'utf8').split('## 12. Signals')[1].split('\n## ')[0];
  const rows = new Map();
  for (const line of section.split('\n')) {
    const m = /^\| `(fencecheck_[a-z_]+)` \| ([a-z]+) \| (.*?) \| (.*?) \|$/.exec(line.trim());
    if (!m) continue;
    const labels = new Map();
    for (const [, label, inner] of m[3].matchAll(/`([a-z_]+)` \(([^()]*)\)/g)) {
      const values = new Set([...inner.matchAll(/`([^`]+)`/g)].map((v) => v[1]));
      for (const [, lo, hi] of inner.matchAll(/`(\d+)`\s*[–-]\s*`(\d+)`/g)) {
        for (let v = Number(lo); v <= Number(hi); v++) values.add(String(v));
      }
      // "…": the table lists examples; any value of the host's own set.
      labels.set(label, { values, open: inner.includes('…') });
    }
    rows.set(m[1], { type: m[2], labels });
  }
  assert.ok(rows.size >= 8, `only ${[...rows.keys()]} parsed from ${DESIGN} §12`);
  return rows;
}

const allows = (label, value) => label.values.has(value) || label.open;

// Assert every series ({name, type, labels, value}) is the table's; the
// fencecheck_decisions_total counts by "operation outcome epoch".
function check(series) {
  const rows = table();
  const counts = {};
  for (const s of series) {
    const row = rows.get(s.name);
    assert.ok(row, `${s.name} is not in docs/design.md §12`);
    assert.equal(s.type, row.type, `${s.name} is exported as a ${s.type}, the table says ${row.type}`);
    assert.deepEqual(Object.keys(s.labels).sort(), [...row.labels.keys()].sort(), `${s.name}: the table's labels`);
    for (const [label, value] of Object.entries(s.labels)) {
      assert.ok(allows(row.labels.get(label), value), `${s.name}: ${label}=${value} is not among the table's values`);
    }
    if (s.name === DECISIONS && s.value) {
      const key = `${s.labels.operation} ${s.labels.outcome} ${s.labels.epoch}`;
      counts[key] = (counts[key] ?? 0) + s.value;
    }
  }
  return counts;
}

// Every fencecheck_* sample of a text exposition, typed by its # TYPE line.
function parseExposition(text) {
  const types = new Map();
  const series = [];
  for (const line of text.split('\n')) {
    const type = /^# TYPE (\S+) (\S+)$/.exec(line);
    if (type) types.set(type[1], type[2]);
    const sample = /^(fencecheck_[a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)/.exec(line);
    if (!sample) continue;
    const labels = Object.fromEntries([...(sample[2] ?? '').matchAll(/([a-zA-Z_]\w*)="((?:[^"\\]|\\.)*)"/g)].map((l) => [l[1], l[2]]));
    series.push({ name: sample[1], type: types.get(sample[1]), labels, value: Number(sample[3]) });
  }
  return series;
}

// -- the writes: one of every outcome through fencedWrite; what they must count

function drive(t) {
  const dir = mkdtempSync(join(tmpdir(), 'fencecheck-node-signals-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const db = new Database(join(dir, 'db.sqlite'));
  t.after(() => db.close());
  db.exec('CREATE TABLE catalog (version INTEGER)');
  install(db);
  setKeys(db, 'signed/', [{ keyId: 1, secret: new Uint8Array(32).fill(7) }]);
  const guest = runtime.instance();
  const publish = (conn, applied) => void conn.prepare('INSERT INTO catalog VALUES (?)').run(BigInt(applied.version));
  const write = (tok, more = {}, mutate = publish) => fencedWrite(db, guest, { scope: 'report/july', token: tok, ...more }, mutate);

  assert.equal(write(token(0, 0, 42)).outcome, 'applied');
  assert.equal(write(token(0, 0, 41)).outcome, 'stale-fence'); // the paused writer
  const first = write(token(0, 0, 43), { policy: 'allow-equal', opId: 'a' });
  assert.equal(first.outcome, 'applied');
  assert.deepEqual(write(token(0, 0, 43), { policy: 'allow-equal', opId: 'a' }), { outcome: 'duplicate', version: first.version });
  assert.equal(write(token(0, 0, 44), { expectedVersion: 99 }).outcome, 'version-conflict');
  assert.throws(() => write(token(0, 0, 0)), (e) => e instanceof FenceError && e.reason === 'missing-token'); // no token
  assert.equal(write(token(0, 3, 1)).outcome, 'applied'); // after a restore: epoch 3
  assert.throws(() => write(token(0, 20, 1), {}, () => { throw new Error('the mutation failed'); }), /the mutation failed/); // epoch 20: other
  assert.throws(() => write(token(0, 0, 1), { scope: 'signed/x' }), (e) => e instanceof FenceError && e.code === 'unauthenticated');
  assert.equal(db.prepare('SELECT count(*) AS n FROM catalog').get().n, 3);
  return {
    'write applied 0': 2,
    'write stale-fence 0': 1,
    'write duplicate 0': 1,
    'write version-conflict 0': 1,
    'write refused none': 1,
    'write applied 3': 1,
    'write error other': 1,
    'write unauthenticated 0': 1,
  };
}

// Each test installs what it needs; the one installed before is put back.
function restoring(t) {
  const before = installedSignals();
  t.after(() => installSignals(before));
}

test('prom-client exports the table\'s decisions', async (t) => {
  restoring(t);
  // The example of host/node/README.md:
  const registry = new client.Registry();
  installSignals(new PrometheusSignals(client, { registry }));

  const expected = drive(t);
  const series = parseExposition(await registry.metrics());
  assert.deepEqual(new Set(series.map((s) => s.name)), new Set([DECISIONS]));
  assert.deepEqual(check(series), expected);
});

function otelSeries(resourceMetrics) {
  const out = [];
  for (const rm of resourceMetrics) {
    for (const sm of rm.scopeMetrics) {
      for (const m of sm.metrics) {
        const type = m.dataPointType === DataPointType.SUM ? (m.isMonotonic ? 'counter' : 'gauge')
          : m.dataPointType === DataPointType.GAUGE ? 'gauge' : 'histogram';
        for (const p of m.dataPoints) {
          out.push({ name: m.descriptor.name, type, labels: { ...p.attributes }, value: type === 'histogram' ? p.value.count : p.value });
        }
      }
    }
  }
  return out;
}

test('OpenTelemetry exports the table\'s decisions', async (t) => {
  restoring(t);
  // The example of host/node/README.md:
  const exporter = new InMemoryMetricExporter(AggregationTemporality.CUMULATIVE);
  const reader = new PeriodicExportingMetricReader({ exporter, exportIntervalMillis: 3_600_000 });
  metrics.setGlobalMeterProvider(new MeterProvider({ readers: [reader] }));
  installSignals(new OpenTelemetrySignals(metrics.getMeter('fencecheck')));
  t.after(() => metrics.disable());

  const expected = drive(t);
  await reader.forceFlush();
  const series = otelSeries([exporter.getMetrics().at(-1)]); // cumulative: the last export holds every count
  assert.deepEqual(new Set(series.map((s) => s.name)), new Set([DECISIONS]));
  assert.deepEqual(check(series), expected);
  await reader.shutdown();
});

test('OpenTelemetry through its Prometheus exporter, scraped over HTTP, is the table', async (t) => {
  restoring(t);
  const exporter = new PrometheusExporter({ preventServerStart: true, withoutScopeInfo: true, withoutTargetInfo: true });
  const provider = new MeterProvider({ readers: [exporter] });
  installSignals(new OpenTelemetrySignals(provider.getMeter('fencecheck')));
  const server = createServer((req, res) => exporter.getMetricsRequestHandler(req, res));
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.after(() => new Promise((resolve) => server.close(resolve)));

  const expected = drive(t);
  const text = await (await fetch(`http://127.0.0.1:${server.address().port}/metrics`)).text();
  const series = parseExposition(text);
  // The name is the table's, not `…_total_total`.
  assert.deepEqual(new Set(series.map((s) => s.name)), new Set([DECISIONS]));
  assert.deepEqual(check(series), expected);
  await provider.shutdown();
});

test('the default records nothing; installSignals returns the previous', (t) => {
  restoring(t);
  const calls = [];
  const recording = { decision: (...labels) => calls.push(labels) };
  installSignals(null);
  const none = installedSignals();
  assert.equal(installSignals(recording), none);
  assert.equal(installedSignals(), recording);
  assert.equal(installSignals(undefined), recording);
  assert.equal(installedSignals(), none);
  drive(t);
  assert.deepEqual(calls, []);
  assert.throws(() => installSignals({}), TypeError);
});

test('a failing signals never fails the write; one warning', async (t) => {
  restoring(t);
  const warnings = [];
  const onWarning = (w) => warnings.push(w);
  process.on('warning', onWarning);
  t.after(() => process.off('warning', onWarning));
  installSignals({ decision() { throw new Error('the metrics backend is down'); } });
  const dir = mkdtempSync(join(tmpdir(), 'fencecheck-node-signals-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const db = new Database(join(dir, 'db.sqlite'));
  t.after(() => db.close());
  install(db);
  const guest = runtime.instance();
  assert.equal(fencedWrite(db, guest, { scope: 's', token: token(0, 0, 1) }, () => {}).outcome, 'applied');
  assert.equal(fencedWrite(db, guest, { scope: 's', token: token(0, 0, 2) }, () => {}).outcome, 'applied');
  await new Promise((resolve) => setImmediate(resolve)); // warnings are emitted on the next tick
  assert.deepEqual(warnings.map((w) => [w.code, /the metrics backend is down/.test(w.message)]), [['FENCECHECK_SIGNALS', true]]);
});

test('labels: a bounded epoch, the table\'s outcomes and operations', () => {
  assert.equal(epochLabel(undefined), 'none');
  assert.equal(epochLabel(token(7, 0, 0)), 'none'); // the zero token is "no token"
  assert.equal(epochLabel(token(0, 0, 1)), '0');
  assert.equal(epochLabel({ authority: 0, epoch: 15, counter: 1 }), '15');
  assert.equal(epochLabel(token(0, 16, 0)), 'other');
  assert.equal(epochLabel(token(0, (1n << 64n) - 1n, 1)), 'other');
  assert.equal(outcomeLabel({ outcome: 'stale-fence' }), 'stale-fence');
  assert.equal(outcomeLabel(new FenceError('unauthenticated', 'unsigned')), 'unauthenticated');
  assert.equal(outcomeLabel(new FenceError('invalid-keys', 'no-keys')), 'refused');
  assert.equal(outcomeLabel(new TypeError('x')), 'error');
  assert.throws(() => recordDecision('upload', null, new Error()), RangeError);
  const row = table().get(DECISIONS);
  for (const operation of OPERATIONS) assert.ok(allows(row.labels.get('operation'), operation), operation);
  assert.deepEqual(new Set(OUTCOMES), row.labels.get('outcome').values);
});
