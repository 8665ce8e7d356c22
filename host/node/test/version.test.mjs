// The component's version is its WIT package version: componentVersion() and
// runtime.componentVersion report the loaded one, and a component of a
// version this package does not run is refused at load. The other versions
// are the real transpiled core module with the version in every
// `fencecheck:fence…@0.1.1` export name rewritten (same length, validated),
// and the released 0.1.0 (tests/fixtures), transpiled by jco here.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import {
  ComponentLoadError, FenceError, HostError, Runtime, UnsupportedComponent, UnsupportedFeature, WIT_VERSION, componentVersion, token,
} from '../src/index.js';
import { vet } from '../src/version.js';

const HERE = dirname(fileURLToPath(import.meta.url));
const GEN = join(HERE, '..', 'gen');
const REPO = join(HERE, '..', '..', '..');
const JCO = join(HERE, '..', 'node_modules', '.bin', 'jco');

// A copy of gen/'s core modules (all `Runtime({ dir })` reads from it) claiming `version` instead of WIT_VERSION.
function genClaiming(version) {
  assert.equal(version.length, WIT_VERSION.length);
  const dir = mkdtempSync(join(tmpdir(), 'fencecheck-gen-'));
  let rewritten = 0;
  for (const name of readdirSync(GEN)) {
    if (!name.endsWith('.wasm')) continue;
    const bytes = Buffer.from(readFileSync(join(GEN, name)));
    const pattern = /fencecheck:fence[a-z0-9/_-]*@/g;
    const text = bytes.toString('latin1');
    let m;
    while ((m = pattern.exec(text)) !== null) {
      const at = m.index + m[0].length;
      if (text.slice(at, at + WIT_VERSION.length) === WIT_VERSION) {
        bytes.write(version, at, 'latin1');
        rewritten++;
      }
    }
    assert.ok(WebAssembly.validate(bytes), `${name} no longer validates`);
    writeFileSync(join(dir, name), bytes);
  }
  assert.ok(rewritten > 0, 'no versioned name in the core modules');
  return dir;
}

// The version this package was written against is wit/fence.wit's: the
// interface's version, on the release's line (the package's own version,
// Cargo.toml's) and never ahead of it (scripts/version --check).
test('WIT_VERSION is the WIT package version, on the package version\'s line', () => {
  const wit = readFileSync(join(REPO, 'wit', 'fence.wit'), 'utf8').match(/^package fencecheck:fence@([^;\s]+);/m);
  assert.ok(wit);
  assert.equal(WIT_VERSION, wit[1]);
  const pkg = JSON.parse(readFileSync(join(HERE, '..', 'package.json'), 'utf8'));
  const [release, iface] = [pkg.version, WIT_VERSION].map((v) => v.split('.').map(Number));
  assert.deepEqual(iface.slice(0, 2), release.slice(0, 2));
  assert.ok(iface[2] <= release[2]);
});

// componentVersion() and runtime.componentVersion read the loaded component.
test('the transpiled component reports its version', () => {
  assert.equal(componentVersion(), WIT_VERSION);
  assert.equal(new Runtime().componentVersion, WIT_VERSION);
});

