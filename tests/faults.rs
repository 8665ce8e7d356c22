//! Guest faults beyond traps and fuel (those are in component.rs): a guest
//! that grows its memory without bound, and one whose results break the
//! canonical ABI. Each must be a clear error for that call, change nothing,
//! and leave the instance able to serve the next call — over both
//! transports and through the SQLite adapter.
//!
//! The misbehaving component is built here, at test time (no committed
//! binary): a core module written with wasm-encoder that exports exactly
//! `fencecheck:fence/check@<the WIT version>` etc. with the signatures wit-parser derives
//! from `wit/`, given the WIT metadata and encoded by wit-component as the
//! real guest is. It answers a normal request with a fixed `applied` and
//! misbehaves only when the token's counter names a fault, so the call after
//! a fault is an ordinary one that must succeed.

use std::path::PathBuf;

use anyhow::{Context, Result, bail, ensure};
use fencecheck::{Decision, Error, Instance, Limits, Policy, Request, Runtime, Token, Transport};
use fencecheck_sqlite::{fenced_write, install, publish, stage};
use wasm_encoder::{
    BlockType, CodeSection, ConstExpr, DataSection, ExportKind, ExportSection, Function,
    FunctionSection, GlobalSection, GlobalType, Instruction as I, MemArg, MemorySection,
    MemoryType, Module, TypeSection, ValType,
};
use wit_parser::abi::{AbiVariant, WasmType};
use wit_parser::{LiftLowerAbi, ManglingAndAbi, Resolve, WasmExport, WasmExportKind, WorldItem};

/// The faults, selected by the request token's counter.
const FAULTS: [(u64, &str); 9] = [
    (1, "grows memory without bound"),
    (2, "returns a list pointer outside memory"),
    (3, "returns a list length beyond memory"),
    (4, "returns an unknown variant discriminant"),
    (5, "returns a result area outside memory"),
    (6, "returns an unknown result discriminant / packed tag"),
    (7, "returns a string that is not UTF-8"),
    (8, "returns more packed results than items"),
    (9, "returns an unaligned result area"),
];

/// Where the module keeps its answers (see `data()`).
const RET: i32 = 16;
const PACKED_OK: i32 = 256;
const PACKED_GARBAGE: i32 = 320;
const PACKED_BAD_UTF8: i32 = 384;
const PACKED_TWO: i32 = 448;
const STATE_OK: i32 = 512;
const NOT_UTF8: i32 = 520;
/// The bump allocator's start, after the fixed areas.
const HEAP: i32 = 1024;
const OUT_OF_BOUNDS: i32 = -16; // 0xFFFF_FFF0

/// What a normal request gets from the misbehaving component (both exports).
fn normal_outcome() -> fencecheck::Outcome {
    Ok(Decision::Applied {
        version: 1,
        highest: Token::new(0, 0, 1),
        state: b"ok".to_vec(),
    })
}

/// The packed `applied(1, 0.0.1, "ok")` outcome body, without the count.
fn packed_applied() -> Vec<u8> {
    let mut out = vec![0u8];
    for v in [1u64, 0, 0, 1] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&2u32.to_le_bytes());
    out.extend_from_slice(b"ok");
    out
}

/// The data segment at `PACKED_OK`: every fixed answer the module returns.
fn data() -> Vec<u8> {
    let mut seg = vec![0u8; (HEAP - PACKED_OK) as usize];
    let mut put = |at: i32, bytes: &[u8]| {
        let at = (at - PACKED_OK) as usize;
        seg[at..at + bytes.len()].copy_from_slice(bytes);
    };
    let one = 1u32.to_le_bytes();
    put(PACKED_OK, &[&one[..], &packed_applied()].concat());
    put(PACKED_GARBAGE, &[&one[..], &[0xEE]].concat());
    put(
        PACKED_BAD_UTF8,
        &[&one[..], &[131], &2u32.to_le_bytes(), &[0xFF, 0xFE]].concat(),
    );
    put(
        PACKED_TWO,
        &[&2u32.to_le_bytes()[..], &packed_applied()].concat(),
    );
    put(STATE_OK, b"ok");
    put(NOT_UTF8, &[0xFF, 0xFE]);
    seg
}

fn mem(offset: u64, align: u32) -> MemArg {
    MemArg {
        offset,
        align,
        memory_index: 0,
    }
}

/// Instructions that store `value` at absolute address `at`.
fn store32(f: &mut Function, at: i32, value: i32) {
    f.instruction(&I::I32Const(at))
        .instruction(&I::I32Const(value))
        .instruction(&I::I32Store(mem(0, 2)));
}

