//! `report.html`: one self-contained page per run (inline SVG and CSS, no
//! scripts, no external resources) — what ran (the plan as a table), each
//! checker's verdict with why and links to its pictures, a latency plot
//! (every completed operation) and a throughput plot (ok operations per
//! second, per op), both with the fault windows shaded and the heal
//! marked, and the perf checker's table per fault window.
//!
//! Colours are fixed per operation name, so two reports read side by
//! side. A history whose times are not nanoseconds since a start (some
//! Jepsen and Porcupine files number their events, or have no times) is
//! drawn by event order instead, and the page says so.

use crate::files::{ResultsFile, RunInfo};
use crate::picture::esc;
use drift_checkers::perf::{fault_edge, FStats, FaultEdge, PerfSummary, Span};
use drift_checkers::{History, Outcome};
use std::fmt::Write;

/// Most latency points drawn; past it every k-th operation is drawn (the
/// quantile tables still count all of them).
const POINTS_MAX: usize = 20_000;
/// Throughput buckets across the run.
const BUCKETS: usize = 120;
const PLOT_W: f64 = 1100.0;
const PLOT_H: f64 = 260.0;
const LEFT: f64 = 70.0;
const TOP: f64 = 24.0;
const BOTTOM: f64 = 36.0;
/// Colours for operation names without one of their own.
const PALETTE: [&str; 8] = [
    "#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f",
];
/// Width of one character of the plots' 10px monospace labels.
const LABEL_CHAR_PX: f64 = 6.2;
/// Rows fault labels are stacked in before they may overlap.
const LABEL_ROWS: usize = 4;

/// The colour of operation `f`: the same in every report (the usual
/// names have their own; others get one from their name's hash).
pub fn op_colour(f: &str) -> &'static str {
    match f {
        "read" | "get" => "#1f77b4",
        "write" | "put" | "add" | "enqueue" | "generate" => "#9467bd",
        "cas" | "append" | "dequeue" => "#2ca02c",
        "drain" | "close" | "expire" | "delete" => "#8c564b",
        "create" => "#e377c2",
        "children" => "#17becf",
        _ => {
            // FNV-1a: stable across runs and builds
            let h = f.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
            });
            PALETTE[(h % PALETTE.len() as u64) as usize]
        }
    }
}

/// How a history's times are drawn.
#[derive(Debug, Clone, PartialEq)]
pub enum Clock {
    /// Nanoseconds since the start (drift's own histories, Jepsen's).
    Nanos,
    /// Not nanoseconds (why): each event is drawn at its position.
    Order(String),
}

/// Whether `h`'s times are nanoseconds since a start. They are not when
/// they step evenly (positions, or no times: a reader fills in the
/// index), or when many operations span less than a millisecond.
pub fn clock_of(h: &History) -> Clock {
    let n = h.ops.len();
    if n < 3 {
        return Clock::Nanos;
    }
    let time = |i: usize| h.ops[i].time;
    let step = time(1) - time(0);
    if h.ops.windows(2).all(|w| w[1].time - w[0].time == step) {
        return Clock::Order(format!(
            "its times step evenly by {step}, as positions do, not as nanoseconds of a run"
        ));
    }
    let span = time(n - 1).saturating_sub(time(0));
    if n > 100 && span < 1_000_000 {
        return Clock::Order(format!("{n} events span {span} time units: not nanoseconds of a run"));
    }
    Clock::Nanos
}

/// One fault's stretch of time, from its `start-` to its `stop-` event
/// (or the end of the history when it never stopped).
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    pub kind: String,
    pub from_ns: i64,
    pub to_ns: i64,
    /// Nodes it touched, as the start event names them.
    pub nodes: String,
}

/// The faults of a history, in start order. A `stop-<kind>` ends the
/// earliest open fault of that kind.
pub fn faults(h: &History) -> Vec<Fault> {
    faults_at(h, &|i| h.ops[i].time)
}

/// [`faults`] with each line's time as `at` gives it.
fn faults_at(h: &History, at: &dyn Fn(usize) -> i64) -> Vec<Fault> {
    let end = h.ops.len().checked_sub(1).map_or(0, at);
    let mut out: Vec<Fault> = Vec::new();
    let mut open: Vec<usize> = Vec::new();
    for &i in &h.nemesis {
        let op = &h.ops[i];
        match fault_edge(&op.f) {
            Some(FaultEdge::Start(kind)) => {
                open.push(out.len());
                out.push(Fault {
                    kind: kind.to_string(),
                    from_ns: at(i),
                    to_ns: end,
                    nodes: op.value.get("nodes").map(|n| n.to_string()).unwrap_or_default(),
                });
            }
            Some(FaultEdge::Stop(kind)) => {
                if let Some(k) = open.iter().position(|&f| out[f].kind == kind) {
                    out[open.remove(k)].to_ns = at(i);
                }
            }
            None => {}
        }
    }
    out
}

