"""Tests of scripts/load-render and of the load part in scripts/demo-render:
a raw folder laid out as tests/vm/guest/load leaves it, with fio and
nfsrdma bench reports whose figures are chosen so each derived number is
known.

Run: python3 -m unittest discover -s scripts/tests (scripts/test does).
"""

import io
import json
import os
import subprocess
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ET
from contextlib import redirect_stdout

from scriptmod import SCRIPTS, module


lr = module("load-render")
dr = module("demo-render")


def fio_side(iops, p50_us, p99_us, mean_us, runtime_ms=3000, bs=4096):
    return {
        "iops": iops,
        "bw_bytes": int(iops * bs),
        "total_ios": int(iops * runtime_ms / 1000),
        "runtime": runtime_ms if iops else 0,
        "clat_ns": {"percentile": {"50.000000": p50_us * 1000, "99.000000": p99_us * 1000}} if iops else {},
        "lat_ns": {"mean": mean_us * 1000},
    }


def fio_doc(read=None, write=None, usr=10.0, sys_=40.0):
    idle = fio_side(0, 0, 0, 0)
    return {
        "fio version": "fio-3.33",
        "jobs": [
            {
                "jobname": "x",
                "error": 0,
                "read": read or idle,
                "write": write or idle,
                "usr_cpu": usr,
                "sys_cpu": sys_,
                "job_runtime": 3000,
            }
        ],
    }


def bench_doc(read_ops, write_ops, secs, client_cores, server_cores, turnaround=None, bs=4096):
    lat = {"samples": 1, "min_us": 1, "median_us": 300.0, "mean_us": 320.0, "p90_us": 400, "p99_us": 900.0, "p999_us": 1000, "max_us": 1100}
    return {
        "schema": "nfsrdma-bench/1",
        "config": {"throughput": {"bs_bytes": bs}},
        "throughput": [
            {
                "variant": "A",
                "ops": read_ops + write_ops,
                "read_ops": read_ops,
                "write_ops": write_ops,
                "bytes": (read_ops + write_ops) * bs,
                "elapsed_s": secs,
                "iops": (read_ops + write_ops) / secs,
                "mb_per_s": 0,
                "latency": lat,
                "read_latency": lat if read_ops else None,
                "write_latency": lat if write_ops else None,
                "client_cpu_cores": client_cores,
                "server_cpu_cores": server_cores,
                "retransmits": 0,
                "server_turnaround_us": turnaround,
                "server_counters": None,
            }
        ],
    }


class Raw:
    """A raw folder: runs.tsv plus the reports it names."""

    HEADER = "name\ttable\tclient\ttarget\trw\tbs\tiodepth\tnumjobs\tserver_cpu_s\twindow_s\tbusy_cpu_s\tsoftirq_cpu_s\n"

    def __init__(self, root):
        self.root = root
        os.makedirs(os.path.join(root, "fio"))
        os.makedirs(os.path.join(root, "bench"))
        self.lines = []

    def fio(self, name, table, target, rw, bs, depth, jobs, doc, server_cpu="1.000", window="2.000", busy="3.000", softirq="0.500", notices=True):
        with open(os.path.join(self.root, "fio", name + ".json"), "w") as f:
            if notices:
                f.write("fio: exec_prerun notice\n")
            json.dump(doc, f)
        self.lines.append(f"{name}\t{table}\tkernel\t{target}\t{rw}\t{bs}\t{depth}\t{jobs}\t{server_cpu}\t{window}\t{busy}\t{softirq}\n")

    def bench(self, name, table, target, rw, bs, depth, jobs, doc):
        with open(os.path.join(self.root, "bench", name + ".json"), "w") as f:
            json.dump(doc, f)
        self.lines.append(f"{name}\t{table}\tnfsrdma\t{target}\t{rw}\t{bs}\t{depth}\t{jobs}\t-\t-\t-\t-\n")

    def prom(self, name, which, total_s, count):
        with open(os.path.join(self.root, "fio", f"{name}.{which}.prom"), "w") as f:
            f.write("# HELP nfsrdmad_turnaround_seconds turnaround\n")
            f.write(f'nfsrdmad_turnaround_seconds_sum{{transport="rdma",procedure="READ",size="4k"}} {total_s}\n')
            f.write(f'nfsrdmad_turnaround_seconds_count{{transport="rdma",procedure="READ",size="4k"}} {count}\n')
            # Another procedure's calls must not count.
            f.write(f'nfsrdmad_turnaround_seconds_sum{{transport="rdma",procedure="WRITE",size="4k"}} {total_s * 7}\n')
            f.write(f'nfsrdmad_turnaround_seconds_count{{transport="rdma",procedure="WRITE",size="4k"}} {count * 3}\n')

    def done(self):
        with open(os.path.join(self.root, "runs.tsv"), "w") as f:
            f.write(self.HEADER + "".join(self.lines))
        with open(os.path.join(self.root, "meta.txt"), "w") as f:
            f.write("mode=vm\nkernel=6.1.0\nfio_version=fio-3.33\n")


