//! The keyspace: `u64` points `[0, 2^64)`, the hash that maps a record key to its point, and the
//! power-of-two aligned blocks ("extents") that ranges own. Does no I/O.
//!
//! An extent is stored as `start` and `end_inclusive` so the whole keyspace is representable
//! (`0..=u64::MAX`) without a 65-bit integer. Every extent a range can own is a buddy block: its
//! width is a power of two (`2^0 ..= 2^64`) and its start is a multiple of its width. Widths are
//! computed in `u128` so `2^64` never overflows.

use serde::{Deserialize, Serialize};

/// The point a key routes to. Pinned forever by golden-value tests: changing it would move
/// every stored key to a different range.
pub fn key_point(key: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(key)
}

/// A contiguous, inclusive band of keyspace points. Constructed only through [`Extent::new`]
/// and the block operations below, so every value is an aligned power-of-two block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Extent {
    pub start: u64,
    pub end_inclusive: u64,
}

impl Extent {
    /// The whole keyspace, `[0, 2^64)`.
    pub const FULL: Extent = Extent { start: 0, end_inclusive: u64::MAX };

    /// An aligned power-of-two block, or `None` when `[start, end_inclusive]` is not one.
    pub fn new(start: u64, end_inclusive: u64) -> Option<Extent> {
        let extent = Extent { start, end_inclusive };
        extent.is_block().then_some(extent)
    }

    /// Number of points covered, `1 ..= 2^64`.
    pub fn width(&self) -> u128 {
        u128::from(self.end_inclusive - self.start) + 1
    }

    /// `log2(width)` for a block, `0 ..= 64`.
    pub fn width_log2(&self) -> u32 {
        assert!(self.is_block(), "extent {self:?} is not an aligned block");
        self.width().trailing_zeros()
    }

    /// True when the width is a power of two and the start is aligned to it.
    pub fn is_block(&self) -> bool {
        if self.end_inclusive < self.start {
            return false;
        }
        let width = self.width();
        width.is_power_of_two() && u128::from(self.start) % width == 0
    }

    pub fn contains(&self, point: u64) -> bool {
        self.start <= point && point <= self.end_inclusive
    }

    /// The two buddy halves `[low, high]`, split at the midpoint; `None` for a width-1 extent.
    pub fn halves(&self) -> Option<[Extent; 2]> {
        let width = self.width();
        if width < 2 {
            return None;
        }
        let half = u64::try_from(width / 2).expect("half of a width <= 2^64 fits in u64");
        let middle = self.start + half;
        let low = Extent { start: self.start, end_inclusive: middle - 1 };
        let high = Extent { start: middle, end_inclusive: self.end_inclusive };
        assert!(low.is_block() && high.is_block());
        Some([low, high])
    }

    /// The block of twice the width that contains this one; `None` for [`Extent::FULL`].
    pub fn parent(&self) -> Option<Extent> {
        let log2 = self.width_log2();
        if log2 == 64 {
            return None;
        }
        if log2 == 63 {
            return Some(Extent::FULL);
        }
        let double_width = 1u64 << (log2 + 1);
        let start = self.start & !(double_width - 1);
        Some(Extent { start, end_inclusive: start + (double_width - 1) })
    }

    /// The other half of this block's parent; `None` for [`Extent::FULL`].
    pub fn buddy(&self) -> Option<Extent> {
        let parent = self.parent()?;
        let [low, high] = parent.halves().expect("a parent block has width >= 2");
        Some(if low == *self { high } else { low })
    }

    /// The `2^count_log2` equal aligned blocks tiling the keyspace, in keyspace order.
    pub fn initial_tiling(count_log2: u32) -> Vec<Extent> {
        assert!(count_log2 <= 32, "initial tiling of 2^{count_log2} ranges is unbounded");
        let width_minus_one = u64::MAX >> count_log2;
        let tiling: Vec<Extent> = (0..(1u64 << count_log2))
            .map(|index| {
                let start = if count_log2 == 0 { 0 } else { index << (64 - count_log2) };
                Extent { start, end_inclusive: start + width_minus_one }
            })
            .collect();
        assert!(tiles_keyspace(tiling.iter().copied()));
        tiling
    }
}

/// True when the extents, given in ascending `start` order, cover `[0, 2^64)` exactly once.
pub fn tiles_keyspace(extents: impl IntoIterator<Item = Extent>) -> bool {
    let mut next_start: Option<u64> = Some(0);
    for extent in extents {
        if next_start != Some(extent.start) || extent.end_inclusive < extent.start {
            return false;
        }
        next_start = extent.end_inclusive.checked_add(1);
    }
    next_start.is_none()
}

#[cfg(test)]
mod tests;