/// Maps history time and a value range onto one plot.
struct Frame {
    t0: i64,
    t1: i64,
    y_top: f64,
    /// Where this plot starts on the page.
    y_off: f64,
    log: bool,
    y_min: f64,
}

impl Frame {
    fn x(&self, t: i64) -> f64 {
        let span = self.t1.saturating_sub(self.t0).max(1) as f64;
        LEFT + t.saturating_sub(self.t0) as f64 / span * PLOT_W
    }

    fn y(&self, v: f64) -> f64 {
        let frac = if self.log {
            let (lo, hi) = (self.y_min.log10(), self.y_top.log10());
            (v.max(self.y_min).log10() - lo) / (hi - lo).max(1e-9)
        } else {
            v / self.y_top.max(1e-9)
        };
        self.y_off + TOP + PLOT_H * (1.0 - frac.clamp(0.0, 1.0))
    }

    fn height() -> f64 {
        TOP + PLOT_H + BOTTOM
    }
}

fn fault_colour(kind: &str) -> &'static str {
    match kind {
        "partition" => "#fde0dd",
        "kill" => "#fee8c8",
        "pause" => "#e0ecf4",
        "corrupt" => "#f2e6ff",
        "diverge" => "#ffe6e6",
        "clock" => "#e5f5e0",
        _ => "#eeeeee",
    }
}

/// The x axis of the plots: what a history's times are drawn as.
struct XAxis<'a> {
    /// Axis units per displayed unit (1e9: ns shown as seconds).
    unit: f64,
    title: &'a str,
}

/// Approximate width of a label in the plots' 10px monospace.
fn label_px(text: &str) -> f64 {
    text.chars().count() as f64 * LABEL_CHAR_PX
}

/// Shaded fault windows, their labels (stacked so neighbours do not
/// overlap), the heal marks (their labels kept inside the picture), axes
/// and ticks of one plot.
fn frame_svg(
    svg: &mut String,
    f: &Frame,
    faults: &[Fault],
    marks: &[(i64, &str)],
    y_label: &str,
    y_ticks: &[f64],
    xa: &XAxis<'_>,
) {
    let bottom = f.y_off + TOP + PLOT_H;
    let right = LEFT + PLOT_W + 18.0;
    for &(t, label) in marks {
        let x = f.x(t);
        // a label that would run past the right edge sits left of its line
        let (lx, anchor) = if x + 3.0 + label_px(label) > right {
            (x - 3.0, "end")
        } else {
            (x + 3.0, "start")
        };
        let _ = write!(
            svg,
            r##"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{bottom:.1}" stroke="#555" stroke-dasharray="4 3"/><text x="{lx:.1}" y="{:.1}" fill="#555" font-size="10" text-anchor="{anchor}">{}</text>"##,
            f.y_off + TOP,
            f.y_off + TOP - 4.0,
            esc(label)
        );
    }
    let mut row_end = [f64::MIN; LABEL_ROWS];
    for fault in faults {
        let (x0, x1) = (f.x(fault.from_ns), f.x(fault.to_ns));
        let lx = x0 + 2.0;
        // the first row this label fits in after its neighbours, else the
        // one that frees up first
        let row = (0..LABEL_ROWS).find(|&r| row_end[r] + 4.0 <= lx).unwrap_or_else(|| {
            (0..LABEL_ROWS)
                .min_by(|&a, &b| row_end[a].total_cmp(&row_end[b]))
                .unwrap_or(0)
        });
        row_end[row] = lx + label_px(&fault.kind);
        let _ = write!(
            svg,
            r##"<rect x="{x0:.1}" y="{:.1}" width="{:.1}" height="{PLOT_H}" fill="{}" opacity="0.8"><title>{} {} from {} to {}</title></rect><text x="{lx:.1}" y="{:.1}" fill="#777" font-size="10">{}</text>"##,
            f.y_off + TOP,
            (x1 - x0).max(1.0),
            fault_colour(&fault.kind),
            esc(&fault.kind),
            esc(&fault.nodes),
            short(fault.from_ns.saturating_sub(f.t0) as f64 / xa.unit),
            short(fault.to_ns.saturating_sub(f.t0) as f64 / xa.unit),
            f.y_off + TOP + 10.0 + row as f64 * 11.0,
            esc(&fault.kind)
        );
    }
    let _ = write!(
        svg,
        r##"<rect x="{LEFT}" y="{:.1}" width="{PLOT_W}" height="{PLOT_H}" fill="none" stroke="#999"/><text x="14" y="{:.1}" transform="rotate(-90 14 {:.1})" text-anchor="middle" fill="#444">{}</text>"##,
        f.y_off + TOP,
        f.y_off + TOP + PLOT_H / 2.0,
        f.y_off + TOP + PLOT_H / 2.0,
        esc(y_label)
    );
    for &v in y_ticks {
        let y = f.y(v);
        let _ = write!(
            svg,
            r##"<line x1="{}" y1="{y:.1}" x2="{LEFT}" y2="{y:.1}" stroke="#999"/><text x="{}" y="{:.1}" text-anchor="end" fill="#555" font-size="10">{}</text>"##,
            LEFT - 4.0,
            LEFT - 6.0,
            y + 3.0,
            short(v)
        );
    }
    let span = f.t1.saturating_sub(f.t0) as f64 / xa.unit;
    let step = nice_step(span / 10.0);
    // each tick from its own count, so no error piles up
    for k in 0..=100 {
        let v = k as f64 * step;
        if step <= 0.0 || v > span + 1e-9 {
            break;
        }
        let x = LEFT + v / span.max(1e-9) * PLOT_W;
        let _ = write!(
            svg,
            r##"<line x1="{x:.1}" y1="{bottom:.1}" x2="{x:.1}" y2="{:.1}" stroke="#999"/><text x="{x:.1}" y="{:.1}" text-anchor="middle" fill="#555" font-size="10">{}</text>"##,
            bottom + 4.0,
            bottom + 16.0,
            short(v)
        );
    }
    let _ = write!(
        svg,
        r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#444">{}</text>"##,
        LEFT + PLOT_W / 2.0,
        bottom + 30.0,
        esc(xa.title)
    );
}

