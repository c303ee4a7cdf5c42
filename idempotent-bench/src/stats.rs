//! Medians, percentiles and the benchmark's deterministic shuffles.

use serde::Serialize;

/// The median of `values` (0 for none).
pub fn median(values: Vec<f64>) -> f64 {
    percentile(values, 50.0)
}

/// The `p`th percentile of `values`, by the nearest rank (0 for none); the median of an even
/// count is the mean of the middle two.
pub fn percentile(mut values: Vec<f64>, p: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    if (p - 50.0).abs() < f64::EPSILON && values.len().is_multiple_of(2) {
        let mid = values.len() / 2;
        return (values[mid - 1] + values[mid]) / 2.0;
    }
    let rank = (p / 100.0 * values.len() as f64).ceil() as usize;
    values[rank.clamp(1, values.len()) - 1]
}

/// Median and 99th percentile of latencies, in microseconds.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Spread {
    pub p50_us: f64,
    pub p99_us: f64,
}

impl Spread {
    pub fn of(micros: &[f64]) -> Self {
        Self {
            p50_us: percentile(micros.to_vec(), 50.0),
            p99_us: percentile(micros.to_vec(), 99.0),
        }
    }
}

/// A xorshift generator: the same sequence every run.
#[derive(Debug, Clone)]
pub struct Xorshift(u64);

impl Xorshift {
    pub fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Fisher-Yates.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = usize::try_from(self.next() % (i as u64 + 1)).unwrap_or(0);
            items.swap(i, j);
        }
    }
}

/// Microseconds `f` took.
pub fn time_us(f: impl FnOnce()) -> f64 {
    let started = std::time::Instant::now();
    f();
    started.elapsed().as_secs_f64() * 1e6
}
