//! Rolling upgrades: the released 0.1.0 component (`tests/fixtures/`, never
//! rebuilt) next to this tree's build and the native reference.
//!
//! Today the tree's component is byte for byte the fixture, so these tests
//! pass trivially; they exist to catch the first change to `guest/` that
//! decides differently on states 0.1.0 wrote, or that 0.1.0 cannot safely
//! share a database with.

use anyhow::{Context, Result, bail, ensure};
use fencecheck::vectors::{load, run};
use fencecheck::{
    AcquireRequest, CheckError, Checker, Decision, Error, FORMAT_VERSION, GrantKey, Instance,
    LeaseError, Native, Policy, ReleaseRequest, RenewRequest, Request, Token, Transport,
};
use fencecheck_sqlite::{Fenced, Rejection, fenced_write, install, publish, stage};
use fencecheck_tests::upgrade::{
    FIXTURE_SHA256, crc32c, fixture_path, newer_format, old_runtime, pack,
};
use fencecheck_tests::{runtime, vector_files};
use proptest::prelude::*;
use sha2::{Digest, Sha256};

/// The fixture is the released component: its SHA-256 is the one recorded
/// in tests/fixtures/README.md, so nobody overwrites it with a rebuild by
/// accident; and it loads, over the core transport.
#[test]
fn fixture_is_the_released_component() -> Result<()> {
    let bytes = std::fs::read(fixture_path()).context("reading the fixture")?;
    let digest = hex(&Sha256::digest(&bytes));
    ensure!(
        digest == FIXTURE_SHA256,
        "tests/fixtures/fencecheck-0.1.0.wasm was changed (SHA-256 {digest}); \
         restore it from git history, it stands for the released 0.1.0"
    );
    ensure!(old_runtime()?.transport() == Transport::Core);
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Every wasm way of deciding: the 0.1.0 fixture and this tree's component,
/// each over the core transport and the component API.
fn instances() -> Result<Vec<(&'static str, Instance)>> {
    let old = old_runtime()?;
    let new = runtime()?;
    Ok(vec![
        ("0.1.0/core", old.instance()?),
        (
            "0.1.0/component",
            old.with_component_transport().instance()?,
        ),
        ("tree/core", new.instance()?),
        ("tree/component", new.with_component_transport().instance()?),
    ])
}

/// `items` decided one by one, as a batch (packed and typed) and as raw
/// packed bytes by every instance: all must equal the native reference.
fn same_batches(
    instances: &mut [(&'static str, Instance)],
    items: &[(Option<&[u8]>, &Request)],
) -> Result<()> {
    let expected = items
        .iter()
        .map(|(s, r)| Native.check(*s, r))
        .collect::<Result<Vec<_>, _>>()?;
    ensure!(Native.check_batch(items)? == expected, "native batch");
    let packed = pack(items);
    let native_packed = fencecheck_guest::check_packed(&packed);
    for (name, guest) in instances.iter_mut() {
        ensure!(
            guest.check_batch(items)? == expected,
            "{name}: check-packed batch"
        );
        ensure!(
            guest.check_batch_typed(items)? == expected,
            "{name}: check-batch"
        );
        let raw = guest
            .check_packed_raw(&packed)?
            .map_err(|fencecheck::BatchError::Malformed| "malformed");
        let native = native_packed
            .as_deref()
            .map(<[u8]>::to_vec)
            .map_err(|_| "malformed");
        ensure!(raw == native, "{name}: raw check-packed bytes");
    }
    Ok(())
}

fn fail(e: impl std::fmt::Display) -> TestCaseError {
    TestCaseError::fail(format!("{e:#}"))
}

fn token() -> impl Strategy<Value = Token> {
    (
        prop_oneof![8 => Just(0u64), 1 => Just(1u64), 1 => Just(u64::MAX)],
        prop_oneof![9 => (0u64..3, 0u64..6), 1 => (Just(u64::MAX), Just(u64::MAX))],
    )
        .prop_map(|(authority, (epoch, counter))| Token::new(authority, epoch, counter))
}

fn request() -> impl Strategy<Value = Request> {
    (
        prop_oneof![
            8 => Just("report/july".to_string()),
            1 => Just("rapport/é".to_string()),
            1 => Just(String::new()),
        ],
        token(),
        prop_oneof![Just(Policy::Strict), Just(Policy::AllowEqual)],
        prop_oneof![4 => Just(None), 6 => "op[0-9]{1,2}".prop_map(Some), 1 => Just(Some(String::new()))],
        prop_oneof![3 => Just(None), 1 => (0u64..6).prop_map(Some)],
    )
        .prop_map(|(scope, token, policy, op_id, expected_version)| Request {
            scope,
            token,
            policy,
            op_id,
            expected_version,
            signature: None,
        })
}

/// One lease call of a random sequence.
#[derive(Clone, Debug)]
enum LeaseCall {
    Acquire(AcquireRequest),
    Renew(RenewRequest),
    Release(ReleaseRequest),
    Restore,
}

fn lease_call() -> impl Strategy<Value = LeaseCall> {
    let lease_id = prop_oneof![
        Just("a".to_string()),
        Just("b".to_string()),
        Just(String::new())
    ];
    let small_token = (0u64..3, 0u64..6).prop_map(|(e, c)| Token::new(0, e, c));
    prop_oneof![
        4 => (prop_oneof![5 => Just("lock".to_string()), 1 => Just("other".to_string())],
              lease_id.clone(), 0u64..2, 0u64..3, 0u64..40, 0u64..20)
            .prop_map(|(lock, lease_id, authority, epoch_floor, now, ttl)| {
                LeaseCall::Acquire(AcquireRequest { lock, lease_id, authority, epoch_floor, now, ttl })
            }),
        2 => (lease_id.clone(), small_token.clone(), 0u64..40, 0u64..20)
            .prop_map(|(lease_id, token, now, ttl)| LeaseCall::Renew(RenewRequest { lease_id, token, now, ttl })),
        2 => (lease_id, small_token)
            .prop_map(|(lease_id, token)| LeaseCall::Release(ReleaseRequest { lease_id, token })),
        1 => Just(LeaseCall::Restore),
    ]
}

/// A lease call's outcome and the new state it carries, in one comparable form.
fn lease_step(
    checker: &mut dyn Checker,
    state: Option<&[u8]>,
    call: &LeaseCall,
) -> Result<(String, Option<Vec<u8>>), fencecheck::Error> {
    use fencecheck::{Acquire, Release, Renew};
    Ok(match call {
        LeaseCall::Acquire(r) => {
            let out = checker.acquire(state, r)?;
            let next = match &out {
                Ok(Acquire::Acquired { state, .. }) => Some(state.clone()),
                _ => None,
            };
            (format!("{out:?}"), next)
        }
        LeaseCall::Renew(r) => {
            let out = checker.renew(state, r)?;
            let next = match &out {
                Ok(Renew::Renewed { state, .. }) => Some(state.clone()),
                _ => None,
            };
            (format!("{out:?}"), next)
        }
        LeaseCall::Release(r) => {
            let out = checker.release(state, r)?;
            let next = match &out {
                Ok(Release::Released { state }) => Some(state.clone()),
                _ => None,
            };
            (format!("{out:?}"), next)
        }
        LeaseCall::Restore => {
            let out = checker.restore(state)?;
            let next = out.as_ref().ok().map(|(_, s)| s.clone());
            (format!("{out:?}"), next)
        }
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// States written by the 0.1.0 component (random fence sequences) are
    /// decided identically, outcome and new state bytes, by 0.1.0 and this
    /// tree over both transports and by the native reference, one by one,
    /// as batches (check-packed, check-batch, raw packed bytes), and
    /// inspected identically. Catches a future build that reads old states
    /// differently.
    #[test]
    fn states_the_old_component_wrote_decide_identically(
        requests in prop::collection::vec(request(), 1..40),
    ) {
        let mut all = instances().map_err(fail)?;
        let mut state: Option<Vec<u8>> = None;
        let mut pairs: Vec<(Option<Vec<u8>>, Request)> = Vec::new();
        for request in &requests {
            let expected = Native.check(state.as_deref(), request).map_err(fail)?;
            for (name, guest) in all.iter_mut() {
                let got = guest.check(state.as_deref(), request).map_err(fail)?;
                prop_assert_eq!(&got, &expected, "{}", name);
            }
            if let Some(s) = &state {
                let info = Native.inspect(s).map_err(fail)?;
                for (name, guest) in all.iter_mut() {
                    prop_assert_eq!(&guest.inspect(s).map_err(fail)?, &info, "{} inspect", name);
                }
            }
            pairs.push((state.clone(), request.clone()));
            // The OLD component writes the state the next request meets.
            if let Ok(Decision::Applied { state: next, .. }) = all[0].1.check(state.as_deref(), request).map_err(fail)? {
                state = Some(next);
            }
        }
        let items: Vec<(Option<&[u8]>, &Request)> =
            pairs.iter().map(|(s, r)| (s.as_deref(), r)).collect();
        same_batches(&mut all, &items).map_err(fail)?;
    }

    /// Lease states written by the 0.1.0 component (random acquire, renew,
    /// release and restore sequences) get identical outcomes and new states
    /// from 0.1.0 and this tree over both transports and from the native
    /// reference, and inspect identically.
    #[test]
    fn lease_states_the_old_component_wrote_decide_identically(
        calls in prop::collection::vec(lease_call(), 1..30),
    ) {
        let mut all = instances().map_err(fail)?;
        let mut state: Option<Vec<u8>> = None;
        for call in &calls {
            let expected = lease_step(&mut Native, state.as_deref(), call).map_err(fail)?;
            for (name, guest) in all.iter_mut() {
                let got = lease_step(guest, state.as_deref(), call).map_err(fail)?;
                prop_assert_eq!(&got, &expected, "{}", name);
            }
            if let Some(s) = &state {
                let info = Native.inspect_lease(s).map_err(fail)?;
                for (name, guest) in all.iter_mut() {
                    prop_assert_eq!(&guest.inspect_lease(s).map_err(fail)?, &info, "{} inspect", name);
                }
            }
            if let (_, Some(next)) = lease_step(&mut all[0].1, state.as_deref(), call).map_err(fail)? {
                state = Some(next);
            }
        }
    }
}

/// Every conformance vector passes on the 0.1.0 fixture over both
/// transports, with the same outcomes and state bytes after every step as
/// this tree and the native reference; and every check step, re-decided from
/// the state before it as a batch (packed, typed, raw bytes), and every
/// state the files reach, inspected, agree too. Today 0.1.0 and the tree
/// are the same bytes; this is what fails when a build drifts from 0.1.0.
#[test]
fn every_vector_agrees_between_old_and_new() -> Result<()> {
    let files = vector_files()?;
    ensure!(files.len() >= 30, "only {} vector files", files.len());
    let mut all = instances()?;
    let mut problems = Vec::new();
    let mut steps = 0usize;
    let mut signed_files = 0;
    for path in &files {
        let file = load(path).map_err(anyhow::Error::msg)?;
        let native = run(&file, &mut Native);
        // Signed tokens are new in 0.1.1: those files run on the tree only
        // (what 0.1.0 answers to them is old_component_has_no_signed_tokens).
        let signing = file.needs_signing();
        signed_files += usize::from(signing);
        for (name, guest) in all
            .iter_mut()
            .filter(|(name, _)| !(signing && name.starts_with("0.1.0")))
        {
            let report = run(&file, guest);
            for failure in &report.failures {
                problems.push(format!("{} [{name}] {failure}", path.display()));
            }
            if report.records != native.records {
                problems.push(format!("{} [{name}]: differs from native", path.display()));
            }
        }
        let mut before: Option<Vec<u8>> = None;
        for (step, record) in file.steps.iter().zip(&native.records) {
            if let Some(check) = step.check.as_ref().filter(|c| c.keys.is_none()) {
                let request = check.request();
                same_batches(&mut all, &[(before.as_deref(), &request)])
                    .with_context(|| format!("{}", path.display()))?;
                steps += 1;
            }
            for state in [&record.state, &record.lease_state].into_iter().flatten() {
                let info = Native.inspect(state)?;
                let lease = Native.inspect_lease(state)?;
                for (name, guest) in all.iter_mut() {
                    ensure!(
                        guest.inspect(state)? == info,
                        "{}: {name} inspect",
                        path.display()
                    );
                    ensure!(
                        guest.inspect_lease(state)? == lease,
                        "{}: {name} lease inspect",
                        path.display()
                    );
                }
            }
            before = record.state.clone();
        }
    }
    if !problems.is_empty() {
        bail!("{} problem(s):\n{}", problems.len(), problems.join("\n"));
    }
    ensure!(steps > 100, "only {steps} check steps re-decided");
    ensure!(signed_files >= 5, "only {signed_files} signed vector files");
    Ok(())
}

/// The test's CRC-32C is the guest's: it reproduces the checksum of the
/// newer-format frame in tests/vectors/unsupported-state-version.json.
#[test]
fn forged_frames_use_the_guests_checksum() -> Result<()> {
    let frame = b"\x46\x53\x02\x0e\x00\x00\x00\x00\x00\x00\xe2\x8c\x2a\x7a";
    ensure!(crc32c(&frame[..10]).to_le_bytes() == frame[10..]);
    Ok(())
}

/// A fence state and a lease state as a future format would write them
/// (well-formed frame of format FORMAT_VERSION + 1, valid CRC-32C).
fn newer_states() -> Result<(Vec<u8>, Vec<u8>)> {
    let request = Request::new("s", Token::new(0, 1, 7), Policy::Strict);
    let Ok(Decision::Applied { state, .. }) = Native.check(None, &request)? else {
        bail!("a fresh scope applies");
    };
    let acquire = acquire_request();
    let Ok(fencecheck::Acquire::Acquired { state: lease, .. }) = Native.acquire(None, &acquire)?
    else {
        bail!("a fresh lock is acquired");
    };
    Ok((newer_format(&state)?, newer_format(&lease)?))
}

fn acquire_request() -> AcquireRequest {
    AcquireRequest {
        lock: "s".into(),
        lease_id: "a".into(),
        authority: 0,
        epoch_floor: 0,
        now: 10,
        ttl: 5,
    }
}

/// The 0.1.0 component refuses a newer-format state with
/// `unsupported-state-version(2)`, never corrupt-state and never a decision,
/// over both transports: check (with and without guards, any token), the
/// batches (check-packed, check-batch, raw packed bytes), inspect, and every
/// lease function including lease inspect. A damaged copy of the same frame
/// is corrupt-state instead, so the refusal really reads the version.
#[test]
fn old_component_refuses_a_newer_format_state() -> Result<()> {
    let (fence, lease) = newer_states()?;
    let unsupported = FORMAT_VERSION + 1;
    ensure!(unsupported == 2, "this test speaks of format 2");
    let old = old_runtime()?;
    let requests = [
        Request::new("s", Token::new(0, 1, 8), Policy::Strict),
        Request::new("s", Token::new(0, 0, 1), Policy::Strict),
        Request::new(
            "s",
            Token::new(u64::MAX, u64::MAX, u64::MAX),
            Policy::AllowEqual,
        )
        .with_op_id("op"),
        Request {
            expected_version: Some(1),
            ..Request::new("s", Token::new(0, 1, 9), Policy::Strict)
        },
    ];
    let refused = Err(CheckError::UnsupportedStateVersion(unsupported));
    let lease_refused = LeaseError::UnsupportedStateVersion(unsupported);
    for guest_rt in [old.clone(), old.with_component_transport()] {
        let mut guest = guest_rt.instance()?;
        let how = format!("{:?}", guest_rt.transport());
        for request in &requests {
            ensure!(
                guest.check(Some(&fence), request)? == refused,
                "{how}: check {request:?}"
            );
        }
        let items: Vec<(Option<&[u8]>, &Request)> = requests
            .iter()
            .map(|r| (Some(fence.as_slice()), r))
            .collect();
        let all_refused = vec![refused.clone(); items.len()];
        ensure!(
            guest.check_batch(&items)? == all_refused,
            "{how}: check-packed"
        );
        ensure!(
            guest.check_batch_typed(&items)? == all_refused,
            "{how}: check-batch"
        );
        let raw = guest
            .check_packed_raw(&pack(&items))?
            .map_err(|_| anyhow::anyhow!("{how}: raw batch malformed"))?;
        // Per item: tag 130 (unsupported-state-version) and the version.
        let mut expected_raw = (items.len() as u32).to_le_bytes().to_vec();
        for _ in &items {
            expected_raw.extend_from_slice(&[130, unsupported]);
        }
        ensure!(raw == expected_raw, "{how}: raw check-packed bytes {raw:?}");
        ensure!(
            guest.inspect(&fence)?.err() == Some(CheckError::UnsupportedStateVersion(unsupported)),
            "{how}: inspect"
        );

        ensure!(
            guest.acquire(Some(&lease), &acquire_request())?.err() == Some(lease_refused.clone()),
            "{how}: acquire"
        );
        let token = Token::new(0, 1, 1);
        let renew = RenewRequest {
            lease_id: "a".into(),
            token,
            now: 11,
            ttl: 5,
        };
        ensure!(
            guest.renew(Some(&lease), &renew)?.err() == Some(lease_refused.clone()),
            "{how}: renew"
        );
        let release = ReleaseRequest {
            lease_id: "a".into(),
            token,
        };
        ensure!(
            guest.release(Some(&lease), &release)?.err() == Some(lease_refused.clone()),
            "{how}: release"
        );
        ensure!(
            guest.restore(Some(&lease))?.err() == Some(lease_refused.clone()),
            "{how}: restore"
        );
        ensure!(
            guest.inspect_lease(&lease)?.err() == Some(lease_refused.clone()),
            "{how}: lease inspect"
        );

        let mut damaged = fence.clone();
        let last = damaged.len() - 1;
        damaged[last] ^= 1;
        ensure!(
            matches!(
                guest.check(Some(&damaged), &requests[0])?,
                Err(CheckError::CorruptState(_))
            ),
            "{how}: a damaged newer frame is corrupt"
        );
    }
    Ok(())
}

/// Every row of every adapter table as SQL text: "nothing changed" compares these.
fn snapshot(conn: &rusqlite::Connection) -> Result<Vec<String>> {
    let mut rows = Vec::new();
    for (table, columns) in [
        (
            "fencecheck_scopes",
            "scope, fence_state, version, visible_object, published_at_ms",
        ),
        ("fencecheck_objects", "id, scope, name, body, staged_at_ms"),
        ("fencecheck_meta", "key, value"),
        ("audit", "scope, note"),
    ] {
        let quoted = columns
            .split(", ")
            .map(|c| format!("quote({c})"))
            .collect::<Vec<_>>()
            .join(" || ',' || ");
        let mut statement = conn.prepare(&format!(
            "SELECT '{table}:' || {quoted} FROM {table} ORDER BY 1"
        ))?;
        let found = statement.query_map([], |r| r.get::<_, String>(0))?;
        for row in found {
            rows.push(row?);
        }
    }
    Ok(rows)
}

/// Through the SQLite adapter, a scope whose stored state a newer format
/// wrote is refused by the 0.1.0 component (both transports) with
/// `unsupported-state-version(2)` on a fenced write and on a publish (the
/// one-statement path), the mutation never runs, and no row of any table
/// changes; this tree's component refuses it the same way.
#[test]
fn sqlite_with_a_newer_state_changes_nothing_under_the_old_component() -> Result<()> {
    let (fence, _) = newer_states()?;
    let dir = tempfile::tempdir()?;
    let mut conn = rusqlite::Connection::open(dir.path().join("upgrade.db"))?;
    install(&conn)?;
    conn.execute_batch("CREATE TABLE audit (scope TEXT NOT NULL, note TEXT NOT NULL)")?;
    let now = std::time::UNIX_EPOCH;
    // A publish by the future writer: its state, version 1, its object.
    let theirs = stage(&conn, "s", "future", b"future body", now)?;
    conn.execute(
        "INSERT INTO fencecheck_scopes (scope, fence_state, version, visible_object, published_at_ms)
         VALUES ('s', ?1, 1, ?2, 0)",
        rusqlite::params![fence, theirs.get()],
    )?;
    let ours = stage(&conn, "s", "ours", b"old body", now)?;
    let before = snapshot(&conn)?;
    let old = old_runtime()?;
    let refused = Rejection::Refused(CheckError::UnsupportedStateVersion(FORMAT_VERSION + 1));
    for (name, rt) in [
        ("0.1.0/core", old.clone()),
        ("0.1.0/component", old.with_component_transport()),
        ("tree/core", runtime()?),
    ] {
        let mut guest = rt.instance()?;
        let request = Request::new("s", Token::new(0, 1, 8), Policy::Strict);
        let mut ran = false;
        let written = fenced_write(&mut conn, &mut guest, &request, |tx, _| {
            ran = true;
            tx.execute(
                "INSERT INTO audit (scope, note) VALUES ('s', 'old writer')",
                [],
            )
        })?;
        ensure!(
            written == Fenced::Rejected(refused.clone()),
            "{name}: fenced write {written:?}"
        );
        ensure!(!ran, "{name}: the mutation ran");
        let published = publish(&mut conn, &mut guest, &request, ours, now)?;
        ensure!(
            published == Fenced::Rejected(refused.clone()),
            "{name}: publish {published:?}"
        );
        ensure!(snapshot(&conn)? == before, "{name}: the database changed");
    }
    Ok(())
}

/// `hex` back to bytes (the worker's state-before field).
fn unhex(text: &str) -> Result<Vec<u8>> {
    ensure!(text.len().is_multiple_of(2), "odd hex length");
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).context("hex"))
        .collect()
}

/// Two OS processes on one SQLite file, one running the 0.1.0 fixture and
/// one this tree's component (plus a third: the tree over the component
/// API), write the same three scopes concurrently through
/// fencecheck-sqlite's fenced write, with tokens from a shared sequence in
/// the database, held (paused) grants and replays. The shared history
/// checker holds (versions 1..n, no accepted token below an earlier one,
/// acknowledged writes kept, refused ones without trace), every scope's
/// stored mark is its highest audited token, and every decision any process
/// made is exactly what 0.1.0 and this tree (both transports) and the native
/// reference decide on the same stored state and request: the versions
/// never disagree.
#[test]
fn old_and_new_processes_share_one_database() -> Result<()> {
    use fencecheck_tests::history::{Attempt, Audited, Kept, Seen, check};
    use std::io::{BufRead, BufReader, Write};
    use std::process::{Command, Stdio};

    const ATTEMPTS: u64 = 150;
    let scopes = ["report/a", "report/b", "report/c"];
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("shared.db");
    let conn = rusqlite::Connection::open(&db)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    install(&conn)?;
    conn.execute_batch(
        "CREATE TABLE upgrade_audit (scope TEXT NOT NULL, version INTEGER NOT NULL,
             token TEXT NOT NULL, payload TEXT NOT NULL, PRIMARY KEY (scope, version));
         CREATE TABLE upgrade_value (scope TEXT NOT NULL PRIMARY KEY,
             version INTEGER NOT NULL, payload TEXT NOT NULL);
         CREATE TABLE upgrade_seq (next INTEGER NOT NULL);
         INSERT INTO upgrade_seq VALUES (0);",
    )?;
    let fixture = fixture_path();
    let fixture = fixture.to_str().context("fixture path")?;
    let workers: [(&str, Vec<&str>); 3] = [
        ("0.1.0/core", vec!["--component", fixture]),
        ("tree/core", vec![]),
        ("tree/component", vec!["--component-api"]),
    ];
    let mut children = Vec::new();
    for (client, (name, flags)) in workers.iter().enumerate() {
        let mut child = Command::new(env!("CARGO_BIN_EXE_fencecheck-upgrade-worker"))
            .arg(&db)
            .arg(client.to_string())
            .arg(ATTEMPTS.to_string())
            .args(flags)
            .args(scopes)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting the {name} worker"))?;
        let mut out = BufReader::new(child.stdout.take().context("stdout")?);
        let mut ready = String::new();
        out.read_line(&mut ready)?;
        ensure!(ready.trim_end() == "ready", "{name}: {ready:?}");
        children.push((*name, child, out));
    }
    // Every process has loaded its component before any writes.
    let mut readers = Vec::new();
    for (name, mut child, out) in children {
        writeln!(child.stdin.take().context("stdin")?, "go")?;
        readers.push(std::thread::spawn(
            move || -> Result<(&str, Vec<String>)> {
                let lines = out.lines().collect::<std::io::Result<Vec<_>>>()?;
                let status = child.wait()?;
                ensure!(status.success(), "{name} worker: {status}");
                Ok((name, lines))
            },
        ));
    }
    let mut outputs = Vec::new();
    for reader in readers {
        outputs.push(
            reader
                .join()
                .map_err(|_| anyhow::anyhow!("reader panicked"))??,
        );
    }

    let mut judges = instances()?;
    let mut history = Vec::new();
    let mut applied_by = [0usize; 3];
    for (client, (name, lines)) in outputs.iter().enumerate() {
        ensure!(
            lines.last().map(String::as_str) == Some("done"),
            "{name} did not finish"
        );
        let attempts: Vec<&String> = lines
            .iter()
            .filter(|l| l.starts_with("attempt\t"))
            .collect();
        ensure!(
            attempts.len() as u64 == ATTEMPTS,
            "{name}: {} attempts",
            attempts.len()
        );
        for line in attempts {
            let fields: Vec<&str> = line.split('\t').collect();
            let [_, _, scope, token, payload, state, recorded] = fields.as_slice() else {
                bail!("{name}: bad line {line:?}");
            };
            let token = token.parse::<fencecheck::TokenText>()?.0;
            let state = match *state {
                "-" => None,
                text => Some(unhex(text)?),
            };
            let request = Request::new(*scope, token, Policy::Strict);
            let reference = Native.check(state.as_deref(), &request)?;
            ensure!(
                format!("{reference:?}") == *recorded,
                "{name} decided {recorded} where native decides {reference:?} ({request:?})"
            );
            for (judge, guest) in judges.iter_mut() {
                let again = guest.check(state.as_deref(), &request)?;
                ensure!(
                    again == reference,
                    "{judge} disagrees with {name} on {request:?}"
                );
            }
            let seen = match fencecheck::accept(reference) {
                Ok((accepted, _)) => {
                    applied_by[client] += 1;
                    Seen::Applied(accepted.version)
                }
                Err(rejection) => Seen::Refused(rejection.name().to_string()),
            };
            history.push(Attempt {
                client,
                scope: scope.to_string(),
                token,
                op_id: None,
                expected_version: None,
                payload: payload.to_string(),
                seen,
            });
        }
    }

    let mut kept = Kept::default();
    let mut audit = conn.prepare("SELECT scope, version, token, payload FROM upgrade_audit")?;
    let rows = audit.query_map([], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, i64>(1)?,
            r.get::<_, String>(2)?,
            r.get::<_, String>(3)?,
        ))
    })?;
    for row in rows {
        let (scope, version, token, payload) = row?;
        let token = token.parse::<fencecheck::TokenText>()?.0;
        kept.audit
            .entry(scope)
            .or_default()
            .insert(u64::try_from(version)?, Audited { payload, token });
    }
    let mut values = conn.prepare("SELECT scope, version, payload FROM upgrade_value")?;
    let rows = values.query_map([], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, i64>(1)?,
            r.get::<_, String>(2)?,
        ))
    })?;
    for row in rows {
        let (scope, version, payload) = row?;
        kept.finals
            .insert(scope, (u64::try_from(version)?, payload));
    }
    let summary = check(&history, &kept)?;
    ensure!(summary.unknown == 0, "{summary:?}");
    ensure!(
        summary.refused > 0,
        "held and replayed grants must be refused: {summary:?}"
    );
    for (client, applied) in applied_by.iter().enumerate() {
        ensure!(*applied > 0, "client {client} never applied a write");
    }
    // The mark: each scope's stored highest token is its last audited one.
    for scope in scopes {
        let log = kept.audit.get(scope).context("every scope was written")?;
        let (version, last) = log.iter().next_back().context("non-empty")?;
        let state = fencecheck_sqlite::stored_state(&conn, scope)?.context("a stored state")?;
        let info = Native
            .inspect(&state)?
            .map_err(|e| anyhow::anyhow!("{scope}: {e:?}"))?;
        ensure!(
            info.highest == last.token && info.version == *version,
            "{scope}: stored mark {:?} v{} is not the last audited {:?} v{version}",
            info.highest,
            info.version,
            last.token
        );
    }
    // How often consecutive commits to a scope came from different
    // processes (reported, not asserted: the scheduler decides).
    let switches: usize = kept
        .audit
        .values()
        .map(|log| {
            let writers: Vec<&str> = log.values().map(|w| &w.payload[..2]).collect();
            writers.windows(2).filter(|w| w[0] != w[1]).count()
        })
        .sum();
    eprintln!(
        "shared database: {summary:?}, applied per process {applied_by:?}, \
         {switches} hand-overs between processes"
    );
    Ok(())
}