/// 1, 2 or 5 times a power of ten, at least `raw`.
fn nice_step(raw: f64) -> f64 {
    if raw.is_nan() || raw <= 0.0 {
        return 0.0;
    }
    let p = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * p)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * p)
}

fn short(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v.abs() >= 100.0 || v.fract() == 0.0 {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
            .trim_end_matches('0')
            .trim_end_matches('.')
            .to_string()
    }
}

/// Swatches of the operations' colours; with `marks`, the latency plot's
/// point shapes too.
fn legend(fs: &[&str], marks: bool) -> String {
    let mut out = String::from(r#"<div class="legend">"#);
    for f in fs {
        let _ = write!(
            out,
            r#"<span><i class="sw" style="background:{}"></i>{}</span>"#,
            op_colour(f),
            esc(f)
        );
    }
    if marks {
        out.push_str(
            r#"<span>● ok</span><span>○ fail</span><span>× info (indeterminate; drawn at its timeout)</span>"#,
        );
    }
    out.push_str("</div>");
    out
}

/// What a report page draws from the history alone — the plots, the
/// node events, the latency summary — apart from what the checkers
/// found: judging a run draws it beside the checks, on a thread of its
/// own, since on a long history it takes a while.
pub struct Plots {
    clock: Clock,
    t0: i64,
    t1: i64,
    legend: String,
    legend_ops: String,
    latency_svg: String,
    throughput_svg: String,
    nodes_events: String,
    /// The latency summary, when computed here rather than taken from
    /// the perf checker's result.
    perf: Option<PerfSummary>,
}

impl Plots {
    /// How the history's times were read (and the plots drawn).
    pub fn clock(&self) -> &Clock {
        &self.clock
    }
}

/// Where history line `i` sits on a plot's x axis.
fn x_of(h: &History, by_order: bool, i: usize) -> i64 {
    if by_order {
        i as i64
    } else {
        h.ops[i].time
    }
}

fn x_axis(by_order: bool) -> XAxis<'static> {
    if by_order {
        XAxis {
            unit: 1.0,
            title: "position in the history (event order)",
        }
    } else {
        XAxis {
            unit: 1e9,
            title: "seconds since the start",
        }
    }
}

/// The page for one run, its latency summary given.
#[cfg(test)]
fn render(h: &History, info: Option<&RunInfo>, results: &ResultsFile, perf: &PerfSummary) -> String {
    let mut p = plots(h, false);
    p.perf = Some(perf.clone());
    page(h, info, results, &p)
}

