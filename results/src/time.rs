//! UTC timestamps for run directories and files. Proleptic Gregorian
//! calendar from a Unix time; no time zones, no leap seconds.

use std::time::{SystemTime, UNIX_EPOCH};

/// Civil date (year, month 1..=12, day 1..=31) of a day count since
/// 1970-01-01 (Howard Hinnant's days-to-civil algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Parts of a UTC time: (year, month, day, hour, minute, second, millis).
fn parts(t: SystemTime) -> (i64, u32, u32, u32, u32, u32, u32) {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() as i64;
    let (y, mo, da) = civil_from_days(secs.div_euclid(86_400));
    let sod = secs.rem_euclid(86_400) as u32;
    (y, mo, da, sod / 3600, sod / 60 % 60, sod % 60, d.subsec_millis())
}

/// `20261130T052734.123Z`: sortable, and safe as a directory name.
pub fn dir_stamp(t: SystemTime) -> String {
    let (y, mo, d, h, mi, s, ms) = parts(t);
    format!("{y:04}{mo:02}{d:02}T{h:02}{mi:02}{s:02}.{ms:03}Z")
}

/// RFC 3339, e.g. `2026-11-30T05:27:34.123Z`.
pub fn rfc3339(t: SystemTime) -> String {
    let (y, mo, d, h, mi, s, ms) = parts(t);
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{ms:03}Z")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn known_instants_format_correctly() {
        let t = UNIX_EPOCH + Duration::from_millis(1_796_016_454_123);
        assert_eq!(rfc3339(t), "2026-11-30T05:27:34.123Z");
        assert_eq!(dir_stamp(t), "20261130T052734.123Z");
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        // leap day
        let t = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(rfc3339(t), "2000-02-29T00:00:00.000Z");
    }
}