/// The 0.1.0 component has no signed tokens, and says so: `check_signed`
/// and `sign` are refused by the host before anything reaches the guest
/// (`Error::Unsupported`, naming 0.1.1), a packed batch whose items carry
/// keys (flags 4 and 5) is refused whole as malformed, never decided with
/// the keys ignored; and every unsigned call still works on the same
/// instance.
#[test]
fn old_component_has_no_signed_tokens() -> Result<()> {
    let old = old_runtime()?;
    ensure!(!old.supports_signing() && runtime()?.supports_signing());
    let key = GrantKey {
        key_id: 1,
        secret: vec![7; 32],
    };
    let request = Request::new("s", Token::new(0, 1, 1), Policy::Strict);
    for rt in [old.clone(), old.with_component_transport()] {
        let mut guest = rt.instance()?;
        let how = format!("{:?}", rt.transport());
        let refused = |e: &Error| {
            matches!(e, Error::Unsupported { version, since: "0.1.1", .. } if version == "0.1.0")
                && e.to_string()
                    == "the loaded component (fencecheck:fence@0.1.0) has no signed tokens: that needs 0.1.1 or later"
        };
        match guest.check_signed(None, &request, std::slice::from_ref(&key)) {
            Err(e) if refused(&e) => {}
            other => bail!("{how}: check_signed on 0.1.0: {other:?}"),
        }
        match guest.sign("s", Token::new(0, 1, 1), "l", &key) {
            Err(e) if refused(&e) => {}
            other => bail!("{how}: sign on 0.1.0: {other:?}"),
        }
        // One keyed item: flags 0b1_0000, no state, the key after the scope.
        let mut batch = 1u32.to_le_bytes().to_vec();
        batch.push(0b1_0000);
        for v in [0u64, 1, 1] {
            batch.extend_from_slice(&v.to_le_bytes());
        }
        batch.extend_from_slice(&1u32.to_le_bytes());
        batch.push(b's');
        batch.push(1);
        batch.extend_from_slice(&1u32.to_le_bytes());
        batch.push(32);
        batch.extend_from_slice(&[7; 32]);
        ensure!(
            guest.check_packed_raw(&batch)? == Err(fencecheck::BatchError::Malformed),
            "{how}: 0.1.0 decided a keyed item"
        );
        let mut tree = runtime()?.instance()?;
        let answer = tree.check_packed_raw(&batch)?;
        // The tree decides it: unsigned (tag 134, failure 0).
        ensure!(answer == Ok(vec![1, 0, 0, 0, 134, 0]), "tree: {answer:?}");
        ensure!(
            matches!(guest.check(None, &request)?, Ok(Decision::Applied { .. })),
            "{how}: the instance stopped working"
        );
    }
    Ok(())
}
