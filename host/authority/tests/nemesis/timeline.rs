//! The nemesis run as a picture: a self-contained SVG timeline in the style
//! of Jepsen's, written when `FENCECHECK_NEMESIS_SVG=PATH` is set
//! (`scripts/nemesis` sets it). Faults are shaded bands across the client
//! lanes; each client's lane shows its believed leases as bars and its
//! writes through the fence (applied: a dot; refused stale-fence: a red
//! cross); the closest approach of two believed leases, the figure the
//! fenced-write checker reports, is marked on the whole run and drawn again
//! in a zoomed panel with a bracket.
//!
//! Times are CLOCK_MONOTONIC nanoseconds, as the client processes stamp
//! them, drawn relative to the run's start. Only recorded data is drawn;
//! nothing here runs during the schedule.

use std::fmt::Write as _;

use crate::etcd_clients::Tally;

/// What a fault does, for its band's colour.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Links cut between nodes (isolations, minorities, bridges).
    Partition,
    /// A member's process killed or stopped.
    Process,
    /// A member removed and replaced.
    Membership,
}

impl Kind {
    fn class(self) -> &'static str {
        match self {
            Kind::Partition => "partition",
            Kind::Process => "process",
            Kind::Membership => "membership",
        }
    }
}

/// One fault of the schedule: from just before it was injected to just
/// after it was healed (links restored, a killed member restarted, a
/// stopped one continued).
pub struct FaultSpan {
    pub kind: Kind,
    pub label: String,
    pub start: u128,
    pub end: u128,
}

/// One lease as its client believed it held: from the grant's answer until
/// the TTL after the request (or the last renewal) was sent, or until the
/// release was sent, whichever is first: the conservative deadline of
/// `check_fenced_writes`.
#[derive(Clone, Debug)]
pub struct Belief {
    pub process: usize,
    pub lease: String,
    /// The token's epoch and counter.
    pub token: (u64, u64),
    pub from: u128,
    pub until: u128,
}

/// The beliefs of a run, by `(from, until, lease)` as the checker orders
/// them; empty beliefs (the answer came after the deadline) left out, as
/// there.
pub fn beliefs(tally: &Tally, ttl_ms: u64) -> Vec<Belief> {
    let ttl_ns = u128::from(ttl_ms) * 1_000_000;
    let mut out: Vec<Belief> = tally
        .grants
        .iter()
        .map(|g| {
            let sent = tally
                .renewed_at
                .get(&g.lease_id)
                .map_or(g.start, |r| (*r).max(g.start));
            let deadline = sent + ttl_ns;
            let until = tally
                .released_at
                .get(&g.lease_id)
                .map_or(deadline, |r| (*r).min(deadline));
            Belief {
                process: g.process,
                lease: g.lease_id.clone(),
                token: (g.token.epoch, g.token.counter),
                from: g.end,
                until,
            }
        })
        .filter(|b| b.from < b.until)
        .collect();
    out.sort_by(|a, b| (a.from, a.until, &a.lease).cmp(&(b.from, b.until, &b.lease)));
    out
}

/// The closest two beliefs came: the later one's start minus the end of
/// the latest-ending belief before it (negative: an overlap), in
/// nanoseconds, with the two beliefs' indices (earlier, later).
#[derive(Clone, Copy, Debug)]
pub struct Closest {
    pub gap_ns: i128,
    pub earlier: usize,
    pub later: usize,
}

/// The same sweep as `check_fenced_writes` (whose `closest_us` is this gap
/// in whole microseconds), keeping which two beliefs it was.
pub fn closest(beliefs: &[Belief]) -> Option<Closest> {
    let mut best: Option<Closest> = None;
    let mut latest: Option<usize> = None;
    for (i, b) in beliefs.iter().enumerate() {
        if let Some(l) = latest {
            let gap_ns = b.from as i128 - beliefs[l].until as i128;
            if best.is_none_or(|c| gap_ns < c.gap_ns) {
                best = Some(Closest {
                    gap_ns,
                    earlier: l,
                    later: i,
                });
            }
        }
        if latest.is_none_or(|l| b.until > beliefs[l].until) {
            latest = Some(i);
        }
    }
    best
}

