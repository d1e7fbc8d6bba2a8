"""python -m kvreshard.bench: the 70B-size resharded read, as JSON."""

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PY = os.path.join(os.path.dirname(HERE))


def bench(*args):
    p = subprocess.run([sys.executable, "-m", "kvreshard.bench"] + list(args), capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=PY), timeout=600)
    return p.returncode, p.stdout, p.stderr


def test_bench_reads_the_pages_it_wrote(tmp_path):
    url = "file://" + str(tmp_path)
    code, out, err = bench("--url", url, "--pages", "2", "--repeat", "1", "--calls", "10", "--write")
    assert (code, err) == (0, ""), out + err
    r = json.loads(out)
    # rank 0/0 of TP 4 x PP 2: 64 tokens x 40 layers x 2 heads x 128 x 2 bytes, K and V
    assert (r["url"], r["pages"], r["bytes"]) == (url, 2, 2 * 64 * 40 * 2 * 128 * 2 * 2)
    assert r["read_seconds"] > 0 and r["call_us"] > 0 and r["gbps"] > 0
    # the pages are there for another process, and a third page is not
    code, out, err = bench("--url", url, "--pages", "3", "--repeat", "1", "--calls", "10")
    assert code == 1 and err == ""
    assert json.loads(out)["error"].startswith("read 2 of 3 pages: MISS page missing or incomplete")


def test_bench_usage():
    code, out, err = bench("--url", "mem://", "--pages", "0")
    assert code == 2 and "--pages, --repeat and --calls must be at least 1" in err
