//! Latency mode: QD1 write, rewrite, read and reread per record size.

use super::pattern;
use super::stats::{self, Summary};
use super::{BenchError, BenchResult, Conn, Hooks, LatencyRow, Phase, Plan};
use crate::transport::TransportStats;
use crate::xdr::nfs3::{NfsFh3, Sattr3, StableHow};
use crate::xdr::Payload;
use crate::{Client, ClientError};
use bytes::Bytes;
use hdrhistogram::Histogram;
use std::time::Instant;

/// The pass whose data a phase writes or expects: each record size has
/// two (write, then rewrite); reads check the rewrite's.
fn pass_of(size_index: usize, phase: Phase) -> u64 {
    let base = 2 * size_index as u64 + 1;
    match phase {
        Phase::Write => base,
        Phase::Rewrite | Phase::Read | Phase::Reread => base + 1,
    }
}

/// Writes one record with FILE_SYNC WRITEs of at most `wsize` bytes. A
/// record larger than `wsize` goes out as one WRITE per `wsize` piece, all
/// in flight together (as the kernel client splits an O_DIRECT write);
/// the record is done when every piece is.
pub(super) async fn write_record(
    client: &Client,
    fh: &NfsFh3,
    label: &str,
    offset: u64,
    data: Bytes,
) -> Result<(), BenchError> {
    let wsize = (client.wsize() as usize).max(1);
    if data.len() <= wsize {
        return write_piece(client, fh, label, offset, data).await;
    }
    let mut set = tokio::task::JoinSet::new();
    for start in (wsize..data.len()).step_by(wsize) {
        let (c, f, l) = (client.clone(), fh.clone(), label.to_string());
        let piece = data.slice(start..(start + wsize).min(data.len()));
        set.spawn(async move { write_piece(&c, &f, &l, offset + start as u64, piece).await });
    }
    let first = write_piece(client, fh, label, offset, data.slice(..wsize)).await;
    join_all(set, label, first, |_: ()| ()).await
}

/// One WRITE, continued by further WRITEs if the server takes less.
async fn write_piece(
    client: &Client,
    fh: &NfsFh3,
    label: &str,
    offset: u64,
    data: Bytes,
) -> Result<(), BenchError> {
    let mut done = 0usize;
    while done < data.len() {
        let at = offset + done as u64;
        let err = |source| BenchError::Client {
            variant: label.to_string(),
            what: format!("WRITE at offset {at}"),
            source,
        };
        let r = client
            .write(
                fh,
                at,
                Payload::from(data.slice(done..)),
                StableHow::FileSync,
            )
            .await
            .map_err(err)?;
        if r.count == 0 {
            return Err(err(ClientError::Protocol(
                "WRITE made no progress (count 0)".into(),
            )));
        }
        done += r.count as usize;
    }
    Ok(())
}

/// Waits for every task of `set` after the first piece's result `first`;
/// returns the first error, or the pieces' values through `keep`.
async fn join_all<T: 'static>(
    mut set: tokio::task::JoinSet<Result<T, BenchError>>,
    label: &str,
    first: Result<T, BenchError>,
    mut keep: impl FnMut(T),
) -> Result<(), BenchError> {
    let mut outcome = first.map(&mut keep);
    while let Some(joined) = set.join_next().await {
        let r = joined.map_err(|e| BenchError::Client {
            variant: label.to_string(),
            what: "I/O task".into(),
            source: ClientError::Protocol(format!("task failed: {e}")),
        })?;
        match r {
            Ok(v) => keep(v),
            Err(e) => {
                if outcome.is_ok() {
                    outcome = Err(e);
                }
            }
        }
    }
    outcome
}

/// Reads one record with READs of at most `rsize` bytes; a record larger
/// than `rsize` is read as one READ per `rsize` piece, all in flight
/// together. The pieces point into the receive buffers.
pub(super) async fn read_record(
    client: &Client,
    fh: &NfsFh3,
    label: &str,
    offset: u64,
    len: u64,
) -> Result<Vec<Bytes>, BenchError> {
    let rsize = u64::from(client.rsize()).max(1);
    if len <= rsize {
        return read_piece(client, fh, label, offset, len, offset, len).await;
    }
    let mut set = tokio::task::JoinSet::new();
    let pieces = len.div_ceil(rsize) as usize;
    for i in 1..pieces {
        let (c, f, l) = (client.clone(), fh.clone(), label.to_string());
        let start = i as u64 * rsize;
        let n = rsize.min(len - start);
        set.spawn(async move {
            read_piece(&c, &f, &l, offset + start, n, offset, len)
                .await
                .map(|parts| (i, parts))
        });
    }
    let first = read_piece(client, fh, label, offset, rsize, offset, len)
        .await
        .map(|parts| (0, parts));
    let mut by_piece: Vec<Vec<Bytes>> = vec![Vec::new(); pieces];
    join_all(set, label, first, |(i, parts)| by_piece[i] = parts).await?;
    Ok(by_piece.into_iter().flatten().collect())
}