// A gen dir whose core module claims 0.2.0 or 1.0.0 is refused at load with
// what it exports and what this package runs.
test('other versions are refused at load', () => {
  for (const version of ['0.2.0', '1.0.0', '0.0.9']) {
    const dir = genClaiming(version);
    try {
      assert.throws(() => new Runtime({ dir }), (err) => {
        assert.ok(err instanceof UnsupportedComponent && err instanceof ComponentLoadError);
        assert.equal(err.message, `component exports fencecheck:fence/check@${version}; this host supports fencecheck:fence@0.1.x`);
        assert.equal(err.found, `fencecheck:fence/check@${version}`);
        assert.equal(err.supported, 'fencecheck:fence@0.1.x');
        assert.equal(err.retryable, false);
        return true;
      });
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }
});

// A same-line patch (0.1.9) is a version this package runs, but the glue in
// gen/fencecheck.js calls 0.1.1's names: refused at load, naming both, not
// left to fail on the first call.
test('core modules that do not match the glue are refused at load', () => {
  const dir = genClaiming('0.1.9');
  try {
    assert.throws(() => new Runtime({ dir }), (err) => {
      assert.ok(err instanceof ComponentLoadError && !(err instanceof UnsupportedComponent));
      assert.ok(err.message.includes(`implement fencecheck:fence@0.1.9, but the transpiled glue (gen/fencecheck.js) calls fencecheck:fence/check@${WIT_VERSION}`), err.message);
      return true;
    });
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  // The untouched copy loads and decides.
  const same = genClaiming(WIT_VERSION);
  try {
    const d = new Runtime({ dir: same }).instance().check(null, { scope: 's', token: token(0, 0, 1) });
    assert.equal(d.outcome, 'applied');
  } finally {
    rmSync(same, { recursive: true, force: true });
  }
});

// Malformed, tagged, missing, mixed versions and a missing interface are
// refused (as in the Rust and Python hosts).
test('vet refuses everything but the supported line', () => {
  const cases = [
    [['fencecheck:fence/check@0.1'], 'fencecheck:fence/check@0.1'],
    [['fencecheck:fence/check@0.1.0-rc1'], 'fencecheck:fence/check@0.1.0-rc1'],
    [['fencecheck:fence/check@0.01.0'], 'fencecheck:fence/check@0.01.0'],
    [['fencecheck:fence/check'], 'fencecheck:fence/check without a version'],
    [['fencecheck:fence/check@0.1.0', 'fencecheck:fence/lease@0.2.0'], 'fencecheck:fence/check@0.1.0 and fencecheck:fence/lease@0.2.0 (two versions)'],
    [['fencecheck:fence/lease@0.1.0', 'check'], 'no fencecheck:fence/check interface (its exports: check, fencecheck:fence/lease@0.1.0)'],
    [[], 'no fencecheck:fence/check interface (its exports: nothing)'],
  ];
  for (const [names, found] of cases) assert.deepEqual(vet(names), { found });
  // Any patch of the line, newer or older than WIT_VERSION (0.1.0 has no auth interface).
  for (const v of ['0.1.7', '0.1.0']) {
    assert.deepEqual(vet([`fencecheck:fence/check@${v}`, `fencecheck:fence/lease@${v}`]), {
      version: v, check: `fencecheck:fence/check@${v}`, lease: `fencecheck:fence/lease@${v}`, auth: `fencecheck:fence/auth@${v}`,
    });
  }
});

// The released 0.1.0 (no auth interface), transpiled as `npm run build`
// transpiles ours, loads through Runtime.load: an older patch of the line
// runs; check, batches and leases work; every signed call throws
// UnsupportedFeature (a HostError naming the feature and the version it
// needs) before reaching the guest, and the instance keeps working.
test('the 0.1.0 fixture runs, without signed tokens', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'fencecheck-010-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  execFileSync(JCO, ['transpile', join(REPO, 'tests', 'fixtures', 'fencecheck-0.1.0.wasm'), '--out-dir', dir,
    '--name', 'fencecheck', '--instantiation', 'sync', '--no-nodejs-compat', '--quiet']);
  const runtime = await Runtime.load(dir);
  assert.equal(runtime.componentVersion, '0.1.0');
  assert.equal(runtime.supportsSigning, false);
  assert.equal(new Runtime().supportsSigning, true);
  const g = runtime.instance();
  const req = { scope: 's', token: token(0, 1, 1) };
  const { state } = g.check(null, req);
  assert.equal(g.check(state, req).outcome, 'stale-fence');
  assert.equal(g.checkBatch([[state, { ...req, token: token(0, 1, 2) }]])[0].outcome, 'applied');
  assert.equal(g.acquire(null, { lock: 's', leaseId: 'l', now: 0, ttl: 10 }).outcome, 'acquired');
  const key = { keyId: 3, secret: new Uint8Array(32) };
  const unsupported = (e) => e instanceof UnsupportedFeature && e instanceof HostError && !(e instanceof FenceError)
    && e.retryable === false && e.feature === 'signed tokens' && e.version === '0.1.0' && e.since === '0.1.1'
    && e.message === 'the loaded component (fencecheck:fence@0.1.0) has no signed tokens: that needs 0.1.1 or later';
  assert.throws(() => g.checkSigned(state, req, [key]), unsupported);
  assert.throws(() => g.checkBatch([[null, req], [state, req, [key]]]), unsupported);
  assert.throws(() => g.sign('s', token(0, 1, 1), 'l', key), unsupported);
  assert.throws(() => g.grantMessage('s', token(0, 1, 1), 3, 'l'), unsupported);
  assert.equal(g.check(state, { ...req, token: token(0, 1, 3) }).outcome, 'applied');
  // A directory without a transpiled glue is a load error.
  await assert.rejects(Runtime.load(join(dir, 'nothing')), ComponentLoadError);
});
