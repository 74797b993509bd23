"""Progress of long work: plain lines (quiet for short work, a line per period, a closing line,
what an interruption kept) and rich bars rendered on a recording terminal console."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import threading

import pytest
from rich.console import Console

from sglang_patcher.piprun import announced_bytes, run_pip
from sglang_patcher.progress import SILENT, PlainMeter, RichMeter, Task, human_bytes, meter_for


def test_plain_lines_for_large_work_say_what_is_ahead_how_far_and_the_rate():
    lines: list[str] = []
    meter = PlainMeter(lines.append, every=0.0)
    with meter.task("snapshot gpu1", total_bytes=100 << 20, total_files=1000) as task:
        task.advance(nbytes=40 << 20, files=400)
        task.advance(nbytes=60 << 20, files=600)
    assert lines[0] == "snapshot gpu1: 1000 files, 100.0 MiB ahead"
    assert lines[1].startswith("snapshot gpu1: 400/1000 files, 40.0 MiB of 100.0 MiB in ")
    assert lines[-1].startswith("snapshot gpu1: 1000 files, 100.0 MiB in ")


def test_plain_lines_stay_quiet_for_short_work_and_say_when_totals_turn_out_large():
    lines: list[str] = []
    meter = PlainMeter(lines.append)
    with meter.task("snapshot h") as task:
        task.note("hashing the install on the host")
        task.advance(nbytes=10, files=1)
    assert lines == []
    with meter.task("snapshot h (first)") as task:
        task.total(nbytes=200 << 20, files=6000)    # learnt from the host's index
    assert lines[0] == "snapshot h (first): 6000 files, 200.0 MiB ahead"


def test_an_interrupted_task_says_how_far_it_got_and_what_was_kept():
    lines: list[str] = []
    meter = PlainMeter(lines.append)
    with pytest.raises(KeyboardInterrupt):
        with meter.task("snapshot h", total_files=10) as task:
            task.advance(nbytes=2048, files=3)
            task.failed_note = "the mirror is partial: 3 of 10 files kept"
            raise KeyboardInterrupt
    assert lines[-1].startswith("snapshot h: interrupted after 3/10 files, 2.0 KiB")
    assert lines[-1].endswith("— the mirror is partial: 3 of 10 files kept")



def test_a_task_ended_by_an_error_says_it_failed_and_why_never_interrupted_after_done():
    """A missing SGLang release ended the download task with an error and nothing counted: the
    line read "download sglang==0.0.999: interrupted after done in 2.0 s". An error is a failure
    (not a Ctrl-C), work that counted nothing says only its time, and the task's note says why."""
    lines: list[str] = []
    with pytest.raises(RuntimeError):
        with PlainMeter(lines.append).task("download sglang==0.0.999") as task:
            task.failed_note = "sglang 0.0.999 is not available (newest releases: 0.5.23)"
            raise RuntimeError("not on PyPI")
    assert re.fullmatch(r"download sglang==0\.0\.999: failed after \d+\.\d s — sglang 0\.0\.999 is not "
                        r"available \(newest releases: 0\.5\.23\)", lines[-1]), lines
    out = io.StringIO()
    meter = meter_for(Console(file=out, force_terminal=True, width=200, color_system=None))
    with pytest.raises(RuntimeError):
        with meter.task("download sglang==0.0.999"):
            raise RuntimeError("not on PyPI")
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    assert "failed after" in text and "done" not in text and "interrupted" not in text, text


def test_rich_bars_on_a_terminal_give_way_to_one_closing_line():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120, color_system=None)
    meter = meter_for(console)
    assert isinstance(meter, RichMeter)
    with meter.task("download sglang==0.5.23", total_bytes=4 << 20) as task:
        done = threading.Event()

        def reader():                      # a transport's reader thread advancing the same task
            task.advance(nbytes=1 << 20)
            done.set()

        threading.Thread(target=reader).start()
        assert done.wait(5)
        task.advance(nbytes=3 << 20, files=1)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())   # the live display's cursor moves
    assert "download sglang==0.5.23" in text
    assert text.rstrip().splitlines()[-1].startswith("• download sglang==0.5.23: 1 files, 4.0 MiB in ")


def test_a_console_that_is_not_a_terminal_gets_plain_lines_and_library_calls_get_silence():
    assert isinstance(meter_for(Console(file=io.StringIO())), PlainMeter)
    with SILENT.task("x", total_bytes=1 << 40) as task:
        task.advance(nbytes=1)
    assert isinstance(task, Task) and task.nbytes == 1
    assert human_bytes(1536) == "1.5 KiB" and human_bytes(None) == "?"


