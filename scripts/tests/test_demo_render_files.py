"""Tests of the files part in scripts/demo-render: tests/vm/guest/meta's
results-PROTO.json collected into results.json ("files") with known
medians, ranges and ratios, and its table rendered; a run of the files
part alone (no raw/meta.txt) is still collected, and takes the VM mode
from host.txt.

Run: python3 -m unittest discover -s scripts/tests (scripts/test does).
"""

import io
import json
import os
import tempfile
import unittest
from contextlib import redirect_stdout

from scriptmod import module

dr = module("demo-render")

MOUNTS = ["v42-deleg", "v42-nodeleg", "v3", "knfsd-v42"]
KINDS = ["open-read-close", "stat", "create-write-close"]


def medians(proto):
    """Round medians (ns) per mount and kind: the deleg mount at a tenth
    of no-deleg over RDMA, a fifth over TCP; knfsd at twice no-deleg."""
    share = 0.1 if proto == "rdma" else 0.2
    out = {}
    for m in MOUNTS:
        out[m] = {}
        for i, k in enumerate(KINDS):
            base = 1_000_000 * (i + 1)
            f = {"v42-deleg": share, "v42-nodeleg": 1.0, "v3": 0.5, "knfsd-v42": 2.0}[m]
            # Three rounds: the median is the middle one.
            out[m][k] = [base * f * 0.9, base * f, base * f * 1.3]
    return out


class FilesPart(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.out = self.tmp.name
        os.makedirs(os.path.join(self.out, "files"))
        for proto in ("rdma", "tcp"):
            with open(os.path.join(self.out, "files", f"results-{proto}.json"), "w") as f:
                json.dump({"proto": proto, "rounds": 3, "ops": 200, "medians_ns": medians(proto)}, f)
        with open(os.path.join(self.out, "host.txt"), "w") as f:
            f.write("vm=qemu 7.2.0 TCG, 2 vCPUs, 2G\n")

    def tearDown(self):
        self.tmp.cleanup()

    def test_rows_ratios_and_ranges(self):
        path = dr.collect(self.out)
        with open(path) as f:
            res = json.load(f)
        self.assertEqual(res["meta"], {"mode": "vm"})
        fs = res["files"]
        self.assertEqual((fs["rounds"], fs["ops"]), (3, 200))
        self.assertEqual([(r["proto"], r["kind"]) for r in fs["rows"]],
                         [(p, k) for p in ("rdma", "tcp") for k in KINDS])
        orc = fs["rows"][0]
        self.assertAlmostEqual(orc["targets"]["v42-nodeleg"]["median_us"], 1000.0)
        self.assertAlmostEqual(orc["targets"]["v42-deleg"]["min_us"], 90.0)
        self.assertAlmostEqual(orc["targets"]["v42-deleg"]["max_us"], 130.0)
        self.assertAlmostEqual(orc["ratio_deleg_to_nodeleg"], 0.1)
        self.assertAlmostEqual(orc["ratio_deleg_to_knfsd"], 0.05)
        self.assertAlmostEqual(fs["rows"][3]["ratio_deleg_to_nodeleg"], 0.2)

    def test_the_table_is_rendered(self):
        path = dr.collect(self.out)
        buf = io.StringIO()
        with redirect_stdout(buf):
            dr.render(path)
        text = buf.getvalue()
        self.assertIn("Small files and metadata", text)
        self.assertIn("Soft-RoCE", text)
        line = next(l for l in text.splitlines() if l.startswith("rdma") and "open-read-close" in l)
        self.assertIn("0.10x", line)
        self.assertIn("0.05x", line)
        self.assertIn("100 [90.0-130]", line)

    def test_nothing_to_collect_is_an_error(self):
        with tempfile.TemporaryDirectory() as empty:
            with self.assertRaises(dr.Bad):
                dr.collect(empty)


if __name__ == "__main__":
    unittest.main()
