//! Every bound the codec applies, in one place, with the spec section that fixes it.
//!
//! Sizes are in bytes and fixed-width: nothing here depends on the platform's `usize` except the
//! in-memory bounds on pre-allocation.

/// Bytes of the length prefix in front of every frame (section 1.1).
pub const FRAME_LENGTH_BYTES: usize = 4;

/// Default largest frame body, length prefix not counted (section 1.2, `max_frame_size`). A body
/// of exactly this many bytes is accepted.
pub const FRAME_BYTES_MAX_DEFAULT: u32 = 16_777_216;

/// Bytes of the request envelope (`api_key:u16`, `corr:u32`) and of the response envelope
/// (`corr:u32`, `error_code:u16`); a body shorter than this cannot name its request.
pub const ENVELOPE_BYTES: usize = 6;

/// Default cap on a batch's `inflated_size` (section 2.4, `max_inflated_batch_bytes`). It is
/// independent of the frame limit because a compressed batch inflates past its frame.
pub const INFLATED_BATCH_BYTES_MAX_DEFAULT: u32 = 16_777_216;

/// Bytes of a batch header: `codec:u8`, `count:u32`, `inflated_size:u32`, `size:u32`.
pub const BATCH_HEADER_BYTES: usize = 13;

/// Most items a `list16` can carry (section 2); an encoder refuses longer lists.
pub const LIST16_ITEMS_MAX: usize = 65_535;

/// Most items a decoder reserves room for before it has read them. A count is first checked
/// against the bytes left, so this only caps the up-front allocation: a 16 MiB frame of minimal
/// items still decodes, by growing the vector as the items are actually read.
pub const PREALLOCATED_ITEMS_MAX: usize = 1024;
