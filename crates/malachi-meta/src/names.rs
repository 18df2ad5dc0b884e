//! Name rules for topics, storage policies, consumer groups and users. Does no I/O.
//!
//! Topic and policy names share one rule, `[A-Za-z0-9._-]{1,249}` and neither `.` nor `..`, so
//! a name is always safe as a path component and a metric label. Group names and usernames are
//! opaque to the system; they are bounded in length and may not hold control characters.

use crate::error::TopicError;

/// Longest topic or policy name, in bytes.
pub const NAME_MAX_BYTES: usize = 249;
/// Longest consumer-group name or username, in bytes.
pub const LABEL_MAX_BYTES: usize = 255;

/// Checks a topic name; the error's reason is `invalid_topic_name`.
pub fn validate_topic_name(name: &str) -> Result<(), TopicError> {
    if is_valid_name(name) { Ok(()) } else { Err(TopicError::InvalidTopicName) }
}

/// The shared topic and policy name rule.
pub fn is_valid_name(name: &str) -> bool {
    let length_ok = !name.is_empty() && name.len() <= NAME_MAX_BYTES;
    length_ok
        && name != "."
        && name != ".."
        && name.bytes().all(|byte| byte.is_ascii_alphanumeric() || b"._-".contains(&byte))
}

/// The group-name and username rule: 1 to 255 bytes, no control characters.
pub fn is_valid_label(label: &str) -> bool {
    !label.is_empty() && label.len() <= LABEL_MAX_BYTES && !label.chars().any(char::is_control)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_name_table() {
        let long_ok = "a".repeat(NAME_MAX_BYTES);
        let too_long = "a".repeat(NAME_MAX_BYTES + 1);
        let cases: &[(&str, bool)] = &[
            ("orders", true),
            ("Orders.v2_final-1", true),
            ("...", true),
            ("a", true),
            (long_ok.as_str(), true),
            ("", false),
            (".", false),
            ("..", false),
            (too_long.as_str(), false),
            ("with space", false),
            ("slash/name", false),
            ("ünïcode", false),
            ("star*", false),
            ("nul\0", false),
        ];
        for (name, valid) in cases {
            let result = validate_topic_name(name);
            assert_eq!(result.is_ok(), *valid, "{name:?}");
            if let Err(error) = result {
                assert_eq!(error.reason(), "invalid_topic_name");
            }
        }
    }

    #[test]
    fn label_table() {
        let cases: &[(&str, bool)] = &[
            ("workers", true),
            ("group with spaces/and:colons", true),
            ("ünïcode", true),
            ("", false),
            ("tab\there", false),
            ("newline\n", false),
        ];
        for (label, valid) in cases {
            assert_eq!(is_valid_label(label), *valid, "{label:?}");
        }
        assert!(is_valid_label(&"x".repeat(LABEL_MAX_BYTES)));
        assert!(!is_valid_label(&"x".repeat(LABEL_MAX_BYTES + 1)));
    }
}