fn store8(f: &mut Function, at: i32, value: i32) {
    f.instruction(&I::I32Const(at))
        .instruction(&I::I32Const(value))
        .instruction(&I::I32Store8(mem(0, 0)));
}

fn store64(f: &mut Function, at: i32, value: i64) {
    f.instruction(&I::I32Const(at))
        .instruction(&I::I64Const(value))
        .instruction(&I::I64Store(mem(0, 3)));
}

/// `if mode == fault { body; return ret }`, with the mode in local `mode`.
fn on_fault(f: &mut Function, mode: u32, fault: u64, body: impl FnOnce(&mut Function), ret: i32) {
    f.instruction(&I::LocalGet(mode))
        .instruction(&I::I64Const(fault as i64))
        .instruction(&I::I64Eq)
        .instruction(&I::If(BlockType::Empty));
    body(f);
    f.instruction(&I::I32Const(ret))
        .instruction(&I::Return)
        .instruction(&I::End);
}

/// Grow memory by 16 pages forever: only the runtime's limit ends it.
fn grow_forever(f: &mut Function) {
    f.instruction(&I::Loop(BlockType::Empty))
        .instruction(&I::I32Const(16))
        .instruction(&I::MemoryGrow(0))
        .instruction(&I::Drop)
        .instruction(&I::Br(0))
        .instruction(&I::End);
}

/// `check-packed(ptr, len) -> ret`: the fault is the first item's counter
/// (bytes 21..29 of the batch).
fn check_packed_body() -> Function {
    let mut f = Function::new([(1, ValType::I64)]);
    let mode = 2;
    f.instruction(&I::LocalGet(1))
        .instruction(&I::I32Const(29))
        .instruction(&I::I32GeU)
        .instruction(&I::If(BlockType::Empty))
        .instruction(&I::LocalGet(0))
        .instruction(&I::I64Load(mem(21, 0)))
        .instruction(&I::LocalSet(mode))
        .instruction(&I::End);
    // `ok(list)` at RET: tag, pointer, length.
    let ok = |ptr: i32, len: i32| {
        move |f: &mut Function| {
            store8(f, RET, 0);
            store32(f, RET + 4, ptr);
            store32(f, RET + 8, len);
        }
    };
    on_fault(&mut f, mode, 1, grow_forever, RET);
    on_fault(&mut f, mode, 2, ok(OUT_OF_BOUNDS, 16), RET);
    on_fault(&mut f, mode, 3, ok(PACKED_OK, i32::MAX), RET);
    on_fault(&mut f, mode, 4, |f| store8(f, RET, 7), RET);
    on_fault(&mut f, mode, 5, ok(PACKED_OK, 43), OUT_OF_BOUNDS);
    on_fault(&mut f, mode, 6, ok(PACKED_GARBAGE, 5), RET);
    on_fault(&mut f, mode, 7, ok(PACKED_BAD_UTF8, 11), RET);
    on_fault(&mut f, mode, 8, ok(PACKED_TWO, 43), RET);
    on_fault(&mut f, mode, 9, ok(PACKED_OK, 43), RET + 1);
    ok(PACKED_OK, 43)(&mut f);
    f.instruction(&I::I32Const(RET)).instruction(&I::End);
    f
}

/// `check(state?, request) -> ret` (14 flat parameters; the counter is
/// parameter 7). Layout of `result<decision, check-error>` at RET: result
/// tag +0, decision or error tag +8, payload from +16 (`applied`: version
/// +16, highest +24/+32/+40, state pointer +48, length +52).
fn check_body() -> Function {
    let mut f = Function::new([]);
    let mode = 7;
    let applied = |ptr: i32, len: i32| {
        move |f: &mut Function| {
            store8(f, RET, 0);
            store8(f, RET + 8, 0);
            store64(f, RET + 16, 1);
            store64(f, RET + 24, 0);
            store64(f, RET + 32, 0);
            store64(f, RET + 40, 1);
            store32(f, RET + 48, ptr);
            store32(f, RET + 52, len);
        }
    };
    on_fault(&mut f, mode, 1, grow_forever, RET);
    on_fault(&mut f, mode, 2, applied(OUT_OF_BOUNDS, 16), RET);
    on_fault(&mut f, mode, 3, applied(STATE_OK, i32::MAX), RET);
    on_fault(
        &mut f,
        mode,
        4,
        |f| {
            store8(f, RET, 0);
            store8(f, RET + 8, 9);
        },
        RET,
    );
    on_fault(&mut f, mode, 5, applied(STATE_OK, 2), OUT_OF_BOUNDS);
    on_fault(&mut f, mode, 6, |f| store8(f, RET, 2), RET);
    on_fault(
        &mut f,
        mode,
        7,
        |f| {
            // err(scope-mismatch(string)): case 3 of check-error.
            store8(f, RET, 1);
            store8(f, RET + 8, 3);
            store32(f, RET + 16, NOT_UTF8);
            store32(f, RET + 20, 2);
        },
        RET,
    );
    on_fault(&mut f, mode, 8, |f| store8(f, RET, 0x55), RET);
    on_fault(&mut f, mode, 9, applied(STATE_OK, 2), RET + 1);
    applied(STATE_OK, 2)(&mut f);
    f.instruction(&I::I32Const(RET)).instruction(&I::End);
    f
}

