//! `--server-metrics URL`: the server's own counters, read from its
//! Prometheus text endpoint (nfsrdmad's `--metrics`) before and after each
//! slice of a throughput run, so that a run reports what the server
//! counted for exactly the calls it made: every counter's change, and the
//! server's mean turnaround (from a call's arrival to its reply posted)
//! for the run's READs and WRITEs beside the client's mean latency.

use std::collections::BTreeMap;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The longest exposition read.
const MAX_BODY: usize = 16 << 20;
/// How long one scrape may take.
const SCRAPE_LIMIT: Duration = Duration::from_secs(10);

/// Where the endpoint is: `http://HOST:PORT/PATH`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsUrl {
    /// `HOST:PORT`.
    pub authority: String,
    /// The path, from its `/`.
    pub path: String,
}

impl std::fmt::Display for MetricsUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "http://{}{}", self.authority, self.path)
    }
}

/// Parses `--server-metrics`.
pub fn parse_url(s: &str) -> Result<MetricsUrl, String> {
    let rest = s
        .strip_prefix("http://")
        .ok_or_else(|| format!("{s:?}: give an http:// URL, e.g. http://10.0.0.1:9420/metrics"))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/metrics"),
    };
    let port_ok = authority
        .rsplit_once(':')
        .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0));
    if !port_ok {
        return Err(format!("{s:?}: the URL needs HOST:PORT"));
    }
    Ok(MetricsUrl {
        authority: authority.to_string(),
        path: path.to_string(),
    })
}

/// Every sample of one scrape: series (name and labels, as written) to
/// value.
pub type Samples = BTreeMap<String, f64>;

/// Reads the exposition at `url`.
pub async fn scrape(url: &MetricsUrl) -> Result<Samples, String> {
    let body = tokio::time::timeout(SCRAPE_LIMIT, get(url))
        .await
        .map_err(|_| format!("{url}: no answer within {SCRAPE_LIMIT:?}"))??;
    Ok(parse(&body))
}

async fn get(url: &MetricsUrl) -> Result<String, String> {
    let mut s = tokio::net::TcpStream::connect(&url.authority)
        .await
        .map_err(|e| format!("{url}: {e}"))?;
    let req = format!(
        "GET {} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        url.path, url.authority
    );
    s.write_all(req.as_bytes())
        .await
        .map_err(|e| format!("{url}: {e}"))?;
    let mut all = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = s.read(&mut buf).await.map_err(|e| format!("{url}: {e}"))?;
        if n == 0 {
            break;
        }
        all.extend_from_slice(&buf[..n]);
        if all.len() > MAX_BODY {
            return Err(format!("{url}: more than {MAX_BODY} bytes"));
        }
    }
    let text = String::from_utf8(all).map_err(|_| format!("{url}: not UTF-8"))?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("{url}: not an HTTP response"))?;
    let status = head.lines().next().unwrap_or_default();
    if status.split(' ').nth(1) != Some("200") {
        return Err(format!("{url}: {status}"));
    }
    Ok(body.to_string())
}

/// The samples of a Prometheus text exposition (comments and lines that
/// are not `SERIES VALUE` skipped).
pub fn parse(text: &str) -> Samples {
    let mut out = Samples::new();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        // The value follows the last space (label values here hold none).
        if let Some((series, value)) = line.rsplit_once(' ') {
            if let Ok(v) = value.parse::<f64>() {
                out.insert(series.to_string(), v);
            }
        }
    }
    out
}

/// Adds to `acc` how every cumulative series (`_total`, `_sum`, `_count`,
/// `_bucket`) moved from `before` to `after`.
pub fn add_delta(acc: &mut Samples, before: &Samples, after: &Samples) {
    for (k, v) in after {
        let name = k.split('{').next().unwrap_or(k);
        let cumulative = ["_total", "_sum", "_count", "_bucket"]
            .iter()
            .any(|s| name.ends_with(s));
        if cumulative {
            let d = v - before.get(k).copied().unwrap_or(0.0);
            *acc.entry(k.clone()).or_insert(0.0) += d;
        }
    }
}

/// The mean turnaround in microseconds, over the READs and WRITEs in
/// `delta` (`nfsrdmad_turnaround_seconds` of every transport and size);
/// `None` when there were none.
pub fn mean_turnaround_us(delta: &Samples) -> Option<f64> {
    let mut sum = 0.0;
    let mut count = 0.0;
    for (k, v) in delta {
        let data = k.contains(r#"procedure="READ""#) || k.contains(r#"procedure="WRITE""#);
        if !data {
            continue;
        }
        if k.starts_with("nfsrdmad_turnaround_seconds_sum{") {
            sum += v;
        } else if k.starts_with("nfsrdmad_turnaround_seconds_count{") {
            count += v;
        }
    }
    (count > 0.0).then(|| sum / count * 1e6)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(
            parse_url("http://10.0.0.1:9420/metrics"),
            Ok(MetricsUrl {
                authority: "10.0.0.1:9420".into(),
                path: "/metrics".into()
            })
        );
        assert_eq!(parse_url("http://[::1]:9420").unwrap().path, "/metrics");
        assert!(parse_url("https://h:1/").is_err());
        assert!(parse_url("http://host/metrics").is_err());
        assert!(parse_url("http://:80/").is_err());
        assert!(parse_url("http://h:0/").is_err());
    }

    #[test]
    fn deltas_and_mean_turnaround() {
        let before = parse(
            "# TYPE x counter\n\
             nfsrdmad_rdma_calls_total 10\n\
             nfsrdmad_rdma_connections_open 1\n\
             nfsrdmad_turnaround_seconds_sum{transport=\"rdma\",procedure=\"READ\",size=\"4k\"} 0.001\n\
             nfsrdmad_turnaround_seconds_count{transport=\"rdma\",procedure=\"READ\",size=\"4k\"} 10\n",
        );
        let after = parse(
            "nfsrdmad_rdma_calls_total 40\n\
             nfsrdmad_rdma_connections_open 2\n\
             nfsrdmad_turnaround_seconds_sum{transport=\"rdma\",procedure=\"READ\",size=\"4k\"} 0.004\n\
             nfsrdmad_turnaround_seconds_count{transport=\"rdma\",procedure=\"READ\",size=\"4k\"} 30\n\
             nfsrdmad_turnaround_seconds_sum{transport=\"rdma\",procedure=\"WRITE\",size=\"4k\"} 0.002\n\
             nfsrdmad_turnaround_seconds_count{transport=\"rdma\",procedure=\"WRITE\",size=\"4k\"} 10\n\
             nfsrdmad_turnaround_seconds_sum{transport=\"rdma\",procedure=\"GETATTR\",size=\"any\"} 9\n\
             nfsrdmad_turnaround_seconds_count{transport=\"rdma\",procedure=\"GETATTR\",size=\"any\"} 1\n",
        );
        let mut acc = Samples::new();
        add_delta(&mut acc, &before, &after);
        assert_eq!(acc.get("nfsrdmad_rdma_calls_total"), Some(&30.0));
        // A gauge is no delta.
        assert!(!acc.contains_key("nfsrdmad_rdma_connections_open"));
        // (0.003 + 0.002) s over 30 calls: GETATTR is not a data call.
        let mean = mean_turnaround_us(&acc).unwrap();
        assert!((mean - 5000.0 / 30.0).abs() < 1e-6, "{mean}");
        assert_eq!(mean_turnaround_us(&Samples::new()), None);
    }
}