/// Everything the picture shows.
pub struct Run<'a> {
    /// The seed, for the title.
    pub seed: u64,
    pub clients: usize,
    /// CLOCK_MONOTONIC when the clients were started: time zero.
    pub start: u128,
    pub faults: &'a [FaultSpan],
    pub tally: &'a Tally,
    pub ttl_ms: u64,
}

const WIDTH: f64 = 1200.0;
const LEFT: f64 = 96.0;
const RIGHT: f64 = WIDTH - 24.0;
const LANE: f64 = 54.0;
const BAR_Y: f64 = 8.0;
const BAR_H: f64 = 14.0;
const WRITE_Y: f64 = 37.0;
/// Faults listed under the whole run at most (a long soak has hundreds).
const LISTED: usize = 30;

const STYLE: &str = "
text{font-family:'DejaVu Sans',Helvetica,Arial,sans-serif;font-size:12px;fill:#222}
.title{font-size:16px;font-weight:bold}
.sub{font-size:11.5px;fill:#555}
.head{font-size:13px;font-weight:bold}
.small{font-size:10.5px;fill:#444}
.lane{fill:#f4f5f7}
.partition{fill:#f5a35c;fill-opacity:.35}
.process{fill:#a98bd6;fill-opacity:.35}
.membership{fill:#5fa8e8;fill-opacity:.35}
.lease{fill:#3b6ea8}
.applied{fill:#2e8b3e}
.stale{stroke:#d62728;stroke-width:2;fill:none}
.span{stroke:#888;stroke-width:1}
.axis{stroke:#444;stroke-width:1}
.grid{stroke:#ccc;stroke-width:.6}
.mark{stroke:#111;stroke-width:1.2;fill:none}
.late{stroke:#3b6ea8;stroke-width:1.2;stroke-dasharray:4 3}
.guide{stroke:#111;stroke-width:.8;stroke-dasharray:3 2}
.overlap{fill:#d62728}
.bad{fill:#d62728}
.tok{font-size:9.5px;fill:#fff}
";

/// A minimal SVG writer: numbers with one decimal, text escaped.
struct Svg(String);

fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
    out
}

impl Svg {
    fn rect(&mut self, x: f64, y: f64, w: f64, h: f64, class: &str) {
        let _ = write!(
            self.0,
            r#"<rect x="{x:.1}" y="{y:.1}" width="{:.1}" height="{h:.1}" class="{class}"/>"#,
            w.max(0.6)
        );
        self.0.push('\n');
    }

    fn line(&mut self, x1: f64, y1: f64, x2: f64, y2: f64, class: &str) {
        let _ = writeln!(
            self.0,
            r#"<line x1="{x1:.1}" y1="{y1:.1}" x2="{x2:.1}" y2="{y2:.1}" class="{class}"/>"#
        );
    }

    fn text(&mut self, x: f64, y: f64, anchor: &str, class: &str, text: &str) {
        let _ = writeln!(
            self.0,
            r#"<text x="{x:.1}" y="{y:.1}" text-anchor="{anchor}" class="{class}">{}</text>"#,
            esc(text)
        );
    }

    fn dot(&mut self, x: f64, y: f64, r: f64) {
        let _ = writeln!(
            self.0,
            r#"<circle cx="{x:.1}" cy="{y:.1}" r="{r:.1}" class="applied"/>"#
        );
    }

    fn cross(&mut self, x: f64, y: f64, s: f64) {
        let _ = writeln!(
            self.0,
            r#"<path d="M{:.1} {:.1}L{:.1} {:.1}M{:.1} {:.1}L{:.1} {:.1}" class="stale"/>"#,
            x - s,
            y - s,
            x + s,
            y + s,
            x - s,
            y + s,
            x + s,
            y - s
        );
    }
}

/// Nanoseconds `[t0, t1]` onto `[LEFT, RIGHT]`.
#[derive(Clone, Copy)]
struct Scale {
    t0: u128,
    t1: u128,
}

impl Scale {
    fn x(self, t: u128) -> f64 {
        let span = (self.t1 - self.t0).max(1) as f64;
        let t = t.clamp(self.t0, self.t1);
        LEFT + (t - self.t0) as f64 / span * (RIGHT - LEFT)
    }

    fn ns_per_px(self) -> f64 {
        (self.t1 - self.t0).max(1) as f64 / (RIGHT - LEFT)
    }

    fn overlaps(self, from: u128, until: u128) -> bool {
        until >= self.t0 && from <= self.t1
    }
}

/// Seconds since `start`, with `decimals` places.
fn secs(t: u128, start: u128, decimals: usize) -> String {
    format!("{:.*}", decimals, t.saturating_sub(start) as f64 / 1e9)
}

/// A 1-2-5 tick step giving at most `max` ticks over `span` seconds, and
/// the decimals its labels need.
fn tick_step(span: f64, max: f64) -> (f64, usize) {
    let raw = (span / max).max(1e-9);
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    let decimals = (-step.log10().floor()).max(0.0) as usize;
    (step, decimals)
}

/// The ticks of `scale`'s time axis: each one's x and its label in
/// seconds since `start`.
fn ticks(scale: Scale, start: u128) -> Vec<(f64, String)> {
    let lo = (scale.t0 - start.min(scale.t0)) as f64 / 1e9;
    let hi = (scale.t1 - start.min(scale.t1)) as f64 / 1e9;
    let (step, decimals) = tick_step(hi - lo, 12.0);
    let mut out = Vec::new();
    let mut k = (lo / step).ceil();
    while k * step <= hi + 1e-12 {
        let s = k * step;
        let t = start + (s * 1e9).round() as u128;
        out.push((scale.x(t), format!("{s:.decimals$}")));
        k += 1.0;
    }
    out
}

/// The time axis at `y` for `scale` (grid lines up to `top`, the lanes
/// draw theirs), labelled in seconds since `start`.
fn axis(svg: &mut Svg, scale: Scale, start: u128, y: f64, top: f64, caption: &str) {
    svg.line(LEFT, y, RIGHT, y, "axis");
    for (x, label) in ticks(scale, start) {
        svg.line(x, top, x, y, "grid");
        svg.line(x, y, x, y + 4.0, "axis");
        svg.text(x, y + 16.0, "middle", "small", &label);
    }
    svg.text((LEFT + RIGHT) / 2.0, y + 31.0, "middle", "small", caption);
}

/// One panel: fault bands, then per client a lane of lease bars and writes.
/// Returns the y below the lanes.
fn lanes(svg: &mut Svg, run: &Run, beliefs: &[Belief], scale: Scale, top: f64, zoom: bool) -> f64 {
    let bottom = top + LANE * run.clients as f64;
    for c in 0..run.clients {
        let y = top + LANE * c as f64;
        svg.rect(LEFT, y + 2.0, RIGHT - LEFT, LANE - 4.0, "lane");
        svg.text(
            LEFT - 8.0,
            y + BAR_Y + 11.0,
            "end",
            "head",
            &format!("client {c}"),
        );
        svg.text(LEFT - 8.0, y + WRITE_Y + 4.0, "end", "small", "writes");
    }
    for (x, _) in ticks(scale, run.start) {
        svg.line(x, top - 16.0, x, bottom, "grid");
    }
    // Fault bands over the lanes, numbered above them (a number only
    // where it does not run into the previous one).
    let mut last_label = f64::NEG_INFINITY;
    for (i, f) in run.faults.iter().enumerate() {
        if !scale.overlaps(f.start, f.end) {
            continue;
        }
        let (x1, x2) = (scale.x(f.start), scale.x(f.end));
        svg.rect(x1, top - 16.0, x2 - x1, bottom - top + 16.0, f.kind.class());
        let mid = (x1 + x2) / 2.0;
        if mid - last_label >= 16.0 {
            svg.text(mid, top - 4.0, "middle", "small", &(i + 1).to_string());
            last_label = mid;
        }
    }
    // Believed leases. On the whole run, bars closer than a pixel merge
    // (thousands of leases); zoomed in, each bar carries its token.
    let merge_ns = if zoom { 0.0 } else { scale.ns_per_px() };
    for c in 0..run.clients {
        let y = top + LANE * c as f64 + BAR_Y;
        let mut open: Option<(u128, u128)> = None;
        let flush = |svg: &mut Svg, (from, until): (u128, u128)| {
            let (x1, x2) = (scale.x(from), scale.x(until));
            svg.rect(x1, y, x2 - x1, BAR_H, "lease");
        };
        for b in beliefs.iter().filter(|b| b.process == c) {
            if !scale.overlaps(b.from, b.until) {
                continue;
            }
            if zoom {
                flush(svg, (b.from, b.until));
                let (x1, x2) = (scale.x(b.from), scale.x(b.until));
                let label = format!("{}.{}", b.token.0, b.token.1);
                if x2 - x1 > 7.0 * label.len() as f64 {
                    svg.text((x1 + x2) / 2.0, y + 10.5, "middle", "tok", &label);
                }
                continue;
            }
            open = match open {
                Some((from, until)) if (b.from as f64) - (until as f64) < merge_ns => {
                    Some((from, until.max(b.until)))
                }
                Some(done) => {
                    flush(svg, done);
                    Some((b.from, b.until))
                }
                None => Some((b.from, b.until)),
            };
        }
        if let Some(done) = open {
            flush(svg, done);
        }
    }
    // A lease's writes after its belief ended (the client paused past its
    // lease, or its requests were slow): a dashed line from the bar's end
    // to the last one.
    for b in beliefs {
        let late = run
            .tally
            .writes
            .iter()
            .filter(|w| w.lease_id == b.lease && w.start > b.until)
            .map(|w| w.end)
            .max();
        if let Some(last) = late.filter(|&last| scale.overlaps(b.until, last)) {
            let y = top + LANE * b.process as f64 + BAR_Y + BAR_H / 2.0;
            svg.line(scale.x(b.until), y, scale.x(last), y, "late");
        }
    }
    // Writes at the time their outcome was known: applied ones (dots,
    // thinned to one per two pixels on the whole run), then stale ones
    // (crosses, every one) on top.
    for c in 0..run.clients {
        let y = top + LANE * c as f64 + WRITE_Y;
        let mut writes: Vec<_> = run
            .tally
            .writes
            .iter()
            .filter(|w| w.process == c && scale.overlaps(w.start, w.end))
            .collect();
        writes.sort_by_key(|w| w.end);
        let mut last = f64::NEG_INFINITY;
        for w in writes.iter().filter(|w| w.outcome == "applied") {
            let x = scale.x(w.end);
            if zoom {
                svg.line(scale.x(w.start), y, x, y, "span");
            }
            if zoom || x - last >= 2.0 {
                svg.dot(x, y, if zoom { 3.5 } else { 2.5 });
                last = x;
            }
        }
        for w in writes.iter().filter(|w| w.outcome != "applied") {
            if zoom {
                svg.line(scale.x(w.start), y, scale.x(w.end), y, "span");
            }
            svg.cross(scale.x(w.end), y, 4.5);
        }
    }
    bottom
}

/// The legend: one row of swatches at `y`.
fn legend(svg: &mut Svg, y: f64) {
    let mut x = LEFT - 80.0;
    let mut item = |svg: &mut Svg, draw: &dyn Fn(&mut Svg, f64), label: &str, width: f64| {
        draw(svg, x);
        svg.text(x + 22.0, y + 4.0, "start", "small", label);
        x += width;
    };
    item(
        svg,
        &|s, x| s.rect(x, y - 6.0, 16.0, 11.0, "lease"),
        "lease believed held",
        140.0,
    );
    item(
        svg,
        &|s, x| s.line(x, y, x + 16.0, y, "late"),
        "wrote after its belief ended",
        198.0,
    );
    item(svg, &|s, x| s.dot(x + 8.0, y, 3.5), "write applied", 110.0);
    item(
        svg,
        &|s, x| s.cross(x + 8.0, y, 4.5),
        "write refused: stale fence",
        185.0,
    );
    item(
        svg,
        &|s, x| s.rect(x, y - 7.0, 16.0, 13.0, "partition"),
        "partition",
        90.0,
    );
    item(
        svg,
        &|s, x| s.rect(x, y - 7.0, 16.0, 13.0, "process"),
        "member killed / stopped",
        168.0,
    );
    item(
        svg,
        &|s, x| s.rect(x, y - 7.0, 16.0, 13.0, "membership"),
        "member replaced",
        130.0,
    );
    item(
        svg,
        &|s, x| {
            s.line(x + 2.0, y - 6.0, x + 2.0, y + 5.0, "mark");
            s.line(x + 2.0, y, x + 14.0, y, "mark");
            s.line(x + 14.0, y - 6.0, x + 14.0, y + 5.0, "mark");
        },
        "closest approach",
        120.0,
    );
}

/// "412 µs apart" or "overlap of 3 µs".
fn describe_gap(gap_ns: i128) -> String {
    // Whole microseconds toward zero, as the checker prints them.
    let us = gap_ns / 1_000;
    if gap_ns < 0 {
        format!("OVERLAP of {} µs", -us)
    } else if us >= 10_000 {
        format!("{:.1} ms apart", us as f64 / 1e3)
    } else {
        format!("{us} µs apart")
    }
}

/// The whole picture.
pub fn svg(run: &Run) -> String {
    let tally = run.tally;
    let beliefs = beliefs(tally, run.ttl_ms);
    let closest = closest(&beliefs);
    let mut end = run.start + 1;
    for t in tally
        .grants
        .iter()
        .map(|g| g.end)
        .chain(beliefs.iter().map(|b| b.until))
        .chain(tally.writes.iter().map(|w| w.end))
        .chain(run.faults.iter().map(|f| f.end))
    {
        end = end.max(t);
    }
    let whole = Scale {
        t0: run.start,
        t1: end,
    };
    let count = |o: &str| tally.writes.iter().filter(|w| w.outcome == o).count();
    let (applied, stale) = (count("applied"), count("stale"));
    let others = tally.writes.len() - applied - stale;

    let mut svg = Svg(String::new());
    let margin = LEFT - 80.0;
    let mut y = 26.0;
    svg.text(
        margin,
        y,
        "start",
        "title",
        &format!(
            "fencecheck nemesis, seed {}: {} fault{}, {} grants, {} writes through the fence \
             ({applied} applied, {stale} refused stale{})",
            run.seed,
            run.faults.len(),
            if run.faults.len() == 1 { "" } else { "s" },
            tally.grants.len(),
            tally.writes.len(),
            if others > 0 {
                format!(", {others} errors")
            } else {
                String::new()
            },
        ),
    );
    y += 20.0;
    let overlap = closest.is_some_and(|c| c.gap_ns < 0);
    svg.text(
        margin,
        y,
        "start",
        if overlap { "head bad" } else { "head" },
        &format!(
            "Closest two believed leases: {}",
            closest.map_or("n/a (fewer than two)".to_owned(), |c| describe_gap(
                c.gap_ns
            )),
        ),
    );
    for line in [
        format!(
            "{} client processes take one etcd lock (3 members; members and clients each in a \
             network namespace of their own), lease TTL {} ms, then write twice",
            run.clients, run.ttl_ms
        ),
        "through the fence to one SQLite resource; every tenth lease is paused past its end \
         before writing. A lease is believed from the grant's answer until TTL after"
            .to_owned(),
        "its request (or last renewal) was sent, or until its release was sent, whichever is \
         first: the checker's rule. Two believed leases must never overlap."
            .to_owned(),
    ] {
        y += 16.0;
        svg.text(margin, y, "start", "sub", &line);
    }
    y += 26.0;
    legend(&mut svg, y);

    // The whole run.
    y += 32.0;
    svg.text(margin, y, "start", "head", "The whole run");
    let top = y + 26.0;
    let bottom = lanes(&mut svg, run, &beliefs, whole, top, false);
    if let Some(c) = closest {
        let x = whole.x(beliefs[c.later].from);
        svg.line(x, top - 16.0, x, bottom, "guide");
        let anchor = if x > RIGHT - 200.0 { "end" } else { "start" };
        let tx = if anchor == "end" { x - 4.0 } else { x + 4.0 };
        svg.text(
            tx,
            bottom + 12.0,
            anchor,
            "small",
            "closest approach (zoomed below)",
        );
    }
    let axis_y = bottom + 22.0;
    axis(
        &mut svg,
        whole,
        run.start,
        axis_y,
        bottom,
        "seconds since the clients started",
    );

    // The schedule, listed in two columns.
    y = axis_y + 56.0;
    svg.text(
        margin,
        y,
        "start",
        "head",
        "Faults (each band above: from injection to heal)",
    );
    y += 18.0;
    let shown = run.faults.len().min(LISTED);
    let rows = shown.div_ceil(2).max(1);
    for (i, f) in run.faults.iter().take(shown).enumerate() {
        let x = margin + (i / rows) as f64 * 590.0;
        let ty = y + (i % rows) as f64 * 16.0;
        svg.rect(x, ty - 9.0, 10.0, 11.0, f.kind.class());
        svg.text(x + 30.0, ty, "end", "small", &(i + 1).to_string());
        svg.text(
            x + 40.0,
            ty,
            "start",
            "small",
            &format!(
                "{}–{} s",
                secs(f.start, run.start, 1),
                secs(f.end, run.start, 1)
            ),
        );
        svg.text(x + 120.0, ty, "start", "small", &f.label);
    }
    y += rows as f64 * 16.0;
    if run.faults.len() > shown {
        svg.text(
            margin + 40.0,
            y,
            "start",
            "small",
            &format!(
                "… and {} more (the test's output lists them all)",
                run.faults.len() - shown
            ),
        );
        y += 16.0;
    }

    // The closest approach, zoomed: a window around the gap (or overlap),
    // wide enough to show a few leases either side of it.
    if let Some(c) = closest {
        let (a, b) = (&beliefs[c.earlier], &beliefs[c.later]);
        let (lo, hi) = (a.until.min(b.from), a.until.max(b.from));
        let gap = hi - lo;
        let side = (gap * 6).clamp(10_000_000, 500_000_000);
        let zoom = Scale {
            t0: lo.saturating_sub(side).max(run.start),
            t1: hi + side,
        };
        y += 28.0;
        svg.text(
            margin,
            y,
            "start",
            "head",
            &format!(
                "The closest approach, zoomed in: {} to {} s",
                secs(zoom.t0, run.start, 3),
                secs(zoom.t1, run.start, 3)
            ),
        );
        let top = y + 58.0;
        let bottom = lanes(&mut svg, run, &beliefs, zoom, top, true);
        let (x1, x2) = (zoom.x(a.until), zoom.x(b.from));
        svg.line(x1, top - 30.0, x1, bottom, "guide");
        svg.line(x2, top - 30.0, x2, bottom, "guide");
        let by = top - 24.0;
        if c.gap_ns < 0 {
            svg.rect(x2, by - 4.0, x1 - x2, 8.0, "overlap");
        } else {
            svg.line(x1, by, x2, by, "mark");
            svg.line(x1, by - 5.0, x1, by + 5.0, "mark");
            svg.line(x2, by - 5.0, x2, by + 5.0, "mark");
        }
        let who = |l: &Belief| {
            format!(
                "{} (client {}, token {}.{}, believed {}–{} s)",
                l.lease,
                l.process,
                l.token.0,
                l.token.1,
                secs(l.from, run.start, 3),
                secs(l.until, run.start, 6),
            )
        };
        let note = format!("from the end of {} to the start of {}", who(a), who(b));
        // Centred on the bracket, kept inside the picture (~5.8 px a character).
        let half = note.chars().count() as f64 * 2.9;
        let mid = ((x1 + x2) / 2.0).max(margin + half).min(WIDTH - 8.0 - half);
        svg.text(
            (x1 + x2) / 2.0,
            by - 22.0,
            "middle",
            "small",
            &describe_gap(c.gap_ns),
        );
        svg.text(mid, by - 9.0, "middle", "small", &note);
        let axis_y = bottom + 22.0;
        axis(
            &mut svg,
            zoom,
            run.start,
            axis_y,
            bottom,
            "seconds since the clients started; bars labelled with their token \
             (epoch.counter); a write's line runs from its request to its outcome",
        );
        y = axis_y + 40.0;
    }

    let height = y + 8.0;
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height:.0}\" \
         viewBox=\"0 0 {WIDTH} {height:.0}\">\n<style>{STYLE}</style>\n\
         <rect width=\"100%\" height=\"100%\" fill=\"#fff\"/>\n{}</svg>\n",
        svg.0
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etcd_clients::{Grant, Write};

    /// Two clients, one fault: the beliefs and the closest approach follow
    /// the checker's rule, and the SVG draws every stale write, escapes its
    /// labels and closes its root; an overlap (a run the checker fails) is
    /// named and drawn red. `FENCECHECK_TIMELINE_SAMPLE=PATH` writes that
    /// overlap picture, to look at.
    #[test]
    fn timeline_draws_a_small_run() {
        let ms = 1_000_000u128;
        let grant = |process, lease: &str, counter, start: u128, end: u128| Grant {
            process,
            lease_id: lease.to_owned(),
            token: fencecheck::Token::new(7, 0, counter),
            start: start * ms,
            end: end * ms,
        };
        let write = |process, lease: &str, outcome: &str, at: u128| Write {
            process,
            lease_id: lease.to_owned(),
            n: 1,
            outcome: outcome.to_owned(),
            start: at * ms,
            end: at * ms + ms / 2,
        };
        let mut tally = Tally {
            grants: vec![
                grant(0, "p0-1", 1, 100, 110),
                grant(1, "p1-1", 2, 150, 160),
                grant(0, "p0-2", 3, 300, 305),
            ],
            writes: vec![
                write(0, "p0-1", "applied", 120),
                write(1, "p1-1", "applied", 170),
                write(0, "p0-2", "stale", 1_500),
            ],
            ..Tally::default()
        };
        tally.released_at.insert("p0-1".to_owned(), 140 * ms);
        tally.released_at.insert("p1-1".to_owned(), 200 * ms);
        let b = beliefs(&tally, 1_000);
        assert_eq!(b.len(), 3);
        assert_eq!((b[0].from, b[0].until), (110 * ms, 140 * ms));
        assert_eq!(b[2].until, 1_300 * ms, "unreleased: TTL after the request");
        let c = closest(&b).expect("two beliefs");
        assert_eq!((c.earlier, c.later, c.gap_ns), (0, 1, 20 * ms as i128));
        let faults = [FaultSpan {
            kind: Kind::Partition,
            label: "client 0 left with member <2> & no one".to_owned(),
            start: 50 * ms,
            end: 90 * ms,
        }];
        let svg = svg(&Run {
            seed: 3,
            clients: 2,
            start: 0,
            faults: &faults,
            tally: &tally,
            ttl_ms: 1_000,
        });
        assert!(svg.starts_with("<svg ") && svg.ends_with("</svg>\n"));
        assert!(svg.contains("member &lt;2&gt; &amp; no one"));
        assert!(!svg.contains("<2>"));
        // One stale cross in the whole run and one in the zoom if it falls
        // inside it (it does not: 1.5 s is past the zoomed window).
        assert_eq!(
            svg.matches(r#"class="stale""#).count(),
            1 + 1,
            "legend + run"
        );
        assert!(svg.contains("20.0 ms apart"));

        // A run that would fail the checker: client 1's belief starts 5 ms
        // before client 0's ends. The picture says so and marks it red.
        tally.grants[1] = grant(1, "p1-1", 2, 130, 135);
        let b = beliefs(&tally, 1_000);
        let c = closest(&b).expect("two beliefs");
        assert_eq!(c.gap_ns, -5 * ms as i128);
        let svg = super::svg(&Run {
            seed: 3,
            clients: 2,
            start: 0,
            faults: &faults,
            tally: &tally,
            ttl_ms: 1_000,
        });
        if let Some(path) = std::env::var_os("FENCECHECK_TIMELINE_SAMPLE") {
            std::fs::write(path, &svg).expect("writing the sample");
        }
        assert!(svg.contains("OVERLAP of 5000 µs"));
        assert!(svg.contains(r#"class="overlap""#));
    }
}
