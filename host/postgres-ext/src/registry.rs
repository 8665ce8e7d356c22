//! What the fenced-table triggers trust, checked once per backend and table
//! and then kept until PostgreSQL says the table changed.
//!
//! - [`fenced`]: the table is in `fencecheck.protected` and sound now
//!   (`fencecheck.unsound` in `sql/protect.sql`: its columns, its unique
//!   key, no inheritance, the triggers fence_protect made and nothing after
//!   them). The answer is cached per table; a relcache invalidation of the
//!   table (any ALTER TABLE, CREATE/DROP TRIGGER or INDEX on it, from any
//!   backend) drops it, so the next row asks again. The hot path (a fenced
//!   UPDATE) runs no SQL of its own.
//! - [`scope_keys`]: the signing keys a scope requires, from a per-backend
//!   copy of `fencecheck.keys`, dropped the same way: a statement trigger on
//!   that table (`keys_changed`) invalidates it in every backend, and waits
//!   for the fenced writes in flight.
//! - [`as_owner`]: statements on the extension's own tables run as its
//!   owner, never as the writer.
#![allow(unsafe_code)]

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::{CString, c_int};

use pgrx::pg_sys;
use pgrx::spi::{Spi, SpiClient};

use crate::soundness;

use crate::sqlstate::{Raise, SqlState, hint};
use fencecheck::GrantKey;

/// A fenced table as its triggers use it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Fenced {
    /// The extension's owner: tombstones and keys are read and written as it.
    pub(crate) owner: pg_sys::Oid,
    /// Attribute numbers of the scope, token and state columns.
    pub(crate) scope: c_int,
    pub(crate) token: c_int,
    pub(crate) state: c_int,
    /// `true` under `allow-equal`.
    pub(crate) allow_equal: bool,
}

impl Fenced {
    /// The policy argument, as the component takes it.
    pub(crate) fn policy(&self) -> &'static [u8] {
        if self.allow_equal {
            b"allow-equal"
        } else {
            b"strict"
        }
    }

    /// Every firing: the three columns still have the types the trigger
    /// reads them as (a cached check would be as good, since a type change
    /// invalidates the cache; this costs three array reads and never trusts
    /// a cache to keep a datum from being read through the wrong type).
    ///
    /// # Safety
    /// `desc` must be the firing relation's tuple descriptor.
    pub(crate) unsafe fn check_types(&self, desc: pg_sys::TupleDesc) -> Result<(), Raise> {
        // SAFETY: per the caller; from_pg_unchecked neither copies nor frees.
        let desc = unsafe { pgrx::PgTupleDesc::from_pg_unchecked(desc) };
        let column = |attnum: c_int, texts: bool| {
            let att = usize::try_from(attnum - 1)
                .ok()
                .and_then(|i| desc.get(i))
                .filter(|a| !a.attisdropped)?;
            let ok = if texts {
                att.atttypid == pg_sys::TEXTOID || att.atttypid == pg_sys::VARCHAROID
            } else {
                att.atttypid == pg_sys::BYTEAOID
            };
            ok.then_some(())
        };
        for (attnum, texts, what) in [
            (self.scope, true, "scope"),
            (self.token, true, "token"),
            (self.state, false, "state"),
        ] {
            column(attnum, texts).ok_or_else(|| {
                unsound(format!(
                    "the {what} column is no longer of the type fence_protect checked"
                ))
            })?;
        }
        Ok(())
    }
}

pub(crate) fn unsound(detail: impl std::fmt::Display) -> Raise {
    Raise::new(SqlState::UnsoundFence, detail).with_hint(hint::REFENCE)
}

/// One signing key of `fencecheck.keys`.
struct StoredKey {
    prefix: String,
    key: GrantKey,
}