def messenger_point(raw, depth, ours_iops, knfsd_iops, ours_tcp_iops, knfsd_tcp_iops):
    """One 4 KiB randread point for the four targets, kernel client.
    Server cores: ours 1.0 s / 2.0 s = 0.5; knfsd 0.5 s / 2.0 s = 0.25.
    Client cores: RDMA 50% of a CPU, TCP (usr 20 + sys 60) 80%. Machine
    cores: RDMA 3.0 s / 2.0 s = 1.5 (0.25 softirq), TCP 3.2 s = 1.6."""
    for target, iops, cpu, usr, sys_, busy, sirq in (
        ("ours-rdma", ours_iops, "1.000", 10.0, 40.0, "3.000", "0.500"),
        ("knfsd-rdma", knfsd_iops, "0.500", 10.0, 40.0, "3.000", "0.500"),
        ("ours-tcp", ours_tcp_iops, "1.000", 20.0, 60.0, "3.200", "0.800"),
        ("knfsd-tcp", knfsd_tcp_iops, "0.500", 20.0, 60.0, "3.200", "0.800"),
    ):
        raw.fio(
            f"m.{target}.4k.randread.d{depth}.j1", "messenger", target, "randread", "4k", depth, 1,
            fio_doc(read=fio_side(iops, 200, 900, 250), usr=usr, sys_=sys_), server_cpu=cpu, busy=busy, softirq=sirq,
        )


