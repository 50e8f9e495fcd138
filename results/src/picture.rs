//! A self-contained HTML page (inline SVG and CSS, no scripts, no external
//! resources) that draws one linearizability violation: the operations
//! around it per process on an axis of history events, the longest
//! linearizable prefix shaded, the return no linearization passes marked,
//! and the core — the operations that cannot all hold — outlined in red.
//!
//! The page opens at the violation: the axis holds the core's events and
//! a few around each, and stretches between them with nothing of the core
//! in them are folded into one marked column, so the core and the failing
//! return fit a 1400-pixel window without scrolling however far apart
//! they lie in the history.

use drift_checkers::linear::{OpRef, Violation};
use std::fmt::Write;

/// Most operations drawn; past it, those closest to the failing return win.
const OPS_DRAWN_MAX: usize = 400;
/// Room per axis column: wide enough for a short label, narrow enough
/// that no column hogs the plot.
const EVENT_PX_MAX: f64 = 40.0;
const EVENT_PX_MIN: f64 = 3.0;
/// The plot's width: the page fits a 1400-pixel window.
const PLOT_PX: f64 = 1150.0;
/// History events kept on the axis either side of each of the core's.
const CONTEXT_EVENTS: usize = 1;
/// Most time labels on the axis.
const TICKS_MAX: usize = 8;
const LANE_PX: f64 = 30.0;
const LABEL_PX: f64 = 90.0;
const TOP_PX: f64 = 40.0;

/// Escapes text for HTML and SVG.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
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

/// How the axis labels its events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AxisLabels {
    /// Time since the start: the history's times are nanoseconds of a run.
    Time,
    /// Position in the history: its times are not nanoseconds (Porcupine's
    /// files, some of Jepsen's), so a time label would mislead.
    Position,
}