/// `cabi_realloc(old, old_size, align, size)`: a bump allocator that grows
/// memory as needed (enough for any test argument).
fn realloc_body() -> Function {
    let mut f = Function::new([(1, ValType::I32)]);
    let ret = 4;
    // ret = (bump + align - 1) & -align; bump = ret + size
    f.instruction(&I::GlobalGet(0))
        .instruction(&I::LocalGet(2))
        .instruction(&I::I32Add)
        .instruction(&I::I32Const(1))
        .instruction(&I::I32Sub)
        .instruction(&I::I32Const(0))
        .instruction(&I::LocalGet(2))
        .instruction(&I::I32Sub)
        .instruction(&I::I32And)
        .instruction(&I::LocalTee(ret))
        .instruction(&I::LocalGet(3))
        .instruction(&I::I32Add)
        .instruction(&I::GlobalSet(0))
        // while bump > memory.size * 64 KiB: grow one page (a refusal traps)
        .instruction(&I::Block(BlockType::Empty))
        .instruction(&I::Loop(BlockType::Empty))
        .instruction(&I::GlobalGet(0))
        .instruction(&I::MemorySize(0))
        .instruction(&I::I32Const(16))
        .instruction(&I::I32Shl)
        .instruction(&I::I32LeU)
        .instruction(&I::BrIf(1))
        .instruction(&I::I32Const(1))
        .instruction(&I::MemoryGrow(0))
        .instruction(&I::I32Const(-1))
        .instruction(&I::I32Eq)
        .instruction(&I::If(BlockType::Empty))
        .instruction(&I::Unreachable)
        .instruction(&I::End)
        .instruction(&I::Br(0))
        .instruction(&I::End)
        .instruction(&I::End)
        .instruction(&I::LocalGet(ret))
        .instruction(&I::End);
    f
}

/// Post-return: free everything (the next call starts a fresh heap).
fn post_body() -> Function {
    let mut f = Function::new([]);
    f.instruction(&I::I32Const(HEAP))
        .instruction(&I::GlobalSet(0))
        .instruction(&I::End);
    f
}

fn core_type(t: &WasmType) -> ValType {
    match t {
        WasmType::I32 | WasmType::Pointer | WasmType::Length => ValType::I32,
        WasmType::I64 | WasmType::PointerOrI64 => ValType::I64,
        WasmType::F32 => ValType::F32,
        WasmType::F64 => ValType::F64,
    }
}

