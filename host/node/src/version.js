// Which component versions this package runs (as host/runtime/src/version.rs
// and the Python host's _wit.py).
//
// A component's version is its WIT package version, carried in its export
// names (`fencecheck:fence/check@0.1.0`). This package was written against
// WIT_VERSION (the `package fencecheck:fence@…;` line of wit/fence.wit;
// test/version.test.mjs keeps the two equal) and runs a component only if its
// exports carry a version of the same release line: for 0.x the same major
// and minor, any patch, older or newer. Anything else has another contract and
// is refused at load. Within a line versions only add (0.1.1 added
// `fencecheck:fence/auth`): a call that needs what an older component lacks
// throws UnsupportedFeature, and every other call works.

export const WIT_PACKAGE = 'fencecheck:fence';
export const WIT_VERSION = '0.1.1';

// MAJOR.MINOR.PATCH, no leading zeros, no pre-release or build tag.
const SEMVER = /^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$/;

function parse(text) {
  const m = SEMVER.exec(text);
  return m ? [BigInt(m[1]), BigInt(m[2]), BigInt(m[3])] : null;
}

/** The versions this package runs, e.g. `fencecheck:fence@0.1.x`. */
export function supported() {
  const built = parse(WIT_VERSION);
  if (!built) return `${WIT_PACKAGE}@${WIT_VERSION}`;
  const [major, minor] = built;
  return `${WIT_PACKAGE}@${major === 0n ? `0.${minor}.x` : `${major}.x`}`;
}

/**
 * The component whose top-level export (interface) names are `names`, if this
 * package runs it: `{ version, check, lease, auth }` (the full interface
 * names; `auth` is absent from components before 0.1.1).
 * Otherwise `{ found }`: what it exports, for the refusal.
 */
export function vet(names) {
  const ours = [];
  const others = [];
  for (const name of names) {
    if (name.startsWith(`${WIT_PACKAGE}/`)) {
      const rest = name.slice(WIT_PACKAGE.length + 1);
      const at = rest.indexOf('@');
      ours.push(at < 0 ? [rest, null] : [rest.slice(0, at), rest.slice(at + 1)]);
    } else {
      others.push(name);
    }
  }
  const full = (iface, v) => `${WIT_PACKAGE}/${iface}${v === null ? '' : `@${v}`}`;
  const check = ours.find(([iface]) => iface === 'check');
  if (!check) {
    const listed = [...ours.map(([i, v]) => full(i, v)), ...others].sort();
    return { found: `no ${WIT_PACKAGE}/check interface (its exports: ${listed.join(', ') || 'nothing'})` };
  }
  const version = check[1];
  const checkName = full('check', version);
  if (version === null) return { found: `${checkName} without a version` };
  const mixed = ours.find(([, v]) => v !== version);
  if (mixed) return { found: `${checkName} and ${full(mixed[0], mixed[1])} (two versions)` };
  const found = parse(version);
  const built = parse(WIT_VERSION);
  const sameLine = found && built && (built[0] === 0n ? found[0] === 0n && found[1] === built[1] : found[0] === built[0]);
  if (!sameLine) return { found: checkName };
  return { version, check: checkName, lease: full('lease', version), auth: full('auth', version) };
}

/**
 * The interfaces a core module of a transpiled component implements, from
 * its export names (`fencecheck:fence/check@0.1.0#check-packed`,
 * `cabi_post_…#…`): what the glue calls into.
 */
export function coreInterfaces(exportNames) {
  const set = new Set();
  for (const name of exportNames) {
    const hash = name.indexOf('#');
    if (hash < 0) continue;
    const iface = name.slice(0, hash).replace(/^cabi_post_/, '');
    if (iface.startsWith(`${WIT_PACKAGE}/`)) set.add(iface);
  }
  return [...set];
}
