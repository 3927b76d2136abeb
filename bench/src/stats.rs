//! Percentiles.

use std::time::Duration;

/// Milliseconds at percentile `p` (0-100) of `values`; 0 when empty.
pub fn percentile(values: &[Duration], p: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut sorted: Vec<Duration> = values.to_vec();
    sorted.sort_unstable();
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)].as_secs_f64() * 1000.0
}

/// p50 and p99 in milliseconds.
pub fn p50_p99(values: &[Duration]) -> (f64, f64) {
    (percentile(values, 50.0), percentile(values, 99.0))
}
