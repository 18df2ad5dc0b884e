//! Latency samples and their percentiles.

/// Latencies in microseconds. Benchmarks are bounded in time, so keeping every sample is cheap
/// and gives exact percentiles.
#[derive(Debug, Default)]
pub struct Latencies {
    samples_us: Vec<u64>,
}

impl Latencies {
    pub fn record_us(&mut self, latency_us: u64) {
        self.samples_us.push(latency_us);
    }

    pub fn merge(&mut self, other: Latencies) {
        self.samples_us.extend(other.samples_us);
    }

    pub fn len(&self) -> usize {
        self.samples_us.len()
    }

    /// The value at `quantile` (0.0..=1.0) by the nearest-rank method; 0 without samples.
    pub fn percentile_us(&mut self, quantile: f64) -> u64 {
        if self.samples_us.is_empty() {
            return 0;
        }
        self.samples_us.sort_unstable();
        let rank = (quantile * self.samples_us.len() as f64).ceil() as usize;
        self.samples_us[rank.clamp(1, self.samples_us.len()) - 1]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let mut latencies = Latencies::default();
        for value in (1..=1000).rev() {
            latencies.record_us(value);
        }
        let cases = [(0.5, 500), (0.99, 990), (0.999, 999), (1.0, 1000), (0.0, 1)];
        for (quantile, expected) in cases {
            assert_eq!(latencies.percentile_us(quantile), expected, "q {quantile}");
        }
        assert_eq!(Latencies::default().percentile_us(0.5), 0);
    }
}
