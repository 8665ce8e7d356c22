//! The lease authority's decisions over a sequence of acquire, renew,
//! release, restore and damage steps threading one lease-state slot: the
//! native reference and the component over both transports answer the same
//! and never trap; each answer is what docs/design.md §5 says (a model
//! written from the rules, on the decoded state); every state written
//! decodes and is canonical; a new grant's token is above the lock's stored
//! epoch and counter, so grants only ever increase, and the stored epoch and
//! counter never go back.
//!
//! Input: `flags u8` (bit 0: a starting state follows as a blob; bit 1: make
//! the slot's frame intact before each action), then up to 40 steps, `op u8`
//! modulo 5:
//! - 0 acquire: `lock string | lease-id string | authority u64 |
//!   epoch-floor u64 | now u64 | ttl u64`
//! - 1 renew: `lease-id string | token | now u64 | ttl u64`
//! - 2 release: `lease-id string | token`
//! - 3 restore
//! - 4 a damage step (lib.rs)
//!
//! where `token` is `sel u8`, then, if `sel` is even, `authority u64 |
//! epoch u64 | counter u64`; an odd `sel` uses the last token granted.
#![no_main]

use fencecheck::{
    Acquire, AcquireRequest, LeaseError, LeaseInfo, Release, ReleaseRequest, Renew, RenewRequest,
    Token,
};
use fencecheck_fuzz::{
    Damage, LeaseAction, LeaseExpect, Runtimes, Src, encode_lease, fix_frame, model_lease,
    with_runtimes,
};
use libfuzzer_sys::fuzz_target;

fn token(src: &mut Src<'_>, last: Token) -> Token {
    if src.u8() & 1 == 1 {
        last
    } else {
        Token::new(src.u64(), src.u64(), src.u64())
    }
}

/// A written state: it decodes, on every runtime, to a canonical encoding.
fn written(rt: &mut Runtimes, state: &[u8]) -> LeaseInfo {
    let info = rt
        .all("inspect-lease", |c| c.inspect_lease(state))
        .unwrap_or_else(|e| panic!("a written lease state does not decode: {e}"));
    assert_eq!(
        encode_lease(&info),
        state,
        "a written lease state is not canonical"
    );
    info
}

fn run(rt: &mut Runtimes, src: &mut Src<'_>) {
    let flags = src.u8();
    let mut slot = (flags & 1 != 0).then(|| src.blob().to_vec());
    let mut last = Token::default();
    // The highest (epoch, counter) this run has seen stored since the last
    // damage step: grants and stored counters must stay above it.
    let mut floor: Option<(u64, u64)> = None;
    for _ in 0..40 {
        if src.is_empty() {
            break;
        }
        let action = match src.u8() % 5 {
            0 => LeaseAction::Acquire(AcquireRequest {
                lock: src.string(),
                lease_id: src.string(),
                authority: src.u64(),
                epoch_floor: src.u64(),
                now: src.u64(),
                ttl: src.u64(),
            }),
            1 => LeaseAction::Renew(RenewRequest {
                lease_id: src.string(),
                token: token(src, last),
                now: src.u64(),
                ttl: src.u64(),
            }),
            2 => LeaseAction::Release(ReleaseRequest {
                lease_id: src.string(),
                token: token(src, last),
            }),
            3 => LeaseAction::Restore,
            _ => {
                Damage::read(src).apply(&mut slot);
                floor = None;
                continue;
            }
        };
        if flags & 2 != 0
            && let Some(state) = slot.as_mut()
        {
            fix_frame(state);
        }
        let state = slot.as_deref();
        let old: Result<Option<LeaseInfo>, LeaseError> = state
            .map(|s| rt.all("inspect-lease", |c| c.inspect_lease(s)))
            .transpose();
        if let Ok(Some(old)) = &old {
            let stored = (old.epoch, old.counter);
            assert!(
                floor.is_none_or(|f| stored >= f),
                "the stored counter went back"
            );
            floor = Some(stored);
        }
        let expected = model_lease(
            old.as_ref().map(Option::as_ref).map_err(Clone::clone),
            &action,
        );
        let (actual, new) = match &action {
            LeaseAction::Acquire(r) => match rt.all("acquire", |c| c.acquire(state, r)) {
                Ok(Acquire::Acquired {
                    token,
                    expires_at,
                    state,
                }) => {
                    let info = written(rt, &state);
                    let retry = matches!(&old, Ok(Some(LeaseInfo { holder: Some(h), .. }))
                        if h.lease_id == r.lease_id && r.now < h.expires_at);
                    if !retry {
                        // A new grant is above everything the lock issued.
                        if let Ok(Some(old)) = &old {
                            assert!(
                                (token.epoch, token.counter) > (old.epoch, old.counter),
                                "granted {token:?} not above the stored ({}, {})",
                                old.epoch,
                                old.counter
                            );
                        }
                        assert!(
                            (token.epoch, token.counter) > (r.epoch_floor, 0),
                            "granted {token:?} below the epoch floor {}",
                            r.epoch_floor
                        );
                    }
                    last = token;
                    let e = LeaseExpect {
                        outcome: "acquired",
                        token: Some(token),
                        expires_at: Some(expires_at),
                        holder: None,
                        state: Some(info),
                    };
                    (Ok(e), Some(state))
                }
                Ok(Acquire::Busy { holder, expires_at }) => {
                    let e = LeaseExpect {
                        outcome: "busy",
                        token: None,
                        expires_at: Some(expires_at),
                        holder: Some(holder),
                        state: None,
                    };
                    (Ok(e), None)
                }
                Err(e) => (Err(e), None),
            },
            LeaseAction::Renew(r) => match rt.all("renew", |c| c.renew(state, r)) {
                Ok(Renew::Renewed { expires_at, state }) => {
                    let info = written(rt, &state);
                    let e = LeaseExpect {
                        outcome: "renewed",
                        token: None,
                        expires_at: Some(expires_at),
                        holder: None,
                        state: Some(info),
                    };
                    (Ok(e), Some(state))
                }
                Ok(Renew::Lost) => (Ok(outcome("lost")), None),
                Err(e) => (Err(e), None),
            },
            LeaseAction::Release(r) => match rt.all("release", |c| c.release(state, r)) {
                Ok(Release::Released { state }) => {
                    let info = written(rt, &state);
                    let e = LeaseExpect {
                        state: Some(info),
                        ..outcome("released")
                    };
                    (Ok(e), Some(state))
                }
                Ok(Release::NotOwner) => (Ok(outcome("not-owner")), None),
                Err(e) => (Err(e), None),
            },
            LeaseAction::Restore => match rt.all("restore", |c| c.restore(state)) {
                Ok((epoch, state)) => {
                    let info = written(rt, &state);
                    let e = LeaseExpect {
                        token: Some(Token::new(info.authority, epoch, 0)),
                        state: Some(info),
                        ..outcome("restored")
                    };
                    (Ok(e), Some(state))
                }
                Err(e) => (Err(e), None),
            },
        };
        assert_eq!(actual, expected, "{action:?} on {old:?}");
        if let Some(new) = new {
            slot = Some(new);
        }
    }
}

fn outcome(name: &'static str) -> LeaseExpect {
    LeaseExpect {
        outcome: name,
        token: None,
        expires_at: None,
        holder: None,
        state: None,
    }
}

fuzz_target!(|data: &[u8]| {
    with_runtimes(|rt| run(rt, &mut Src(data)));
});
