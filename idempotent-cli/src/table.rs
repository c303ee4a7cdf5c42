//! Aligned plain-text tables, with cells made safe to print on a terminal.
//!
//! Widths are terminal cells ([`UnicodeWidthStr`]): a CJK character or an emoji takes two, a
//! combining accent none, so that columns line up whatever the keys hold.

use unicode_width::{UnicodeWidthChar, UnicodeWidthStr};

/// How a column's cells line up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    /// Text: padded on the right.
    Left,
    /// Numbers: padded on the left.
    Right,
}

/// A table: a header row and rows of cells, rendered with two spaces between columns.
#[derive(Debug, Default)]
pub struct Table {
    /// Each column's header and alignment.
    columns: Vec<(&'static str, Align)>,
    /// The rows' cells, already printable.
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column headers.
    pub fn new(columns: &[(&'static str, Align)]) -> Self {
        Self {
            columns: columns.to_vec(),
            rows: Vec::new(),
        }
    }

    /// Adds a row; each cell is made printable (see [`printable`]).
    pub fn row<I, S>(&mut self, cells: I)
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.rows
            .push(cells.into_iter().map(|c| printable(c.as_ref())).collect());
    }

    /// The table as text, one line per row, each ending in a newline.
    pub fn render(&self) -> String {
        let width = |text: &str| text.width();
        let mut widths: Vec<usize> = self.columns.iter().map(|(h, _)| width(h)).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate().take(widths.len()) {
                widths[i] = widths[i].max(width(cell));
            }
        }
        let mut out = String::new();
        let headers = self.columns.iter().map(|(h, _)| (*h).to_owned()).collect();
        for row in std::iter::once(&headers).chain(&self.rows) {
            let mut line = String::new();
            for (i, ((_, align), w)) in self.columns.iter().zip(&widths).enumerate() {
                let cell = row.get(i).map_or("", String::as_str);
                let pad = " ".repeat(w.saturating_sub(width(cell)));
                if i > 0 {
                    line.push_str("  ");
                }
                match align {
                    Align::Left => {
                        line.push_str(cell);
                        line.push_str(&pad);
                    }
                    Align::Right => {
                        line.push_str(&pad);
                        line.push_str(cell);
                    }
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// `text` safe to print on a terminal: control characters (a newline, an escape sequence), the
/// Unicode direction overrides and marks, and every character a terminal draws as nothing or
/// hides (a zero-width space, a soft hyphen, a word joiner, a byte order mark, a variation
/// selector) are written as escapes, so that a key or an error text from the database can neither
/// break a table's lines nor drive the terminal, and two keys that differ only there never look
/// alike.
pub fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        // A backslash too: else a key holding the text `\u{200b}` would look like one holding
        // the character.
        if c.is_control() || invisible(c) || c == '\\' {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// The text that [`printable`] printed as `shown`, where `shown` holds its escapes (`\\`, `\n`,
/// `\u{200b}`); `None` where it holds none, or where `printable` would not print it so (a `\`
/// before anything else, an escape of a character it prints as it is).
pub fn unprintable(shown: &str) -> Option<String> {
    if !shown.contains('\\') {
        return None;
    }
    let mut out = String::with_capacity(shown.len());
    let mut rest = shown;
    while let Some(backslash) = rest.find('\\') {
        out.push_str(&rest[..backslash]);
        rest = &rest[backslash + 1..];
        let (c, len) = match rest.chars().next()? {
            '\\' => ('\\', 1),
            'n' => ('\n', 1),
            't' => ('\t', 1),
            'r' => ('\r', 1),
            'u' => {
                let close = rest.find('}')?;
                let hex = rest.get(..close)?.strip_prefix("u{")?;
                (
                    char::from_u32(u32::from_str_radix(hex, 16).ok()?)?,
                    close + 1,
                )
            }
            _ => return None,
        };
        out.push(c);
        rest = &rest[len..];
    }
    out.push_str(rest);
    // Exactly what `printable` writes: no other spelling of an escape, no escape of a character
    // it prints as it is.
    (printable(&out) == shown).then_some(out)
}

/// Unicode's default-ignorable code points (drawn as nothing) and its format characters
/// (general category Cf; among them the direction overrides, isolates and marks), Unicode 16.
fn invisible(c: char) -> bool {
    matches!(
        c,
        '\u{ad}'
            | '\u{34f}'
            | '\u{600}'..='\u{605}'
            | '\u{61c}'
            | '\u{6dd}'
            | '\u{70f}'
            | '\u{890}'..='\u{891}'
            | '\u{8e2}'
            | '\u{115f}'..='\u{1160}'
            | '\u{17b4}'..='\u{17b5}'
            | '\u{180b}'..='\u{180f}'
            | '\u{200b}'..='\u{200f}'
            | '\u{202a}'..='\u{202e}'
            | '\u{2060}'..='\u{206f}'
            | '\u{3164}'
            | '\u{fe00}'..='\u{fe0f}'
            | '\u{feff}'
            | '\u{ffa0}'
            | '\u{fff0}'..='\u{fffb}'
            | '\u{110bd}'
            | '\u{110cd}'
            | '\u{13430}'..='\u{1343f}'
            | '\u{1bca0}'..='\u{1bca3}'
            | '\u{1d173}'..='\u{1d17a}'
            | '\u{e0000}'..='\u{e0fff}'
    )
}

/// `text` cut to at most `max` terminal cells, with `…` at the end when cut.
pub fn truncate(text: &str, max: usize) -> String {
    if text.width() <= max {
        return text.to_owned();
    }
    let mut cut = String::new();
    let mut used = 0;
    for c in text.chars() {
        let w = c.width().unwrap_or(0);
        if used + w > max.saturating_sub(1) {
            break;
        }
        used += w;
        cut.push(c);
    }
    cut.push('…');
    cut
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two keys that differ by a character drawn as nothing print differently. Before, a zero-width
    /// space, the direction marks, a word joiner, a byte order mark or a soft hyphen were printed
    /// as they are, and `keys list` showed two rows that looked the same.
    #[test]
    fn keys_that_differ_invisibly_print_differently() {
        let plain = "invoice:2026-10:cust_481";
        for hidden in [
            '\u{200b}',
            '\u{200c}',
            '\u{200d}',
            '\u{200e}',
            '\u{200f}',
            '\u{2060}',
            '\u{2064}',
            '\u{feff}',
            '\u{ad}',
            '\u{202e}',
            '\u{2067}',
            '\u{fe0f}',
            '\u{e0041}',
            '\u{3164}',
        ] {
            let other = format!("invoice:2026-10:cust{hidden}_481");
            let shown = printable(&other);
            assert_ne!(shown, printable(plain), "U+{:04X}", u32::from(hidden));
            assert_eq!(
                shown,
                format!("invoice:2026-10:cust\\u{{{:x}}}_481", u32::from(hidden))
            );
        }
        // Nor does the escape look like the character: a key holding its text prints otherwise.
        assert_ne!(
            printable("invoice:2026-10:cust\u{200b}_481"),
            printable("invoice:2026-10:cust\\u{200b}_481")
        );
        assert_eq!(printable("a\\b"), "a\\\\b");
        // Visible text is untouched.
        assert_eq!(printable("Zürich 中 🦀 é"), "Zürich 中 🦀 é");
    }

    /// What `printable` printed reads back as the text it printed: `keys list`'s keys are given
    /// back as it prints them.
    #[test]
    fn printed_text_reads_back() {
        for text in [
            "long:C:\\tmp\\x0",
            "long:zw\u{200b}sp0",
            "a\nb\tc\u{1b}[2J\u{202e}",
            "two\\\\slashes",
            "Zürich 中 🦀",
        ] {
            let shown = printable(text);
            let expected = (shown != text).then(|| text.to_owned());
            assert_eq!(unprintable(&shown), expected, "{shown}");
        }
        // Not what `printable` writes: read as given.
        for shown in ["a\\x", "a\\", "\\u{41}", "\\u{zz}", "\\u{200B}", "\\u{200b"] {
            assert_eq!(unprintable(shown), None, "{shown}");
        }
    }

    #[test]
    fn aligns_columns() {
        let mut table = Table::new(&[
            ("JOB", Align::Left),
            ("KEYS", Align::Right),
            ("NOTE", Align::Left),
        ]);
        table.row(["charge", "12", "x"]);
        table.row(["digest-email", "3", ""]);
        assert_eq!(
            table.render(),
            "JOB           KEYS  NOTE\n\
             charge          12  x\n\
             digest-email     3\n"
        );
    }

    #[test]
    fn wide_characters_take_two_cells() {
        let mut table = Table::new(&[("KEY", Align::Left), ("DONE", Align::Left)]);
        table.row(["invoice:東京:42", "x"]);
        table.row(["welcome:🎉", "y"]);
        table.row(["plain", "z"]);
        table.row(["e\u{301}", "w"]); // e and a combining accent: one cell
        let text = table.render();
        let columns: Vec<usize> = text
            .lines()
            .map(|line| {
                let (before, _) = line.rsplit_once("  ").expect("two columns");
                UnicodeWidthStr::width(before) + 2
            })
            .collect();
        assert!(columns.iter().all(|c| *c == columns[0]), "{text}");
        assert_eq!(columns[0], "invoice:東京:42".width() + 2, "{text}");
        assert_eq!(truncate("東京東京", 5), "東京…");
        assert!(truncate("東京東京", 5).width() <= 5);
    }

    #[test]
    fn cells_cannot_drive_the_terminal() {
        assert_eq!(
            printable("a\nb\u{1b}[2Jc\u{202e}"),
            "a\\nb\\u{1b}[2Jc\\u{202e}"
        );
        assert_eq!(
            printable("invoice:2026-10:cust_481"),
            "invoice:2026-10:cust_481"
        );
        assert_eq!(truncate("abcdef", 4), "abc…");
        assert_eq!(truncate("abc", 4), "abc");
    }
}
