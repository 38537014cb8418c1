//! Rendering a [`BenchResult`]: the plain-text tables, JSON (the schema is
//! docs/bench.schema.json), CSV and an SVG chart.

use super::{BenchResult, LatencyRow, Mode, Phase, Summary, ThroughputRow};
use serde_json::{json, Value};
use std::fmt::Write;

/// The `schema` field of the JSON document.
pub const SCHEMA_ID: &str = "nfsrdma-bench/1";

/// `4 KiB`, `1 MiB`, `1000 B`.
pub fn fmt_size(b: u64) -> String {
    for (unit, shift) in [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)] {
        if b >= 1 << shift && b.is_multiple_of(1 << shift) {
            return format!("{} {unit}", b >> shift);
        }
    }
    format!("{b} B")
}

/// `4k`, `1m`, `1000`: the spelling the options take.
pub fn fmt_size_short(b: u64) -> String {
    for (unit, shift) in [("t", 40), ("g", 30), ("m", 20), ("k", 10)] {
        if b >= 1 << shift && b.is_multiple_of(1 << shift) {
            return format!("{}{unit}", b >> shift);
        }
    }
    b.to_string()
}

fn ok_variants(r: &BenchResult) -> Vec<usize> {
    (0..r.variants.len())
        .filter(|&i| r.variants[i].error.is_none())
        .collect()
}

fn find_latency(r: &BenchResult, v: usize, rs: u64, phase: Phase) -> Option<&LatencyRow> {
    r.latency
        .iter()
        .find(|l| l.variant == v && l.record_size == rs && l.phase == phase)
}

fn record_sizes_run(r: &BenchResult) -> Vec<u64> {
    let mut out: Vec<u64> = Vec::new();
    for l in &r.latency {
        if !out.contains(&l.record_size) {
            out.push(l.record_size);
        }
    }
    out
}

fn us(v: f64) -> String {
    if v >= 1000.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// The tables printed by `nfsrdma bench`.
pub fn text(r: &BenchResult) -> String {
    let p = &r.plan;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "nfsrdma bench {}  {}:{}  {} mode  file {} per variant  {} round(s)  {}",
        env!("CARGO_PKG_VERSION"),
        p.server,
        p.path,
        p.mode.name(),
        fmt_size(p.file_size),
        p.rounds,
        r.date
    );
    let _ = writeln!(s, "variants:");
    for v in &r.variants {
        let state = match &v.error {
            None => format!("rsize {} wsize {}", v.rsize, v.wsize),
            Some(e) => format!("DID NOT RUN: {e}"),
        };
        let _ = writeln!(s, "  {:<3} {}  {state}", v.spec.label, v.spec.describe());
    }
    match p.mode {
        Mode::Latency => latency_tables(r, &mut s),
        Mode::Throughput => throughput_table(r, &mut s),
    }
    for n in &r.notes {
        let _ = writeln!(s, "note: {n}");
    }
    s
}

fn latency_tables(r: &BenchResult, s: &mut String) {
    let vs = ok_variants(r);
    let _ = writeln!(
        s,
        "\nQD1 latency, median, microseconds (FILE_SYNC writes, no client cache; one row per record size)"
    );
    let mut header = format!("{:>8}", "record");
    let mut cols = Vec::new();
    for ph in Phase::ALL {
        for &v in &vs {
            cols.push((ph, v));
            header.push_str(&format!(
                " {:>10}",
                format!("{}:{}", ph.name(), r.variants[v].spec.label)
            ));
        }
    }
    let _ = writeln!(s, "{header}");
    for rs in record_sizes_run(r) {
        let mut line = format!("{:>8}", fmt_size_short(rs));
        for &(ph, v) in &cols {
            let cell = find_latency(r, v, rs, ph)
                .map(|l| us(l.summary.median_us))
                .unwrap_or_else(|| "-".into());
            line.push_str(&format!(" {cell:>10}"));
        }
        let _ = writeln!(s, "{line}");
    }
    let _ = writeln!(s, "\nLatency percentiles, microseconds");
    let _ = writeln!(
        s,
        "{:<7} {:>7} {:<7} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7}  breakdown",
        "variant", "record", "phase", "samples", "median", "mean", "p99", "p99.9", "max", "retrans"
    );
    for rs in record_sizes_run(r) {
        for ph in Phase::ALL {
            for &v in &vs {
                if let Some(l) = find_latency(r, v, rs, ph) {
                    let m = &l.summary;
                    let _ = writeln!(
                        s,
                        "{:<7} {:>7} {:<7} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7}  {}",
                        r.variants[v].spec.label,
                        fmt_size_short(rs),
                        ph.name(),
                        m.samples,
                        us(m.median_us),
                        us(m.mean_us),
                        us(m.p99_us),
                        us(m.p999_us),
                        us(m.max_us),
                        l.retransmits,
                        breakdown_text(&l.breakdown)
                    );
                }
            }
        }
    }
}

