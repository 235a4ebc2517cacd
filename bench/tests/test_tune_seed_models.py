#!/usr/bin/env python3
"""CPU tests of scripts/tune-seed-models with a stand-in moekit-tune (no GPU): the layers it
tunes and their flags, the pack it leaves at every exit, resuming from a pack, the budget, and
the pictures' bench runs it skips."""
import json
import os
import subprocess
import tarfile
import tempfile
import textwrap
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "tune-seed-models")

# Writes --out and --partial as moekit-tune does and logs its arguments to $STUB_CALLS.
STUB = textwrap.dedent("""\
    #!/usr/bin/env bash
    echo "$*" >>"$STUB_CALLS"
    if [ "$1" = --verify ]; then
      echo "moekit-tune: $2: 1 entries of stub verified at 2 counts, ${STUB_VERIFY_FAILED:-0} failed"
      exit $(( ${STUB_VERIFY_FAILED:-0} > 0 ))
    fi
    out="" partial="" model=""
    while [ $# -gt 0 ]; do
      case "$1" in
        --out) out=$2; shift 2 ;;
        --partial) partial=$2; shift 2 ;;
        --model) model=$2; shift 2 ;;
        *) shift ;;
      esac
    done
    echo "# moekit-tune partial: stub $model" >"$partial"
    echo "# moekit tuning table: stub $model" >"$out"
    echo "moekit-tune: 1 entries -> $out"
    """)


