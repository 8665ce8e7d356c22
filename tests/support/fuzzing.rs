//! The interface fuzzers' shared driver: each host's fuzzer (RESP for the
//! Redis module, SQL for the SQLite and PostgreSQL extensions, HTTP and S3
//! for the gateway) sends random input through the host's real interface
//! and checks that the host answers every input and stays up. This module
//! holds what they share: the seed, the bounds, the generator and the small
//! vocabulary of nasty values (docs/development.md, "Fuzzing the hosts").
//!
//! Every run is bounded by a count and a time, seeded, and prints its seed
//! first, so a finding replays exactly: `FENCECHECK_FUZZ_SEED=S` (one seed
//! for every fuzzer in the process), `FENCECHECK_FUZZ_INPUTS=N` (inputs per
//! fuzzer run, default the fuzzer's own), `FENCECHECK_FUZZ_SECONDS=T` (a
//! time bound per run, default 120). Without a seed each run draws a new
//! one, so CI explores a little more every time and says what to replay.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};

/// One fuzzer run: its name, seed, bounds and generator.
pub struct Fuzz {
    name: String,
    seed: u64,
    inputs: u64,
    deadline: Instant,
    done: u64,
    rng: StdRng,
}

fn env_u64(name: &str) -> Result<Option<u64>> {
    match std::env::var(name) {
        Ok(v) => Ok(Some(
            v.trim()
                .parse()
                .with_context(|| format!("{name}={v:?} is not a u64"))?,
        )),
        Err(_) => Ok(None),
    }
}

impl Fuzz {
    /// A run named `name` of `default_inputs` inputs unless
    /// `FENCECHECK_FUZZ_INPUTS` says otherwise; prints how to replay it.
    pub fn from_env(name: &str, default_inputs: u64) -> Result<Fuzz> {
        let seed = match env_u64("FENCECHECK_FUZZ_SEED")? {
            Some(s) => s,
            None => {
                let now = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .unwrap_or_default();
                // Nanoseconds and the process id: two fuzzers started in
                // the same instant still differ.
                (now.as_nanos() as u64) ^ (u64::from(std::process::id()) << 40)
            }
        };
        let inputs = env_u64("FENCECHECK_FUZZ_INPUTS")?.unwrap_or(default_inputs);
        let seconds = env_u64("FENCECHECK_FUZZ_SECONDS")?.unwrap_or(120);
        println!(
            "fuzz {name}: seed {seed}, at most {inputs} inputs in {seconds} s \
             (replay: FENCECHECK_FUZZ_SEED={seed} FENCECHECK_FUZZ_INPUTS={inputs})"
        );
        Ok(Fuzz {
            name: name.to_string(),
            seed,
            inputs,
            deadline: Instant::now() + Duration::from_secs(seconds),
            done: 0,
            rng: StdRng::seed_from_u64(seed),
        })
    }

    /// Whether to send another input (counts it): false once the count or
    /// the time bound is reached.
    pub fn next_input(&mut self) -> bool {
        if self.done >= self.inputs || Instant::now() >= self.deadline {
            return false;
        }
        self.done += 1;
        true
    }

    /// Inputs sent so far.
    pub fn done(&self) -> u64 {
        self.done
    }

    /// The seed (for messages).
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Context for a finding: the fuzzer, seed and input number.
    pub fn at(&self) -> String {
        format!(
            "fuzz {} input {} (replay: FENCECHECK_FUZZ_SEED={} FENCECHECK_FUZZ_INPUTS={})",
            self.name, self.done, self.seed, self.done
        )
    }

    /// Print the closing line: how many inputs, and the run's own counts.
    pub fn finish(&self, summary: &str) {
        println!(
            "fuzz {}: seed {}, {} inputs: {summary}",
            self.name, self.seed, self.done
        );
    }