thread_local! {
    /// Tables found sound, by relation.
    static FENCED: RefCell<HashMap<pg_sys::Oid, Fenced>> = RefCell::new(HashMap::new());
    /// This backend's copy of `fencecheck.keys` (None: not loaded).
    static KEYS: RefCell<Option<Vec<StoredKey>>> = const { RefCell::new(None) };
    /// `fencecheck.keys`'s relation, once known.
    static KEYS_RELID: Cell<pg_sys::Oid> = const { Cell::new(pg_sys::Oid::INVALID) };
    /// Counts invalidations of the relation being looked up ([`FILLING`]),
    /// of `fencecheck.keys`, or of everything: an entry computed while one
    /// arrived is used once, not kept.
    static GENERATION: Cell<u64> = const { Cell::new(0) };
    /// The relation [`fenced`] is checking now.
    static FILLING: Cell<pg_sys::Oid> = const { Cell::new(pg_sys::Oid::INVALID) };
    /// An invalidation arrived while a cache was borrowed: drop everything.
    static FLUSH: Cell<bool> = const { Cell::new(false) };
    static REGISTERED: Cell<bool> = const { Cell::new(false) };
}

/// PostgreSQL's relcache invalidation callback: `relid` changed (or, for
/// `InvalidOid`, anything may have).
unsafe extern "C-unwind" fn relation_changed(_arg: pg_sys::Datum, relid: pg_sys::Oid) {
    let all = relid == pg_sys::Oid::INVALID;
    if all || relid == FILLING.with(Cell::get) || relid == KEYS_RELID.with(Cell::get) {
        GENERATION.with(|g| g.set(g.get().wrapping_add(1)));
    }
    let dropped = FENCED.with(|f| match f.try_borrow_mut() {
        Ok(mut f) => {
            if all {
                f.clear();
            } else {
                f.remove(&relid);
            }
            true
        }
        Err(_) => false,
    });
    let keys = all || KEYS_RELID.with(Cell::get) == relid;
    let keys_dropped = !keys
        || KEYS.with(|k| match k.try_borrow_mut() {
            Ok(mut k) => {
                *k = None;
                true
            }
            Err(_) => false,
        });
    if !(dropped && keys_dropped) {
        FLUSH.with(|f| f.set(true));
    }
}

/// Register [`relation_changed`] once per backend, and apply a pending
/// flush.
fn prepare() {
    if !REGISTERED.with(Cell::get) {
        // SAFETY: a plain registration, once per backend (PostgreSQL keeps
        // at most ten); the callback only touches this thread's caches.
        unsafe {
            pg_sys::CacheRegisterRelcacheCallback(Some(relation_changed), pg_sys::Datum::from(0));
        }
        REGISTERED.with(|r| r.set(true));
    }
    if FLUSH.with(|f| f.replace(false)) {
        FENCED.with(|f| f.borrow_mut().clear());
        KEYS.with(|k| *k.borrow_mut() = None);
    }
}

/// The fenced table `relid` if this backend found it sound and nothing has
/// invalidated that since (the row trigger's hot path: no SQL, no catalog
/// read).
pub(crate) fn cached(relid: pg_sys::Oid) -> Option<Fenced> {
    prepare();
    FENCED.with(|f| f.borrow().get(&relid).copied())
}

/// The fenced table `relid`, whose firing trigger has `args`, checked as
/// sound (5F016 otherwise).
///
/// # Safety
/// `desc` must be `relid`'s tuple descriptor.
pub(crate) unsafe fn fenced(
    relid: pg_sys::Oid,
    desc: pg_sys::TupleDesc,
    args: &[&str],
) -> Result<Fenced, Raise> {
    prepare();
    if let Some(fenced) = FENCED.with(|f| f.borrow().get(&relid).copied()) {
        return Ok(fenced);
    }
    let generation = GENERATION.with(Cell::get);
    FILLING.with(|f| f.set(relid));
    let checked =
        soundness::unsound(relid).and_then(|reason| Ok((reason, soundness::extension_owner()?)));
    FILLING.with(|f| f.set(pg_sys::Oid::INVALID));
    let (reason, owner) = checked?;
    if let Some(reason) = reason {
        return Err(unsound(reason));
    }
    let [scope, token, state, policy] = args else {
        return Err(unsound("the trigger does not take 4 arguments"));
    };
    let attnum = |name: &str| -> Result<c_int, Raise> {
        let c = CString::new(name).map_err(|_| unsound("a column name holds NUL"))?;
        // SAFETY: a valid descriptor (per the caller) and a C string.
        let n = unsafe { pg_sys::SPI_fnumber(desc, c.as_ptr()) };
        if n <= 0 {
            return Err(unsound(format!("no column {name:?}")));
        }
        Ok(n)
    };
    let fenced = Fenced {
        owner,
        scope: attnum(scope)?,
        token: attnum(token)?,
        state: attnum(state)?,
        allow_equal: *policy == "allow-equal",
    };
    if GENERATION.with(Cell::get) == generation {
        FENCED.with(|f| f.borrow_mut().insert(relid, fenced));
    }
    Ok(fenced)
}

