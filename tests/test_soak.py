"""The soak (benchmarks/soak.py) for 60 seconds: random call mixes, invariants after each, RSS flat."""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_soak_60_seconds():
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "soak.py"), "--duration", "60"],
                          cwd=ROOT, capture_output=True, text=True, timeout=240)
    out = proc.stdout
    print(out[-3000:])
    assert proc.returncode == 0, f"soak failed:\n{out[-3000:]}\n{proc.stderr[-3000:]}"
    assert re.search(r"^seed: \d+$", out, re.M)
    report = dict(re.findall(r"^(\w+): (.*)$", out, re.M))
    for key in ("duration", "calls", "requests", "aborts", "preemptions", "rss_mib", "rss_growth_after_warmup",
                "rss_curve", "result"):
        assert key in report, f"the report has no {key!r} line"
    assert float(report["duration"].split()[0]) >= 60
    assert int(report["calls"]) > 0 and int(report["requests"]) > 0
    assert report["result"] == "PASS"