def test_pip_downloads_are_measured_by_what_pip_announces_and_writes(tmp_path):
    assert announced_bytes("  Downloading sglang-0.5.23-py3-none-any.whl.metadata (3.1 kB)\n"
                           "  Downloading sglang-0.5.23-py3-none-any.whl (3.9 MB)\n"
                           "Downloading https://x/torch-2.4.0-cp311-none.whl (190.2 MB)\n") == 194_100_000
    # a stand-in for pip's file handling (a real pip run: the test below): announces a download,
    # writes it into a pip-unpack-* directory under TMPDIR in pieces while its HTTP cache buffers the
    # same bytes in a temp file beside it (counted too, that doubled every figure), deletes both, exits 0
    fake = tmp_path / "fakepip.py"
    fake.write_text("import os, time, tempfile\n"
                    "print('  Downloading pkg-1.0-py3-none-any.whl (3.0 MB)', flush=True)\n"
                    "d = tempfile.mkdtemp(prefix='pip-unpack-')\n"
                    "p = os.path.join(d, 'pkg-1.0-py3-none-any.whl')\n"
                    "c = os.path.join(tempfile.gettempdir(), 'tmpcachebuffer')\n"
                    "with open(p, 'wb') as f, open(c, 'wb') as g:\n"
                    "    for _ in range(3):\n"
                    "        f.write(b'x' * 1_000_001); f.flush(); g.write(b'x' * 1_000_001); g.flush()\n"
                    "        time.sleep(0.3)\n"
                    "os.unlink(p); os.unlink(c)\n")
    task = Task("download pkg", None, None)
    proc = run_pip([sys.executable, str(fake)], task=task)
    assert proc.returncode == 0 and "Downloading pkg" in proc.stdout
    assert task.total_bytes == 3_000_003 and task.nbytes == 3_000_003   # the bytes written, not pip's 3.0 MB
    # too quick to be seen (written and deleted between two polls): pip's figure stands in
    quick = tmp_path / "quickpip.py"
    quick.write_text("print('  Downloading pkg-1.0-py3-none-any.whl (2.0 MB)', flush=True)\n")
    task = Task("download pkg", None, None)
    assert run_pip([sys.executable, str(quick)], task=task).returncode == 0
    assert task.total_bytes == task.nbytes == 2_000_000
    with pytest.raises(subprocess.TimeoutExpired):
        run_pip([sys.executable, "-c", "import time; time.sleep(30)"], task=Task("x", None, None), timeout=0.5)


def test_a_real_pip_install_reports_the_bytes_of_the_wheel_it_fetched(tmp_path):
    """Progress figures were ~2x the download: pip's HTTP cache buffers each download in a temp file
    beside pip's own copy, and both were counted. A real pip installs a real wheel fetched from a local
    HTTP server that sends it slowly (so the download is seen while it runs); the reported total and
    the bytes advanced both equal the wheel's size (not pip's rounded figure)."""
    import functools
    import http.server
    import os
    import time
    import zipfile

    served = tmp_path / "served"
    served.mkdir()
    wheel = served / "sglpatchdemo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as z:
        z.writestr("sglpatchdemo/__init__.py", "")
        z.writestr("sglpatchdemo/blob.bin", os.urandom(3_000_000))
        z.writestr("sglpatchdemo-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: sglpatchdemo\nVersion: 1.0\n")
        z.writestr("sglpatchdemo-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                                          "Tag: py3-none-any\n")
        z.writestr("sglpatchdemo-1.0.dist-info/RECORD", "")

    class Slow(http.server.SimpleHTTPRequestHandler):
        def end_headers(self):                         # as PyPI serves files: pip's cache keeps them
            self.send_header("Cache-Control", "max-age=365000000, immutable, public")
            super().end_headers()

        def copyfile(self, source, outputfile):        # ~1.5 s for the wheel: several polls see it
            while block := source.read(64 << 10):
                outputfile.write(block)
                time.sleep(0.03)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Slow, directory=str(served)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        dest = tmp_path / "dest"
        env = {**os.environ, "PIP_CACHE_DIR": str(tmp_path / "pip-cache"), "PIP_CONFIG_FILE": os.devnull}
        class Noted(Task):
            notes: list[str] = []

            def note(self, text: str) -> None:
                self.notes.append(text)

        task = Noted("download sglpatchdemo", None, None)
        proc = run_pip([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--disable-pip-version-check",
                        "--find-links", f"http://127.0.0.1:{server.server_address[1]}/", "--target", str(dest),
                        "sglpatchdemo==1.0"], task=task, env=env, timeout=120)
    finally:
        server.shutdown()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"Downloading \S*sglpatchdemo-1.0-py3-none-any.whl \(", proc.stdout), proc.stdout
    size = wheel.stat().st_size
    assert (dest / "sglpatchdemo" / "blob.bin").stat().st_size == 3_000_000    # installed
    assert task.total_bytes == size and task.nbytes == size, (task.total_bytes, task.nbytes, size)
    # past the downloads the bar stands full: the task says pip is installing (a new user saw 100 %
    # for a minute and thought it hung)
    assert task.notes == ["installing 1 package (downloads done)"], task.notes


def test_pip_install_phase_is_read_from_its_output():
    from sglang_patcher.piprun import phase

    assert phase("Collecting sglang==0.5.23\n  Downloading sglang-0.5.23.whl (3.9 MB)\n") is None
    assert phase("x\nInstalling collected packages: torch, triton, sglang\n") == \
        "installing 3 packages (downloads done)"
