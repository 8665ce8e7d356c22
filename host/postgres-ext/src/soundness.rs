//! Is a table fenced soundly? The one implementation of the rules, read
//! from the relation cache and the catalogs through PostgreSQL's C API (no
//! SQL, no planner: the row trigger asks once per backend and table, and a
//! new connection must not pay milliseconds for it). SQL reaches it as
//! `fencecheck.unfit`, `fencecheck.trigger_trouble` and `fencecheck.unsound`
//! (`sql/protect.sql`: fence_protect and the DDL guard).
//!
//! A table can be fenced soundly on (scope, token, state) when it is a
//! plain, logged, permanent table with no inheritance parent or child; the
//! three columns are `text`/`varchar`, `text`/`varchar` and `bytea`, none
//! generated; and a valid, non-deferrable unique index covers the scope
//! column alone, with the column's and the index's collation deterministic
//! (so the index's equality is byte equality, as the tombstones' and the
//! key prefixes' is). It is fenced soundly now when, besides, it is in
//! `fencecheck.protected` and its triggers are the ones fence_protect made
//! (enabled, unconditional, with the registered arguments), and no enabled
//! BEFORE row trigger fires after the fence's (whose name sorts after it).
#![allow(unsafe_code)]

use std::ffi::{CStr, c_char, c_int};

use pgrx::pg_sys;

use crate::sqlstate::{Raise, SqlState, hint};

/// The row trigger's name. BEFORE triggers fire in name order (strcmp):
/// this one must be the last to see NEW.
pub(crate) const ROW_TRIGGER: &str = "zz_fencecheck_row";
pub(crate) const INSERTED_TRIGGER: &str = "fencecheck_inserted";
pub(crate) const TRUNCATE_TRIGGER: &str = "fencecheck_truncate";

/// pg_inherits, its indexes and columns: fixed catalog numbers
/// (catalog/pg_inherits.h), which pgrx's bindings leave out. Each index is
/// paired with the heap column it leads with (systable_beginscan's keys
/// name heap columns).
const INHERITS_RELATION: u32 = 2611;
const BY_CHILD: (u32, i16) = (2680, 1); // (inhrelid, inhseqno), inhrelid
const BY_PARENT: (u32, i16) = (2187, 2); // (inhparent), inhparent

/// tgtype bits (commands/trigger.h).
const ROW: i16 = 1;
const BEFORE: i16 = 2;
const INSERT: i16 = 4;
const DELETE: i16 = 8;
const UPDATE: i16 = 16;
const TRUNCATE: i16 = 32;

/// A table's entry in `fencecheck.protected`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Registered {
    pub(crate) scope: String,
    pub(crate) token: String,
    pub(crate) state: String,
    pub(crate) policy: String,
}

impl Registered {
    fn args(&self) -> [&str; 4] {
        [&self.scope, &self.token, &self.state, &self.policy]
    }
}

fn runtime(detail: impl std::fmt::Display) -> Raise {
    Raise::new(SqlState::RuntimeError, detail)
}

/// The OID of schema `fencecheck`, and of its relation `name`.
fn own_relation(name: &CStr) -> Result<pg_sys::Oid, Raise> {
    // SAFETY: syscache lookups by name; missing_ok.
    unsafe {
        let schema = pg_sys::get_namespace_oid(c"fencecheck".as_ptr(), true);
        let relid = if schema == pg_sys::Oid::INVALID {
            schema
        } else {
            pg_sys::get_relname_relid(name.as_ptr(), schema)
        };
        if relid == pg_sys::Oid::INVALID {
            // The library is newer than the extension's SQL objects (a new
            // package installed, ALTER EXTENSION UPDATE not yet run): there
            // is nothing to trust, so every fenced row is refused.
            return Err(Raise::new(
                SqlState::UnsoundFence,
                format!(
                    "fencecheck.{} is missing: the extension's SQL objects are older than its library: run ALTER EXTENSION fencecheck UPDATE",
                    name.to_string_lossy()
                ),
            )
            .with_hint(hint::UPGRADE));
        }
        Ok(relid)
    }
}