    /// A number below `n` (0 if `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.rng.random_range(0..n)
        }
    }

    /// An index into a slice of `len` items (0 if empty).
    pub fn index(&mut self, len: usize) -> usize {
        if len == 0 {
            0
        } else {
            self.rng.random_range(0..len)
        }
    }

    /// True with probability `1/n`.
    pub fn one_in(&mut self, n: u64) -> bool {
        self.below(n) == 0
    }

    /// A random u64.
    pub fn u64(&mut self) -> u64 {
        self.rng.next_u64()
    }

    /// One of `items`, cloned.
    pub fn pick<T: Clone>(&mut self, items: &[T]) -> T {
        items[self.index(items.len())].clone()
    }

    /// `len` random bytes.
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut out = vec![0; len];
        self.rng.fill_bytes(&mut out);
        out
    }

    /// A length: mostly small, sometimes at the edges (0, 1, 255, 256,
    /// 1023, 1024, 1025, 64 Ki), rarely up to `max`.
    pub fn size(&mut self, max: usize) -> usize {
        match self.below(10) {
            0 => self
                .pick(&[0, 1, 255, 256, 1023, 1024, 1025, 65_535, 65_536])
                .min(max),
            1 => self.index(max.saturating_add(1)),
            _ => self.index(33.min(max.saturating_add(1))),
        }
    }

    /// A random char from the whole Unicode range, weighted towards the
    /// ones that break byte-per-char code: U+0100..U+FFFF (whose low byte
    /// can be NUL, CR or LF), controls and NUL.
    pub fn char(&mut self) -> char {
        let code = match self.below(6) {
            0 => self.below(0x20) as u32,
            1 => 0x100 * (1 + self.below(0xff) as u32) + self.pick(&[0, 0x0a, 0x0d, 0x25]),
            2 => 0x80 + self.below(0xff80) as u32,
            3 => 0x1_0000 + self.below(0x10_0000) as u32,
            _ => 0x20 + self.below(0x5f) as u32,
        };
        char::from_u32(code).unwrap_or('\u{fffd}')
    }

    /// Text of random chars (see [`Fuzz::char`]).
    pub fn text(&mut self, max_chars: usize) -> String {
        let n = self.size(max_chars);
        (0..n).map(|_| self.char()).collect()
    }

    /// Bytes that are often not UTF-8: random bytes, text, or text with one
    /// byte replaced.
    pub fn binary(&mut self, max: usize) -> Vec<u8> {
        match self.below(3) {
            0 => {
                let n = self.size(max);
                self.bytes(n)
            }
            1 => self.text(max).into_bytes(),
            _ => {
                let mut t = self.text(max).into_bytes();
                if !t.is_empty() {
                    let i = self.index(t.len());
                    t[i] = self.pick(&[0x00, 0xff, 0xc0, 0x80, 0x0a, 0x0d, b'%']);
                }
                t
            }
        }
    }

    /// A token text, well-formed or nearly so.
    pub fn token(&mut self) -> String {
        let n = |f: &mut Fuzz| -> String {
            match f.below(8) {
                0 => "18446744073709551615".into(),
                1 => "18446744073709551616".into(),
                2 => "0".into(),
                3 => "-1".into(),
                4 => format!("{}", f.u64()),
                _ => format!("{}", f.below(6)),
            }
        };
        match self.below(10) {
            0 => self.text(24),
            1 => format!("{}:{}.{}", n(self), n(self), n(self)),
            2 => format!("{}.{}~1~lease~AAAA", n(self), n(self)),
            3 => format!("{}.{}.{}", n(self), n(self), n(self)),
            4 => format!(" {}.{}", n(self), n(self)),
            _ => format!("{}.{}", self.below(4), self.below(12)),
        }
    }

    /// `bytes` with one to four bits flipped, bytes cut off or appended.
    pub fn damage(&mut self, bytes: &[u8]) -> Vec<u8> {
        let mut out = bytes.to_vec();
        match self.below(4) {
            0 if !out.is_empty() => {
                let keep = self.index(out.len());
                out.truncate(keep);
            }
            1 => {
                let n = self.size(16);
                let tail = self.bytes(n);
                out.extend(tail);
            }
            _ => {
                for _ in 0..1 + self.below(4) {
                    if out.is_empty() {
                        break;
                    }
                    let i = self.index(out.len());
                    out[i] ^= 1 << self.below(8);
                }
            }
        }
        out
    }
}

/// `bytes` as a short printable excerpt, for a finding's message.
pub fn shown(bytes: &[u8]) -> String {
    let text: String = String::from_utf8_lossy(bytes).chars().take(120).collect();
    if bytes.len() > 120 {
        format!("{text:?}… ({} bytes)", bytes.len())
    } else {
        format!("{text:?}")
    }
}
