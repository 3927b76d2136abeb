//! Times as the SQLite store writes and reads them.

use chrono::{DateTime, SecondsFormat, Utc};

use crate::store::{Result, StoreError};

/// Timestamps as sqlx's SQLite driver writes them, so both sides compare:
/// RFC 3339 with 0, 3, 6 or 9 digits of the second's fraction (as many
/// as it needs) and `+00:00`, as chrono's `to_rfc3339_opts(AutoSi,
/// false)` writes them.
///
/// Written here digit by digit: the writer thread formats two a
/// journaled event (its row's and its run's), and chrono's, through
/// `fmt`, was 3.7 % of that thread's time under paced streams (issue
/// 42). A year outside 0-9999 or a leap second goes to chrono.
pub(in crate::store) fn ts(at: DateTime<Utc>) -> String {
    use chrono::{Datelike, Timelike};
    let (date, time) = (at.date_naive(), at.time());
    let (year, nanos) = (date.year(), time.nanosecond());
    let Ok(year) = u32::try_from(year) else {
        return at.to_rfc3339_opts(SecondsFormat::AutoSi, false);
    };
    if year > 9999 || nanos >= 1_000_000_000 {
        return at.to_rfc3339_opts(SecondsFormat::AutoSi, false);
    }
    let mut out = [0u8; 35];
    let mut len = digits_into(&mut out, 0, year, 4);
    let fields = [
        (b'-', date.month(), 2),
        (b'-', date.day(), 2),
        (b'T', time.hour(), 2),
        (b':', time.minute(), 2),
        (b':', time.second(), 2),
    ];
    for (before, value, digits) in fields {
        out[len] = before;
        len += 1;
        len = digits_into(&mut out, len, value, digits);
    }
    let fraction = if nanos == 0 {
        None
    } else if nanos % 1_000_000 == 0 {
        Some((nanos / 1_000_000, 3))
    } else if nanos % 1_000 == 0 {
        Some((nanos / 1_000, 6))
    } else {
        Some((nanos, 9))
    };
    if let Some((value, digits)) = fraction {
        out[len] = b'.';
        len = digits_into(&mut out, len + 1, value, digits);
    }
    for &byte in b"+00:00" {
        out[len] = byte;
        len += 1;
    }
    // Only ASCII digits and separators were written.
    String::from_utf8_lossy(&out[..len]).into_owned()
}

/// Writes `value`'s last `digits` decimal digits at `at`; the place
/// after them.
fn digits_into(out: &mut [u8], at: usize, value: u32, digits: u32) -> usize {
    let mut rest = value;
    for place in (0..digits as usize).rev() {
        // A digit: below 10, so the cast keeps it.
        out[at + place] = b'0' + (rest % 10) as u8;
        rest /= 10;
    }
    at + digits as usize
}

/// A timestamp as [`ts`] (or sqlx) wrote it.
pub(in crate::store) fn parse_ts(raw: &str) -> Result<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(raw)
        .map(|at| at.with_timezone(&Utc))
        .or_else(|_| {
            chrono::NaiveDateTime::parse_from_str(raw, "%Y-%m-%d %H:%M:%S%.f")
                .map(|at| at.and_utc())
        })
        .map_err(|e| StoreError::Corrupt(format!("timestamp {raw:?}: {e}")))
}

#[cfg(test)]
mod tests {
    use chrono::{DateTime, NaiveDate, SecondsFormat, Utc};

    use super::{parse_ts, ts};

    fn chrono_writes(at: DateTime<Utc>) -> String {
        at.to_rfc3339_opts(SecondsFormat::AutoSi, false)
    }

    /// Byte for byte what chrono writes: every width of the fraction,
    /// the ends of the years it writes itself, the years and the leap
    /// second it leaves to chrono, and a spread of instants between.
    #[test]
    fn a_time_is_written_as_chrono_writes_it() {
        let mut instants = Vec::new();
        for nanos in [
            0,
            1,
            999,
            1_000,
            120_000,
            5_000_000,
            123_456_789,
            999_999_999,
        ] {
            for secs in [0_i64, 1_700_000_000, -1, 253_402_300_799, -62_167_219_200] {
                instants.push(DateTime::from_timestamp(secs, nanos).unwrap());
            }
        }
        // Outside 0-9999, and a leap second.
        instants.push(DateTime::from_timestamp(253_402_300_800, 5).unwrap());
        instants.push(DateTime::from_timestamp(-62_167_219_201, 7_000).unwrap());
        let leap = NaiveDate::from_ymd_opt(2016, 12, 31)
            .unwrap()
            .and_hms_nano_opt(23, 59, 59, 1_500_000_000)
            .unwrap()
            .and_utc();
        instants.push(leap);
        // A spread: a step that is prime in seconds and in nanoseconds.
        let mut at = DateTime::from_timestamp(-5_000_000_000, 0).unwrap();
        for _ in 0..20_000 {
            instants.push(at);
            at += chrono::Duration::seconds(1_000_003) + chrono::Duration::nanoseconds(7_919_011);
        }
        for at in instants {
            let written = ts(at);
            assert_eq!(written, chrono_writes(at), "{at:?}");
            if (0..=9999).contains(&chrono::Datelike::year(&at)) {
                assert_eq!(parse_ts(&written).unwrap(), at, "{written} reads back");
            }
        }
    }
}