/// The misbehaving component, exporting the world `fencecheck` of `wit/`.
fn misbehaving_component() -> Result<Vec<u8>> {
    let wit = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../wit");
    let mut resolve = Resolve::default();
    let (package, _) = resolve.push_dir(&wit).context("parsing wit/")?;
    let world = resolve.select_world(&[package], Some("fencecheck"))?;
    let mangling = ManglingAndAbi::Legacy(LiftLowerAbi::Sync);

    let mut types = TypeSection::new();
    let mut functions = FunctionSection::new();
    let mut exports = ExportSection::new();
    let mut code = CodeSection::new();
    let mut add = |name: String, params: Vec<ValType>, results: Vec<ValType>, body: Function| {
        let index = functions.len();
        types.ty().function(params, results);
        functions.function(index);
        exports.export(&name, ExportKind::Func, index);
        code.function(&body);
    };
    let i32s = |n| vec![ValType::I32; n];
    add(
        resolve.wasm_export_name(mangling, WasmExport::Realloc),
        i32s(4),
        i32s(1),
        realloc_body(),
    );
    let mut found = 0;
    for (key, item) in &resolve.worlds[world].exports {
        let WorldItem::Interface { id, .. } = item else {
            continue;
        };
        let interface = resolve.id_of(*id).unwrap_or_default();
        for (name, func) in &resolve.interfaces[*id].functions {
            let sig = resolve.wasm_signature(AbiVariant::GuestExport, func);
            let params: Vec<ValType> = sig.params.iter().map(core_type).collect();
            let results: Vec<ValType> = sig.results.iter().map(core_type).collect();
            let export = |kind| {
                resolve.wasm_export_name(
                    mangling,
                    WasmExport::Func {
                        interface: Some(key),
                        func,
                        kind,
                    },
                )
            };
            let check = format!("fencecheck:fence/check@{}", fencecheck::WIT_VERSION);
            let body = match (interface.as_str(), name.as_str()) {
                (i, "check-packed") if i == check => {
                    ensure!(
                        params == i32s(2) && results == i32s(1),
                        "check-packed: {sig:?}"
                    );
                    check_packed_body()
                }
                (i, "check") if i == check => {
                    ensure!(
                        params.len() == 14 && params[7] == ValType::I64 && results == i32s(1),
                        "check's flat signature changed: {sig:?}"
                    );
                    check_body()
                }
                // Not exercised: a trap if ever called.
                _ => {
                    let mut f = Function::new([]);
                    f.instruction(&I::Unreachable).instruction(&I::End);
                    f
                }
            };
            if matches!(name.as_str(), "check" | "check-packed") {
                found += 1;
                add(
                    export(WasmExportKind::PostReturn),
                    i32s(1),
                    vec![],
                    post_body(),
                );
            }
            add(export(WasmExportKind::Normal), params, results, body);
        }
    }
    ensure!(found == 2, "wit/ lost check or check-packed");

    let mut memories = MemorySection::new();
    memories.memory(MemoryType {
        minimum: 1,
        maximum: None,
        memory64: false,
        shared: false,
        page_size_log2: None,
    });
    exports.export(
        &resolve.wasm_export_name(mangling, WasmExport::Memory),
        ExportKind::Memory,
        0,
    );
    let mut globals = GlobalSection::new();
    globals.global(
        GlobalType {
            val_type: ValType::I32,
            mutable: true,
            shared: false,
        },
        &ConstExpr::i32_const(HEAP),
    );
    let mut data_section = DataSection::new();
    data_section.active(0, &ConstExpr::i32_const(PACKED_OK), data());

    let mut module = Module::new();
    module
        .section(&types)
        .section(&functions)
        .section(&memories)
        .section(&globals)
        .section(&exports)
        .section(&code)
        .section(&data_section);
    let mut bytes = module.finish();
    wit_component::embed_component_metadata(
        &mut bytes,
        &resolve,
        world,
        wit_component::StringEncoding::UTF8,
    )?;
    wit_component::ComponentEncoder::default()
        .module(&bytes)?
        .validate(true)
        .encode()
}

fn request(counter: u64) -> Request {
    Request::new("s", Token::new(0, 0, counter), Policy::Strict)
}

/// The runtime over the misbehaving component, over each transport.
fn runtimes() -> Result<[Runtime; 2]> {
    let rt = Runtime::from_bytes(&misbehaving_component()?, Limits::default())?;
    ensure!(
        rt.transport() == Transport::Core,
        "the misbehaving component must exercise the core transport too"
    );
    let component = rt.with_component_transport();
    Ok([rt, component])
}

/// `result` is a clear error for the call (a trap or a protocol error naming
/// it), never a decision; for memory growth, the error says memory.
fn clear_error<T: std::fmt::Debug>(result: Result<T, Error>, fault: u64, what: &str) -> Result<()> {
    match result {
        Err(e @ (Error::Trapped { .. } | Error::Protocol { .. })) => {
            let message = e.to_string();
            eprintln!("{what}: {message}");
            ensure!(message.contains("check"), "{what}: {message}");
            if fault == 1 {
                ensure!(
                    message.contains("memory"),
                    "{what}: a memory-limit trap should say so: {message}"
                );
            }
            Ok(())
        }
        other => bail!("{what}: expected a clear error, got {other:?}"),
    }
}

/// The normal request works on `guest` (the one after a fault).
fn works(guest: &mut Instance, what: &str) -> Result<()> {
    let outcome = guest.check(None, &request(100))?;
    ensure!(
        outcome == normal_outcome(),
        "{what}: next call gave {outcome:?}"
    );
    ensure!(
        guest.check_batch(&[(None, &request(101))])? == vec![normal_outcome()],
        "{what}: next batch"
    );
    Ok(())
}

