//! Load-driven split and merge: per-range rates over a sliding window, and the pure decision of
//! which ranges to split or merge. Time comes in as arguments; nothing here reads a clock.
//!
//! The original system has no trigger at all. Ours splits a range whose records/s or bytes/s
//! stay above a threshold and merges two buddy halves whose combined rate stays well below it,
//! with a cooldown per topic so a burst cannot make the topology flap, and a maximum number of
//! active ranges per topic.

use std::collections::BTreeMap;

/// Thresholds of automatic split and merge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadConfig {
    pub enabled: bool,
    /// Rates are averaged over this window.
    pub window_ms: u64,
    /// Split a range above either rate.
    pub split_records_per_s: u64,
    pub split_bytes_per_s: u64,
    /// Merge two buddies whose combined rates are below both of these.
    pub merge_records_per_s: u64,
    pub merge_bytes_per_s: u64,
    /// Minimum time between two reshapes of one topic, and minimum age of a range before it is
    /// judged (it needs a full window of history).
    pub cooldown_ms: u64,
    pub ranges_per_topic_max: u32,
}

impl Default for LoadConfig {
    fn default() -> LoadConfig {
        LoadConfig {
            enabled: true,
            window_ms: 30_000,
            split_records_per_s: 50_000,
            split_bytes_per_s: 32 * 1024 * 1024,
            merge_records_per_s: 5_000,
            merge_bytes_per_s: 2 * 1024 * 1024,
            cooldown_ms: 60_000,
            ranges_per_topic_max: 64,
        }
    }
}

/// Records and bytes per second over the window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rate {
    pub records_per_s: u64,
    pub bytes_per_s: u64,
}

const BUCKETS: u64 = 10;

/// A ring of per-bucket counts covering one window.
#[derive(Clone, Debug, Default)]
struct Window {
    /// (bucket number, records, bytes); bucket number = now_ms / bucket_ms.
    buckets: Vec<(u64, u64, u64)>,
}

/// Per-range load of every range this node writes.
#[derive(Clone, Debug)]
pub struct LoadTracker {
    bucket_ms: u64,
    ranges: BTreeMap<(u64, u32), Window>,
}

impl LoadTracker {
    pub fn new(window_ms: u64) -> LoadTracker {
        LoadTracker { bucket_ms: (window_ms / BUCKETS).max(1), ranges: BTreeMap::new() }
    }

    pub fn record(&mut self, topic_id: u64, range_id: u32, records: u64, bytes: u64, now_ms: u64) {
        let bucket = now_ms / self.bucket_ms;
        let window = self.ranges.entry((topic_id, range_id)).or_default();
        window.buckets.retain(|(number, _, _)| number + BUCKETS > bucket);
        match window.buckets.iter_mut().find(|(number, _, _)| *number == bucket) {
            Some(entry) => {
                entry.1 += records;
                entry.2 += bytes;
            }
            None => window.buckets.push((bucket, records, bytes)),
        }
    }

    pub fn rate(&self, topic_id: u64, range_id: u32, now_ms: u64) -> Rate {
        let Some(window) = self.ranges.get(&(topic_id, range_id)) else {
            return Rate::default();
        };
        let bucket = now_ms / self.bucket_ms;
        let (records, bytes) = window
            .buckets
            .iter()
            .filter(|(number, _, _)| number + BUCKETS > bucket && *number <= bucket)
            .fold((0, 0), |(records, bytes), (_, r, b)| (records + r, bytes + b));
        let window_s = (self.bucket_ms * BUCKETS).max(1);
        Rate { records_per_s: records * 1000 / window_s, bytes_per_s: bytes * 1000 / window_s }
    }

    /// The ranges with load recorded, in order.
    pub fn ranges(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.ranges.keys().copied()
    }

    /// Drops ranges that no longer take writes.
    pub fn retain(&mut self, mut keep: impl FnMut(u64, u32) -> bool) {
        self.ranges.retain(|(topic_id, range_id), _| keep(*topic_id, *range_id));
    }
}

/// An active range as the planner sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ActiveRange {
    pub range_id: u32,
    pub start: u64,
    pub end_inclusive: u64,
    pub created_ms: u64,
}

