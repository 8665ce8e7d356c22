//! One fence check through wasmtime against the native reference, and a
//! batch per check: `check-packed` (what `Instance::check_batch` uses) and the
//! typed `check-batch`. `wasm` is the default runtime (checks over the core
//! transport: the embedded component, unmetered, one crossing per single
//! check); `wasm-metered` the same under fuel metering (what a component
//! loaded from a path gets); `wasm-component` the same component through
//! wasmtime's component API for every call. `native-packed` is the native
//! reference through the same packed encoding and decoding as `wasm`, so
//! that ratio's two sides do the same work. Reproduce: `cargo bench -p fencecheck-benches --bench check`.
//!
//! The workload is the common case: a scope that has accepted token 0.41 and a
//! request presenting 0.42, so the guest decodes the state, decides `applied`
//! and encodes the new state (the full path a publish takes). `check/signed`
//! runs the same request on a scope that requires signed tokens (one
//! HMAC-SHA256 key, a valid signature) beside the unsigned check it guards.

// criterion_group! generates an undocumented pub fn.
#![allow(missing_docs)]

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use fencecheck::{
    Checker, Decision, GrantKey, Limits, Native, NativePacked, Policy, Request, Runtime, Token,
};

const BATCH: usize = 256;

fn setup() -> anyhow::Result<(Vec<u8>, Request)> {
    let first = Request::new("report/july", Token::new(0, 0, 41), Policy::Strict);
    let Ok(Decision::Applied { state, .. }) = fencecheck_guest::check(None, &first) else {
        anyhow::bail!("setup check was not applied");
    };
    Ok((
        state,
        Request::new("report/july", Token::new(0, 0, 42), Policy::Strict),
    ))
}

fn bench(c: &mut Criterion) -> anyhow::Result<()> {
    let (state, request) = setup()?;
    let runtime = Runtime::new()?;
    let mut wasm = runtime.instance()?;
    let mut component = runtime.with_component_transport().instance()?;
    let mut metered =
        Runtime::from_bytes_metered(fencecheck::COMPONENT, Limits::default())?.instance()?;
    let mut packed = NativePacked::default();
    // Every runtime must decide the same thing before we time them.
    let expected = Native.check(Some(&state), &request)?;
    anyhow::ensure!(wasm.check(Some(&state), &request)? == expected);
    anyhow::ensure!(component.check(Some(&state), &request)? == expected);
    anyhow::ensure!(metered.check(Some(&state), &request)? == expected);
    anyhow::ensure!(packed.check(Some(&state), &request)? == expected);

    let mut single = c.benchmark_group("check/single");
    single.throughput(Throughput::Elements(1));
    single.bench_function("native", |b| {
        b.iter(|| fencecheck_guest::check(black_box(Some(&state)), black_box(&request)))
    });
    single.bench_function("native-packed", |b| {
        b.iter(|| packed.check(black_box(Some(&state)), black_box(&request)))
    });
    single.bench_function("wasm", |b| {
        b.iter(|| wasm.check(black_box(Some(&state)), black_box(&request)))
    });
    single.bench_function("wasm-metered", |b| {
        b.iter(|| metered.check(black_box(Some(&state)), black_box(&request)))
    });
    single.bench_function("wasm-component", |b| {
        b.iter(|| component.check(black_box(Some(&state)), black_box(&request)))
    });
    single.finish();

    let key = GrantKey {
        key_id: 3,
        secret: vec![0x5a; 32],
    };
    let signature =
        fencecheck_guest::sign("report/july", request.token, "lease-7f3a9c2e-0001", &key)
            .map_err(|e| anyhow::anyhow!("signing: {e}"))?;
    let signed = request.clone().with_signature(signature);
    let keys = [key];
    let expected_signed = Native.check_signed(Some(&state), &signed, &keys)?;
    anyhow::ensure!(expected_signed.is_ok());
    anyhow::ensure!(wasm.check_signed(Some(&state), &signed, &keys)? == expected_signed);
    anyhow::ensure!(component.check_signed(Some(&state), &signed, &keys)? == expected_signed);
    let mut group = c.benchmark_group("check/signed");
    group.throughput(Throughput::Elements(1));
    group.bench_function("native-unsigned", |b| {
        b.iter(|| fencecheck_guest::check(black_box(Some(&state)), black_box(&request)))
    });
    group.bench_function("native-signed", |b| {
        b.iter(|| {
            fencecheck_guest::check_signed(black_box(Some(&state)), black_box(&signed), &keys)
        })
    });
    group.bench_function("wasm-unsigned", |b| {
        b.iter(|| wasm.check(black_box(Some(&state)), black_box(&request)))
    });
    group.bench_function("wasm-signed", |b| {
        b.iter(|| wasm.check_signed(black_box(Some(&state)), black_box(&signed), &keys))
    });
    group.bench_function("wasm-component-signed", |b| {
        b.iter(|| component.check_signed(black_box(Some(&state)), black_box(&signed), &keys))
    });
    group.finish();

    let items: Vec<(Option<&[u8]>, &Request)> = (0..BATCH)
        .map(|_| (Some(state.as_slice()), &request))
        .collect();
    let mut batch = c.benchmark_group("check/batch");
    batch.throughput(Throughput::Elements(BATCH as u64));
    batch.bench_with_input(BenchmarkId::new("native", BATCH), &items, |b, items| {
        b.iter(|| Native.check_batch(black_box(items)))
    });
    batch.bench_with_input(
        BenchmarkId::new("native-packed", BATCH),
        &items,
        |b, items| b.iter(|| packed.check_batch(black_box(items))),
    );
    batch.bench_with_input(
        BenchmarkId::new("wasm-packed", BATCH),
        &items,
        |b, items| b.iter(|| wasm.check_batch(black_box(items))),
    );
    batch.bench_with_input(
        BenchmarkId::new("wasm-component-packed", BATCH),
        &items,
        |b, items| b.iter(|| component.check_batch(black_box(items))),
    );
    batch.bench_with_input(BenchmarkId::new("wasm-typed", BATCH), &items, |b, items| {
        b.iter(|| wasm.check_batch_typed(black_box(items)))
    });
    batch.finish();
    Ok(())
}

fn benches(c: &mut Criterion) {
    if let Err(e) = bench(c) {
        eprintln!("benchmark setup failed: {e:#}");
        std::process::exit(1);
    }
}

criterion_group! {
    name = check;
    config = Criterion::default().measurement_time(Duration::from_secs(4)).warm_up_time(Duration::from_secs(1));
    targets = benches
}
criterion_main!(check);