class TuneSeedModels(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.bin = os.path.join(self.tmp.name, "bin")
        os.makedirs(os.path.join(self.bin, "bench", "tune"))
        stub = os.path.join(self.bin, "bench", "tune", "moekit-tune")
        with open(stub, "w") as f:
            f.write(STUB)
        os.chmod(stub, 0o755)
        self.calls = os.path.join(self.tmp.name, "calls.txt")

    def tearDown(self):
        self.tmp.cleanup()

    def run_script(self, *args, verify_failed=0):
        env = dict(os.environ, STUB_CALLS=self.calls, STUB_VERIFY_FAILED=str(verify_failed))
        p = subprocess.run([SCRIPT, "--bin", self.bin, *args], capture_output=True, text=True,
                           env=env, timeout=60)
        return p.returncode, p.stdout + p.stderr

    def stub_calls(self):
        if not os.path.exists(self.calls):
            return []
        with open(self.calls) as f:
            return f.read().splitlines()

    def test_tunes_the_layers_named_and_packs_them(self):
        out = os.path.join(self.tmp.name, "tune")
        pack = os.path.join(self.tmp.name, "tune.tgz")
        rc, log = self.run_script("--models", "qwen3-30b,qwen3-30b-ep8", "--pack", pack, out)
        self.assertEqual(rc, 0, log)
        calls = self.stub_calls()
        self.assertEqual(len(calls), 2, calls)
        self.assertIn("--model qwen3-30b --experts 128 --hidden 2048", calls[0])
        self.assertNotIn("--local-experts", calls[0])
        self.assertIn("--model qwen3-30b-ep8 ", calls[1])
        self.assertIn("--local-experts 0-15", calls[1])
        for c in calls:
            self.assertIn("--tokens 1-16,24,32,48,64,96,128,192,256,384,512,1024,2048,4096", c)
        with tarfile.open(pack) as t:
            names = sorted(os.path.basename(n) for n in t.getnames())
        self.assertEqual(names, ["qwen3-30b-ep8.table", "qwen3-30b-ep8.table.log",
                                 "qwen3-30b-ep8.table.partial", "qwen3-30b.table",
                                 "qwen3-30b.table.log", "qwen3-30b.table.partial"])

    def test_resumes_from_a_pack_and_skips_finished_layers(self):
        first = os.path.join(self.tmp.name, "a")
        pack = os.path.join(self.tmp.name, "a.tgz")
        rc, log = self.run_script("--models", "glm45", "--pack", pack, first)
        self.assertEqual(rc, 0, log)
        # A bench run of the pictures travels in the pack too.
        with open(os.path.join(first, "bench-glm45.json"), "w") as f:
            f.write('{"records": []}')
        rc, log = self.run_script("--models", "glm45", "--pack", pack, first)
        self.assertEqual(rc, 0, log)
        os.remove(self.calls)
        second = os.path.join(self.tmp.name, "b")
        rc, log = self.run_script("--from", pack, "--models", "glm45,qwen3-235b", "--pictures",
                                  second)
        # qwen3-235b's pictures run fails here (no GPU, no moekit-bench): the exit status says so.
        self.assertEqual(rc, 1, log)
        self.assertIn("bench-qwen3-235b.json rc=1", log)
        self.assertIn("glm45.table exists, skipped", log)
        calls = self.stub_calls()
        self.assertEqual(len(calls), 1, calls)
        self.assertIn("--model qwen3-235b ", calls[0])
        self.assertTrue(os.path.exists(os.path.join(second, "bench-glm45.json")))
        # glm45's pictures came with the pack: no bench run for it.
        self.assertFalse(os.path.exists(os.path.join(second, "bench-glm45.log")))

    def test_verify_checks_each_table_it_writes(self):
        out = os.path.join(self.tmp.name, "tune")
        os.makedirs(out)
        with open(os.path.join(out, "glm45.table"), "w") as f:
            f.write("# an earlier call's table\n")
        rc, log = self.run_script("--verify", "--models", "glm45,qwen3-30b", out)
        self.assertEqual(rc, 0, log)
        calls = self.stub_calls()
        # glm45's table existed: neither tuned nor verified again.
        self.assertEqual(len(calls), 2, calls)
        self.assertIn("--model qwen3-30b ", calls[0])
        self.assertEqual(calls[1], "--verify " + os.path.join(out, "qwen3-30b.table"))
        self.assertIn("verify " + os.path.join(out, "qwen3-30b.table") + " rc=0", log)
        with open(os.path.join(out, "qwen3-30b.table.verify.log")) as f:
            self.assertIn("0 failed", f.read())
        # A failed check sets the exit status; the next layer is still tuned.
        rc, log = self.run_script("--verify", "--models", "qwen3-235b,glm45-ep8", out,
                                  verify_failed=1)
        self.assertEqual(rc, 1, log)
        self.assertIn("qwen3-235b.table rc=1", log)
        self.assertIn("--model glm45-ep8 ", self.stub_calls()[-2])

    def test_a_table_whose_partial_lacks_steps_is_tuned_again(self):
        out = os.path.join(self.tmp.name, "tune")
        os.makedirs(out)
        counts = list(range(1, 17)) + [24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 1024, 2048,
                                       4096]
        plan = "sorted two_gemms{gate_up: sm90 128x128, down: sm90 128x128}"

        def write_layer(name, dropped):
            lines = ["# moekit-tune partial: " + name]
            for t in counts:
                for routing in ("uniform", "skewed"):
                    if t not in dropped:
                        lines.append("%d | %s | %s | 10.0 | accurate | default" % (t, routing, plan))
            for suffix, text in ((".table.partial", "\n".join(lines) + "\n"),
                                 (".table", "# a table\n")):
                with open(os.path.join(out, name + suffix), "w") as f:
                    f.write(text)
            with open(os.path.join(out, "bench-%s.json" % name), "w") as f:
                f.write('{"records": []}')

        write_layer("qwen3-30b", dropped=(96, 128))  # the default moved at 96 and 128
        write_layer("glm45", dropped=())
        rc, log = self.run_script("--models", "qwen3-30b,glm45", out)
        self.assertEqual(rc, 0, log)
        self.assertIn("qwen3-30b.table.partial lacks 4 steps: tuned again", log)
        self.assertIn("glm45.table exists, skipped", log)
        calls = self.stub_calls()
        self.assertEqual(len(calls), 1, calls)
        self.assertIn("--model qwen3-30b ", calls[0])
        self.assertIn("--partial " + os.path.join(out, "qwen3-30b.table.partial"), calls[0])
        # The re-tuned layer's pictures run (the old default's) is gone, the other's kept.
        self.assertFalse(os.path.exists(os.path.join(out, "bench-qwen3-30b.json")))
        self.assertTrue(os.path.exists(os.path.join(out, "bench-glm45.json")))

    def test_the_committed_fp8_partials_are_tuned_again_where_they_lack_steps(self):
        # Counts whose default plan changed were dropped from the FP8 partial files: 96 and 128
        # (the direct path, 2026-12-07; the H100's measured again since, the H200's not yet),
        # and 192-512 (E = 257) / 192-1024 (E = 513) on the F = 128 layers (the weight-only
        # GEMMs), and 96-128 again on E = 257 (the weight-only GEMMs from 2 routes an expert):
        # 2 steps (uniform, skewed) a count.
        for gpu, name, lacking in (("h100", "hunyuan3-e192-i192-fp8", 0),
                                   ("h100", "qwen3.5-35b-e257-i128-fp8", 12),
                                   ("h200", "qwen3.5-397b-e513-i128-fp8", 14)):
            out = os.path.join(self.tmp.name, "t-%s-%s" % (gpu, name))
            rc, log = self.run_script("--from", os.path.join(ROOT, "results", gpu, "tune"),
                                      "--models", name, out)
            self.assertEqual(rc, 0, log)
            if lacking:
                self.assertIn("%s.table.partial lacks %d steps: tuned again" % (name, lacking), log)
            else:
                self.assertNotIn("lacks", log)
                self.assertIn(name + ".table", log)

    def test_ep8_layers_have_no_pictures_run(self):
        out = os.path.join(self.tmp.name, "tune")
        rc, log = self.run_script("--models", "kimi-k2-ep8", "--pictures", out)
        self.assertEqual(rc, 0, log)
        self.assertFalse(os.path.exists(os.path.join(out, "bench-kimi-k2-ep8.log")))
        self.assertIn("--local-experts 0-47", self.stub_calls()[0])

    def test_the_decoding_prs_layers_run_to_16384_tokens_without_an_ep8_form(self):
        out = os.path.join(self.tmp.name, "tune")
        rc, log = self.run_script("--models", "qwen3.8-flash-next-e513-i320,hunyuan3-e192-i192-fp8",
                                  out)
        self.assertEqual(rc, 0, log)
        calls = self.stub_calls()
        self.assertEqual(len(calls), 2, calls)
        self.assertIn("--experts 513 --hidden 4096 --intermediate 320 --top-k 8 ", calls[0])
        self.assertNotIn("--weight-quant", calls[0])
        self.assertIn("--experts 192 --hidden 4096 --intermediate 192 --top-k 8 "
                      "--weight-quant fp8_per_tensor ", calls[1])
        for c in calls:
            self.assertNotIn("--local-experts", c)
            self.assertIn("--tokens 1-16,24,32,48,64,96,128,192,256,384,512,1024,2048,4096,"
                          "8192,16384 ", c)
        rc, log = self.run_script("--models", "hunyuan3-e192-i192-fp8-ep8", out)
        self.assertEqual(rc, 2, log)
        self.assertIn("unknown layer 'hunyuan3-e192-i192-fp8-ep8'", log)

    def test_the_default_layers_are_the_seed_models_then_the_prs(self):
        out = os.path.join(self.tmp.name, "tune")
        rc, log = self.run_script(out)
        self.assertEqual(rc, 0, log)
        models = [c.split("--model ")[1].split()[0] for c in self.stub_calls()]
        self.assertEqual(len(models), 24, models)
        self.assertEqual(models[:3], ["ds-v3", "kimi-k2", "qwen3-235b"])
        self.assertEqual(models[5], "ds-v3-ep8")
        self.assertEqual(models[10], "qwen3.8-flash-next-e513-i192")
        self.assertEqual(models[18], "qwen3.5-397b-e513-i128-fp8")
        self.assertEqual(models[-1], "qwen3-30b-fp8-tensor")
        # Every layer has its pictures' workload (bench/workloads/tune_seed.json, full layers).
        with open(os.path.join(ROOT, "bench", "workloads", "tune_seed.json")) as f:
            names = {w["name"] for op in json.load(f)["ops"] for w in op["workloads"]}
        self.assertEqual(set(models), names)

    def test_a_spent_budget_stops_before_a_layer_and_still_packs(self):
        out = os.path.join(self.tmp.name, "tune")
        pack = os.path.join(self.tmp.name, "tune.tgz")
        rc, log = self.run_script("--budget", "0", "--models", "ds-v3", "--pack", pack, out)
        self.assertEqual(rc, 3, log)
        self.assertIn("budget spent before", log)
        self.assertEqual(self.stub_calls(), [])
        self.assertTrue(os.path.exists(pack))

    def with_nvidia_smi(self, name):
        """A stand-in nvidia-smi naming GPU `name`, first on PATH."""
        smi_dir = os.path.join(self.tmp.name, "smi")
        os.makedirs(smi_dir, exist_ok=True)
        smi = os.path.join(smi_dir, "nvidia-smi")
        with open(smi, "w") as f:
            f.write("#!/usr/bin/env bash\necho '%s'\n" % name)
        os.chmod(smi, 0o755)
        return dict(PATH=smi_dir + os.pathsep + os.environ["PATH"])

    def test_from_auto_resumes_from_the_gpus_committed_results(self):
        for name, gpu in (("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200")):
            out = os.path.join(self.tmp.name, "t-" + gpu)
            env = dict(os.environ, STUB_CALLS=self.calls, **self.with_nvidia_smi(name))
            p = subprocess.run([SCRIPT, "--bin", self.bin, "--from", "auto", "--models",
                                "qwen3-30b", out], capture_output=True, text=True, env=env,
                               timeout=60)
            log = p.stdout + p.stderr
            self.assertEqual(p.returncode, 0, log)
            self.assertIn("--from auto: %s, results/%s/tune" % (name, gpu), log)
            # The committed table is copied in and kept: the layer is not tuned again.
            with open(os.path.join(ROOT, "results", gpu, "tune", "qwen3-30b.table")) as f:
                committed = f.read()
            with open(os.path.join(out, "qwen3-30b.table")) as f:
                self.assertEqual(f.read(), committed)
            self.assertIn("qwen3-30b.table exists, skipped", log)
        self.assertEqual(self.stub_calls(), [])
        env = dict(os.environ, STUB_CALLS=self.calls, **self.with_nvidia_smi("NVIDIA A100"))
        p = subprocess.run([SCRIPT, "--bin", self.bin, "--from", "auto",
                            os.path.join(self.tmp.name, "t")], capture_output=True, text=True,
                           env=env, timeout=60)
        self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
        self.assertIn("no committed results for GPU 'NVIDIA A100'", p.stderr)

    def test_rejects_an_unknown_layer(self):
        rc, log = self.run_script("--models", "ds-v4", os.path.join(self.tmp.name, "t"))
        self.assertEqual(rc, 2, log)
        self.assertIn("unknown layer 'ds-v4'", log)
        self.assertEqual(self.stub_calls(), [])


if __name__ == "__main__":
    unittest.main()