/// The extension's owner (the owner of schema `fencecheck`).
pub(crate) fn extension_owner() -> Result<pg_sys::Oid, Raise> {
    // SAFETY: a syscache lookup, released before returning.
    unsafe {
        let schema = pg_sys::get_namespace_oid(c"fencecheck".as_ptr(), true);
        let tuple = pg_sys::SearchSysCache1(
            pg_sys::SysCacheIdentifier::NAMESPACEOID as c_int,
            pg_sys::Datum::from(schema),
        );
        if tuple.is_null() {
            return Err(runtime("schema fencecheck is missing"));
        }
        let owner =
            (*pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_namespace>(tuple)).nspowner;
        pg_sys::ReleaseSysCache(tuple);
        Ok(owner)
    }
}

/// Every row of the extension's table `name` (under the latest snapshot:
/// configuration, read as it is now whatever the caller's isolation), as
/// the values `read` makes of each.
///
/// # Safety
/// `read` gets a tuple and descriptor of that table, valid only during the
/// call.
pub(crate) unsafe fn scan_own<T>(
    name: &CStr,
    mut read: impl FnMut(pg_sys::HeapTuple, pg_sys::TupleDesc) -> Result<Option<T>, Raise>,
) -> Result<(pg_sys::Oid, Vec<T>), Raise> {
    let relid = own_relation(name)?;
    let mut rows = Vec::new();
    let mut failed = None;
    // SAFETY: open, scan and close under AccessShareLock; a PostgreSQL
    // error inside aborts the transaction, which releases all three.
    unsafe {
        let rel = pg_sys::relation_open(relid, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        let snapshot = pg_sys::RegisterSnapshot(pg_sys::GetLatestSnapshot());
        let scan = pg_sys::systable_beginscan(
            rel,
            pg_sys::Oid::INVALID,
            false,
            snapshot,
            0,
            std::ptr::null_mut(),
        );
        loop {
            let tuple = pg_sys::systable_getnext(scan);
            if tuple.is_null() {
                break;
            }
            match read(tuple, (*rel).rd_att) {
                Ok(Some(row)) => rows.push(row),
                Ok(None) => {}
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        pg_sys::systable_endscan(scan);
        pg_sys::UnregisterSnapshot(snapshot);
        pg_sys::relation_close(rel, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
    }
    match failed {
        Some(e) => Err(e),
        None => Ok((relid, rows)),
    }
}

/// Column `attnum` of `tuple` as `T` (`None` for NULL).
///
/// # Safety
/// `tuple` and `desc` belong together and the column's type is `T`'s.
pub(crate) unsafe fn column<T: pgrx::FromDatum>(
    tuple: pg_sys::HeapTuple,
    desc: pg_sys::TupleDesc,
    attnum: c_int,
) -> Option<T> {
    let mut null = false;
    // SAFETY: per the caller.
    unsafe {
        let datum = pg_sys::heap_getattr(tuple, attnum, desc, &mut null);
        T::from_datum(datum, null)
    }
}

/// `relid`'s entry in `fencecheck.protected`, if any.
pub(crate) fn registered(relid: pg_sys::Oid) -> Result<Option<Registered>, Raise> {
    // SAFETY: the registry's columns are (relid regclass, scope_column,
    // token_column, state_column, policy text), all NOT NULL.
    let (_, mut rows) = unsafe {
        scan_own(c"protected", |tuple, desc| {
            if column::<pg_sys::Oid>(tuple, desc, 1) != Some(relid) {
                return Ok(None);
            }
            let text = |n| {
                column::<String>(tuple, desc, n)
                    .ok_or_else(|| runtime("fencecheck.protected holds a NULL"))
            };
            Ok(Some(Registered {
                scope: text(2)?,
                token: text(3)?,
                state: text(4)?,
                policy: text(5)?,
            }))
        })?
    };
    Ok(rows.pop())
}

/// An open relation, closed when dropped.
struct Open(pg_sys::Relation);

impl Open {
    /// `relid` under AccessShareLock, or `None` if it no longer exists.
    fn relation(relid: pg_sys::Oid) -> Option<Self> {
        // SAFETY: try_relation_open returns NULL for a missing relation.
        let rel = unsafe {
            pg_sys::try_relation_open(relid, pg_sys::AccessShareLock as pg_sys::LOCKMODE)
        };
        // Never `then_some(Open(rel))`: that makes an `Open` of NULL and
        // drops it, closing a NULL relation (a segfault that took down the
        // server on `fencecheck.unfit` of a missing OID).
        if rel.is_null() { None } else { Some(Open(rel)) }
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        // SAFETY: opened by `relation` with this lock mode.
        unsafe { pg_sys::relation_close(self.0, pg_sys::AccessShareLock as pg_sys::LOCKMODE) }
    }
}

/// `relid`'s name for messages (its OID if it has none).
fn name_of(relid: pg_sys::Oid) -> String {
    // SAFETY: a syscache lookup; NULL for a relation that is gone.
    let name = unsafe { pg_sys::get_rel_name(relid) };
    if name.is_null() {
        format!("relation {}", u32::from(relid))
    } else {
        // SAFETY: a palloc'd C string.
        unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned()
    }
}

/// Whether a row of pg_inherits names `relid` in the column `(index,
/// column)` leads with.
///
/// # Safety
/// Inside a transaction.
unsafe fn inherits((index, column): (u32, i16), relid: pg_sys::Oid) -> bool {
    // SAFETY: an index scan of pg_inherits under AccessShareLock.
    unsafe {
        let rel = pg_sys::relation_open(
            pg_sys::Oid::from(INHERITS_RELATION),
            pg_sys::AccessShareLock as pg_sys::LOCKMODE,
        );
        let mut key = pg_sys::ScanKeyData::default();
        pg_sys::ScanKeyInit(
            &mut key,
            column,
            pg_sys::BTEqualStrategyNumber as pg_sys::StrategyNumber,
            pg_sys::Oid::from(pg_sys::F_OIDEQ),
            pg_sys::Datum::from(relid),
        );
        let scan = pg_sys::systable_beginscan(
            rel,
            pg_sys::Oid::from(index),
            true,
            std::ptr::null_mut(),
            1,
            &mut key,
        );
        let found = !pg_sys::systable_getnext(scan).is_null();
        pg_sys::systable_endscan(scan);
        pg_sys::relation_close(rel, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        found
    }
}

/// The attribute of `desc` called `name`, if it is a live column.
fn attribute<'a>(
    desc: &'a pgrx::PgTupleDesc<'_>,
    name: &str,
) -> Option<&'a pg_sys::FormData_pg_attribute> {
    desc.iter().find(|a| {
        !a.attisdropped
            // SAFETY: NameData holds a NUL-terminated name.
            && unsafe { CStr::from_ptr(a.attname.data.as_ptr()) }.to_bytes() == name.as_bytes()
    })
}

/// Why `rel` cannot be fenced soundly on these columns, or `None`.
///
/// # Safety
/// `rel` must be an open relation.
pub(crate) unsafe fn unfit(rel: pg_sys::Relation, columns: [&str; 3]) -> Option<String> {
    // SAFETY: an open relation's descriptor and catalog row.
    let (relid, form) = unsafe { ((*rel).rd_id, &*(*rel).rd_rel) };
    let name = name_of(relid);
    let kind = form.relkind as u8;
    if kind == pg_sys::RELKIND_PARTITIONED_TABLE || form.relispartition {
        return Some(format!(
            "{name} is partitioned or a partition: a fenced table is one plain table"
        ));
    }
    if kind != pg_sys::RELKIND_RELATION {
        return Some(format!("{name} is not a table"));
    }
    match form.relpersistence as u8 {
        pg_sys::RELPERSISTENCE_UNLOGGED => {
            return Some(format!(
                "{name} is unlogged: its marks would not survive a crash"
            ));
        }
        pg_sys::RELPERSISTENCE_TEMP => {
            return Some(format!(
                "{name} is temporary: its marks would end with the session"
            ));
        }
        _ => {}
    }
    // SAFETY: inside the caller's transaction.
    if unsafe { inherits(BY_CHILD, relid) || inherits(BY_PARENT, relid) } {
        return Some(format!(
            "{name} inherits from or is inherited by another table: rows of a child are written through its parent without a token"
        ));
    }
    let [scope, token, state] = columns;
    if scope == token || scope == state || token == state {
        return Some("the scope, token and state columns must be three different columns".into());
    }
    // SAFETY: the open relation's descriptor, not copied nor freed.
    let desc = unsafe { pgrx::PgTupleDesc::from_pg_unchecked((*rel).rd_att) };
    let mut scope_att = 0;
    for (role, column, texts) in [
        ("scope", scope, true),
        ("token", token, true),
        ("state", state, false),
    ] {
        let Some(att) = attribute(&desc, column) else {
            return Some(format!("{name} has no column {column:?}"));
        };
        let ok = if texts {
            att.atttypid == pg_sys::TEXTOID || att.atttypid == pg_sys::VARCHAROID
        } else {
            att.atttypid == pg_sys::BYTEAOID
        };
        if !ok {
            return Some(format!(
                "the {role} column {column:?} must be {}",
                if texts { "text or varchar" } else { "bytea" }
            ));
        }
        if att.attgenerated != 0 {
            return Some(format!("the {role} column {column:?} is generated"));
        }
        if role == "scope" {
            // SAFETY: a syscache lookup of the column's collation.
            if !unsafe { pg_sys::get_collation_isdeterministic(att.attcollation) } {
                return Some(format!(
                    "the scope column {column:?} has a nondeterministic collation: two spellings of one scope would be two high-water marks"
                ));
            }
            scope_att = att.attnum;
        }
    }
    // SAFETY: the relation's index list (a copy) and each index's
    // pg_index row, released before returning.
    let keyed = unsafe { has_scope_key(rel, scope_att) };
    if !keyed {
        return Some(format!(
            "{name} needs a primary key or unique index on {scope:?} alone, not deferrable, with a deterministic collation"
        ));
    }
    None
}

/// A valid, immediate unique index on `attnum` alone, no expression or
/// predicate, with a deterministic collation.
///
/// # Safety
/// `rel` must be an open relation.
unsafe fn has_scope_key(rel: pg_sys::Relation, attnum: i16) -> bool {
    // SAFETY: per the caller; syscache tuples released before the next.
    unsafe {
        let list = pg_sys::RelationGetIndexList(rel);
        let n = if list.is_null() { 0 } else { (*list).length };
        let mut found = false;
        for i in 0..usize::try_from(n).unwrap_or(0) {
            let index = (*(*list).elements.add(i)).oid_value;
            let tuple = pg_sys::SearchSysCache1(
                pg_sys::SysCacheIdentifier::INDEXRELID as c_int,
                pg_sys::Datum::from(index),
            );
            if tuple.is_null() {
                continue;
            }
            let form = &*pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_index>(tuple);
            let mut null = false;
            let plain = {
                pg_sys::SysCacheGetAttr(
                    pg_sys::SysCacheIdentifier::INDEXRELID as c_int,
                    tuple,
                    pg_sys::Anum_pg_index_indexprs as pg_sys::AttrNumber,
                    &mut null,
                );
                let no_exprs = null;
                pg_sys::SysCacheGetAttr(
                    pg_sys::SysCacheIdentifier::INDEXRELID as c_int,
                    tuple,
                    pg_sys::Anum_pg_index_indpred as pg_sys::AttrNumber,
                    &mut null,
                );
                no_exprs && null
            };
            let collation = {
                let datum = pg_sys::SysCacheGetAttr(
                    pg_sys::SysCacheIdentifier::INDEXRELID as c_int,
                    tuple,
                    pg_sys::Anum_pg_index_indcollation as pg_sys::AttrNumber,
                    &mut null,
                );
                if null {
                    None
                } else {
                    let vector = datum.cast_mut_ptr::<pg_sys::oidvector>();
                    ((*vector).dim1 >= 1).then(|| *(*vector).values.as_ptr())
                }
            };
            let keys = form
                .indkey
                .values
                .as_slice(form.indkey.dim1.max(0) as usize);
            let fits = form.indisunique
                && form.indimmediate
                && form.indisvalid
                && form.indisready
                && form.indislive
                && form.indnkeyatts == 1
                && keys.first() == Some(&attnum)
                && plain
                && collation.is_some_and(|c| pg_sys::get_collation_isdeterministic(c));
            pg_sys::ReleaseSysCache(tuple);
            if fits {
                found = true;
                break;
            }
        }
        if !list.is_null() {
            pg_sys::list_free(list);
        }
        found
    }
}

/// `fencecheck.<name>()`'s OID is `foid`.
fn is_ours(foid: pg_sys::Oid, name: &str) -> bool {
    // SAFETY: syscache lookups; NULL/invalid for a function that is gone.
    unsafe {
        let schema = pg_sys::get_namespace_oid(c"fencecheck".as_ptr(), true);
        if schema == pg_sys::Oid::INVALID || pg_sys::get_func_namespace(foid) != schema {
            return false;
        }
        let fname = pg_sys::get_func_name(foid);
        !fname.is_null() && CStr::from_ptr(fname).to_bytes() == name.as_bytes()
    }
}

/// What is wrong with the triggers of the fenced table `rel` registered as
/// `reg`, or `None`. With `complete`, every trigger fence_protect makes
/// must be there (a restore creates them one by one, so the DDL guard
/// checks only what is present); with `just`, only that one is compared
/// with what fence_protect makes (fence_protect replaces them one at a
/// time). The ordering rule always holds.
///
/// # Safety
/// `rel` must be an open relation.
pub(crate) unsafe fn trigger_trouble(
    rel: pg_sys::Relation,
    reg: &Registered,
    complete: bool,
    just: Option<&str>,
) -> Option<String> {
    // SAFETY: the open relation's trigger descriptor, read only.
    let triggers: &[pg_sys::Trigger] = unsafe {
        let desc = (*rel).trigdesc;
        if desc.is_null() {
            &[]
        } else {
            std::slice::from_raw_parts(
                (*desc).triggers,
                usize::try_from((*desc).numtriggers).unwrap_or(0),
            )
        }
    };
    // SAFETY: an open relation.
    let name = name_of(unsafe { (*rel).rd_id });
    let cstr = |p: *const c_char| -> &[u8] {
        if p.is_null() {
            b""
        } else {
            // SAFETY: the trigger descriptor's NUL-terminated strings.
            unsafe { CStr::from_ptr(p) }.to_bytes()
        }
    };
    let args_of = |t: &pg_sys::Trigger| -> Vec<&[u8]> {
        (0..usize::try_from(t.tgnargs).unwrap_or(0))
            // SAFETY: tgargs holds tgnargs strings.
            .map(|i| cstr(unsafe { *t.tgargs.add(i) }))
            .collect()
    };
    let wanted = [
        (
            ROW_TRIGGER,
            "row_trigger",
            ROW | BEFORE | INSERT | DELETE | UPDATE,
            true,
        ),
        (INSERTED_TRIGGER, "inserted_trigger", ROW | INSERT, true),
        (
            TRUNCATE_TRIGGER,
            "truncate_trigger",
            BEFORE | TRUNCATE,
            false,
        ),
    ];
    let registered: Vec<&[u8]> = reg.args().iter().map(|a| a.as_bytes()).collect();
    for (tgname, function, tgtype, with_args) in wanted {
        if just.is_some_and(|j| j != tgname) {
            continue;
        }
        let Some(t) = triggers
            .iter()
            .find(|t| cstr(t.tgname) == tgname.as_bytes())
        else {
            if complete {
                return Some(format!("{name}: its trigger {tgname} is missing"));
            }
            continue;
        };
        let args_ok = if with_args {
            args_of(t) == registered
        } else {
            t.tgnargs == 0
        };
        let enabled = matches!(t.tgenabled as u8, b'O' | b'A');
        if !is_ours(t.tgfoid, function)
            || t.tgtype != tgtype
            || !enabled
            || !t.tgqual.is_null()
            || t.tgnattr != 0
            || !args_ok
        {
            return Some(format!(
                "{name}: its trigger {tgname} is not the one fence_protect made (disabled, conditional, or another function, event or argument list)"
            ));
        }
    }
    for t in triggers {
        let tname = cstr(t.tgname);
        if just.is_some_and(|j| j.as_bytes() != tname) {
            continue;
        }
        let named_ours = [ROW_TRIGGER, INSERTED_TRIGGER, TRUNCATE_TRIGGER]
            .iter()
            .any(|n| n.as_bytes() == tname);
        let runs_ours = ["row_trigger", "inserted_trigger", "truncate_trigger"]
            .iter()
            .any(|f| is_ours(t.tgfoid, f));
        if runs_ours && !named_ours {
            return Some(format!(
                "{name}: trigger {} runs a fencecheck trigger function but is not one fence_protect made",
                String::from_utf8_lossy(tname)
            ));
        }
    }
    let late = triggers.iter().find(|t| {
        t.tgenabled as u8 != b'D'
            && t.tgtype & (ROW | BEFORE) == ROW | BEFORE
            && t.tgtype & (INSERT | DELETE | UPDATE) != 0
            && cstr(t.tgname) > ROW_TRIGGER.as_bytes()
    });
    late.map(|t| {
        format!(
            "{name}: BEFORE trigger {} fires after {ROW_TRIGGER} and could change a row the fence approved: give it a name that sorts before {ROW_TRIGGER}",
            String::from_utf8_lossy(cstr(t.tgname))
        )
    })
}

/// Why the table `relid` is not fenced soundly now, or `None`.
pub(crate) fn unsound(relid: pg_sys::Oid) -> Result<Option<String>, Raise> {
    let Some(reg) = registered(relid)? else {
        return Ok(Some(format!(
            "{} is not fenced by fence_protect",
            name_of(relid)
        )));
    };
    let Some(open) = Open::relation(relid) else {
        return Ok(Some(format!("{} does not exist", name_of(relid))));
    };
    // SAFETY: an open relation.
    Ok(unsafe {
        unfit(open.0, [&reg.scope, &reg.token, &reg.state])
            .or_else(|| trigger_trouble(open.0, &reg, true, None))
    })
}

/// `fencecheck.unfit(tbl, scope_column, token_column, state_column)`.
pub(crate) fn unfit_of(relid: pg_sys::Oid, columns: [&str; 3]) -> Option<String> {
    match Open::relation(relid) {
        // SAFETY: an open relation.
        Some(open) => unsafe { unfit(open.0, columns) },
        None => Some(format!("{} does not exist", name_of(relid))),
    }
}

/// `fencecheck.trigger_trouble(tbl, complete, just)`.
pub(crate) fn trigger_trouble_of(
    relid: pg_sys::Oid,
    complete: bool,
    just: Option<&str>,
) -> Result<Option<String>, Raise> {
    let Some(reg) = registered(relid)? else {
        return Ok(Some(format!(
            "{} is not fenced by fence_protect",
            name_of(relid)
        )));
    };
    Ok(match Open::relation(relid) {
        // SAFETY: an open relation.
        Some(open) => unsafe { trigger_trouble(open.0, &reg, complete, just) },
        None => Some(format!("{} does not exist", name_of(relid))),
    })
}