/// Draws what the page shows of the history itself; with `summarize`,
/// also its latency summary (not needed when the perf checker ran).
pub fn plots(h: &History, summarize: bool) -> Plots {
    let clock = clock_of(h);
    let by_order = matches!(clock, Clock::Order(_));
    let at = |i: usize| x_of(h, by_order, i);
    let xa = x_axis(by_order);
    let faults = faults_at(h, &at);
    // the heal: the main phase ends there and the final reads begin
    let marks: Vec<(i64, &str)> = h
        .nemesis
        .iter()
        .filter(|&&i| h.ops[i].f == "healed")
        .map(|&i| (at(i), "healed"))
        .collect();
    let mut fs: Vec<&str> = Vec::new();
    for o in &h.operations {
        let f = h.f_of(o);
        if !fs.contains(&f) {
            fs.push(f);
        }
    }
    let t0 = if h.ops.is_empty() { 0 } else { at(0) };
    let t1 = if h.ops.is_empty() { 1 } else { at(h.ops.len() - 1) }.max(t0.saturating_add(1));

    // latency: every completed op (every k-th past POINTS_MAX), in ms, or
    // in events between invoke and completion when drawn by order
    let done: Vec<_> = h.operations.iter().filter(|o| o.complete.is_some()).collect();
    let every = done.len().div_ceil(POINTS_MAX).max(1);
    let (lat_unit, lat_floor, lat_label) = if by_order {
        (1.0, 1.0, "latency, events (log)")
    } else {
        (1e6, 0.01, "latency, ms (log)")
    };
    let lat_of = |o: &drift_checkers::Operation| {
        let c = o.complete.map_or(0, at);
        (c.saturating_sub(at(o.invoke)).max(0) as f64 / lat_unit).max(lat_floor / 10.0)
    };
    let max_lat = done.iter().map(|o| lat_of(o)).fold(lat_floor * 100.0, f64::max);
    let y_top = 10f64.powf(max_lat.log10().ceil());
    let lat = Frame {
        t0,
        t1,
        y_top,
        y_off: 0.0,
        log: true,
        y_min: lat_floor,
    };
    let mut svg = String::new();
    let decades: Vec<f64> = (lat_floor.log10() as i32..=y_top.log10() as i32)
        .map(|e| 10f64.powi(e))
        .collect();
    frame_svg(&mut svg, &lat, &faults, &marks, lat_label, &decades, &xa);
    for o in done.iter().step_by(every) {
        let x = lat.x(at(o.invoke));
        let y = lat.y(lat_of(o));
        let c = op_colour(h.f_of(o));
        let _ = match o.outcome {
            Outcome::Ok => write!(svg, r#"<circle cx="{x:.1}" cy="{y:.1}" r="1.8" fill="{c}"/>"#),
            Outcome::Fail => write!(
                svg,
                r#"<circle cx="{x:.1}" cy="{y:.1}" r="2.2" fill="none" stroke="{c}"/>"#
            ),
            _ => write!(
                svg,
                r#"<path d="M{:.1} {:.1}l4 4m0 -4l-4 4" stroke="{c}"/>"#,
                x - 2.0,
                y - 2.0
            ),
        };
    }
    let latency_svg = wrap_svg(svg, Frame::height());

    // throughput: ok ops per second (or per 100 events) per op, in
    // buckets (by order, ten events a bucket at the least)
    let buckets = if by_order {
        (h.ops.len() / 10).clamp(1, BUCKETS)
    } else {
        BUCKETS
    };
    let width = (t1.saturating_sub(t0) as f64 / buckets as f64).max(1.0);
    let mut counts = vec![vec![0u32; buckets]; fs.len()];
    for o in &h.operations {
        if o.outcome != Outcome::Ok {
            continue;
        }
        let t = o.complete.map_or(at(o.invoke), at);
        let b = ((t.saturating_sub(t0) as f64 / width) as usize).min(buckets - 1);
        let k = fs.iter().position(|x| *x == h.f_of(o)).unwrap_or(0);
        counts[k][b] += 1;
    }
    let (per, thr_label) = if by_order {
        (100.0 / width, "ok ops per 100 events")
    } else {
        (1e9 / width, "ok ops/s")
    };
    let top = counts.iter().flatten().map(|&c| c as f64 * per).fold(1.0f64, f64::max);
    let top = nice_step(top / 4.0) * 4.0;
    let thr = Frame {
        t0,
        t1,
        y_top: top,
        y_off: 0.0,
        log: false,
        y_min: 0.0,
    };
    let mut svg = String::new();
    let ticks: Vec<f64> = (0..=4).map(|k| top * k as f64 / 4.0).collect();
    frame_svg(&mut svg, &thr, &faults, &marks, thr_label, &ticks, &xa);
    for (k, row) in counts.iter().enumerate() {
        let points: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(b, &c)| {
                let t = t0.saturating_add(((b as f64 + 0.5) * width) as i64);
                format!("{:.1},{:.1}", thr.x(t), thr.y(c as f64 * per))
            })
            .collect();
        let _ = write!(
            svg,
            r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="1.5"/>"#,
            points.join(" "),
            op_colour(fs[k])
        );
    }
    let throughput_svg = wrap_svg(svg, Frame::height());
    let nodes_events = node_events(h, t0, &at, &xa);
    Plots {
        clock,
        t0,
        t1,
        legend: legend(&fs, true),
        legend_ops: legend(&fs, false),
        latency_svg,
        throughput_svg,
        nodes_events,
        perf: summarize.then(|| drift_checkers::perf::summarize(h)),
    }
}

