"""Tests of scripts/pynfs-summary: reading results.tsv and the expectations
file, the per-group summary (judged and control), and the comparison of
two servers' results, on small result sets made here.

Run: python3 -m unittest discover -s scripts/tests (scripts/test does).
"""

import io
import os
import subprocess
import sys
import tempfile
import unittest
from contextlib import redirect_stderr, redirect_stdout

from scriptmod import SCRIPTS, module


ps = module("pynfs-summary")

OURS = [
    ("OPEN2", "open", "PASS", "st_open.testCreate", ""),
    ("OPEN10", "open", "PASS", "st_open.testNames", ""),
    ("DELEG1", "delegation", "FAIL", "st_delegation.testReadDeleg", "no deleg"),
    ("RNM21", "rename", "FAIL", "st_rename.testStaleRename", "STALE"),
    ("XATT1", "xattr", "FAIL", "st_xattr.testGetXattrAttribute", "no xattr_support"),
    ("SEQ1", "sequence", "WARN", "st_sequence.testSupported", "odd"),
]
CONTROL = [
    ("OPEN2", "open", "PASS", "st_open.testCreate", ""),
    ("OPEN10", "open", "FAIL", "st_open.testNames", "NFS4ERR_INVAL"),
    ("DELEG1", "delegation", "PASS", "st_delegation.testReadDeleg", ""),
    ("RNM21", "rename", "PASS", "st_rename.testStaleRename", ""),
    ("XATT1", "xattr", "FAIL", "st_xattr.testGetXattrAttribute", "xattrs off"),
    ("SEQ1", "sequence", "PASS", "st_sequence.testSupported", ""),
]
EXPECTED = "# comment\n\nDELEG1\tno delegations\nRNM21\tfreed at last unlink\nXATT1\tno xattrs\n"


