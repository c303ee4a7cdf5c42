//! Stacked bar charts as inline SVG, drawn on the server: one bar per hour, one colour per series,
//! with a legend and the numbers in a table for screen readers and for reading exact values.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::html::esc;
use super::sql::HourRow;

/// Okabe-Ito colours: told apart with the common colour-vision deficiencies.
const COLOURS: [&str; 8] = [
    "#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000",
];

/// Counts per series and hour ago, `hours` hours back.
pub struct Series {
    /// Per series, per hour ago (0 = the last hour), the count.
    counts: BTreeMap<String, Vec<i64>>,
    /// The span in hours.
    hours: usize,
}

impl Series {
    /// The rows that fall within the last `hours` hours.
    pub fn new(rows: &[HourRow], hours: usize) -> Self {
        let mut counts: BTreeMap<String, Vec<i64>> = BTreeMap::new();
        for row in rows {
            let Ok(ago) = usize::try_from(row.hours_ago.max(0)) else {
                continue;
            };
            if ago < hours {
                counts
                    .entry(row.series.clone())
                    .or_insert_with(|| vec![0; hours])[ago] += row.n;
            }
        }
        Self { counts, hours }
    }

    /// The total of one series, for the numbers table.
    fn total(&self, series: &str) -> i64 {
        self.counts.get(series).map_or(0, |c| c.iter().sum())
    }
}

/// A chart with its caption, legend and numbers. `unit` names what is counted ("keys done").
pub fn chart(caption: &str, unit: &str, series: &Series) -> String {
    let mut out = format!("<figure><figcaption>{}</figcaption>", esc(caption));
    if series.counts.is_empty() {
        let _ = write!(
            out,
            "<p class=\"hint\">No {} in this span.</p></figure>",
            esc(unit)
        );
        return out;
    }
    out.push_str(&svg(caption, series));
    out.push_str("<ul class=\"legend\">");
    for (i, name) in series.counts.keys().enumerate() {
        let _ = write!(
            out,
            "<li><svg class=\"swatch\" viewBox=\"0 0 1 1\" aria-hidden=\"true\"><rect width=\"1\" height=\"1\" fill=\"{}\"/></svg>{}: {} {}</li>",
            COLOURS[i % COLOURS.len()],
            esc(name),
            series.total(name),
            esc(unit)
        );
    }
    out.push_str("</ul>");
    out.push_str(&numbers(unit, series));
    out.push_str("</figure>");
    out
}

/// The bars: x is time (oldest left), y the count, one stacked bar per hour.
fn svg(caption: &str, series: &Series) -> String {
    let (width, height, left, bottom) = (720.0_f64, 200.0_f64, 40.0_f64, 20.0_f64);
    let hours = series.hours;
    let per_hour: Vec<i64> = (0..hours)
        .map(|h| series.counts.values().map(|c| c[h]).sum())
        .collect();
    let max = per_hour.iter().copied().max().unwrap_or(0).max(1);
    let bar = (width - left) / hours as f64;
    let scale = (height - bottom - 10.0) / max as f64;
    let mut out = format!(
        "<svg class=\"chart\" viewBox=\"0 0 {width} {height}\" role=\"img\" aria-label=\"{}: at most {max} in an hour\">",
        esc(caption)
    );
    let base = height - bottom;
    let _ = write!(
        out,
        "<line x1=\"{left}\" y1=\"{base}\" x2=\"{width}\" y2=\"{base}\" stroke=\"#4a4a4a\"/>\
<text x=\"{x}\" y=\"14\" font-size=\"12\" text-anchor=\"end\" fill=\"#1a1a1a\">{max}</text>\
<text x=\"{x}\" y=\"{base}\" font-size=\"12\" text-anchor=\"end\" fill=\"#1a1a1a\">0</text>",
        x = left - 4.0
    );
    for ago in 0..hours {
        let x = left + (hours - 1 - ago) as f64 * bar;
        let mut y = base;
        for (i, counts) in series.counts.values().enumerate() {
            if counts[ago] == 0 {
                continue;
            }
            let h = counts[ago] as f64 * scale;
            y -= h;
            let _ = write!(
                out,
                "<rect x=\"{x:.2}\" y=\"{y:.2}\" width=\"{w:.2}\" height=\"{h:.2}\" fill=\"{}\"/>",
                COLOURS[i % COLOURS.len()],
                w = (bar - 1.0).max(0.5)
            );
        }
    }
    let span = if hours > 48 {
        format!("{} days ago", hours / 24)
    } else {
        format!("{hours} hours ago")
    };
    let _ = write!(
        out,
        "<text x=\"{left}\" y=\"{h}\" font-size=\"12\" fill=\"#1a1a1a\">{span}</text>\
<text x=\"{width}\" y=\"{h}\" font-size=\"12\" text-anchor=\"end\" fill=\"#1a1a1a\">now</text></svg>",
        h = height - 4.0
    );
    out
}

/// The non-zero hours as a table, folded away.
fn numbers(unit: &str, series: &Series) -> String {
    let mut out = format!(
        "<details><summary>The numbers</summary><div class=\"scroll\"><table><caption>{} per hour</caption>\
<thead><tr><th scope=\"col\">series</th><th scope=\"col\">hours ago</th><th scope=\"col\" class=\"num\">{}</th></tr></thead><tbody>",
        esc(unit),
        esc(unit)
    );
    for (name, counts) in &series.counts {
        for (ago, n) in counts.iter().enumerate().filter(|(_, n)| **n > 0) {
            let _ = write!(
                out,
                "<tr><td>{}</td><td>{ago}</td><td class=\"num\">{n}</td></tr>",
                esc(name)
            );
        }
    }
    out.push_str("</tbody></table></div></details>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hours_fall_in_their_bars() {
        let row = |series: &str, hours_ago, n| HourRow {
            series: series.to_owned(),
            hours_ago,
            n,
        };
        let series = Series::new(
            &[row("charge", 0, 3), row("charge", 30, 2), row("hook", 5, 1)],
            24,
        );
        assert_eq!(series.total("charge"), 3, "30 hours ago is outside a day");
        let html = chart("Keys done per hour", "keys done", &series);
        assert!(html.contains("<svg") && html.contains("charge: 3 keys done"));
        assert!(html.contains("<td>hook</td><td>5</td><td class=\"num\">1</td>"));
        assert!(chart("x", "keys done", &Series::new(&[], 24)).contains("No keys done"));
    }
}
