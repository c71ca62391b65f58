//! How the CLI prints: for a person by default (tables, sizes in KiB,
//! times as dates with how long ago), or the node's JSON as it came with
//! `--json`, for scripts.

use std::time::{Duration, UNIX_EPOCH};

use serde_json::Value;

/// Which of the two forms a command prints.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Output {
    pub json: bool,
}

impl Output {
    /// Prints `v` as JSON with `--json`, else runs `human`.
    pub(crate) fn print(&self, v: &Value, human: impl FnOnce(&Value)) {
        if self.json {
            println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
        } else {
            human(v)
        }
    }
}

/// `24.0 KiB`, `1.5 MiB`; bytes below 1 KiB as they are.
pub(crate) fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

/// Unix milliseconds as `2026-12-02 03:01:52Z (in 5 s)` or `(3 min ago)`.
pub(crate) fn time(ms: u64) -> String {
    let at = UNIX_EPOCH + Duration::from_millis(ms);
    let stamp = humantime::format_rfc3339_seconds(at)
        .to_string()
        .replacen('T', " ", 1);
    let now = UNIX_EPOCH
        + Duration::from_millis(wasmkeep_runtime::Clock::now_ms(
            &wasmkeep_runtime::SystemClock,
        ));
    let relative = match at.duration_since(now) {
        Ok(ahead) => format!("in {}", span(ahead)),
        Err(e) => format!("{} ago", span(e.duration())),
    };
    format!("{stamp} ({relative})")
}

/// A duration in its largest whole unit: `5 s`, `3 min`, `2 h`, `4 d`.
pub(crate) fn span(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s} s"),
        60..3_600 => format!("{} min", s / 60),
        3_600..86_400 => format!("{} h", s / 3_600),
        _ => format!("{} d", s / 86_400),
    }
}

/// Unix milliseconds as a time of day with milliseconds, `03:01:52.123`
/// (UTC), for log lines.
pub(crate) fn clock(ms: u64) -> String {
    let day_ms = ms % 86_400_000;
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        day_ms / 3_600_000,
        day_ms / 60_000 % 60,
        day_ms / 1_000 % 60,
        day_ms % 1_000
    )
}

/// Prints rows as columns two spaces apart, the first row as the header.
pub(crate) fn table(rows: &[Vec<String>]) {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|i| {
            rows.iter()
                .filter_map(|r| r.get(i))
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for row in rows {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        println!("{}", cells.join("  ").trim_end());
    }
}

/// Text a tenant wrote (a log line, a stored value, a column's name), safe
/// to print on an operator's terminal: control characters (an escape
/// sequence could rewrite the screen) and text-reordering ones are shown
/// escaped, `\u{1b}`; tabs stay.
pub(crate) fn printable(s: &str) -> String {
    if !s.chars().any(unsafe_on_terminal) {
        return s.to_owned();
    }
    s.chars()
        .map(|c| {
            if unsafe_on_terminal(c) {
                c.escape_unicode().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// Control characters but the tab, and the invisible characters that
/// reorder or hide text (bidirectional overrides and isolates, zero-width
/// ones): a line must show what it holds.
fn unsafe_on_terminal(c: char) -> bool {
    (c.is_control() && c != '\t')
        || matches!(c, '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{FEFF}')
}

/// A cell of an inspection result: text as it is, a blob as UTF-8 where
/// valid (`x'…'` hex otherwise), null as `NULL`; a line break shown as
/// `↵` (the row stays one line of the table), other control characters
/// escaped.
pub(crate) fn cell(v: &Value) -> String {
    match v {
        Value::Null => "NULL".into(),
        Value::String(s) => one_line(s),
        Value::Object(o) => match o.get("blob_hex").and_then(Value::as_str) {
            Some(h) => blob(h),
            None => v.to_string(),
        },
        other => other.to_string(),
    }
}

/// Hex bytes as text when they are printable UTF-8, else `x'…'`.
pub(crate) fn blob(hex_text: &str) -> String {
    let Ok(raw) = hex::decode(hex_text) else {
        return format!("x'{hex_text}'");
    };
    match String::from_utf8(raw) {
        Ok(s) if !s.chars().any(|c| c.is_control() && c != '\n' && c != '\t') => one_line(&s),
        _ => format!("x'{hex_text}'"),
    }
}

/// [`printable`] text on one line: each line break (`\n`, `\r\n`) as `↵`.
pub(crate) fn one_line(s: &str) -> String {
    s.lines().map(printable).collect::<Vec<_>>().join("↵")
}

/// [`printable`] text over several lines: the first as it is, each next
/// one indented by `indent` spaces, so that no line a tenant wrote can
/// pass for a line of its own in a log (those start with a time).
pub(crate) fn indented(s: &str, indent: usize) -> String {
    let pad = format!("\n{}", " ".repeat(indent));
    s.lines().map(printable).collect::<Vec<_>>().join(&pad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_times_and_cells_read_as_a_person_expects() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(24_576), "24.0 KiB");
        assert_eq!(bytes(3 << 20), "3.0 MiB");
        assert_eq!(span(Duration::from_secs(59)), "59 s");
        assert_eq!(span(Duration::from_secs(7_200)), "2 h");
        assert_eq!(clock(1_796_000_973_103), "01:09:33.103");
        assert!(time(0).starts_with("1970-01-01 00:00:00Z ("));
        assert!(time(0).ends_with(" ago)"));
        assert_eq!(
            cell(&serde_json::json!({"blob_hex": "68656c6c6f"})),
            "hello"
        );
        assert_eq!(cell(&serde_json::json!({"blob_hex": "00ff"})), "x'00ff'");
        assert_eq!(cell(&Value::Null), "NULL");
        assert_eq!(cell(&serde_json::json!(7)), "7");
        assert_eq!(printable("red \u{1b}[31m\ttab"), "red \\u{1b}[31m\ttab");
        assert_eq!(printable("abc\u{202E}fed"), "abc\\u{202e}fed");
        assert_eq!(cell(&serde_json::json!("a\u{7}b")), "a\\u{7}b");
    }

    #[test]
    fn line_breaks_keep_a_table_row_on_one_line_and_a_log_line_indented() {
        let schema = "CREATE TABLE t (\n  a INT\r\n)";
        assert_eq!(
            cell(&serde_json::json!(schema)),
            "CREATE TABLE t (↵  a INT↵)"
        );
        let hex = hex::encode("x\ny");
        assert_eq!(cell(&serde_json::json!({ "blob_hex": hex })), "x↵y");
        let panic = "panicked at src/lib.rs:3:5:\nboom\n12:00:00.000 INFO  forged";
        assert_eq!(
            indented(panic, 4),
            "panicked at src/lib.rs:3:5:\n    boom\n    12:00:00.000 INFO  forged"
        );
        assert_eq!(indented("one \u{1b}[2J", 4), "one \\u{1b}[2J");
    }
}