/// Renders the page for `v`; `title` names the history.
pub fn render(v: &Violation, title: &str, labels: AxisLabels) -> String {
    let is_core = |o: &OpRef| v.core.iter().any(|c| c.invoke_index == o.invoke_index);
    let is_failing = |o: &OpRef| o.invoke_index == v.failing.invoke_index;
    let axis = Axis::new(v);
    // what touches a column of the axis is drawn; what lies wholly in a
    // folded stretch is counted
    let mut ops: Vec<&OpRef> = v.window.iter().filter(|o| axis.touches(o)).collect();
    let folded = v.window.len() - ops.len();
    if ops.len() > OPS_DRAWN_MAX {
        ops.sort_by_key(|o| {
            (
                !(is_core(o) || is_failing(o)),
                v.prefix_end_index.abs_diff(o.invoke_index),
            )
        });
        ops.truncate(OPS_DRAWN_MAX);
    }

    let mut lanes: Vec<&str> = ops.iter().map(|o| o.process.as_str()).collect();
    lanes.sort_by_key(|p| (p.parse::<u64>().unwrap_or(u64::MAX), p.to_string()));
    lanes.dedup();

    let width = axis.width();
    let height = TOP_PX + lanes.len() as f64 * LANE_PX + 62.0;
    let mut svg = String::new();
    let _ = write!(
        svg,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height}" viewBox="0 0 {width:.0} {height}" font-family="monospace" font-size="11"><defs><pattern id="folded" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><rect width="6" height="6" fill="#fafafa"/><line x1="0" y1="0" x2="0" y2="6" stroke="#bbb" stroke-width="2"/></pattern></defs>"##
    );
    // The longest linearizable prefix, and the return nothing passes. A
    // one-pass proof shows only its op's return: an earlier return may
    // fail too, so no prefix is claimed.
    let cut_x = axis.x(v.prefix_end_index);
    if v.proof.is_none() {
        let _ = write!(
            svg,
            r##"<rect x="{LABEL_PX}" y="{}" width="{}" height="{}" fill="#e8f5e9"/>"##,
            TOP_PX - 14.0,
            cut_x - LABEL_PX,
            lanes.len() as f64 * LANE_PX + 14.0,
        );
    }
    // folded stretches, under everything drawn on top of them
    let lanes_bottom = TOP_PX + lanes.len() as f64 * LANE_PX;
    for (x, n) in axis.folds() {
        let _ = write!(
            svg,
            r##"<rect x="{:.1}" y="{}" width="{:.1}" height="{}" fill="url(#folded)"><title>{n} history events with none of the core's folded here</title></rect>"##,
            x - axis.step / 2.0,
            TOP_PX - 14.0,
            axis.step,
            lanes_bottom - TOP_PX + 14.0
        );
    }
    if v.proof.is_none() {
        let _ = write!(
            svg,
            r##"<text x="{}" y="{}" fill="#2e7d32" stroke="#e8f5e9" stroke-width="3" paint-order="stroke">longest linearizable prefix</text>"##,
            LABEL_PX + 4.0,
            TOP_PX - 4.0
        );
    }
    let cut_text = match &v.proof {
        Some(kind) => format!("this op cannot hold ({kind}) ▸"),
        None => "no linearization passes this return ▸".to_string(),
    };
    let _ = write!(
        svg,
        r##"<line x1="{cut_x}" y1="{}" x2="{cut_x}" y2="{}" stroke="#c62828" stroke-width="2"/><text x="{}" y="{}" fill="#c62828" text-anchor="end">{cut_text}</text>"##,
        TOP_PX - 30.0,
        TOP_PX + lanes.len() as f64 * LANE_PX,
        cut_x - 4.0,
        TOP_PX - 18.0
    );
    for (i, p) in lanes.iter().enumerate() {
        let y = TOP_PX + i as f64 * LANE_PX;
        let _ = write!(
            svg,
            r##"<line x1="{LABEL_PX}" y1="{}" x2="{}" y2="{}" stroke="#eee"/><text x="6" y="{}">process {}</text>"##,
            y + LANE_PX - 2.0,
            width - 20.0,
            y + LANE_PX - 2.0,
            y + LANE_PX / 2.0 + 4.0,
            esc(p)
        );
    }
    for o in &ops {
        let lane = lanes.iter().position(|p| *p == o.process).unwrap_or(0);
        let y = TOP_PX + lane as f64 * LANE_PX + 4.0;
        let x0 = axis.x(o.invoke_index) - axis.step * 0.4;
        let x1 = match o.complete_index {
            Some(c) if o.outcome != "info" => axis.x(c) + axis.step * 0.4,
            _ => axis.end(),
        };
        let w = (x1 - x0).max(3.0);
        let (fill, stroke, dash) = match o.outcome.as_str() {
            "ok" => ("#c8e6c9", "#388e3c", ""),
            "fail" => ("#eeeeee", "#9e9e9e", ""),
            _ => ("#ffe0b2", "#ef6c00", r#" stroke-dasharray="4 3""#),
        };
        let (stroke, sw) = if is_failing(o) {
            ("#b71c1c", 3.0)
        } else if is_core(o) {
            ("#e53935", 2.5)
        } else {
            (stroke, 1.0)
        };
        let fill = if is_failing(o) { "#ffcdd2" } else { fill };
        let opacity = if is_core(o) || is_failing(o) { 1.0 } else { 0.75 };
        let tip = format!(
            "line {} · process {} · {} · {} · invoke index {} · completion index {}",
            o.line,
            o.process,
            o.desc,
            o.outcome,
            o.invoke_index,
            o.complete_index.map(|c| c.to_string()).unwrap_or_else(|| "none".into())
        );
        let _ = write!(
            svg,
            r#"<g opacity="{opacity}"><title>{}</title><rect x="{x0:.1}" y="{y:.1}" width="{w:.1}" height="{}" rx="3" fill="{fill}" stroke="{stroke}" stroke-width="{sw}"{dash}/>"#,
            esc(&tip),
            LANE_PX - 10.0
        );
        let label = fit(
            &format!("{} {}", o.desc, if o.outcome == "ok" { "" } else { &o.outcome }),
            w,
        );
        if !label.is_empty() {
            let strike = if o.outcome == "fail" {
                r#" text-decoration="line-through""#
            } else {
                ""
            };
            let _ = write!(
                svg,
                r#"<text x="{:.1}" y="{:.1}"{strike}>{}</text>"#,
                x0 + 3.0,
                y + LANE_PX / 2.0,
                esc(&label)
            );
        }
        svg.push_str("</g>");
    }
    // The axis: columns are history events in order, labelled with their
    // times.
    let axis_y = lanes_bottom + 16.0;
    for (x, index, t) in axis.ticks() {
        let label = match labels {
            AxisLabels::Time => fmt_time(t),
            AxisLabels::Position => format!("#{index}"),
        };
        let _ = write!(
            svg,
            r##"<line x1="{x:.1}" y1="{}" x2="{x:.1}" y2="{}" stroke="#bbb"/><text x="{x:.1}" y="{axis_y}" fill="#555" text-anchor="middle">{}</text>"##,
            axis_y - 14.0,
            axis_y - 10.0,
            esc(&label)
        );
    }
    let _ = write!(
        svg,
        r##"<text x="{:.1}" y="{:.1}" fill="#444" text-anchor="middle">history events in order (hatched: a stretch without the core's, folded); labels: {}</text>"##,
        LABEL_PX + PLOT_PX / 2.0,
        axis_y + 18.0,
        match labels {
            AxisLabels::Time => "time since the start",
            AxisLabels::Position => "position in the history (its times are not nanoseconds of a run)",
        }
    );
    svg.push_str("</svg>");

    let mut core_rows = String::new();
    for o in &v.core {
        let _ = write!(
            core_rows,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            o.line,
            esc(&o.process),
            esc(&o.desc),
            esc(&o.outcome),
            o.invoke_index,
            o.complete_index.map(|c| c.to_string()).unwrap_or_else(|| "–".into())
        );
    }
    let key = v
        .key
        .as_deref()
        .map(|k| format!(" — key {}", esc(k)))
        .unwrap_or_default();
    format!(
        r#"<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>drift: not linearizable{key}</title>
<style>
body {{ font-family: sans-serif; margin: 24px; color: #222; }}
pre {{ background: #fafafa; border: 1px solid #ddd; padding: 10px; white-space: pre-wrap; }}
table {{ border-collapse: collapse; font-family: monospace; }}
td, th {{ border: 1px solid #ccc; padding: 3px 8px; text-align: left; }}
.legend span {{ display: inline-block; margin-right: 16px; }}
.sw {{ display: inline-block; width: 14px; height: 10px; border: 1px solid; margin-right: 4px; vertical-align: middle; }}
</style></head><body>
<h1>Not linearizable{key}</h1>
<p>{}</p>
<p><b>{}</b></p>
<div class="legend">
<span><i class="sw" style="background:#c8e6c9;border-color:#388e3c"></i>ok</span>
<span><i class="sw" style="background:#ffe0b2;border-color:#ef6c00;border-style:dashed"></i>info / no completion (may take effect any time after its invoke, or never)</span>
<span><i class="sw" style="background:#eee;border-color:#9e9e9e"></i>fail (did not happen)</span>
<span><i class="sw" style="background:#fff;border-color:#e53935;border-width:2px"></i>core: cannot all hold</span>
<span><i class="sw" style="background:#ffcdd2;border-color:#b71c1c;border-width:2px"></i>the return no linearization passes</span>
</div>
{svg}
<p>{folded_note}</p>
<h2>Why</h2>
<pre>{}</pre>
<h2>The operations that cannot all hold</h2>
<table><tr><th>line</th><th>process</th><th>operation</th><th>outcome</th><th>invoke index</th><th>completion index</th></tr>
{core_rows}</table>
</body></html>
"#,
        esc(title),
        esc(v.explanation.lines().next().unwrap_or("")),
        esc(&v.explanation),
        folded_note = if folded == 0 {
            String::new()
        } else {
            format!("{folded} operations lying wholly in folded stretches are not drawn.")
        },
    )
}

/// One column of the axis: a history event, or a folded stretch of them.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Column {
    Event {
        index: u64,
        time: i64,
    },
    /// `count` events between the neighbouring columns, none of the core's.
    Folded {
        count: usize,
    },
}

/// The axis: the core's events (invokes, returns, the failing return) and
/// [`CONTEXT_EVENTS`] of the window's events either side of each, in
/// history order, a folded column standing for each stretch between them;
/// as many pixels a column as fit [`PLOT_PX`].
struct Axis {
    columns: Vec<Column>,
    step: f64,
}

impl Axis {
    fn new(v: &Violation) -> Axis {
        let mut all: Vec<(u64, i64)> = vec![(v.prefix_end_index, v.prefix_end_time)];
        for o in &v.window {
            all.push((o.invoke_index, o.invoke_time));
            if let (Some(i), Some(t)) = (o.complete_index, o.complete_time) {
                if i <= v.prefix_end_index {
                    all.push((i, t));
                }
            }
        }
        all.sort_unstable();
        all.dedup_by_key(|e| e.0);
        let mut keep = vec![false; all.len()];
        let mut mark = |index: u64| {
            let r = all.partition_point(|e| e.0 < index);
            let end = (r + CONTEXT_EVENTS + 1).min(all.len());
            keep[r.saturating_sub(CONTEXT_EVENTS)..end].fill(true);
        };
        mark(v.prefix_end_index);
        for o in v.core.iter().chain(std::iter::once(&v.failing)) {
            mark(o.invoke_index);
            if let Some(c) = o.complete_index.filter(|&c| c <= v.prefix_end_index) {
                mark(c);
            }
        }
        let mut columns = Vec::new();
        let mut skipped = 0;
        for (k, &(index, time)) in all.iter().enumerate() {
            if keep[k] {
                if skipped > 0 {
                    columns.push(Column::Folded { count: skipped });
                    skipped = 0;
                }
                columns.push(Column::Event { index, time });
            } else {
                skipped += 1;
            }
        }
        let step = (PLOT_PX / (columns.len() as f64 + 1.5)).clamp(EVENT_PX_MIN, EVENT_PX_MAX);
        Axis { columns, step }
    }

    /// The column rank of history index `i`: its own column, or the folded
    /// column it falls in (or the ends).
    fn rank(&self, i: u64) -> f64 {
        let mut last_event = None;
        for (r, c) in self.columns.iter().enumerate() {
            if let Column::Event { index, .. } = c {
                if *index == i {
                    return r as f64;
                }
                if *index > i {
                    // between the previous event column and this one: the
                    // folded column there, if any
                    return match last_event {
                        Some(p) if p + 1 < r => (p + 1) as f64,
                        _ => r as f64 - 0.5,
                    };
                }
                last_event = Some(r);
            }
        }
        self.columns.len() as f64
    }

    /// Centre of the column of history index `i`.
    fn x(&self, i: u64) -> f64 {
        LABEL_PX + (self.rank(i) + 0.5) * self.step
    }

    /// Whether op `o` spans at least one event column.
    fn touches(&self, o: &OpRef) -> bool {
        let end = o.complete_index.unwrap_or(u64::MAX);
        self.columns
            .iter()
            .any(|c| matches!(c, Column::Event { index, .. } if *index >= o.invoke_index && *index <= end))
    }

    /// The right edge, where open-ended ops run to.
    fn end(&self) -> f64 {
        LABEL_PX + (self.columns.len() as f64 + 1.5) * self.step
    }

    fn width(&self) -> f64 {
        self.end() + 20.0
    }

    /// (x, events) of each folded column.
    fn folds(&self) -> Vec<(f64, usize)> {
        self.columns
            .iter()
            .enumerate()
            .filter_map(|(r, c)| match c {
                Column::Folded { count } => Some((LABEL_PX + (r as f64 + 0.5) * self.step, *count)),
                Column::Event { .. } => None,
            })
            .collect()
    }

    /// (x, history index, time) of at most [`TICKS_MAX`] event columns,
    /// spread evenly.
    fn ticks(&self) -> Vec<(f64, u64, i64)> {
        let events: Vec<(usize, u64, i64)> = self
            .columns
            .iter()
            .enumerate()
            .filter_map(|(r, c)| match c {
                Column::Event { index, time } => Some((r, *index, *time)),
                Column::Folded { .. } => None,
            })
            .collect();
        let every = events.len().div_ceil(TICKS_MAX).max(1);
        events
            .iter()
            .step_by(every)
            .map(|&(r, index, t)| (LABEL_PX + (r as f64 + 0.5) * self.step, index, t))
            .collect()
    }
}

/// Cuts a label to what fits in `width_px` of 11px monospace.
fn fit(label: &str, width_px: f64) -> String {
    let chars = ((width_px - 6.0) / 6.7).floor().max(0.0) as usize;
    let label = label.trim();
    let compact = label
        .replace("read → ", "r ")
        .replace("get → ", "g ")
        .replace("write ", "w ")
        .replace("cas ", "c ")
        .replace(" → ", "→");
    if label.chars().count() <= chars {
        label.to_string()
    } else if compact.chars().count() <= chars {
        compact
    } else if chars >= 2 {
        let mut s: String = compact.chars().take(chars - 1).collect();
        s.push('…');
        s
    } else {
        String::new()
    }
}

/// A history time (ns since the start) for the axis.
fn fmt_time(ns: i64) -> String {
    let a = ns.unsigned_abs();
    if a >= 1_000_000_000 {
        format!("{:.3} s", ns as f64 / 1e9)
    } else if a >= 1_000_000 {
        format!("{:.3} ms", ns as f64 / 1e6)
    } else if a >= 1_000 {
        format!("{:.1} µs", ns as f64 / 1e3)
    } else {
        format!("{ns} ns")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped() {
        assert_eq!(
            esc("<a href='x'>&\"</a>"),
            "&lt;a href=&#39;x&#39;&gt;&amp;&quot;&lt;/a&gt;"
        );
    }

    fn op(process: u64, invoke: u64, complete: u64, desc: &str) -> OpRef {
        OpRef {
            process: process.to_string(),
            f: "write".into(),
            desc: desc.into(),
            outcome: "ok".into(),
            invoke_index: invoke,
            invoke_time: invoke as i64 * 1_000_000,
            complete_index: Some(complete),
            complete_time: Some(complete as i64 * 1_000_000),
            line: invoke + 1,
            complete_line: Some(complete + 1),
        }
    }

    #[test]
    fn a_proof_claims_its_op_and_no_prefix() {
        let read = op(1, 10, 11, "read → 9");
        let mut v = Violation {
            key: None,
            failing: read.clone(),
            core: vec![read.clone()],
            minimal: true,
            untried: 0,
            proof: Some("never-written".into()),
            after_index: None,
            any_state: true,
            window_states: Vec::new(),
            prefix_end_index: 11,
            prefix_end_time: 11_000_000,
            states: Vec::new(),
            window: vec![op(0, 8, 12, "write 1"), read],
            explanation: "key: none".into(),
        };
        let page = render(&v, "h", AxisLabels::Time);
        assert!(page.contains("this op cannot hold (never-written)"), "{page}");
        assert!(!page.contains("longest linearizable prefix"));
        v.proof = None;
        let page = render(&v, "h", AxisLabels::Time);
        assert!(page.contains("longest linearizable prefix"));
        assert!(page.contains("no linearization passes this return"));
    }

    #[test]
    fn a_core_spread_over_thousands_of_events_fits_a_1400_pixel_window() {
        // 1,000 ops over 2,000 events; the core: the first and the last
        let window: Vec<OpRef> = (0..1000).map(|k| op(k % 7, 2 * k, 2 * k + 1, "write 1")).collect();
        let core = vec![window[5].clone(), window[995].clone()];
        let v = Violation {
            key: None,
            failing: window[995].clone(),
            core: core.clone(),
            minimal: true,
            untried: 0,
            proof: None,
            after_index: None,
            any_state: false,
            window_states: Vec::new(),
            prefix_end_index: 1991,
            prefix_end_time: 1_991_000_000,
            states: vec!["1".into()],
            window,
            explanation: "key: none\nmore".into(),
        };
        let page = render(&v, "h", AxisLabels::Time);
        let width: f64 = page
            .split("<svg")
            .nth(1)
            .and_then(|s| s.split("width=\"").nth(1))
            .and_then(|s| s.split('"').next())
            .and_then(|w| w.parse().ok())
            .unwrap();
        assert!(width <= 1400.0 - 2.0 * 24.0, "the picture is {width} px wide");
        // both core ops and the failing return are drawn; most of the
        // window is folded and said so
        assert_eq!(page.matches(r##"stroke="#e53935""##).count(), 1, "the other core op");
        assert_eq!(page.matches(r##"stroke="#b71c1c""##).count(), 1, "the failing op");
        assert!(page.contains("folded"));
        assert!(page.contains("operations lying wholly in folded stretches are not drawn"));
        assert!(page.contains("labels: time since the start") && page.contains(" ms</text>"));
        // times that are not nanoseconds: the ticks name positions
        let page = render(&v, "h", AxisLabels::Position);
        assert!(
            page.contains(">#10</text>"),
            "the first core op's invoke is labelled by its index"
        );
        assert!(page.contains("labels: position in the history"));
        assert!(!page.contains(" ms</text>") && !page.contains(" µs</text>"));
    }

    #[test]
    fn labels_fit_their_boxes() {
        assert_eq!(fit("write 1", 200.0), "write 1");
        assert_eq!(fit("write 12345", 40.0), "w 12…");
        assert_eq!(fit("cas 1 → 2", 40.0), "c 1→2");
        assert_eq!(fit("write", 5.0), "");
    }
}