fn breakdown_text(b: &Option<Vec<(String, f64)>>) -> String {
    match b {
        None => "n/a".into(),
        Some(steps) => steps
            .iter()
            .map(|(n, v)| format!("{n}={}", us(*v)))
            .collect::<Vec<_>>()
            .join(" "),
    }
}

fn throughput_table(r: &BenchResult, s: &mut String) {
    let t = &r.plan.throughput;
    let limit = match t.bytes {
        Some(b) => format!("{} per variant", fmt_size(b)),
        None => format!("{:.1} s per variant", t.runtime.as_secs_f64()),
    };
    let _ = writeln!(
        s,
        "\nThroughput: {} ({}% reads), bs {}, {} job(s) x iodepth {}, {limit}",
        t.rw.name(),
        t.read_percent(),
        fmt_size(t.bs),
        t.jobs,
        t.iodepth
    );
    let _ = writeln!(
        s,
        "{:<7} {:>9} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>12} {:>12}",
        "variant",
        "ops",
        "IOPS",
        "MB/s",
        "median",
        "mean",
        "p99",
        "p99.9",
        "client cores",
        "server cores"
    );
    for row in &r.throughput {
        let m = &row.summary;
        let _ = writeln!(
            s,
            "{:<7} {:>9} {:>10.0} {:>9.2} {:>9} {:>9} {:>9} {:>9} {:>12} {:>12}",
            r.variants[row.variant].spec.label,
            row.ops,
            row.iops(),
            row.mb_per_s(),
            us(m.median_us),
            us(m.mean_us),
            us(m.p99_us),
            us(m.p999_us),
            row.client_cpu_cores
                .map(|c| format!("{c:.2}"))
                .unwrap_or_else(|| "n/a".into()),
            row.server_cpu_cores
                .map(|c| format!("{c:.2}"))
                .unwrap_or_else(|| "n/a".into()),
        );
    }
    let _ = writeln!(s, "(latencies in microseconds)");
    for row in &r.throughput {
        if let Some(server) = row.server_turnaround_us {
            let client = row.summary.mean_us;
            let _ = writeln!(
                s,
                "{}: the server's mean turnaround {server:.1} us of the client's mean latency {client:.1} us ({:.0}%)",
                r.variants[row.variant].spec.label,
                if client > 0.0 { 100.0 * server / client } else { 0.0 },
            );
        }
    }
}

fn summary_json(m: &Summary) -> Value {
    json!({
        "samples": m.samples,
        "min_us": m.min_us,
        "median_us": m.median_us,
        "mean_us": m.mean_us,
        "p90_us": m.p90_us,
        "p99_us": m.p99_us,
        "p999_us": m.p999_us,
        "max_us": m.max_us,
    })
}

fn throughput_json(r: &BenchResult, t: &ThroughputRow) -> Value {
    json!({
        "variant": r.variants[t.variant].spec.label,
        "ops": t.ops,
        "read_ops": t.read_ops,
        "write_ops": t.write_ops,
        "bytes": t.bytes,
        "elapsed_s": t.elapsed_s,
        "iops": t.iops(),
        "mb_per_s": t.mb_per_s(),
        "latency": summary_json(&t.summary),
        "read_latency": t.read_summary.as_ref().map(summary_json),
        "write_latency": t.write_summary.as_ref().map(summary_json),
        "client_cpu_cores": t.client_cpu_cores,
        "server_cpu_cores": t.server_cpu_cores,
        "retransmits": t.retransmits,
        "server_turnaround_us": t.server_turnaround_us,
        "server_counters": t.server_counters,
    })
}