/// Every fault, through `check` and a one-item `check_batch` over the core
/// transport and the component API, is a clear error for that call (a trap,
/// or a protocol error: never a panic, never a decision; unbounded memory
/// growth is stopped by the runtime's memory limit and says so), and the
/// same instance's next, ordinary call is answered normally.
#[test]
fn each_fault_is_a_clear_error_and_the_next_call_works() -> Result<()> {
    for rt in runtimes()? {
        let mut guest = rt.instance()?;
        works(&mut guest, "before any fault")?;
        for (fault, about) in FAULTS {
            let what = format!("{:?}, guest that {about}", rt.transport());
            clear_error(
                guest.check(Some(b"ok"), &request(fault)),
                fault,
                &format!("{what}: check"),
            )?;
            works(&mut guest, &what)?;
            clear_error(
                guest.check_batch(&[(Some(b"ok".as_slice()), &request(fault))]),
                fault,
                &format!("{what}: batch"),
            )?;
            works(&mut guest, &what)?;
        }
    }
    Ok(())
}

/// The harness can fail: a raw packed call of a fault is refused, not
/// handed over as bytes, and the same module starved of fuel fails even the
/// normal call (so `works` above is not trivially true).
#[test]
fn the_fault_harness_can_fail() -> Result<()> {
    let rt = Runtime::from_bytes(&misbehaving_component()?, Limits::default())?;
    let mut guest = rt.instance()?;
    let batch = fencecheck_tests::upgrade::pack(&[(None, &request(2))]);
    ensure!(
        matches!(guest.check_packed_raw(&batch), Err(Error::Protocol { .. })),
        "a raw out-of-bounds reply must be refused"
    );
    let starved = Runtime::from_bytes(
        &misbehaving_component()?,
        Limits {
            fuel_per_check: 1,
            fuel_per_input_byte: 0,
            ..Limits::default()
        },
    )?
    .with_component_transport();
    ensure!(
        starved.instance()?.check(None, &request(100)).is_err(),
        "1 unit of fuel cannot answer"
    );
    Ok(())
}

/// Every row of the adapter's tables and the test's audit, as text.
fn snapshot(conn: &rusqlite::Connection) -> Result<Vec<String>> {
    let mut rows = Vec::new();
    for sql in [
        "SELECT quote(scope) || quote(fence_state) || quote(version) || quote(visible_object) FROM fencecheck_scopes",
        "SELECT quote(id) || quote(scope) || quote(name) || quote(body) FROM fencecheck_objects",
        "SELECT quote(note) FROM audit",
    ] {
        let mut statement = conn.prepare(sql)?;
        for row in statement.query_map([], |r| r.get::<_, String>(0))? {
            rows.push(row?);
        }
    }
    rows.sort();
    Ok(rows)
}

/// Through the SQLite adapter, over both transports: a fenced write and a
/// publish whose check hits any fault fail with the runtime's error, the
/// mutation never runs, and no row changes (the stored state, the version,
/// the catalog pointer, the audit); the next ordinary write applies.
#[test]
fn faults_through_sqlite_change_nothing() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut conn = rusqlite::Connection::open(dir.path().join("faults.db"))?;
    install(&conn)?;
    conn.execute_batch("CREATE TABLE audit (note TEXT NOT NULL)")?;
    let now = std::time::UNIX_EPOCH;
    for rt in runtimes()? {
        let mut guest = rt.instance()?;
        let first = fenced_write(&mut conn, &mut guest, &request(100), |tx, _| {
            tx.execute("INSERT INTO audit (note) VALUES ('normal')", [])
        })?;
        ensure!(first.is_applied(), "{first:?}");
        let object = stage(&conn, "s", "next", b"body", now)?;
        for (fault, about) in FAULTS {
            let what = format!("{:?}, guest that {about}", rt.transport());
            let before = snapshot(&conn)?;
            let mut ran = false;
            let written = fenced_write(&mut conn, &mut guest, &request(fault), |tx, _| {
                ran = true;
                tx.execute("INSERT INTO audit (note) VALUES ('fault')", [])
            });
            match written {
                Err(fencecheck_sqlite::Error::Check(e)) => clear_error::<()>(Err(e), fault, &what)?,
                other => bail!("{what}: fenced write gave {other:?}"),
            }
            ensure!(!ran, "{what}: the mutation ran");
            let published = publish(&mut conn, &mut guest, &request(fault), object, now);
            match published {
                Err(fencecheck_sqlite::Error::Check(e)) => clear_error::<()>(Err(e), fault, &what)?,
                other => bail!("{what}: publish gave {other:?}"),
            }
            ensure!(snapshot(&conn)? == before, "{what}: the database changed");
            let next = fenced_write(&mut conn, &mut guest, &request(100), |tx, _| {
                tx.execute("INSERT INTO audit (note) VALUES ('after')", [])
            })?;
            ensure!(next.is_applied(), "{what}: next write {next:?}");
        }
    }
    Ok(())
}
