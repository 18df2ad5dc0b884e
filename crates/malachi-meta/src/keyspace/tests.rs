//! Golden values for the key hash and tables for the block arithmetic.

use super::*;

/// Pinned forever: the expected values come from the reference C implementation (libxxhash via
/// python-xxhash, XXH3_64bits with seed 0), and the keys cover every xxh3 length class
/// (0, 1-3, 4-8, 9-16, 17-128, 129-240, > 240 bytes).
#[test]
fn key_point_golden_values() {
    let sixteen: Vec<u8> = (0u8..16).collect();
    let two_hundred = vec![b'y'; 200];
    let three_hundred = vec![b'x'; 300];
    let cases: &[(&[u8], u64)] = &[
        (b"", 0x2d06_8005_38d3_94c2),
        (b"a", 0xe6c6_32b6_1e96_4e1f),
        (b"abc", 0x78af_5f94_892f_3950),
        (b"orders", 0xa88c_cdc9_fa49_74fb),
        (b"user-42", 0x50fe_4b21_cf7b_09cd),
        (b"hello world", 0xd447_b1ea_40e6_988b),
        (&sixteen, 0x8355_e3a6_f617_70db),
        (b"abcdefghijklmnopqrstuvwxyz0123456789", 0x1173_f34a_884a_e63c),
        (&two_hundred, 0x78c5_ae5c_f7b1_237e),
        (&three_hundred, 0xa5d1_b460_7dc8_3554),
    ];
    for (key, expected) in cases {
        assert_eq!(key_point(key), *expected, "key {key:?}");
    }
}

#[test]
fn new_accepts_only_aligned_blocks() {
    let cases: &[(u64, u64, bool)] = &[
        (0, u64::MAX, true),
        (0, 0, true),
        (7, 7, true),
        (0, (1 << 63) - 1, true),
        (1 << 63, u64::MAX, true),
        (4, 7, true),
        (4, 8, false),
        (2, 5, false),
        (1, u64::MAX, false),
        (5, 4, false),
        (0, 2, false),
    ];
    for &(start, end_inclusive, valid) in cases {
        assert_eq!(
            Extent::new(start, end_inclusive).is_some(),
            valid,
            "[{start}, {end_inclusive}]"
        );
    }
}

#[test]
fn width_and_log2_table() {
    let half = 1u64 << 63;
    let cases: &[(Extent, u128, u32)] = &[
        (Extent::FULL, 1 << 64, 64),
        (Extent { start: 0, end_inclusive: half - 1 }, 1 << 63, 63),
        (Extent { start: 12, end_inclusive: 15 }, 4, 2),
        (Extent { start: 9, end_inclusive: 9 }, 1, 0),
    ];
    for (extent, width, log2) in cases {
        assert_eq!(extent.width(), *width, "{extent:?}");
        assert_eq!(extent.width_log2(), *log2, "{extent:?}");
    }
}

#[test]
fn halves_parent_and_buddy_table() {
    let half = 1u64 << 63;
    let low = Extent { start: 0, end_inclusive: half - 1 };
    let high = Extent { start: half, end_inclusive: u64::MAX };
    assert_eq!(Extent::FULL.halves(), Some([low, high]));
    assert_eq!(low.parent(), Some(Extent::FULL));
    assert_eq!(high.buddy(), Some(low));
    assert_eq!(Extent::FULL.parent(), None);
    assert_eq!(Extent::FULL.buddy(), None);
    let cases: &[(Extent, Extent, Extent)] = &[
        // (extent, its parent, its buddy)
        (
            Extent { start: 8, end_inclusive: 11 },
            Extent { start: 8, end_inclusive: 15 },
            Extent { start: 12, end_inclusive: 15 },
        ),
        (
            Extent { start: 12, end_inclusive: 15 },
            Extent { start: 8, end_inclusive: 15 },
            Extent { start: 8, end_inclusive: 11 },
        ),
        (
            Extent { start: 5, end_inclusive: 5 },
            Extent { start: 4, end_inclusive: 5 },
            Extent { start: 4, end_inclusive: 4 },
        ),
        (
            Extent { start: u64::MAX, end_inclusive: u64::MAX },
            Extent { start: u64::MAX - 1, end_inclusive: u64::MAX },
            Extent { start: u64::MAX - 1, end_inclusive: u64::MAX - 1 },
        ),
    ];
    for (extent, parent, buddy) in cases {
        assert_eq!(extent.parent(), Some(*parent), "{extent:?}");
        assert_eq!(extent.buddy(), Some(*buddy), "{extent:?}");
        let mut halves = parent.halves().expect("parent splits").to_vec();
        halves.retain(|half| half != extent);
        assert_eq!(halves, vec![*buddy]);
    }
    assert_eq!(Extent { start: 3, end_inclusive: 3 }.halves(), None);
}

#[test]
fn initial_tiling_table() {
    let quarter = 1u64 << 62;
    let cases: &[(u32, Vec<Extent>)] = &[
        (0, vec![Extent::FULL]),
        (
            2,
            vec![
                Extent { start: 0, end_inclusive: quarter - 1 },
                Extent { start: quarter, end_inclusive: 2 * quarter - 1 },
                Extent { start: 2 * quarter, end_inclusive: 3 * quarter - 1 },
                Extent { start: 3 * quarter, end_inclusive: u64::MAX },
            ],
        ),
    ];
    for (count_log2, expected) in cases {
        assert_eq!(&Extent::initial_tiling(*count_log2), expected);
    }
    let eight = Extent::initial_tiling(8);
    assert_eq!(eight.len(), 256);
    assert!(eight.iter().all(|extent| extent.width_log2() == 56));
}

#[test]
fn tiles_keyspace_table() {
    let [low, high] = Extent::FULL.halves().expect("splits");
    let [low_low, low_high] = low.halves().expect("splits");
    let cases: &[(Vec<Extent>, bool)] = &[
        (vec![Extent::FULL], true),
        (vec![low, high], true),
        (vec![low_low, low_high, high], true),
        (vec![], false),
        (vec![low], false),
        (vec![high], false),
        (vec![high, low], false),
        (vec![low, low, high], false),
        (vec![low_low, high], false),
        (vec![Extent::FULL, Extent::FULL], false),
        (vec![low, Extent::FULL], false),
    ];
    for (extents, tiles) in cases {
        assert_eq!(tiles_keyspace(extents.iter().copied()), *tiles, "{extents:?}");
    }
}
