// The single-check core exports (guest/src/one.rs), reached below jco: one
// crossing per check, as the Rust runtime's core transport makes it
// (host/runtime/src/core.rs).
//
// jco's glue instantiates the component's core module through a hook
// (`instantiateCore`, part of its `--instantiation` output's signature) and
// lifts only the WIT exports; the guest's extra core exports
// `fencecheck-one-input() -> i64` (address << 32 | capacity of a static
// input buffer) and `fencecheck-one(len: i32) -> i64` (answer address << 32 |
// length, in a static output buffer; -1 malformed, -2 does not fit: send it
// through check-packed) are on the very instance jco made, next to its
// `memory`. index.js passes its own hook, keeps that instance's exports, and
// uses them only if the component has the shape the Rust and Python core
// transports require: exactly one core instance, of a module that imports
// nothing and exports `memory` and both functions with exactly those core
// types (read from the module's bytes: Node has no type reflection for
// exports). Otherwise every check goes through jco's glue, as before.
//
// A check then costs one encode into the input buffer, one call, and one
// decode of the answer, instead of jco's lowering of every field, its task
// bookkeeping and its post-return (about 4 µs; BENCHMARKS.md). Every address
// and length the guest answers is bounds-checked against its memory.

import { PackedFormatError } from './index.js';
import { encodeInto, encodedBound } from './packed.js';

export const ONE_INPUT = 'fencecheck-one-input';
export const ONE = 'fencecheck-one';

const strictUtf8 = new TextDecoder('utf-8', { fatal: true });
const VALTYPES = new Map([[0x7f, 'i32'], [0x7e, 'i64'], [0x7d, 'f32'], [0x7c, 'f64'], [0x7b, 'v128'], [0x70, 'funcref'], [0x6f, 'externref']]);

/**
 * The core types of a core module's function exports (`name` ->
 * `{params, results}` as type names) and whether it exports a memory, read
 * from its bytes; `null` if it imports anything or has anything this reader
 * does not know (a GC type, a typed reference), so such a module is never
 * trusted with the single-check path.
 */
export function coreExports(bytes) {
  const b = bytes instanceof Uint8Array ? bytes : new Uint8Array(bytes);
  let o = 8;
  const u32 = () => {
    let value = 0;
    for (let shift = 0; shift < 35; shift += 7) {
      if (o >= b.length) throw new RangeError('truncated');
      const byte = b[o++];
      value += (byte & 0x7f) * 2 ** shift;
      if (byte < 0x80) return value;
    }
    throw new RangeError('LEB128 too long');
  };
  const vec = (item) => Array.from({ length: u32() }, item);
  const valtype = () => {
    const t = VALTYPES.get(b[o++]);
    if (t === undefined) throw new RangeError('unknown value type');
    return t;
  };
  try {
    if (b.length < 8 || b[0] !== 0 || b[1] !== 0x61 || b[2] !== 0x73 || b[3] !== 0x6d || b[4] !== 1 || b[5] || b[6] || b[7]) return null;
    let types = [];
    let funcs = [];
    const exports = [];
    while (o < b.length) {
      const id = b[o++];
      const size = u32();
      const end = o + size;
      if (end > b.length) return null;
      if (id === 1) {
        types = vec(() => {
          if (b[o++] !== 0x60) throw new RangeError('not a function type');
          return { params: vec(valtype), results: vec(valtype) };
        });
      } else if (id === 2) {
        if (u32() !== 0) return null;
      } else if (id === 3) {
        funcs = vec(u32);
      } else if (id === 7) {
        exports.push(...vec(() => {
          const length = u32();
          if (o + length > end) throw new RangeError('truncated name');
          const name = strictUtf8.decode(b.subarray(o, o + length));
          o += length;
          return { name, kind: b[o++], index: u32() };
        }));
      }
      if ((id === 1 || id === 3 || id === 7) && o !== end) return null; // a section read must end where it says
      o = end;
    }
    const funcTypes = new Map();
    let memory = false;
    for (const { name, kind, index } of exports) {
      if (kind === 0) {
        const type = types[funcs[index]];
        if (type === undefined) return null;
        funcTypes.set(name, type);
      } else if (kind === 2) {
        memory ||= name === 'memory';
      }
    }
    return { funcs: funcTypes, memory };
  } catch {
    return null;
  }
}