/// The page for one run: the checkers' findings around `plots`. The
/// latency summary is the perf checker's when it ran, else the one
/// `plots` computed (or, failing both, one computed now).
pub fn page(h: &History, info: Option<&RunInfo>, results: &ResultsFile, plots: &Plots) -> String {
    let by_order = matches!(plots.clock, Clock::Order(_));
    let at = |i: usize| x_of(h, by_order, i);
    let (t0, t1) = (plots.t0, plots.t1);
    let xa = x_axis(by_order);
    let perf = PerfSummary::from_results(&results.checkers)
        .or_else(|| plots.perf.clone())
        .unwrap_or_else(|| drift_checkers::perf::summarize(h));
    let clock = &plots.clock;
    let Plots {
        legend,
        legend_ops,
        latency_svg,
        throughput_svg,
        nodes_events,
        ..
    } = plots;

    let title = info.map_or_else(
        || {
            std::path::Path::new(&results.history)
                .file_name()
                .map_or_else(|| "history".to_string(), |n| n.to_string_lossy().into_owned())
        },
        |i| i.test.clone(),
    );
    let mut about = String::new();
    if let Some(i) = info {
        let _ = write!(
            about,
            "<p>{} · {} · seed {} · drift {}</p>{}",
            esc(&i.kind),
            esc(&i.created_at),
            i.seed.map_or_else(|| "–".to_string(), |s| s.to_string()),
            esc(&i.versions.short()),
            config_table(&i.config)
        );
        if let Some(t) = &i.target {
            let _ = write!(
                about,
                "<p>The system under test, as it answered at setup:</p>{}",
                config_table(t)
            );
        }
    }
    if let Clock::Order(why) = clock {
        let _ = write!(
            about,
            r#"<p class="note">This history's times are not nanoseconds since a start ({}): the plots draw each event at its position in the history.</p>"#,
            esc(why)
        );
    }
    let mut checkers = String::new();
    for c in &results.checkers {
        let _ = write!(
            checkers,
            r#"<tr><td>{}</td><td class="{}">{}</td><td class="why">{}</td></tr>"#,
            esc(&c.checker),
            c.verdict.as_str(),
            c.verdict.as_str(),
            why(c, &results.artifacts)
        );
    }
    let dedup = crate::dedup_report::section(h, results, &at, t0, t1, xa.unit);
    let kv = crate::kv_report::section(h, results, &at, t0, t1, xa.unit);
    format!(
        r#"<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>drift: {title}</title>
<style>
body {{ font-family: sans-serif; margin: 24px; color: #222; max-width: 1300px; }}
pre {{ background: #fafafa; border: 1px solid #ddd; padding: 8px; white-space: pre-wrap; }}
table {{ border-collapse: collapse; font-family: monospace; margin-bottom: 16px; }}
td, th {{ border: 1px solid #ccc; padding: 3px 8px; text-align: right; vertical-align: top; }}
td:first-child, th:first-child, th.why {{ text-align: left; }}
td.why, table.config td {{ text-align: left; white-space: pre-wrap; max-width: 900px; }}
.valid {{ color: #2e7d32; font-weight: bold; }} .invalid {{ color: #c62828; font-weight: bold; }} .unknown {{ color: #ef6c00; font-weight: bold; }}
.note {{ background: #fff8e1; border: 1px solid #ffe082; padding: 6px 10px; }}
.legend span {{ display: inline-block; margin-right: 16px; }}
.sw {{ display: inline-block; width: 14px; height: 10px; margin-right: 4px; vertical-align: middle; }}
</style></head><body>
<h1>{title}: <span class="{verdict}">{verdict_up}</span></h1>
{about}
<p>{ops} history lines, {operations} operations</p>
<table><tr><th>checker</th><th>verdict</th><th class="why">why</th></tr>{checkers}</table>
{dedup}
{kv}
<h2>Latency</h2>
{legend}
{latency_svg}
<h2>Throughput</h2>
{legend_ops}
{throughput_svg}
<h2>Per fault window</h2>
{perf_table}
{nodes_events}
</body></html>
"#,
        title = esc(&title),
        verdict = results.verdict.as_str(),
        verdict_up = results.verdict.as_str().to_uppercase(),
        ops = h.ops.len(),
        operations = h.operations.len(),
        perf_table = if by_order {
            "<p>Not shown: rates and latencies need times in nanoseconds.</p>".to_string()
        } else {
            perf_table(&perf)
        },
    )
}

/// The run's plan as a table of option and value.
fn config_table(config: &serde_json::Value) -> String {
    let Some(map) = config.as_object() else {
        return format!("<pre>{}</pre>", esc(&config.to_string()));
    };
    let mut t = String::from(r#"<table class="config"><tr><th>option</th><th class="why">value</th></tr>"#);
    for (k, v) in map {
        let v = match v {
            serde_json::Value::Null => "(default)".to_string(),
            serde_json::Value::Array(a) => a.iter().map(plain).collect::<Vec<_>>().join(", "),
            other => plain(other),
        };
        let _ = write!(t, "<tr><td>{}</td><td>{}</td></tr>", esc(k), esc(&v));
    }
    t.push_str("</table>");
    t
}

/// Most lines of an explanation shown in the checker table.
const WHY_LINES_MAX: usize = 3;

/// Why a checker decided as it did: its reason, and for a violation the
/// first lines of each explanation and a link to its picture; for other
/// invalid checkers, the counts that made them so.
fn why(c: &drift_checkers::CheckResult, artifacts: &[String]) -> String {
    let mut out = String::new();
    if let Some(r) = &c.reason {
        out.push_str(&esc(r));
    }
    if let Ok(report) = serde_json::from_value::<drift_checkers::linear::LinearReport>(c.details.clone()) {
        for (n, v) in report.violations.iter().enumerate() {
            let lines: Vec<&str> = v.explanation.lines().take(WHY_LINES_MAX).collect();
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(&esc(&lines.join("\n")));
            let picture = format!("linearizable-{}.html", n + 1);
            if artifacts.contains(&picture) {
                let _ = write!(out, "\n<a href=\"{picture}\">picture of this violation ({picture})</a>");
            }
        }
        if report.keys_invalid > report.violations.len() {
            let _ = write!(out, "\n{} keys not linearizable in all", report.keys_invalid);
        }
        return out;
    }
    if c.verdict == drift_checkers::Verdict::Invalid {
        if let Some(d) = c.details.as_object() {
            let found: Vec<String> = d
                .iter()
                .filter(|(k, v)| k.ends_with("_count") && v.as_u64().is_some_and(|n| n > 0))
                .map(|(k, v)| {
                    let name = k.trim_end_matches("_count");
                    match d.get(name) {
                        Some(list) => format!("{name} {v}: {}", short_json(list)),
                        None => format!("{name} {v}"),
                    }
                })
                .collect();
            if !found.is_empty() {
                if !out.is_empty() {
                    out.push('\n');
                }
                out.push_str(&esc(&found.join("\n")));
            }
        }
    }
    out
}

/// A JSON value for a table cell: cut after 120 characters.
fn short_json(v: &serde_json::Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 120 {
        format!("{}…", s.chars().take(120).collect::<String>())
    } else {
        s
    }
}

/// Writes the run's `report.html`: the checkers' findings around the
/// plots of its history ([`plots`]).
pub fn write(
    run: &crate::RunDir,
    h: &History,
    info: Option<&RunInfo>,
    results: &ResultsFile,
    plots: &Plots,
) -> std::io::Result<std::path::PathBuf> {
    run.write_file(crate::store::REPORT_HTML, page(h, info, results, plots).as_bytes())
}

fn wrap_svg(body: String, height: f64) -> String {
    let width = LEFT + PLOT_W + 20.0;
    format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="monospace" font-size="11">{body}</svg>"#
    )
}

fn perf_table(perf: &PerfSummary) -> String {
    let mut t = String::from(
        "<table><tr><th>window</th><th>op</th><th>seconds</th><th>ok</th><th>fail</th><th>info</th><th>ok/s</th><th>p50 ms</th><th>p90 ms</th><th>p99 ms</th><th>max ms</th></tr>",
    );
    let mut rows = |name: &str, s: &Span| {
        let mut one = |f: &str, st: &FStats| {
            let q = |v: Option<f64>| v.map_or_else(|| "–".to_string(), |v| format!("{v:.1}"));
            let l = st.latency_ms;
            let _ = write!(
                t,
                "<tr><td>{}</td><td>{}</td><td>{:.1}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.1}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(name),
                esc(f),
                s.seconds,
                st.ok,
                st.fail,
                st.info,
                st.ok_per_s,
                q(l.map(|l| l.p50)),
                q(l.map(|l| l.p90)),
                q(l.map(|l| l.p99)),
                q(l.map(|l| l.max)),
            );
        };
        one("all", &s.all);
        for (f, st) in &s.by_f {
            one(f, st);
        }
    };
    rows("whole run", &perf.run);
    for w in &perf.windows {
        rows(&w.window, &w.span);
    }
    t.push_str("</table>");
    t
}

/// The node-side events (leaders, exits, aborts, snapshots) as a list,
/// their values as JSON fields (`node 2, code 86`), not debug text.
fn node_events(h: &History, t0: i64, at: &dyn Fn(usize) -> i64, xa: &XAxis<'_>) -> String {
    let mut rows = String::new();
    for &i in &h.nemesis {
        let op = &h.ops[i];
        if fault_edge(&op.f).is_some() || crate::kv_report::EVENTS.contains(&op.f.as_str()) {
            continue;
        }
        let value = plain(&op.value);
        let _ = write!(
            rows,
            "<tr><td>{}</td><td class=\"why\">{}</td><td class=\"why\">{}</td></tr>",
            short(at(i).saturating_sub(t0) as f64 / xa.unit),
            esc(&op.f),
            esc(&value)
        );
    }
    if rows.is_empty() {
        return String::new();
    }
    format!(
        "<h2>Node events</h2><table><tr><th>{}</th><th class=\"why\">event</th><th class=\"why\">what</th></tr>{rows}</table>",
        if xa.unit == 1.0 { "position" } else { "seconds" }
    )
}

/// An event's value as a person reads it: `key value` pairs, fields that
/// are null or empty left out, strings unquoted, a list of records one per line.
fn plain(v: &serde_json::Value) -> String {
    use serde_json::Value;
    match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        Value::Object(m) => m
            .iter()
            .filter(|(_, v)| !v.is_null() && v.as_str() != Some(""))
            .map(|(k, v)| match v {
                Value::Array(items) if items.iter().any(Value::is_object) => {
                    format!("{k}:\n  {}", items.iter().map(plain).collect::<Vec<_>>().join("\n  "))
                }
                _ => format!("{k} {}", plain(v)),
            })
            .collect::<Vec<_>>()
            .join(", "),
        Value::Array(items) => format!("[{}]", items.iter().map(plain).collect::<Vec<_>>().join(", ")),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drift_checkers::Verdict;
    use serde_json::{json, Value};

    fn history() -> History {
        let lines: Vec<(u64, &str, &str, Value)> = vec![
            (1, "invoke", "read", Value::Null),
            (1, "ok", "read", json!(1)),
            (0, "nemesis", "start-partition", json!({"nodes": [1, 2]})),
            (2, "invoke", "write", json!(3)),
            (2, "fail", "write", json!(3)),
            (0, "nemesis", "stop-partition", json!({})),
            (3, "invoke", "write", json!("<b>")),
            (0, "nemesis", "leader", json!({"node": 2})),
        ];
        History::from_script(&lines).unwrap()
    }

    #[test]
    fn faults_run_from_their_start_to_their_stop_or_the_end() {
        let mut h = history();
        h.ops[5].f = "stop-kill".into();
        let f = faults(&h);
        assert_eq!(f.len(), 1);
        assert_eq!((f[0].kind.as_str(), f[0].from_ns), ("partition", 2000));
        assert_eq!(f[0].to_ns, 7000, "never stopped: to the end");
        let f = faults(&history());
        assert_eq!((f[0].from_ns, f[0].to_ns), (2000, 5000));
        assert_eq!(f[0].nodes, "[1,2]");
    }

    #[test]
    fn the_page_draws_every_completed_op_shades_faults_and_escapes_text() {
        let h = history();
        let perf = drift_checkers::perf::summarize(&h);
        let results = ResultsFile {
            verdict: Verdict::Invalid,
            history: "h".into(),
            ops: 8,
            operations: 3,
            keys: 1,
            checked_at: "now".into(),
            elapsed_ms: 1.0,
            checkers: vec![drift_checkers::CheckResult {
                checker: "x<y".into(),
                verdict: Verdict::Invalid,
                reason: Some("a & b".into()),
                elapsed_ms: 1.0,
                details: Value::Null,
            }],
            artifacts: vec![],
        };
        let page = render(&h, None, &results, &perf);
        assert_eq!(
            page.matches("<circle").count(),
            2,
            "one ok and one failed op; the open write is not drawn"
        );
        assert_eq!(
            page.matches(r##"fill="#fde0dd""##).count(),
            2,
            "the partition in both plots"
        );
        assert!(page.contains("x&lt;y") && page.contains("a &amp; b"));
        assert!(page.contains(r#"class="invalid">INVALID"#));
        assert!(page.contains(r#"<td class="why">leader</td>"#), "node events listed");
        assert!(!page.contains("<script"), "self-contained, no scripts");
    }

    /// A write of 1 then a read of 2: not linearizable, judged for real.
    fn stale() -> (History, ResultsFile) {
        let lines: Vec<(u64, &str, &str, Value)> = vec![
            (1, "invoke", "write", json!(1)),
            (1, "ok", "write", json!(1)),
            (2, "invoke", "read", Value::Null),
            (2, "ok", "read", json!(2)),
        ];
        let h = History::from_script(&lines).unwrap();
        let checker = drift_checkers::linear::Linearizable {
            model: drift_checkers::linear::model::ModelKind::CasRegister,
            explain: true,
            init: Value::Null,
            tuning: Default::default(),
        };
        let ctx = drift_checkers::checker::CheckContext::new(None, drift_checkers::checker::MEM_BYTES_DEFAULT);
        let c = drift_checkers::checker::Checker::check(&checker, &h, &ctx).unwrap();
        assert_eq!(c.verdict, Verdict::Invalid);
        let results = ResultsFile {
            verdict: Verdict::Invalid,
            history: "h".into(),
            ops: 4,
            operations: 2,
            keys: 1,
            checked_at: "now".into(),
            elapsed_ms: 1.0,
            checkers: vec![c],
            artifacts: vec!["linearizable-1.html".into()],
        };
        (h, results)
    }

    #[test]
    fn the_checker_table_says_why_and_links_the_picture() {
        let (h, results) = stale();
        let explanation = {
            let r: drift_checkers::linear::LinearReport =
                serde_json::from_value(results.checkers[0].details.clone()).unwrap();
            r.violations[0].explanation.lines().next().unwrap().to_string()
        };
        let page = render(&h, None, &results, &drift_checkers::perf::summarize(&h));
        let why = &page[page.find(r#"<td class="why">"#).unwrap()..];
        let why = &why[..why.find("</td>").unwrap()];
        assert!(why.contains(&esc(&explanation)), "{why}");
        assert!(why.contains(r#"<a href="linearizable-1.html">"#), "{why}");
    }

    #[test]
    fn colours_are_fixed_per_operation_and_the_plots_have_legends() {
        let (h, results) = stale();
        let page = render(&h, None, &results, &drift_checkers::perf::summarize(&h));
        // the same colour for `read` whatever the history holds, and a
        // name outside the usual ones still gets one of the palette's
        assert_eq!(op_colour("read"), "#1f77b4");
        assert!(PALETTE.contains(&op_colour("insert")));
        // each workload's operations tell apart
        for fs in [
            ["get", "put", "delete"],
            ["read", "write", "cas"],
            ["enqueue", "dequeue", "drain"],
        ] {
            let cs: std::collections::BTreeSet<&str> = fs.iter().map(|f| op_colour(f)).collect();
            assert_eq!(cs.len(), 3, "{fs:?}");
        }
        for f in ["read", "write"] {
            let swatch = format!(r#"<i class="sw" style="background:{}"></i>{f}"#, op_colour(f));
            assert_eq!(page.matches(&swatch).count(), 2, "{f}: a legend above each plot");
        }
        assert!(
            page.contains(r##"stroke="#9467bd""##),
            "the write line in its own colour"
        );
    }

    #[test]
    fn a_history_without_real_times_is_drawn_by_event_order_and_says_so() {
        let (h, results) = stale();
        assert!(matches!(clock_of(&h), Clock::Order(_)), "the script steps evenly");
        let page = render(&h, None, &results, &drift_checkers::perf::summarize(&h));
        assert!(page.contains("the plots draw each event at its position in the history"));
        assert!(page.contains("position in the history (event order)"));
        assert!(page.contains("Not shown: rates and latencies need times in nanoseconds."));
        // real nanoseconds are drawn as time
        let mut h2 = h.clone();
        for (i, o) in h2.ops.iter_mut().enumerate() {
            o.time = [0, 1_200_000, 5_000_000, 9_700_000][i];
        }
        assert_eq!(clock_of(&h2), Clock::Nanos);
        let page = render(&h2, None, &results, &drift_checkers::perf::summarize(&h2));
        assert!(page.contains("seconds since the start") && !page.contains("position in the history"));
    }

    #[test]
    fn the_plan_is_a_table_and_no_debug_text_reaches_the_page() {
        let (h, results) = stale();
        let info = RunInfo {
            test: "register-drift".into(),
            kind: "test".into(),
            created_at: "2026-12-01T00:00:00Z".into(),
            seed: Some(7),
            config: json!({"workload": "register", "nodes": 5, "nemesis": ["kill", "partition"], "block": null}),
            versions: crate::files::Versions::current("0.1.0", Some("abc")),
            source: None,
            hosts: vec![],
            nemesis_schedule: vec![],
            target: None,
            interrupted_after_s: None,
        };
        let page = render(&h, Some(&info), &results, &drift_checkers::perf::summarize(&h));
        assert!(page.contains(r#"<table class="config">"#));
        assert!(page.contains("<tr><td>nemesis</td><td>kill, partition</td></tr>"));
        assert!(page.contains("<tr><td>nodes</td><td>5</td></tr>"));
        assert!(page.contains("seed 7"));
        assert!(!page.contains("Some("), "no Rust debug text");
    }

    #[test]
    fn node_events_read_as_plain_words_without_nulls_or_json() {
        let v = json!({"converged": true, "note": null, "nodes": [
            {"node": 1, "applied_index": "850", "digest": "0xe9"},
            {"node": 2, "applied_index": "850", "digest": "0xe9"}]});
        assert_eq!(
            plain(&v),
            "converged true, nodes:\n  applied_index 850, digest 0xe9, node 1\n  applied_index 850, digest 0xe9, node 2"
        );
        assert_eq!(plain(&json!({"node": 2, "code": null, "note": ""})), "node 2");
        assert_eq!(plain(&json!({"nodes": [1, 3]})), "nodes [1, 3]");
    }

    #[test]
    fn steps_are_one_two_or_five_times_a_power_of_ten() {
        assert_eq!(nice_step(0.7), 1.0);
        assert_eq!(nice_step(1.5), 2.0);
        assert_eq!(nice_step(3.0), 5.0);
        assert_eq!(nice_step(60.0), 100.0);
        assert_eq!(nice_step(0.0), 0.0);
        assert_eq!(short(3.0 * 0.1), "0.3", "no float noise on the axis");
    }
}