/// The JSON document (see docs/bench.md).
pub fn json(r: &BenchResult) -> Value {
    let p = &r.plan;
    let t = &p.throughput;
    let variants: Vec<Value> = r
        .variants
        .iter()
        .map(|v| {
            let o = &v.spec.options;
            json!({
                "label": v.spec.label,
                "transport": v.spec.choice.transport.name(),
                "remote_inv": v.spec.choice.remote_inv.name() == "on",
                "reg": v.spec.choice.reg.name(),
                "poll": v.spec.choice.poll.name(),
                "inline_bytes": v.spec.inline,
                "port": o.port,
                "mount_port": o.mount_port,
                "rsize": (v.error.is_none()).then_some(v.rsize),
                "wsize": (v.error.is_none()).then_some(v.wsize),
                "soft": o.soft,
                "timeo_s": o.timeo.as_secs_f64(),
                "status": if v.error.is_none() { "ok" } else { "failed" },
                "error": v.error,
                "transport_counters": v.transport.map(|t| json!({
                    "connects": t.connects,
                    "retransmits": t.retransmits,
                    "unmatched_replies": t.unmatched_replies,
                    "send_with_invalidate": t.send_with_invalidate,
                    "local_invalidations": t.local_invalidations,
                    "window_binds": t.window_binds,
                    "window_renewals": t.window_renewals,
                    "mr_registrations": t.mr_registrations,
                    "read_chunk_calls": t.read_chunk_calls,
                    "write_chunk_calls": t.write_chunk_calls,
                    "reply_chunk_calls": t.reply_chunk_calls,
                    "timed_calls": t.timed_calls,
                    "register_ns": t.register_ns,
                    "send_to_reply_ns": t.send_to_reply_ns,
                    "invalidate_ns": t.invalidate_ns,
                    "copy_out_ns": t.copy_out_ns,
                    "reply_bytes_copied": t.reply_bytes_copied,
                    "reply_bytes_lent": t.reply_bytes_lent,
                    "completions_by_caller": t.completions_by_caller,
                    "receives_lent": t.receives_lent,
                    "receives_copied": t.receives_copied,
                })),
            })
        })
        .collect();
    let latency: Option<Vec<Value>> = (p.mode == Mode::Latency).then(|| {
        r.latency
            .iter()
            .map(|l| {
                json!({
                    "variant": r.variants[l.variant].spec.label,
                    "record_size_bytes": l.record_size,
                    "phase": l.phase.name(),
                    "summary": summary_json(&l.summary),
                    "retransmits": l.retransmits,
                    "breakdown_us": l.breakdown.as_ref().map(|steps| {
                        steps
                            .iter()
                            .map(|(n, v)| (n.clone(), json!(v)))
                            .collect::<serde_json::Map<String, Value>>()
                    }),
                })
            })
            .collect()
    });
    let throughput: Option<Vec<Value>> = (p.mode == Mode::Throughput).then(|| {
        r.throughput
            .iter()
            .map(|row| throughput_json(r, row))
            .collect()
    });
    json!({
        "schema": SCHEMA_ID,
        "tool": {"name": "nfsrdma", "version": env!("CARGO_PKG_VERSION")},
        "host": {
            "kernel": r.host.kernel,
            "cpus": r.host.cpus,
            "rdma_devices": r.host.rdma_devices,
        },
        "date": r.date,
        "server": p.server,
        "path": p.path,
        "mode": p.mode.name(),
        "config": {
            "file_size_bytes": p.file_size,
            "record_sizes_bytes": if p.mode == Mode::Latency { p.record_sizes.clone() } else { Vec::new() },
            "rounds": p.rounds,
            "queue_depth": if p.mode == Mode::Latency { 1 } else { t.jobs * t.iodepth },
            "write_stability": "file_sync",
            "verify": p.verify,
            "throughput": (p.mode == Mode::Throughput).then(|| json!({
                "jobs": t.jobs,
                "iodepth": t.iodepth,
                "rw": t.rw.name(),
                "read_percent": t.read_percent(),
                "bs_bytes": t.bs,
                "runtime_s": t.bytes.is_none().then_some(t.runtime.as_secs_f64()),
                "bytes": t.bytes,
                "server_pids": t.server_pids,
                "server_metrics": t.server_metrics.as_ref().map(|u| u.to_string()),
            })),
        },
        "variants": variants,
        "latency": latency,
        "throughput": throughput,
        "notes": r.notes,
    })
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// The CSV header.
pub const CSV_HEADER: &str = "tool_version,date,server,path,mode,file_size_bytes,rounds,\
variant,transport,remote_inv,reg,poll,inline_bytes,record_size_bytes,phase,jobs,iodepth,rw,\
read_percent,samples,min_us,median_us,mean_us,p90_us,p99_us,p999_us,max_us,iops,mb_per_s,\
client_cpu_cores,server_cpu_cores,retransmits";

/// One row per summary (latency: variant × record size × phase;
/// throughput: variant), each with the run's configuration.
pub fn csv(r: &BenchResult) -> String {
    let p = &r.plan;
    let t = &p.throughput;
    let mut s = String::from(CSV_HEADER);
    s.push('\n');
    let opt = |v: Option<f64>| v.map(|x| format!("{x:.3}")).unwrap_or_default();
    let common = |v: usize| {
        let spec = &r.variants[v].spec;
        [
            env!("CARGO_PKG_VERSION").to_string(),
            r.date.clone(),
            csv_field(&p.server),
            csv_field(&p.path),
            p.mode.name().to_string(),
            p.file_size.to_string(),
            p.rounds.to_string(),
            spec.label.clone(),
            spec.choice.transport.name().to_string(),
            spec.choice.remote_inv.name().to_string(),
            spec.choice.reg.name().to_string(),
            spec.choice.poll.name().to_string(),
            spec.inline.map(|i| i.to_string()).unwrap_or_default(),
        ]
        .join(",")
    };
    let stats = |m: &Summary| {
        format!(
            "{},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3}",
            m.samples, m.min_us, m.median_us, m.mean_us, m.p90_us, m.p99_us, m.p999_us, m.max_us
        )
    };
    for l in &r.latency {
        let _ = writeln!(
            s,
            "{},{},{},1,1,,,{},,,,,{}",
            common(l.variant),
            l.record_size,
            l.phase.name(),
            stats(&l.summary),
            l.retransmits
        );
    }
    for row in &r.throughput {
        let _ = writeln!(
            s,
            "{},{},{},{},{},{},{},{},{:.1},{:.3},{},{},{}",
            common(row.variant),
            t.bs,
            t.rw.name(),
            t.jobs,
            t.iodepth,
            t.rw.name(),
            t.read_percent(),
            stats(&row.summary),
            row.iops(),
            row.mb_per_s(),
            opt(row.client_cpu_cores),
            opt(row.server_cpu_cores),
            row.retransmits
        );
    }
    s
}

const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// One series of a chart: a name and one value per x label (`None`: no
/// point).
type Series = (String, Vec<Option<f64>>);

/// Where a panel goes: top left corner and size, in pixels.
#[derive(Clone, Copy)]
struct Area {
    x0: f64,
    y0: f64,
    w: f64,
    h: f64,
}

/// A line chart panel in `area`: categorical x
/// axis, linear y axis from 0.
fn panel(out: &mut String, area: Area, title: &str, xs: &[String], series: &[Series]) {
    let Area { x0, y0, w, h } = area;
    let (left, right, top, bottom) = (60.0, 15.0, 28.0, 40.0);
    let (pw, ph) = (w - left - right, h - top - bottom);
    let max = series
        .iter()
        .flat_map(|(_, v)| v.iter().flatten().copied())
        .fold(0.0f64, f64::max);
    let ymax = nice_ceiling(max);
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" font-size="14" text-anchor="middle" font-weight="bold">{}</text>"#,
        x0 + left + pw / 2.0,
        y0 + 18.0,
        esc(title)
    );
    let _ = writeln!(
        out,
        r##"<rect x="{:.1}" y="{:.1}" width="{pw:.1}" height="{ph:.1}" fill="none" stroke="#888"/>"##,
        x0 + left,
        y0 + top
    );
    for i in 0..=4 {
        let v = ymax * f64::from(i) / 4.0;
        let y = y0 + top + ph - ph * f64::from(i) / 4.0;
        let _ = writeln!(
            out,
            r##"<line x1="{:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" font-size="11" text-anchor="end">{}</text>"##,
            x0 + left,
            x0 + left + pw,
            x0 + left - 4.0,
            y + 4.0,
            us(v)
        );
    }
    let n = xs.len().max(1);
    let xpos = |i: usize| {
        if n == 1 {
            x0 + left + pw / 2.0
        } else {
            x0 + left + pw * i as f64 / (n - 1) as f64
        }
    };
    for (i, label) in xs.iter().enumerate() {
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}" font-size="11" text-anchor="middle">{}</text>"#,
            xpos(i),
            y0 + top + ph + 16.0,
            esc(label)
        );
    }
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" font-size="11" text-anchor="middle" transform="rotate(-90 {:.1} {:.1})">µs</text>"#,
        x0 + 14.0,
        y0 + top + ph / 2.0,
        x0 + 14.0,
        y0 + top + ph / 2.0
    );
    let ypos = |v: f64| {
        if ymax > 0.0 {
            y0 + top + ph - ph * v / ymax
        } else {
            y0 + top + ph
        }
    };
    for (si, (_, values)) in series.iter().enumerate() {
        let color = COLORS[si % COLORS.len()];
        let pts: Vec<String> = values
            .iter()
            .enumerate()
            .filter_map(|(i, v)| v.map(|v| format!("{:.1},{:.1}", xpos(i), ypos(v))))
            .collect();
        let _ = writeln!(
            out,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#,
            pts.join(" ")
        );
        for pt in &pts {
            if let Some((x, y)) = pt.split_once(',') {
                let _ = writeln!(out, r#"<circle cx="{x}" cy="{y}" r="3" fill="{color}"/>"#);
            }
        }
    }
}

