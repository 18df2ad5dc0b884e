//! How the client commands print: records as JSON lines, tables, times. Pure functions.

use std::fmt::Write as _;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use malachi_client::{PolicyField, PolicyValue, Record};

/// One record as a JSON object on one line, fields in this order:
/// `{"key":…,"value":…,"headers":{…},"timestamp_ms":…}`. `key` is `null` when the record has
/// none. Bytes that are not UTF-8 are written as standard base64 and flagged:
/// `"key_base64":true`, `"value_base64":true`, and `"headers_base64":true` (then every header
/// name and value is base64). A repeated header name keeps its first place and last value.
pub fn json_line(record: &Record) -> String {
    let mut line = String::from("{\"key\":");
    let mut flags = Vec::new();
    match &record.key {
        None => line.push_str("null"),
        Some(key) => {
            let (text, encoded) = text_or_base64(key);
            line.push_str(&json_string(&text));
            if encoded {
                flags.push("key_base64");
            }
        }
    }
    let (value, value_encoded) = text_or_base64(&record.value);
    let _ = write!(line, ",\"value\":{}", json_string(&value));
    if value_encoded {
        flags.push("value_base64");
    }
    let headers_encoded = record.headers.iter().any(|header| {
        std::str::from_utf8(&header.name).is_err() || std::str::from_utf8(&header.value).is_err()
    });
    let mut headers: Vec<(String, String)> = Vec::new();
    for header in &record.headers {
        let name = encode_bytes(&header.name, headers_encoded);
        let value = encode_bytes(&header.value, headers_encoded);
        // Like a JavaScript object (the Node client's view): a repeated name keeps its first
        // place and its last value.
        match headers.iter_mut().find(|(existing, _)| *existing == name) {
            Some(slot) => slot.1 = value,
            None => headers.push((name, value)),
        }
    }
    let headers: Vec<String> = headers
        .iter()
        .map(|(name, value)| format!("{}:{}", json_string(name), json_string(value)))
        .collect();
    let _ = write!(line, ",\"headers\":{{{}}}", headers.join(","));
    if headers_encoded {
        flags.push("headers_base64");
    }
    let _ = write!(line, ",\"timestamp_ms\":{}", record.timestamp_ms);
    for flag in flags {
        let _ = write!(line, ",\"{flag}\":true");
    }
    line.push('}');
    line
}

/// Left-aligned columns separated by two spaces, a header row first.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|header| header.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header_row: Vec<String> = headers.iter().map(|header| header.to_string()).collect();
    for row in std::iter::once(&header_row).chain(rows) {
        let cells: Vec<String> =
            row.iter().zip(&widths).map(|(cell, width)| format!("{cell:<width$}")).collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// `2026-01-01T00:00:00.000Z` for milliseconds since the Unix epoch (UTC, proleptic Gregorian).
pub fn utc_time(epoch_ms: u64) -> String {
    let seconds = epoch_ms / 1000;
    let days = i64::try_from(seconds / 86_400).unwrap_or(i64::MAX / 2);
    let (year, month, day) = civil_from_days(days);
    let second_of_day = seconds % 86_400;
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        second_of_day / 3600,
        second_of_day / 60 % 60,
        second_of_day % 60,
        epoch_ms % 1000
    )
}

/// A policy's fields as `name=value` pairs (`off` for a rule switched off).
pub fn policy_fields(fields: &[PolicyField]) -> String {
    let pairs: Vec<String> = fields
        .iter()
        .map(|field| format!("{}={}", lossy(field.name.as_deref()), policy_value(&field.value)))
        .collect();
    if pairs.is_empty() { "(inherits every rule)".to_string() } else { pairs.join(" ") }
}

pub fn policy_value(value: &PolicyValue) -> String {
    match value {
        PolicyValue::Null => "off".to_string(),
        PolicyValue::Integer(number) => number.to_string(),
        PolicyValue::String(text) => String::from_utf8_lossy(text).into_owned(),
    }
}

pub fn lossy(bytes: Option<&[u8]>) -> String {
    bytes.map(|bytes| String::from_utf8_lossy(bytes).into_owned()).unwrap_or_default()
}

fn text_or_base64(bytes: &[u8]) -> (String, bool) {
    match std::str::from_utf8(bytes) {
        Ok(text) => (text.to_string(), false),
        Err(_) => (STANDARD.encode(bytes), true),
    }
}