class Files(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def write(self, name, text):
        path = os.path.join(self.dir, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
        return path

    def test_tsv_round_trip_and_folder(self):
        path = os.path.join(self.dir, "results.tsv")
        ps.write_tsv(path, OURS)
        self.assertEqual(ps.read_tsv(path), OURS)
        self.assertEqual(ps.read_tsv(self.dir), OURS)

    def test_tsv_without_message_column(self):
        path = self.write("r.tsv", "code\tgroup\toutcome\ttest\tmessage\nOPEN2\topen\tPASS\tst_open.testCreate\n")
        self.assertEqual(ps.read_tsv(path), [("OPEN2", "open", "PASS", "st_open.testCreate", "")])

    def test_tsv_rejects_other_files(self):
        path = self.write("r.tsv", "code\tgroup\toutcome\ttest\tmessage\nOPEN2\topen\tMAYBE\tx\t\n")
        with self.assertRaises(ValueError):
            ps.read_tsv(path)

    def test_expected(self):
        problems = []
        path = self.write("exp.tsv", EXPECTED + "BAD\n")
        exp = ps.read_expected(path, problems)
        self.assertEqual(exp, {"DELEG1": "no delegations", "RNM21": "freed at last unlink", "XATT1": "no xattrs"})
        self.assertEqual(len(problems), 1)
        self.assertIn("exp.tsv:6", problems[0])
        self.assertEqual(ps.read_expected("none"), {})


class Summary(unittest.TestCase):
    exp = {"DELEG1": "no delegations", "RNM21": "freed", "XATT1": "no xattrs"}

    def test_counts_per_group(self):
        groups, tot = ps.counts(OURS)
        self.assertEqual(groups["open"]["PASS"], 2)
        self.assertEqual(tot["FAIL"], 3)
        self.assertEqual(tot["WARN"], 1)

    def test_as_expected(self):
        text, ok = ps.summarise(OURS, self.exp, [], 12, "/x/exp.tsv")
        self.assertTrue(ok)
        self.assertIn("expected not to pass (3, exp.tsv):", text)
        self.assertIn("warnings (1):", text)
        self.assertTrue(text.endswith("6 tests in 12s: 2 passed, 1 warned, 3 failed, 0 skipped; as expected\n"))

    def test_unexpected_failure_and_pass(self):
        text, ok = ps.summarise(CONTROL, self.exp, [], 1, "exp.tsv")
        self.assertFalse(ok)
        self.assertIn("UNEXPECTED failures (1):", text)
        self.assertIn("UNEXPECTED passes, listed in exp.tsv (2)", text)

    def test_control_judges_nothing(self):
        text, ok = ps.summarise(CONTROL, {}, [], 1, control="the Linux nfsd")
        self.assertTrue(ok)
        self.assertIn("not passed (2):", text)
        self.assertNotIn("UNEXPECTED", text)
        self.assertIn("control run against the Linux nfsd, nothing judged", text)

    def test_control_stopped_run_fails(self):
        rows = CONTROL + [("LKU1", "lookup", "STOPPED", "st_lookup.testDir", "")]
        text, ok = ps.summarise(rows, {}, [], 1, control="x")
        self.assertFalse(ok)
        self.assertIn("not run (the run was stopped): 1", text)


class Compare(unittest.TestCase):
    def test_side_by_side(self):
        text = ps.compare(OURS, CONTROL, ("nfsrdmad", "knfsd"),
                          {"DELEG1": "no delegations", "RNM21": "freed", "XATT1": "no xattrs"})
        lines = text.splitlines()
        self.assertIn("nfsrdmad", lines[0])
        self.assertIn("knfsd", lines[0])
        total = [l for l in lines if l.startswith("total")][0].split()
        # tests pass warn fail skip, twice
        self.assertEqual(total[1:], ["6", "2", "1", "3", "0", "6", "4", "0", "2", "0"])
        start = lines.index("passed by knfsd, not by nfsrdmad (2):")
        self.assertTrue(lines[start + 1].lstrip().startswith("DELEG1"))
        self.assertIn("listed: no delegations", lines[start + 1])
        self.assertTrue(lines[start + 2].lstrip().startswith("RNM21"))
        start = lines.index("passed by nfsrdmad, not by knfsd (1):")
        self.assertIn("OPEN10", lines[start + 1])
        self.assertIn("NFS4ERR_INVAL", lines[start + 1])
        # a WARN counts as passing: SEQ1 is in neither list
        self.assertNotIn("SEQ1", text.split("listed as expected")[0].split("passed by")[1])
        start = lines.index("listed as expected not to pass on nfsrdmad (3), and knfsd's outcome:")
        listed = [l.split()[:2] for l in lines[start + 1:start + 4]]
        self.assertEqual(sorted(listed), [["DELEG1", "PASS"], ["RNM21", "PASS"], ["XATT1", "FAIL"]])

    def test_one_run_only_and_markdown(self):
        text = ps.compare(OURS[:2], OURS[:1], ("a", "b"), markdown=True)
        self.assertIn("in one run only (1):", text)
        self.assertIn("OPEN10     only in a's run", text)
        self.assertIn("| **total** | 2 / 1 | 2 | 0 | 0 | 0 | 1 | 0 | 0 | 0 |", text)

    def test_command_line(self):
        with tempfile.TemporaryDirectory() as d:
            a, b = os.path.join(d, "a"), os.path.join(d, "b")
            os.makedirs(a)
            os.makedirs(b)
            ps.write_tsv(os.path.join(a, "results.tsv"), OURS)
            ps.write_tsv(os.path.join(b, "results.tsv"), CONTROL)
            out = subprocess.run([sys.executable, os.path.join(SCRIPTS, "pynfs-summary"), "compare", a, b,
                                  "--names", "nfsrdmad,knfsd"], capture_output=True, text=True,
                                 env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertIn("passed by knfsd, not by nfsrdmad (2):", out.stdout)
            buf = io.StringIO()
            with redirect_stdout(buf):
                self.assertEqual(ps.main(["compare", a, b, "--expected", "none"]), 0)
            self.assertIn("passed by nfsrdmad, not by control (1):", buf.getvalue())
            with redirect_stderr(io.StringIO()), self.assertRaises(SystemExit):
                ps.main(["compare", a, b, "--names", "x"])


if __name__ == "__main__":
    unittest.main()
