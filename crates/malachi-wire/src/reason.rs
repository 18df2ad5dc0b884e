//! The reason strings of error answers: the workspace's one table (`malachi-reason`), which the
//! server sends and the client recognises.

pub use malachi_reason::{CONTROL_PLANE_TIMEOUT_TEXT, Reason};