class LoadRender(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.raw = os.path.join(self.tmp.name, "load", "raw")
        self.r = Raw(self.raw)

    def tearDown(self):
        self.tmp.cleanup()

    def row(self, table_title, **want):
        for title, header, rows, _ in lr.tables(lr.collect(self.raw)):
            if title != table_title:
                continue
            for r in rows:
                d = dict(zip(header, r))
                if all(str(d[k]) == str(v) for k, v in want.items()):
                    return d
        self.fail(f"no row {want} in {table_title!r}")

    def test_cores_and_iops_per_core_from_the_cpu_readings(self):
        messenger_point(self.r, 32, 4000, 1000, 1600, 1600)
        self.r.done()
        doc = lr.collect(self.raw)
        ours = next(x for x in doc["runs"] if x["target"] == "ours-rdma")
        self.assertAlmostEqual(ours["server_cores"], 0.5)
        self.assertAlmostEqual(ours["client_cores"], 0.5)
        self.assertEqual(ours["read"]["iops"], 4000)
        self.assertAlmostEqual(ours["read"]["mb_s"], 4000 * 4096 / 1e6)
        d = self.row("Load: IOPS and cores per side (messenger-style)", target="ours-rdma", depth=32)
        self.assertEqual(d["IOPS/srv core"], "8000")
        self.assertEqual(d["IOPS/cli core"], "8000")
        self.assertEqual(d["p50 us"], "200")
        self.assertEqual((d["machine cores"], d["softirq cores"], d["IOPS/machine core"]), ("1.50", "0.25", "2667"))
        tcp = self.row("Load: IOPS and cores per side (messenger-style)", target="ours-tcp", depth=32)
        self.assertEqual(tcp["cli cores"], "0.80")
        self.assertEqual(tcp["IOPS/cli core"], "2000")
        self.assertEqual((tcp["machine cores"], tcp["softirq cores"], tcp["IOPS/machine core"]), ("1.60", "0.40", "1000"))

    def test_ratios_and_the_targets_say_met_or_not(self):
        # ours 4000/0.5 = 8000 per server core, knfsd 1000/0.25 = 4000: 2.00x.
        messenger_point(self.r, 32, 4000, 1000, 1600, 1600)
        # depth 1: ours 1000/0.5 = 2000, knfsd 1000/0.25 = 4000: 0.50x; RDMA
        # 900/0.5 = 1800 per client core against TCP 1600/0.8 = 2000: 0.90x.
        messenger_point(self.r, 1, 900, 1000, 1600, 1600)
        self.r.done()
        d = self.row("Load: ratios at each point", depth=32)
        self.assertEqual(d["IOPS/srv core ours/knfsd (RDMA)"], "2.00x")
        self.assertEqual(d["IOPS/cli core RDMA/TCP (nfsrdmad)"], "4.00x")
        # 4000/1.5 over 1600/1.6.
        self.assertEqual(d["IOPS/machine core RDMA/TCP (nfsrdmad)"], "2.67x")
        d1 = self.row("Load: ratios at each point", depth=1)
        self.assertEqual(d1["IOPS/srv core ours/knfsd (RDMA)"], "0.45x")
        self.assertEqual(d1["IOPS/cli core RDMA/TCP (nfsrdmad)"], "0.90x")
        notes = lr.targets_met(lr.collect(self.raw))
        self.assertTrue(any("iodepth 32" in n and "2.00x" in n and ": met)" in n for n in notes), notes)
        ours = next(n for n in notes if "nfsrdmad: RDMA at least TCP" in n)
        self.assertIn("not met at 1 of 2 points", ours)
        self.assertIn("randread j1 d1 0.90x", ours)

    def test_a_missing_cpu_reading_is_na_not_a_crash(self):
        self.r.fio("m.ours-rdma.4k.randread.d1.j1", "messenger", "ours-rdma", "randread", "4k", 1, 1,
                   fio_doc(read=fio_side(100, 1, 2, 3)), server_cpu="-", window="-")
        self.r.done()
        d = self.row("Load: IOPS and cores per side (messenger-style)", target="ours-rdma")
        self.assertEqual(d["srv cores"], "n/a")
        self.assertEqual(d["IOPS/srv core"], "n/a")
        self.assertEqual(self.row("Load: ratios at each point", depth=1)["IOPS/srv core ours/knfsd (RDMA)"], "n/a")

    def test_a_report_from_before_the_machine_cores_still_renders(self):
        messenger_point(self.r, 1, 900, 1000, 1600, 1600)
        self.r.done()
        doc = lr.collect(self.raw)
        for run in doc["runs"]:
            del run["machine_cores"], run["softirq_cores"]
        rows = {t: dict(zip(h, rs[0])) for t, h, rs, _ in lr.tables(doc)}
        self.assertEqual(rows["Load: IOPS and cores per side (messenger-style)"]["IOPS/machine core"], "n/a")
        self.assertEqual(rows["Load: ratios at each point"]["IOPS/machine core RDMA/TCP (nfsrdmad)"], "n/a")
        self.assertEqual(rows["Load: ratios at each point"]["IOPS/srv core ours/knfsd (RDMA)"], "0.45x")

    def test_nfsrdma_bench_runs_give_their_own_cores(self):
        self.r.bench("bm.ours-rdma.4k.randread.d8.j4", "messenger", "ours-rdma", "randread", "4k", 8, 4,
                     bench_doc(6000, 0, 3.0, 0.25, 0.5))
        self.r.done()
        d = self.row("Load: IOPS and cores per side (messenger-style)", client="nfsrdma", target="ours-rdma")
        self.assertEqual(d["IOPS"], "2000")
        self.assertEqual(d["machine cores"], "n/a")
        self.assertEqual(d["IOPS/srv core"], "4000")
        self.assertEqual(d["IOPS/cli core"], "8000")
        self.assertEqual(d["p99 us"], "900")

    def test_mixed_sums_both_directions_and_compares_transports(self):
        for target, rd, wr in (("ours-rdma", 700, 300), ("ours-tcp", 350, 150)):
            self.r.fio(f"x.{target}.4k.randrw.d1.j16", "mixed", target, "randrw", "4k", 1, 16,
                       fio_doc(read=fio_side(rd, 1, 50, 3), write=fio_side(wr, 1, 70, 3)))
        self.r.bench("bx.ours-rdma.4k.randrw.d16.j1", "mixed", "ours-rdma", "randrw", "4k", 16, 1,
                     bench_doc(2100, 900, 3.0, 0.5, 0.5))
        self.r.done()
        d = self.row("Load: mixed 4 KiB randrw 70/30, RDMA vs TCP", client="kernel", target="ours-rdma")
        self.assertEqual((d["read IOPS"], d["write IOPS"], d["read p99 us"], d["write p99 us"]), ("700", "300", "50", "70"))
        b = self.row("Load: mixed 4 KiB randrw 70/30, RDMA vs TCP", client="nfsrdma")
        self.assertEqual((b["read IOPS"], b["write IOPS"], str(b["depth"])), ("700", "300", "16"))
        notes = next(n for t, _, _, n in lr.tables(lr.collect(self.raw)) if t.startswith("Load: mixed"))
        self.assertIn("kernel client (fio), 16 job(s) x depth 1: total IOPS RDMA/TCP: nfsrdmad 2.00x", notes)

    def test_null_export_beside_the_real_one(self):
        for target, iops in (("ours-rdma", 500), ("ours-null-rdma", 750)):
            self.r.fio(f"n.{target}.64k.randwrite.d32.j1", "null", target, "randwrite", "64k", 32, 1,
                       fio_doc(write=fio_side(iops, 100, 200, 120, bs=65536)))
        self.r.done()
        d = self.row("Load: the store's share, nfsrdmad's null export beside its real one (RDMA, 1 job)", depth=32)
        self.assertEqual((d["real IOPS"], d["null IOPS"], d["null/real IOPS"]), ("500", "750", "1.50x"))

    def test_share_counts_only_the_runs_procedure_and_transport(self):
        name = "s.ours-rdma.4k.randread.d1.j1"
        self.r.fio(name, "share", "ours-rdma", "randread", "4k", 1, 1, fio_doc(read=fio_side(100, 1, 2, 400)))
        self.r.prom(name, "before", 1.0, 100)
        self.r.prom(name, "after", 1.002, 110)  # 10 READs, 2 ms: 200 us each
        self.r.bench("bs.ours-rdma.4k.randread.d1.j1", "share", "ours-rdma", "randread", "4k", 1, 1,
                     bench_doc(300, 0, 3.0, 0.1, 0.1, turnaround=80.0))
        self.r.done()
        d = self.row("Load: the server's share of QD1 latency (nfsrdmad)", client="kernel")
        self.assertEqual((d["client mean us"], d["server turnaround us"], d["share"]), ("400.0", "200.0", "50%"))
        b = self.row("Load: the server's share of QD1 latency (nfsrdmad)", client="nfsrdma")
        self.assertEqual((b["client mean us"], b["share"]), ("320.0", "25%"))

    def test_one_chart_per_table_with_a_line_per_target(self):
        messenger_point(self.r, 1, 900, 1000, 1600, 1600)
        messenger_point(self.r, 32, 4000, 1000, 1600, 1600)
        self.r.fio("n.ours-rdma.4k.randread.d1.j1", "null", "ours-rdma", "randread", "4k", 1, 1, fio_doc(read=fio_side(5, 1, 2, 3)))
        self.r.done()
        out = os.path.join(self.tmp.name, "charts")
        os.makedirs(out)
        paths = lr.write_charts(lr.collect(self.raw), out)
        self.assertEqual(sorted(os.path.basename(p) for p in paths), ["load-messenger.svg", "load-null.svg"])
        svg = ET.parse(os.path.join(out, "load-messenger.svg")).getroot()
        ns = {"s": "http://www.w3.org/2000/svg"}
        lines = {p.get("data-series"): p.get("points") for p in svg.iter("{http://www.w3.org/2000/svg}polyline")}
        self.assertEqual(sorted(lines), sorted(lr.TARGETS))
        # Two depths, two points each; ours-rdma rises (smaller y is higher).
        pts = [tuple(map(float, p.split(","))) for p in lines["ours-rdma"].split()]
        self.assertEqual(len(pts), 2)
        self.assertLess(pts[0][0], pts[1][0])
        self.assertGreater(pts[0][1], pts[1][1])
        flat = [tuple(map(float, p.split(","))) for p in lines["ours-tcp"].split()]
        self.assertEqual(flat[0][1], flat[1][1])
        self.assertEqual(len(svg.findall(".//s:g[@class='panel']", ns)), 1)

    def test_bad_reports_are_named(self):
        doc = fio_doc(read=fio_side(1, 1, 1, 1))
        doc["jobs"].append(doc["jobs"][0])
        self.r.fio("m.ours-rdma.4k.randread.d1.j1", "messenger", "ours-rdma", "randread", "4k", 1, 1, doc)
        self.r.done()
        with self.assertRaisesRegex(lr.Bad, r"m\.ours-rdma.*expected one group-reported fio job, found 2"):
            lr.collect(self.raw)
        cli = subprocess.run([sys.executable, os.path.join(SCRIPTS, "load-render"), "collect", self.tmp.name],
                             capture_output=True, text=True)
        self.assertEqual(cli.returncode, 1)
        self.assertIn("load-render: error:", cli.stderr)
        self.assertIn("runs.tsv", cli.stderr)

    def test_demo_render_takes_the_load_part_alone(self):
        messenger_point(self.r, 32, 4000, 1000, 1600, 1600)
        self.r.done()
        outdir = os.path.join(self.tmp.name)
        with open(os.path.join(outdir, "load", "load.json"), "w") as f:
            json.dump(lr.collect(self.raw), f)
        results = dr.collect(outdir)
        with open(results) as f:
            res = json.load(f)
        self.assertEqual(res["meta"]["mode"], "vm")
        self.assertIsNone(res["nfs"])
        self.assertEqual(len(res["load"]["runs"]), 4)
        text = io.StringIO()
        md = os.path.join(outdir, "results.md")
        with redirect_stdout(text):
            dr.render(results, md)
        self.assertIn("Load: ratios at each point", text.getvalue())
        self.assertIn("chart: " + os.path.join(outdir, "load-messenger.svg"), text.getvalue())
        with open(md) as f:
            self.assertIn("![load-messenger.svg](load-messenger.svg)", f.read())
        ET.parse(os.path.join(outdir, "load-messenger.svg"))


if __name__ == "__main__":
    unittest.main()