const same = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);
const typed = (type, params, results) => type !== undefined && same(type.params, params) && same(type.results, results);

/** Whether a core module's bytes have the single-check exports, exactly typed, and import nothing. */
export function hasOneExports(bytes) {
  const e = coreExports(bytes);
  return e !== null && e.memory && typed(e.funcs.get(ONE_INPUT), [], ['i64']) && typed(e.funcs.get(ONE), ['i32'], ['i64']);
}

const MALFORMED = -1n;
const DOES_NOT_FIT = -2n;

/**
 * The single-check export of one core instance (its exports, as jco got
 * them). `call(batch)` copies a one-item batch into the guest's input
 * buffer and calls it; `write(item)` encodes a validated item straight into
 * that buffer (no batch is allocated) and answers its length, then
 * `cross(length)` calls it. Both calls answer a view of the guest's answer
 * (valid until the next call into the guest: decode it at once),
 * `'malformed'`, or `undefined` when the input does not fit the guest's
 * buffers (the caller sends it through check-packed; `write` answers
 * `undefined` for an item that may not fit). `OneCheck.of` answers `null`
 * when the exports are not usable (an input buffer outside memory: a broken
 * guest).
 */
export class OneCheck {
  static of(exports) {
    const memory = exports?.memory;
    const input = exports?.[ONE_INPUT];
    const one = exports?.[ONE];
    if (!(memory instanceof WebAssembly.Memory) || typeof input !== 'function' || typeof one !== 'function') return null;
    const word = input();
    if (typeof word !== 'bigint') return null;
    const [at, capacity] = split(word);
    if (word < 0n || at + capacity > memory.buffer.byteLength) return null;
    return new OneCheck(memory, one, at, capacity);
  }

  constructor(memory, one, at, capacity) {
    Object.assign(this, { memory, one, at, capacity });
    this.#view();
  }

  // Views of guest memory, made again when growth has replaced its buffer
  // (the old one is then detached: zero length).
  #u8;
  #dv;
  #view() {
    if (this.#u8 === undefined || this.#u8.byteLength === 0) {
      this.#u8 = new Uint8Array(this.memory.buffer);
      this.#dv = new DataView(this.memory.buffer);
    }
    // Memory never shrinks; checked all the same.
    if (this.at + this.capacity > this.#u8.byteLength) {
      throw new PackedFormatError('output', 'the single-check input buffer is outside guest memory');
    }
    return this.#u8;
  }

  call(batch) {
    if (batch.length > this.capacity) return undefined;
    this.#view().set(batch, this.at);
    return this.cross(batch.length);
  }

  write(item) {
    if (encodedBound([item]) > this.capacity) return undefined;
    const u8 = this.#view();
    return encodeInto(u8, this.#dv, this.at, [item]) - this.at;
  }

  cross(n) {
    const ret = this.one(n);
    if (typeof ret !== 'bigint') throw new PackedFormatError('output', `fencecheck-one answered ${typeof ret}, not an i64`);
    if (ret === MALFORMED) return 'malformed';
    if (ret === DOES_NOT_FIT) return undefined;
    const [at, length] = split(ret);
    const u8 = this.#view(); // the guest may have grown its memory
    if (ret < 0n || at + length > u8.byteLength) {
      throw new PackedFormatError('output', `the single-check answer [${at}, +${length}) is outside guest memory (${u8.byteLength} bytes)`);
    }
    return u8.subarray(at, at + length);
  }
}

// An (address << 32) | length answer.
function split(word) {
  const w = BigInt.asUintN(64, word);
  return [Number(w >> 32n), Number(w & 0xffffffffn)];
}