/// Runs `f` as `owner` (the extension's owner), then switches back, also
/// when `f` unwinds or the transaction aborts.
pub(crate) fn as_owner<T>(
    owner: pg_sys::Oid,
    f: impl FnOnce(&mut SpiClient<'_>) -> Result<T, Raise>,
) -> Result<T, Raise> {
    Spi::connect_mut(|client| {
        struct Restore(pg_sys::Oid, c_int);
        impl Drop for Restore {
            fn drop(&mut self) {
                // SAFETY: restores what GetUserIdAndSecContext returned.
                unsafe { pg_sys::SetUserIdAndSecContext(self.0, self.1) }
            }
        }
        let mut user = pg_sys::Oid::INVALID;
        let mut context: c_int = 0;
        // SAFETY: plain reads and a transient, restored switch (PostgreSQL
        // also restores it if the transaction aborts).
        unsafe {
            pg_sys::GetUserIdAndSecContext(&mut user, &mut context);
            pg_sys::SetUserIdAndSecContext(
                owner,
                context
                    | pg_sys::SECURITY_LOCAL_USERID_CHANGE as c_int
                    | pg_sys::SECURITY_RESTRICTED_OPERATION as c_int,
            );
        }
        let _restore = Restore(user, context);
        f(client)
    })
}

/// The keys `scope` requires signed tokens with: those of the longest
/// `fencecheck.keys` prefix that starts it (as `host/postgres/keys.sql` and
/// `host/sqlite/keys.sql` choose), `None` if no prefix does. From this
/// backend's copy of the table, read by the extension itself: writers
/// never see a secret.
pub(crate) fn scope_keys(scope: &str) -> Result<Option<Vec<GrantKey>>, Raise> {
    prepare();
    let pick = |keys: &[StoredKey]| {
        let longest = keys
            .iter()
            .filter(|k| scope.starts_with(k.prefix.as_str()))
            .map(|k| k.prefix.len())
            .max()?;
        Some(
            keys.iter()
                .filter(|k| k.prefix.len() == longest && scope.starts_with(k.prefix.as_str()))
                .map(|k| k.key.clone())
                .collect::<Vec<_>>(),
        )
    };
    if let Some(found) = KEYS.with(|k| k.borrow().as_deref().map(pick)) {
        return Ok(found);
    }
    let generation = GENERATION.with(Cell::get);
    let (relid, mut loaded) = load_keys()?;
    loaded.sort_by_key(|k| k.key.key_id);
    KEYS_RELID.with(|r| r.set(relid));
    let found = pick(&loaded);
    if GENERATION.with(Cell::get) == generation {
        KEYS.with(|k| *k.borrow_mut() = Some(loaded));
    }
    Ok(found)
}

/// `fencecheck.keys`'s relation and rows, read through the C API (the
/// extension's own table: no privilege applies, and no SQL runs).
fn load_keys() -> Result<(pg_sys::Oid, Vec<StoredKey>), Raise> {
    // SAFETY: the keys table's columns are (scope_prefix text, key_id
    // int8, secret bytea), all NOT NULL.
    unsafe {
        soundness::scan_own(c"keys", |tuple, desc| {
            let (Some(prefix), Some(id), Some(secret)) = (
                soundness::column::<String>(tuple, desc, 1),
                soundness::column::<i64>(tuple, desc, 2),
                soundness::column::<Vec<u8>>(tuple, desc, 3),
            ) else {
                return Err(Raise::new(
                    SqlState::InvalidKeys,
                    "fencecheck.keys holds a NULL",
                ));
            };
            let key_id = u32::try_from(id).map_err(|_| {
                Raise::new(
                    SqlState::InvalidKeys,
                    format!("fencecheck.keys: key id {id} is not a u32"),
                )
            })?;
            Ok(Some(StoredKey {
                prefix,
                key: GrantKey { key_id, secret },
            }))
        })
    }
}
