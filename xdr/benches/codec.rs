//! Encode + decode cost of the messages on the data path.
//!
//! `read3res/*` shows that a READ reply's cost does not grow with its
//! payload: the payload is carried by reference on encode (`IoVecSink`) and
//! sliced, not copied, on decode.

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use nfsrdma_xdr::nfs3::{self, Fattr3, NfsResult};
use nfsrdma_xdr::rpcrdma::{ChunkLists, RdmaBody, RdmaHeader, RdmaSegment, WriteChunk};
use nfsrdma_xdr::{IoVecSink, List, Xdr};
use std::hint::black_box;

fn rdma_header(c: &mut Criterion) {
    let h = RdmaHeader {
        xid: 42,
        vers: 1,
        credit: 128,
        body: RdmaBody::Msg(ChunkLists {
            write_list: List(vec![WriteChunk::new(vec![RdmaSegment {
                handle: 0x1234,
                length: 1 << 20,
                offset: 0x7f00_0000_0000,
            }])]),
            ..Default::default()
        }),
    };
    let mut buf = Vec::with_capacity(64);
    c.bench_function("rdma_msg_header_write_chunk/encode+decode", |b| {
        b.iter(|| {
            buf.clear();
            black_box(&h).encode(&mut buf);
            let back = RdmaHeader::from_bytes(Bytes::copy_from_slice(&buf)).unwrap();
            black_box(back)
        })
    });
}

fn read3res(c: &mut Criterion) {
    let mut g = c.benchmark_group("read3res");
    for size in [4usize << 10, 64 << 10, 1 << 20] {
        let res: nfs3::Read3Res = NfsResult::Ok(nfs3::Read3ResOk {
            file_attributes: Some(Fattr3::default()),
            count: size as u32,
            eof: false,
            data: nfs3::Data::new(Bytes::from(vec![0xa5u8; size])),
        });
        // The wire form a receiver sees: one contiguous buffer.
        let wire = res.to_bytes();
        g.bench_with_input(
            BenchmarkId::new("encode_iovec+decode", size),
            &size,
            |b, _| {
                b.iter(|| {
                    let mut s = IoVecSink::new();
                    black_box(&res).encode(&mut s);
                    let parts = s.into_parts();
                    let back = nfs3::Read3Res::from_bytes(black_box(&wire).clone()).unwrap();
                    black_box((parts, back))
                })
            },
        );
        g.bench_with_input(BenchmarkId::new("encode_flat_copy", size), &size, |b, _| {
            let mut buf = Vec::with_capacity(size + 256);
            b.iter(|| {
                buf.clear();
                black_box(&res).encode(&mut buf);
                black_box(buf.len())
            })
        });
    }
    g.finish();
}

fn readdirplus(c: &mut Criterion) {
    let entries = (0..100u64)
        .map(|i| nfs3::EntryPlus3 {
            fileid: i + 2,
            name: nfs3::Filename3::new(format!("file-{i:05}.dat").into_bytes()),
            cookie: i + 1,
            name_attributes: Some(Fattr3 {
                fileid: i + 2,
                size: i * 4096,
                ..Default::default()
            }),
            name_handle: Some(nfs3::NfsFh3::new(vec![i as u8; 32])),
        })
        .collect();
    let res: nfs3::Readdirplus3Res = NfsResult::Ok(nfs3::Readdirplus3ResOk {
        dir_attributes: Some(Fattr3::default()),
        cookieverf: [1; 8],
        reply: nfs3::DirListPlus3 {
            entries: List(entries),
            eof: true,
        },
    });
    let mut buf = Vec::with_capacity(res.encoded_len());
    c.bench_function("readdirplus3res_100_entries/encode+decode", |b| {
        b.iter(|| {
            buf.clear();
            black_box(&res).encode(&mut buf);
            let back = nfs3::Readdirplus3Res::from_bytes(Bytes::copy_from_slice(&buf)).unwrap();
            black_box(back)
        })
    });
}

criterion_group!(benches, rdma_header, read3res, readdirplus);
criterion_main!(benches);
