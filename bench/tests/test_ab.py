#!/usr/bin/env python3
"""CPU tests of scripts/ab: its summary of two builds' synthetic runs, and the interleaved
runs it starts (with stand-in bench binaries that write JSON)."""
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
AB = os.path.join(ROOT, "scripts", "ab")


def record(op, workload, ms, status="ok", accuracy="pass", plan=None):
    r = {"op": op, "workload": workload, "dtype": "bf16", "status": status,
         "ours_ms": ms, "accuracy": accuracy}
    if plan is not None:
        r["plan"] = plan
    return r


def write_run(folder, name, commit, records):
    with open(os.path.join(folder, name), "w") as f:
        json.dump({"commit": commit, "records": records}, f)


def ab(*args):
    p = subprocess.run([sys.executable, AB, *args], capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


class Compare(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def write(self, a_runs, b_runs):
        for i, recs in enumerate(a_runs, 1):
            write_run(self.dir, f"a-r{i}.json", "old1234", recs)
        for i, recs in enumerate(b_runs, 1):
            write_run(self.dir, f"b-r{i}.json", "new5678", recs)

    def test_flags_only_rows_slower_beyond_their_spread(self):
        G, M = "MoEGroupedGemmFwd", "FusedMoEFwd"
        a = [[record(G, "steady", 1.00), record(G, "noisy", 1.00), record(M, "same", 2.0),
              record(M, "faster", 1.0), record(M, "gone", 1.0)],
             [record(G, "steady", 1.00), record(G, "noisy", 1.04), record(M, "same", 2.0),
              record(M, "faster", 1.0), record(M, "gone", 1.0)],
             [record(G, "steady", 1.00), record(G, "noisy", 0.98), record(M, "same", 2.0),
              record(M, "faster", 1.0), record(M, "gone", 1.0)]]
        # steady: 10% slower, no spread -> flagged; noisy: 5% slower within 3% + 6% spread;
        # faster: 20% faster; "gone" is not run by B (status), "new" only by B.
        b = [[record(G, "steady", 1.10, plan="sm90 128x256"), record(G, "noisy", 1.05),
              record(M, "same", 2.0), record(M, "faster", 0.8),
              record(M, "gone", None, status="error: x", accuracy="fail"),
              record(M, "new", 1.0)]] * 3
        self.write(a, b)
        rc, out, err = ab("--compare", self.dir)
        self.assertEqual(rc, 0, err)
        summary = out.strip().splitlines()[-1]
        # geomean of 1.10, 1.05, 1.0, 0.8 over 4 rows
        want = (1.10 * 1.05 * 1.0 * 0.8) ** 0.25
        self.assertIn(f"summary: 4 rows, geomean B/A {want:.4f}", summary)
        self.assertIn("1 slower by > 3% beyond their spread, 1 faster", summary)
        self.assertIn("accuracy failures A 0 B 1", summary)
        self.assertIn("2 rows timed in one build only", summary)
        slower = out.split("rows slower")[1].split("rows faster")[0]
        self.assertIn("steady", slower)
        self.assertIn("sm90 128x256", slower)  # B's plan
        self.assertNotIn("noisy", slower)
        self.assertIn("A: old1234 (3 runs), B: new5678 (3 runs)", out)
        self.assertRegex(out, r"MoEGroupedGemmFwd\s+2\s+1\.0747")
        rc, out_all, _ = ab("--compare", self.dir, "--all")
        self.assertIn("noisy", out_all.split("every row:")[1])

    def test_no_runs_of_a_build_is_an_error(self):
        write_run(self.dir, "a-r1.json", "x", [record("Op", "w", 1.0)])
        rc, _, err = ab("--compare", self.dir)
        self.assertEqual(rc, 1)
        self.assertIn("no usable runs of B", err)


FAKE_BENCH = textwrap.dedent("""\
    #!{python}
    import json, sys
    args = sys.argv[1:]
    with open({log!r}, "a") as f:
        f.write({side!r} + " " + " ".join(args) + "\\n")
    path = args[args.index("--json") + 1]
    json.dump({{"commit": {side!r}, "records": [{{"op": "Op", "workload": "w", "dtype": "bf16",
               "status": "ok", "ours_ms": {ms}, "accuracy": "pass"}}]}}, open(path, "w"))
    """)


class Runs(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name
        self.log = os.path.join(self.dir, "calls.log")
        for side, ms in (("A", 1.0), ("B", 1.1)):
            os.makedirs(os.path.join(self.dir, side, "bench"))
            path = os.path.join(self.dir, side, "bench", "moekit-bench")
            with open(path, "w") as f:
                f.write(FAKE_BENCH.format(python=sys.executable, log=self.log, side=side, ms=ms))
            os.chmod(path, 0o755)

    def tearDown(self):
        self.tmp.cleanup()

    def calls(self):
        with open(self.log) as f:
            return [line.split() for line in f]

    def test_alternates_the_builds_and_checks_in_the_first_round_only(self):
        out_dir = os.path.join(self.dir, "out")
        rc, out, err = ab("--rounds", "3", "--out", out_dir, os.path.join(self.dir, "A"),
                          os.path.join(self.dir, "B"), "--", "--op", "Grouped")
        self.assertEqual(rc, 0, err)
        calls = self.calls()
        self.assertEqual([c[0] for c in calls], ["A", "B", "B", "A", "A", "B"])
        for i, c in enumerate(calls):
            self.assertIn("--no-alternatives", c)
            self.assertEqual(c[-2:], ["--op", "Grouped"])
            self.assertEqual("--no-check" in c, i >= 2)
        self.assertIn("1 slower by > 3% beyond their spread", out)
        self.assertIn("geomean B/A 1.1000", out)

    def test_budget_stops_and_resume_goes_on(self):
        out_dir = os.path.join(self.dir, "out")
        builds = [os.path.join(self.dir, "A"), os.path.join(self.dir, "B")]
        rc, out, _ = ab("--rounds", "2", "--out", out_dir, "--budget", "1e-9", *builds)
        self.assertEqual(rc, 3)  # the first run starts (nothing measured yet), then it stops
        self.assertIn("--resume", out)
        self.assertEqual(len(self.calls()), 1)
        rc, out, _ = ab("--rounds", "2", "--out", out_dir, "--resume", *builds)
        self.assertEqual(rc, 0)
        self.assertEqual([c[0] for c in self.calls()], ["A", "B", "B", "A"])
        self.assertIn("kept", out)
        self.assertTrue(re.search(r"summary: 1 rows", out))


if __name__ == "__main__":
    unittest.main()
