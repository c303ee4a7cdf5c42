//! Aligned plain-text tables, with cells made safe to print on a terminal.

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
        let width = |text: &str| text.chars().count();
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

/// `text` safe to print on a terminal: control characters (a newline, an escape sequence) and
/// the Unicode direction overrides are written as escapes, so that a key or an error text from
/// the database can neither break a table's lines nor drive the terminal.
pub fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        let bidi = matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
        if c.is_control() || bidi {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// `text` cut to at most `max` characters, with `…` at the end when cut.
pub fn truncate(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_owned()
    } else {
        let mut cut: String = text.chars().take(max.saturating_sub(1)).collect();
        cut.push('…');
        cut
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
