//! `report.svg`: latency over the run (top) and the latency distribution (bottom).

use std::path::Path;

use plotters::prelude::*;

use super::fire::{Run, SLICE};
use super::report::{Report, Slice};

/// Percentiles of the distribution chart, as "nines": x = -log10(1 - q).
const NINES: f64 = 4.0;

pub fn draw(path: &Path, report: &Report, run: &Run) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (1000, 820)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(410);
    over_time(&top, report)?;
    distribution(&bottom, run)?;
    root.present()?;
    Ok(())
}

fn over_time(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    report: &Report,
) -> anyhow::Result<()> {
    let seconds = report.duration_s.max(0.1);
    let highest = report
        .timeline
        .iter()
        .map(|s| s.max_ms)
        .fold(1.0_f64, f64::max);
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!(
                "Latency over the run — {} requests, {:.0}/s",
                report.requests, report.requests_per_s
            ),
            ("sans-serif", 20),
        )
        .margin(12)
        .margin_right(40)
        .x_label_area_size(36)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..seconds, 0.0..highest * 1.05)?;
    chart
        .configure_mesh()
        .x_desc("seconds since the first press")
        .y_desc("ms")
        .draw()?;
    let series = [
        ("p50", BLUE, (|s| s.p50_ms) as fn(&Slice) -> f64),
        ("p99", RED, |s| s.p99_ms),
        ("max", BLACK, |s| s.max_ms),
    ];
    for (label, color, value) in series {
        chart
            .draw_series(LineSeries::new(
                report
                    .timeline
                    .iter()
                    .map(|s| (s.at_s + SLICE.as_secs_f64() / 2.0, value(s))),
                &color,
            ))?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

fn distribution(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    run: &Run,
) -> anyhow::Result<()> {
    let h = &run.latency;
    let points: Vec<(f64, f64)> = (0..=400)
        .map(|i| {
            let nines = NINES * f64::from(i) / 400.0;
            let q = 1.0 - 10f64.powf(-nines);
            (nines, h.value_at_quantile(q) as f64 / 1000.0)
        })
        .collect();
    let highest = (h.max() as f64 / 1000.0).max(1.0);
    let mut chart = ChartBuilder::on(area)
        .caption("Latency distribution (all answers)", ("sans-serif", 20))
        .margin(12)
        .margin_right(40)
        .x_label_area_size(36)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..NINES, 0.0..highest * 1.05)?;
    chart
        .configure_mesh()
        .x_labels(5)
        .x_label_formatter(&|nines| {
            let percent = 100.0 * (1.0 - 10f64.powf(-nines));
            format!("p{percent:.2}")
        })
        .x_desc("percentile")
        .y_desc("ms")
        .draw()?;
    chart.draw_series(LineSeries::new(points, &BLUE))?;
    Ok(())
}