/// 1, 2 or 5 times a power of ten, at least `v`.
fn nice_ceiling(v: f64) -> f64 {
    if v <= 0.0 || !v.is_finite() {
        return 1.0;
    }
    let p = 10f64.powf(v.log10().floor());
    for m in [1.0, 2.0, 5.0, 10.0] {
        if m * p >= v {
            return m * p;
        }
    }
    10.0 * p
}

/// The chart: latency mode, median latency against record size for each
/// phase (four panels), one line per variant; throughput mode, latency
/// percentiles (one line per variant).
pub fn svg(r: &BenchResult) -> String {
    let vs = ok_variants(r);
    let names: Vec<String> = vs
        .iter()
        .map(|&v| {
            format!(
                "{} {}",
                r.variants[v].spec.label,
                r.variants[v].spec.describe()
            )
        })
        .collect();
    let (width, panel_h) = (900.0, 300.0);
    let mut body = String::new();
    let panels_h = match r.plan.mode {
        Mode::Latency => {
            let sizes = record_sizes_run(r);
            let xs: Vec<String> = sizes.iter().map(|&s| fmt_size_short(s)).collect();
            for (pi, ph) in Phase::ALL.iter().enumerate() {
                let series: Vec<Series> = vs
                    .iter()
                    .zip(&names)
                    .map(|(&v, name)| {
                        let vals = sizes
                            .iter()
                            .map(|&rs| find_latency(r, v, rs, *ph).map(|l| l.summary.median_us))
                            .collect();
                        (name.clone(), vals)
                    })
                    .collect();
                let (x0, y0) = ((pi % 2) as f64 * width / 2.0, (pi / 2) as f64 * panel_h);
                panel(
                    &mut body,
                    Area {
                        x0,
                        y0,
                        w: width / 2.0,
                        h: panel_h,
                    },
                    &format!("{} median latency (µs) by record size", ph.name()),
                    &xs,
                    &series,
                );
            }
            2.0 * panel_h
        }
        Mode::Throughput => {
            let xs: Vec<String> = ["p50", "mean", "p90", "p99", "p99.9"]
                .iter()
                .map(|s| s.to_string())
                .collect();
            let series: Vec<Series> = vs
                .iter()
                .zip(&names)
                .map(|(&v, name)| {
                    let vals = r
                        .throughput
                        .iter()
                        .find(|t| t.variant == v)
                        .map(|t| {
                            let m = &t.summary;
                            vec![
                                Some(m.median_us),
                                Some(m.mean_us),
                                Some(m.p90_us),
                                Some(m.p99_us),
                                Some(m.p999_us),
                            ]
                        })
                        .unwrap_or_default();
                    (name.clone(), vals)
                })
                .collect();
            panel(
                &mut body,
                Area {
                    x0: 0.0,
                    y0: 0.0,
                    w: width,
                    h: panel_h,
                },
                "throughput run: latency (µs) by percentile",
                &xs,
                &series,
            );
            panel_h
        }
    };
    let legend_h = 20.0 * names.len() as f64 + 30.0;
    let height = panels_h + legend_h;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif">"#
    );
    let _ = writeln!(
        s,
        r#"<title>nfsrdma bench {} {}:{} {}</title>"#,
        r.plan.mode.name(),
        esc(&r.plan.server),
        esc(&r.plan.path),
        r.date
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    s.push_str(&body);
    for (i, name) in names.iter().enumerate() {
        let y = panels_h + 20.0 + 20.0 * i as f64;
        let color = COLORS[i % COLORS.len()];
        let _ = writeln!(
            s,
            r#"<line x1="20" y1="{y:.1}" x2="50" y2="{y:.1}" stroke="{color}" stroke-width="3"/><text x="58" y="{:.1}" font-size="12">{}</text>"#,
            y + 4.0,
            esc(name)
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_print() {
        assert_eq!(fmt_size(4096), "4 KiB");
        assert_eq!(fmt_size(1 << 20), "1 MiB");
        assert_eq!(fmt_size(1000), "1000 B");
        assert_eq!(fmt_size_short(65536), "64k");
        assert_eq!(nice_ceiling(42.0), 50.0);
        assert_eq!(nice_ceiling(0.0), 1.0);
    }

    #[test]
    fn csv_quotes() {
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("ab"), "ab");
    }
}