fn encode_bytes(bytes: &[u8], base64: bool) -> String {
    if base64 { STANDARD.encode(bytes) } else { String::from_utf8_lossy(bytes).into_owned() }
}

fn json_string(text: &str) -> String {
    serde_json::to_string(text).expect("a string always serializes")
}

/// Howard Hinnant's `civil_from_days`: days since 1970-01-01 to (year, month, day).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let shifted = days + 719_468;
    let era = shifted.div_euclid(146_097);
    let day_of_era = shifted.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = u32::try_from(day_of_year - (153 * month_index + 2) / 5 + 1).unwrap_or(1);
    let month = u32::try_from(if month_index < 10 { month_index + 3 } else { month_index - 9 })
        .unwrap_or(1);
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use malachi_client::Header;

    use super::*;

    fn record(key: Option<&[u8]>, value: &[u8], headers: &[(&[u8], &[u8])]) -> Record {
        Record {
            key: key.map(Bytes::copy_from_slice),
            value: Bytes::copy_from_slice(value),
            timestamp_ms: 1_767_225_600_000,
            headers: headers
                .iter()
                .map(|(name, value)| Header {
                    name: Bytes::copy_from_slice(name),
                    value: Bytes::copy_from_slice(value),
                })
                .collect(),
        }
    }

    #[test]
    fn json_lines() {
        let cases: &[(Record, &str)] = &[
            (
                record(Some(b"k1"), b"hello", &[(b"x-seq", b"1")]),
                r#"{"key":"k1","value":"hello","headers":{"x-seq":"1"},"timestamp_ms":1767225600000}"#,
            ),
            (
                record(None, b"say \"hi\"\n", &[]),
                r#"{"key":null,"value":"say \"hi\"\n","headers":{},"timestamp_ms":1767225600000}"#,
            ),
            (
                record(Some(&[0xff]), &[0, 1, 2, 0xfe], &[]),
                r#"{"key":"/w==","value":"AAEC/g==","headers":{},"timestamp_ms":1767225600000,"key_base64":true,"value_base64":true}"#,
            ),
            (
                record(None, b"v", &[(b"a", b"1"), (b"b", &[0x80]), (b"a", b"2")]),
                r#"{"key":null,"value":"v","headers":{"YQ==":"Mg==","Yg==":"gA=="},"timestamp_ms":1767225600000,"headers_base64":true}"#,
            ),
            (
                record(Some(b""), b"", &[(b"a", b"1"), (b"a", b"2")]),
                r#"{"key":"","value":"","headers":{"a":"2"},"timestamp_ms":1767225600000}"#,
            ),
        ];
        for (record, expected) in cases {
            let line = json_line(record);
            assert_eq!(line, *expected);
            serde_json::from_str::<serde_json::Value>(&line).expect("valid JSON");
        }
    }

    #[test]
    fn tables_align_columns() {
        let rows = vec![
            vec!["0".to_string(), "sealed".to_string(), "1,2".to_string()],
            vec!["12".to_string(), "active".to_string(), String::new()],
        ];
        let expected = "RANGE  STATE   CHILDREN\n0      sealed  1,2\n12     active\n";
        assert_eq!(table(&["RANGE", "STATE", "CHILDREN"], &rows), expected);
        assert_eq!(table(&["A"], &[]), "A\n");
    }

    #[test]
    fn utc_times() {
        let cases = [
            (0, "1970-01-01T00:00:00.000Z"),
            (1_767_225_600_000, "2026-01-01T00:00:00.000Z"),
            (951_782_400_123, "2000-02-29T00:00:00.123Z"),
            (1_709_251_199_999, "2024-02-29T23:59:59.999Z"),
        ];
        for (epoch_ms, expected) in cases {
            assert_eq!(utc_time(epoch_ms), expected);
        }
    }

    #[test]
    fn policy_fields_print_as_pairs() {
        let field = |name: &'static str, value| PolicyField { name: Some(name.into()), value };
        let fields = [
            field("retention.max_age_ms", PolicyValue::Integer(60_000)),
            field("retention.max_bytes", PolicyValue::Null),
            field("spread_by", PolicyValue::String("rack".into())),
        ];
        let expected = "retention.max_age_ms=60000 retention.max_bytes=off spread_by=rack";
        assert_eq!(policy_fields(&fields), expected);
        assert_eq!(policy_fields(&[]), "(inherits every rule)");
    }
}
