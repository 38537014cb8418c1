//! Latency summaries from HDR histograms, and the CPU time of this process.

use hdrhistogram::Histogram;

/// A histogram of call times in nanoseconds (1 ns to 10 min, 3
/// significant digits).
pub(crate) fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000_000, 3).expect("valid histogram bounds")
}

/// Records `ns` (clamped into the histogram's range).
pub(crate) fn record(h: &mut Histogram<u64>, ns: u64) {
    h.saturating_record(ns.max(1));
}

/// A latency distribution, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// Calls measured.
    pub samples: u64,
    /// Fastest.
    pub min_us: f64,
    /// Median (p50).
    pub median_us: f64,
    /// Mean.
    pub mean_us: f64,
    /// 90th percentile.
    pub p90_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// Slowest.
    pub max_us: f64,
}

impl Summary {
    /// The summary of a histogram of nanoseconds.
    pub fn of(h: &Histogram<u64>) -> Summary {
        if h.is_empty() {
            return Summary {
                samples: 0,
                min_us: 0.0,
                median_us: 0.0,
                mean_us: 0.0,
                p90_us: 0.0,
                p99_us: 0.0,
                p999_us: 0.0,
                max_us: 0.0,
            };
        }
        let us = |ns: u64| ns as f64 / 1000.0;
        Summary {
            samples: h.len(),
            min_us: us(h.min()),
            median_us: us(h.value_at_quantile(0.5)),
            mean_us: h.mean() / 1000.0,
            p90_us: us(h.value_at_quantile(0.9)),
            p99_us: us(h.value_at_quantile(0.99)),
            p999_us: us(h.value_at_quantile(0.999)),
            max_us: us(h.max()),
        }
    }
}

/// Clock ticks per second of /proc/<pid>/stat times (USER_HZ, 100 on
/// every Linux architecture that matters here).
const USER_HZ: f64 = 100.0;

/// User plus system CPU time of this process so far, in seconds, from
/// /proc/self/stat; `None` where there is no such file.
/// Sum of [`process_cpu_seconds`] over `pids`; `None` when one of them
/// cannot be read (it exited).
pub(crate) fn processes_cpu_seconds(pids: &[u32]) -> Option<f64> {
    pids.iter()
        .map(|&p| process_cpu_seconds(Some(p)))
        .sum::<Option<f64>>()
}

pub(crate) fn process_cpu_seconds(pid: Option<u32>) -> Option<f64> {
    let path = match pid {
        Some(p) => format!("/proc/{p}/stat"),
        None => "/proc/self/stat".to_string(),
    };
    let text = std::fs::read_to_string(path).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces:
    // count fields from the last ')'. Field 3 (state) is then index 0,
    // utime (field 14) index 11 and stime (field 15) index 12.
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) as f64 / USER_HZ)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_of_known_values() {
        let mut h = histogram();
        for ns in 1..=1000u64 {
            record(&mut h, ns * 1000);
        }
        let s = Summary::of(&h);
        assert_eq!(s.samples, 1000);
        assert!((s.median_us - 500.0).abs() < 1.0, "{s:?}");
        assert!((s.p99_us - 990.0).abs() < 2.0, "{s:?}");
        assert!((s.mean_us - 500.5).abs() < 1.0, "{s:?}");
        assert_eq!(Summary::of(&histogram()).samples, 0);
    }

    #[test]
    fn cpu_time_is_read() {
        if std::path::Path::new("/proc/self/stat").exists() {
            assert!(process_cpu_seconds(None).is_some());
            let me = std::process::id();
            assert!(processes_cpu_seconds(&[me, me]).is_some());
            // One process that does not exist spoils the sum.
            assert!(processes_cpu_seconds(&[me, 999_999_999]).is_none());
        }
    }
}
