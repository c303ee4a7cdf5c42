//! Throughput by variant, one panel per backend, as SVG.

use std::fmt::Write as _;

use crate::report::Report;
use crate::throughput::Throughput;
use crate::variants::{VARIANTS, Variant};

/// Throughput by variant, one panel per backend (each with its own scale: SQLite's replays would
/// flatten the servers' bars on a shared one), as SVG.
pub fn svg(report: &Report) -> String {
    const PANEL_WIDTH: f64 = 380.0;
    const HEIGHT: f64 = 380.0;
    const TOP: f64 = 60.0;
    const BOTTOM: f64 = 90.0;
    const LEFT: f64 = 56.0;
    let colors = [
        "#9e9e9e", "#bab0ac", "#79706e", "#d6d6d6", "#c9b8a0", "#f58518", "#ffbf79", "#4c78a8",
        "#72b7b2", "#54a24b", "#e45756",
    ];
    let measured: Vec<(&str, &Throughput)> = report
        .backends
        .iter()
        .filter_map(|b| Some((b.backend, b.throughput.as_ref()?)))
        .collect();
    let (rounds, jobs) = measured
        .first()
        .map_or((0, 0), |(_, t)| (t.rounds, t.jobs_per_round));
    let width = PANEL_WIDTH * measured.len() as f64 + 40.0;
    let plot_height = HEIGHT - TOP - BOTTOM;
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{HEIGHT}\" font-family=\"sans-serif\" font-size=\"11\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">Jobs per second by variant (median of {rounds} rounds of {jobs} jobs)</text>\n",
        width / 2.0
    );
    for (b, (name, throughput)) in measured.iter().enumerate() {
        let x0 = PANEL_WIDTH * b as f64;
        let max = throughput
            .jobs_per_second
            .values()
            .copied()
            .fold(1.0, f64::max)
            * 1.15;
        let _ = writeln!(
            svg,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\" font-size=\"13\">{}</text>",
            x0 + PANEL_WIDTH / 2.0,
            TOP - 14.0,
            name
        );
        for tick in 0..=4 {
            let value = max * f64::from(tick) / 4.0;
            let y = TOP + plot_height - plot_height * f64::from(tick) / 4.0;
            let _ = writeln!(
                svg,
                "<line x1=\"{:.1}\" x2=\"{:.1}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#e0e0e0\"/><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{value:.0}</text>",
                x0 + LEFT,
                x0 + PANEL_WIDTH - 10.0,
                x0 + LEFT - 4.0,
                y + 4.0
            );
        }
        let shown: Vec<Variant> = VARIANTS
            .into_iter()
            .filter(|v| throughput.jobs_per_second.contains_key(v.name()))
            .collect();
        let slot = (PANEL_WIDTH - LEFT - 10.0) / shown.len() as f64;
        for (v, variant) in shown.iter().enumerate() {
            let value = throughput.jobs_per_second[variant.name()];
            let height = plot_height * value / max;
            let x = x0 + LEFT + slot * v as f64 + slot * 0.15;
            let y = TOP + plot_height - height;
            let _ = writeln!(
                svg,
                "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{height:.1}\" fill=\"{}\"><title>{} {}: {value:.0} jobs/s</title></rect>\n\
                 <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"9\">{value:.0}</text>\n\
                 <text transform=\"translate({:.1},{:.1}) rotate(45)\" font-size=\"11\">{}</text>",
                slot * 0.7,
                colors[v % colors.len()],
                name,
                variant.name(),
                x + slot * 0.35,
                y - 3.0,
                x + slot * 0.2,
                TOP + plot_height + 12.0,
                variant.name()
            );
        }
    }
    svg.push_str("</svg>\n");
    svg
}
