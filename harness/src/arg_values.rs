//! Parsers of option values that need more than a type: bounded numbers,
//! JSON. Shared by the commands' argument structs.

/// `--init`: a JSON value.
pub(crate) fn parse_json(s: &str) -> Result<serde_json::Value, String> {
    serde_json::from_str(s).map_err(|e| format!("not JSON ({e}); a string needs its quotes: '\"\"'"))
}

/// A finite number in `lo..=hi` (`lo` itself excluded when `open`).
pub(crate) fn f64_within(s: &str, lo: f64, hi: f64, open: bool) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("`{s}` is not a number"))?;
    let above = if open { v > lo } else { v >= lo };
    if !v.is_finite() || !above || v > hi {
        let from = if open {
            format!("more than {lo}")
        } else {
            format!("at least {lo}")
        };
        return Err(format!("must be {from} and at most {hi}"));
    }
    Ok(v)
}

/// Longest time budget accepted, in seconds: a week (more is a typo).
pub const BUDGET_S_MAX: f64 = 7.0 * 86_400.0;

/// `--budget-s`: seconds, more than 0, at most a week.
pub(crate) fn parse_budget_s(s: &str) -> Result<f64, String> {
    f64_within(s, 0.0, BUDGET_S_MAX, true)
}

/// `--max-*` limits of compare: a percentage of at least 0.
pub(crate) fn parse_percent(s: &str) -> Result<f64, String> {
    f64_within(s, 0.0, 1e9, false)
}

/// A fraction: 0 to 1.
pub(crate) fn parse_fraction(s: &str) -> Result<f64, String> {
    f64_within(s, 0.0, 1.0, false)
}

/// `drift bench table --seconds`: a cell's length.
pub(crate) fn parse_cell_seconds(s: &str) -> Result<f64, String> {
    f64_within(s, 0.5, 600.0, false)
}

/// A count of at least 1.
pub(crate) fn usize_positive(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("`{s}` is not a whole number")),
    }
}