/// READs of `len` bytes at `at` until all are in; `record_offset` and
/// `record_len` name the record in errors.
async fn read_piece(
    client: &Client,
    fh: &NfsFh3,
    label: &str,
    at: u64,
    len: u64,
    record_offset: u64,
    record_len: u64,
) -> Result<Vec<Bytes>, BenchError> {
    let mut parts = Vec::new();
    let mut got = 0u64;
    while got < len {
        let n = (len - got) as u32;
        let r = client
            .read(fh, at + got, n)
            .await
            .map_err(|source| BenchError::Client {
                variant: label.to_string(),
                what: format!("READ at offset {}", at + got),
                source,
            })?;
        if r.data.is_empty() {
            return Err(BenchError::ShortRead {
                variant: label.to_string(),
                offset: record_offset,
                got: at + got - record_offset,
                want: record_len,
            });
        }
        got += r.data.len() as u64;
        parts.extend(r.data.parts().iter().cloned());
    }
    Ok(parts)
}

/// Runs the latency phases for every record size.
pub(super) async fn run(
    plan: &Plan,
    conns: &[Conn],
    hooks: &Hooks,
    result: &mut BenchResult,
) -> Result<(), BenchError> {
    let sizes: Vec<(usize, u64)> = plan
        .record_sizes
        .iter()
        .copied()
        .enumerate()
        .filter(|&(_, rs)| rs <= plan.file_size)
        .collect();
    for &rs in &plan.record_sizes {
        if rs > plan.file_size {
            result.notes.push(format!(
                "record size {} skipped: larger than the file ({})",
                super::report::fmt_size(rs),
                super::report::fmt_size(plan.file_size)
            ));
        }
    }
    let total: u64 = sizes
        .iter()
        .map(|&(_, rs)| plan.file_size / rs * 4 * conns.len() as u64)
        .sum();
    let pb = super::progress_bar(plan, total, "calls");
    let rounds = u64::from(plan.rounds);
    let mut scratch = Vec::new();
    for (size_index, rs) in sizes {
        let records = plan.file_size / rs;
        // A new, empty file for each record size, as iozone does.
        for c in conns {
            c.client()
                .setattr(
                    &c.file,
                    &Sattr3 {
                        size: Some(0),
                        ..Sattr3::default()
                    },
                    None,
                )
                .await
                .map_err(c.err("truncate"))?;
        }
        for phase in Phase::ALL {
            pb.set_message(format!("{} {}", super::report::fmt_size(rs), phase.name()));
            let pass = pass_of(size_index, phase);
            let mut hists: Vec<Histogram<u64>> = conns.iter().map(|_| stats::histogram()).collect();
            let before: Vec<TransportStats> =
                conns.iter().map(|c| c.client().transport_stats()).collect();
            for round in 0..rounds {
                let (from, to) = (round * records / rounds, (round + 1) * records / rounds);
                for (ci, c) in conns.iter().enumerate() {
                    for rec in from..to {
                        let offset = rec * rs;
                        let ns = match phase {
                            Phase::Write | Phase::Rewrite => {
                                let data = pattern::record(offset, rs as usize, pass);
                                let t0 = Instant::now();
                                write_record(c.client(), &c.file, &c.label, offset, data).await?;
                                t0.elapsed().as_nanos() as u64
                            }
                            Phase::Read | Phase::Reread => {
                                let t0 = Instant::now();
                                let parts =
                                    read_record(c.client(), &c.file, &c.label, offset, rs).await?;
                                let ns = t0.elapsed().as_nanos() as u64;
                                if let Some((at, expected, found)) = plan
                                    .verify
                                    .then(|| {
                                        pattern::first_mismatch(&parts, offset, pass, &mut scratch)
                                    })
                                    .flatten()
                                {
                                    pb.finish_and_clear();
                                    return Err(BenchError::Mismatch {
                                        offset: at,
                                        variant: c.label.clone(),
                                        phase: phase.name(),
                                        record_offset: offset,
                                        record_size: rs,
                                        expected,
                                        found,
                                    });
                                }
                                ns
                            }
                        };
                        stats::record(&mut hists[ci], ns);
                        pb.inc(1);
                    }
                }
            }
            for (ci, c) in conns.iter().enumerate() {
                let delta = c.client().transport_stats().since(&before[ci]);
                result.latency.push(LatencyRow {
                    variant: c.idx,
                    record_size: rs,
                    phase,
                    summary: Summary::of(&hists[ci]),
                    retransmits: delta.retransmits,
                    breakdown: delta.step_means_us(),
                });
            }
            if phase == Phase::Rewrite {
                if let Some(hook) = &hooks.after_writes {
                    for c in conns {
                        hook(c.client().clone(), c.file.clone(), rs)
                            .await
                            .map_err(c.err("after-writes hook"))?;
                    }
                }
            }
        }
    }
    pb.finish_and_clear();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_expect_the_rewrite() {
        assert_ne!(pass_of(0, Phase::Write), pass_of(0, Phase::Rewrite));
        assert_eq!(pass_of(0, Phase::Rewrite), pass_of(0, Phase::Read));
        assert_eq!(pass_of(0, Phase::Read), pass_of(0, Phase::Reread));
        assert_ne!(pass_of(0, Phase::Rewrite), pass_of(1, Phase::Write));
    }
}