impl ActiveRange {
    fn width(&self) -> u128 {
        u128::from(self.end_inclusive) - u128::from(self.start) + 1
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reshape {
    Split { range_id: u32 },
    Merge { left: u32, right: u32 },
}

/// Decides at most one reshape for a topic: the hottest range over the split threshold, else the
/// coldest buddy pair under the merge threshold. `ranges` are the topic's active ranges.
pub fn plan_reshape(
    ranges: &[ActiveRange],
    rate_of: impl Fn(u32) -> Rate,
    last_reshape_ms: u64,
    now_ms: u64,
    config: &LoadConfig,
) -> Option<Reshape> {
    if !config.enabled || now_ms < last_reshape_ms.saturating_add(config.cooldown_ms) {
        return None;
    }
    let mature =
        |range: &ActiveRange| now_ms >= range.created_ms.saturating_add(config.cooldown_ms);
    let hot = |rate: Rate| {
        rate.records_per_s > config.split_records_per_s
            || rate.bytes_per_s > config.split_bytes_per_s
    };
    if (ranges.len() as u32) < config.ranges_per_topic_max {
        let hottest = ranges
            .iter()
            .filter(|range| mature(range) && range.width() > 1 && hot(rate_of(range.range_id)))
            .max_by_key(|range| {
                (rate_of(range.range_id).bytes_per_s, std::cmp::Reverse(range.range_id))
            });
        if let Some(range) = hottest {
            return Some(Reshape::Split { range_id: range.range_id });
        }
    }
    coldest_buddies(ranges, &rate_of, &mature, config)
}

fn coldest_buddies(
    ranges: &[ActiveRange],
    rate_of: &impl Fn(u32) -> Rate,
    mature: &impl Fn(&ActiveRange) -> bool,
    config: &LoadConfig,
) -> Option<Reshape> {
    let mut sorted: Vec<&ActiveRange> = ranges.iter().collect();
    sorted.sort_by_key(|range| range.start);
    let mut best: Option<(u64, Reshape)> = None;
    for pair in sorted.windows(2) {
        let (left, right) = (pair[0], pair[1]);
        if !are_buddies(left, right) || !mature(left) || !mature(right) {
            continue;
        }
        let (left_rate, right_rate) = (rate_of(left.range_id), rate_of(right.range_id));
        let records = left_rate.records_per_s + right_rate.records_per_s;
        let bytes = left_rate.bytes_per_s + right_rate.bytes_per_s;
        if records >= config.merge_records_per_s || bytes >= config.merge_bytes_per_s {
            continue;
        }
        let merge = Reshape::Merge { left: left.range_id, right: right.range_id };
        if best.is_none_or(|(best_bytes, _)| bytes < best_bytes) {
            best = Some((bytes, merge));
        }
    }
    best.map(|(_, merge)| merge)
}

/// Two ranges are buddies when they are the two halves of one aligned power-of-two block.
pub fn are_buddies(left: &ActiveRange, right: &ActiveRange) -> bool {
    let width = left.width();
    width == right.width()
        && width.is_power_of_two()
        && u128::from(right.start) == u128::from(left.start) + width
        && u128::from(left.start) % (2 * width) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    const HALF: u64 = 1 << 63;

    fn range(range_id: u32, start: u64, end_inclusive: u64) -> ActiveRange {
        ActiveRange { range_id, start, end_inclusive, created_ms: 0 }
    }

    #[test]
    fn rates_follow_the_window() {
        let mut tracker = LoadTracker::new(10_000);
        tracker.record(1, 0, 1000, 10_000, 0);
        tracker.record(1, 0, 1000, 10_000, 5_000);
        let cases = [(5_000, 200), (9_999, 200), (10_000, 100), (15_000, 0)];
        for (now_ms, records_per_s) in cases {
            assert_eq!(tracker.rate(1, 0, now_ms).records_per_s, records_per_s, "at {now_ms}");
        }
        assert_eq!(tracker.rate(1, 9, 0), Rate::default());
    }

    #[test]
    fn buddies_are_aligned_halves() {
        let cases = [
            (range(1, 0, HALF - 1), range(2, HALF, u64::MAX), true),
            (range(1, 0, (1 << 62) - 1), range(2, 1 << 62, HALF - 1), true),
            (range(1, 1 << 62, HALF - 1), range(2, HALF, HALF + (1 << 62) - 1), false),
            (range(1, 0, HALF - 1), range(2, HALF, HALF + (1 << 62) - 1), false),
        ];
        for (left, right, expected) in cases {
            assert_eq!(are_buddies(&left, &right), expected, "{left:?} {right:?}");
        }
    }

    #[test]
    fn plans_split_merge_or_nothing() {
        let config =
            LoadConfig { cooldown_ms: 100, ranges_per_topic_max: 4, ..LoadConfig::default() };
        let hot = Rate { records_per_s: 60_000, bytes_per_s: 0 };
        let cold = Rate { records_per_s: 10, bytes_per_s: 10 };
        let warm = Rate { records_per_s: 10_000, bytes_per_s: 0 };
        let two = [range(1, 0, HALF - 1), range(2, HALF, u64::MAX)];
        let one = [range(0, 0, u64::MAX)];
        type Case<'a> = (&'a [ActiveRange], Rate, u64, u64, Option<Reshape>);
        let cases: Vec<Case> = vec![
            (&one, hot, 0, 1_000, Some(Reshape::Split { range_id: 0 })),
            (&one, hot, 950, 1_000, None), // cooling down after the last reshape
            (&one, hot, 0, 50, None),      // range too young to judge
            (&two, cold, 0, 1_000, Some(Reshape::Merge { left: 1, right: 2 })),
            (&two, warm, 0, 1_000, None), // between the thresholds: hysteresis
        ];
        for (ranges, rate, last, now, expected) in cases {
            let got = plan_reshape(ranges, |_| rate, last, now, &config);
            assert_eq!(
                got,
                expected,
                "ranges {} rate {rate:?} last {last} now {now}",
                ranges.len()
            );
        }
        let full = LoadConfig { ranges_per_topic_max: 2, ..config };
        assert_eq!(plan_reshape(&two, |_| hot, 0, 1_000, &full), None, "at the range limit");
        let narrow = [range(0, 5, 5)];
        assert_eq!(plan_reshape(&narrow, |_| hot, 0, 1_000, &config), None, "width 1 cannot split");
    }
}
