//! What the drills share: a schedule drawn from one seed, and the stall an event cost the load.

use std::time::{Duration, Instant};

/// A small seeded generator (SplitMix64): a drill's schedule is a function of its seed, so the
/// seed it prints replays it.
pub struct Schedule(u64);

impl Schedule {
    pub fn new(seed: u64) -> Schedule {
        Schedule(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }

    pub fn within(&mut self, range: std::ops::Range<u64>) -> u64 {
        range.start + self.below(range.end - range.start)
    }
}

/// The seed a drill runs with: `MALACHI_DRILL_SEED` when set (a replay), else one drawn from
/// the clock.
pub fn seed() -> u64 {
    let clock = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    let drawn = clock.unwrap_or_default().as_nanos() as u64 % 1_000_000;
    setting("MALACHI_DRILL_SEED", drawn)
}

/// The number in the environment variable `name`, or `default`.
pub fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|value| value.parse().ok()).unwrap_or(default)
}

/// The longest a producer waited for an acknowledgement during `window`: of the intervals
/// between consecutive acknowledgements in `acked_at` (sorted), the longest that overlaps the
/// window, counting the wait from the last acknowledgement to the window's end when none came
/// after it.
pub fn longest_gap_in(acked_at: &[Instant], (from, to): (Instant, Instant)) -> Duration {
    debug_assert!(acked_at.is_sorted(), "acknowledgement times are in order");
    let mut longest = Duration::ZERO;
    let mut previous: Option<Instant> = None;
    for &at in acked_at {
        let since = previous.unwrap_or(from);
        if at >= from && since <= to {
            longest = longest.max(at.saturating_duration_since(since));
        }
        if at > to {
            return longest;
        }
        previous = Some(at);
    }
    longest.max(to.saturating_duration_since(previous.unwrap_or(from)))
}
