//! A self-contained HTML page (inline SVG and CSS, no scripts, no external
//! resources) that draws one linearizability violation: the operations of
//! the window per process on a time axis, the longest linearizable prefix
//! shaded, the return no linearization passes marked, and the core — the
//! operations that cannot all hold — outlined in red.

use drift_checkers::linear::{OpRef, Violation};
use std::fmt::Write;

/// Most operations drawn; past it, those closest to the failing return win.
const OPS_DRAWN_MAX: usize = 400;
/// Horizontal room per history event: enough for a short label.
const EVENT_PX_MIN: f64 = 20.0;
/// The plot is at least this wide.
const PLOT_PX_MIN: f64 = 1000.0;
/// Most time labels on the axis.
const TICKS_MAX: usize = 10;
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

/// Renders the page for `v`; `title` names the history.
pub fn render(v: &Violation, title: &str) -> String {
    let mut ops: Vec<&OpRef> = v.window.iter().collect();
    if ops.len() > OPS_DRAWN_MAX {
        ops.sort_by_key(|o| v.prefix_end_index.abs_diff(o.invoke_index));
        ops.truncate(OPS_DRAWN_MAX);
    }
    let is_core = |o: &OpRef| v.core.iter().any(|c| c.invoke_index == o.invoke_index);
    let is_failing = |o: &OpRef| o.invoke_index == v.failing.invoke_index;

    let mut lanes: Vec<&str> = ops.iter().map(|o| o.process.as_str()).collect();
    lanes.sort_by_key(|p| (p.parse::<u64>().unwrap_or(u64::MAX), p.to_string()));
    lanes.dedup();

    let axis = Axis::new(&ops, v.prefix_end_index, v.prefix_end_time);
    let width = axis.width();
    let height = TOP_PX + lanes.len() as f64 * LANE_PX + 40.0;
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height}" viewBox="0 0 {width:.0} {height}" font-family="monospace" font-size="11">"#
    );
    // The longest linearizable prefix, and the return nothing passes.
    let cut_x = axis.x(v.prefix_end_index);
    let _ = write!(
        svg,
        r##"<rect x="{LABEL_PX}" y="{}" width="{}" height="{}" fill="#e8f5e9"/><text x="{}" y="{}" fill="#2e7d32">longest linearizable prefix</text>"##,
        TOP_PX - 14.0,
        cut_x - LABEL_PX,
        lanes.len() as f64 * LANE_PX + 14.0,
        LABEL_PX + 4.0,
        TOP_PX - 4.0
    );
    let _ = write!(
        svg,
        r##"<line x1="{cut_x}" y1="{}" x2="{cut_x}" y2="{}" stroke="#c62828" stroke-width="2"/><text x="{}" y="{}" fill="#c62828" text-anchor="end">no linearization passes this return ▸</text>"##,
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
    // Time axis.
    let axis_y = TOP_PX + lanes.len() as f64 * LANE_PX + 16.0;
    for (x, t) in axis.ticks() {
        let _ = write!(
            svg,
            r##"<line x1="{x:.1}" y1="{}" x2="{x:.1}" y2="{}" stroke="#bbb"/><text x="{x:.1}" y="{axis_y}" fill="#555" text-anchor="middle">{}</text>"##,
            axis_y - 14.0,
            axis_y - 10.0,
            esc(&fmt_time(t))
        );
    }
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
<pre>{}</pre>
<div class="legend">
<span><i class="sw" style="background:#c8e6c9;border-color:#388e3c"></i>ok</span>
<span><i class="sw" style="background:#ffe0b2;border-color:#ef6c00;border-style:dashed"></i>info / no completion (may take effect any time after its invoke, or never)</span>
<span><i class="sw" style="background:#eee;border-color:#9e9e9e"></i>fail (did not happen)</span>
<span><i class="sw" style="background:#fff;border-color:#e53935;border-width:2px"></i>core: cannot all hold</span>
<span><i class="sw" style="background:#ffcdd2;border-color:#b71c1c;border-width:2px"></i>the return no linearization passes</span>
</div>
{svg}
<h2>The operations that cannot all hold</h2>
<table><tr><th>line</th><th>process</th><th>operation</th><th>outcome</th><th>invoke index</th><th>completion index</th></tr>
{core_rows}</table>
</body></html>
"#,
        esc(title),
        esc(&v.explanation)
    )
}

/// The time axis: one column per history event in the window, so ops
/// that are close in real time still get room for a label; the tick labels
/// give the events' real times.
struct Axis {
    /// Sorted history indices of the events drawn.
    indices: Vec<u64>,
    times: Vec<i64>,
    step: f64,
}

impl Axis {
    fn new(ops: &[&OpRef], cut_index: u64, cut_time: i64) -> Axis {
        let mut events: Vec<(u64, i64)> = vec![(cut_index, cut_time)];
        for o in ops {
            events.push((o.invoke_index, o.invoke_time));
            if let (Some(i), Some(t)) = (o.complete_index, o.complete_time) {
                if i <= cut_index {
                    events.push((i, t));
                }
            }
        }
        events.sort_unstable();
        events.dedup_by_key(|e| e.0);
        let step = (PLOT_PX_MIN / events.len() as f64).max(EVENT_PX_MIN);
        Axis {
            indices: events.iter().map(|e| e.0).collect(),
            times: events.iter().map(|e| e.1).collect(),
            step,
        }
    }

    /// Centre of the column of history index `i` (events past the window
    /// land at its end).
    fn x(&self, i: u64) -> f64 {
        let rank = self.indices.partition_point(|&e| e < i);
        LABEL_PX + (rank as f64 + 0.5) * self.step
    }

    /// The right edge, where open-ended ops run to.
    fn end(&self) -> f64 {
        LABEL_PX + (self.indices.len() as f64 + 1.5) * self.step
    }

    fn width(&self) -> f64 {
        self.end() + 20.0
    }

    fn ticks(&self) -> Vec<(f64, i64)> {
        let every = self.indices.len().div_ceil(TICKS_MAX).max(1);
        (0..self.indices.len())
            .step_by(every)
            .map(|r| (self.x(self.indices[r]), self.times[r]))
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

    #[test]
    fn labels_fit_their_boxes() {
        assert_eq!(fit("write 1", 200.0), "write 1");
        assert_eq!(fit("write 12345", 40.0), "w 12…");
        assert_eq!(fit("cas 1 → 2", 40.0), "c 1→2");
        assert_eq!(fit("write", 5.0), "");
    }
}
