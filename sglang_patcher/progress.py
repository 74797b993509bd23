"""Progress of long work — a first snapshot over SSH, a wheel download, the sandbox build: files,
bytes and rate, as rich progress bars on a terminal and as plain lines otherwise.

The work asks a :class:`Meter` for a task and tells it what it did::

    with meter.task("snapshot gpu1", total_bytes=n, total_files=k) as task:
        task.advance(nbytes=len(chunk))      # from any thread (a transport's reader thread too)
        task.advance(files=1)

A task that ends with an exception says how far it got before the exception goes on:
"interrupted after ..." for Ctrl-C, "failed after ..." for an error, each followed by the task's
``failed_note`` (what was kept, or why it failed: "sglang==X is not available ..."). :data:`SILENT` shows nothing (library calls, tests); :func:`meter_for` picks
the bars or the plain lines for a console. Plain lines stay quiet for short work: a start line only
for work announced as large, a line every ``every`` seconds, and a closing line once anything was
said or the work took longer than ``quiet_s``.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from rich.console import Console
from rich.progress import (BarColumn, DownloadColumn, Progress, SpinnerColumn, TaskID, TextColumn,
                           TimeElapsedColumn, TransferSpeedColumn)

__all__ = ["Meter", "Task", "SILENT", "PlainMeter", "RichMeter", "meter_for", "human_bytes"]

LARGE_BYTES = 8 << 20     # work announced with more bytes or files than these is said at its start
LARGE_FILES = 500


def human_bytes(n: float | None) -> str:
    if n is None:
        return "?"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


class Task:
    """One piece of work being measured: ``advance`` what was done, ``total`` what is now known to
    be ahead, ``note`` what it is doing (e.g. waiting for the host to hash). Thread-safe."""

    def __init__(self, what: str, total_bytes: int | None, total_files: int | None):
        self.what = what
        self.total_bytes = total_bytes
        self.total_files = total_files
        self.nbytes = 0
        self.files = 0
        self.started = time.monotonic()
        self.failed_note = ""   # said after "interrupted/failed after ...": what was kept, or why
        self._lock = threading.Lock()

    def advance(self, *, nbytes: int = 0, files: int = 0) -> None:
        with self._lock:
            self.nbytes += nbytes
            self.files += files
        self._changed()

    def total(self, *, nbytes: int | None = None, files: int | None = None) -> None:
        with self._lock:
            if nbytes is not None:
                self.total_bytes = nbytes
            if files is not None:
                self.total_files = files
        self._changed()

    def note(self, text: str) -> None:
        pass

    def _changed(self) -> None:
        pass

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.started

    def summary(self) -> str:
        """'N files, X MiB in T s (R MiB/s)' — what is known of the work so far."""
        parts = []
        if self.files or self.total_files:
            parts.append(f"{self.files}" + (f"/{self.total_files}" if self.total_files is not None
                                             and self.total_files != self.files else "") + " files")
        if self.nbytes or self.total_bytes:
            parts.append(human_bytes(self.nbytes) + (f" of {human_bytes(self.total_bytes)}"
                                                     if self.total_bytes and self.total_bytes != self.nbytes else ""))
        s = max(self.seconds, 1e-6)
        rate = f" ({human_bytes(self.nbytes / s)}/s)" if self.nbytes and s > 0.05 else ""
        return (", ".join(parts) or "done") + f" in {s:.1f} s" + rate

    def failure(self, exc: BaseException) -> str:
        """How far the work got when ``exc`` ended it: 'interrupted after …' (Ctrl-C) or 'failed
        after …' (an error), then ``failed_note``. Work that counted nothing says only its time
        ('failed after 2.0 s', never 'after done')."""
        done = self.summary()
        if not (self.files or self.total_files or self.nbytes or self.total_bytes):
            done = f"{max(self.seconds, 1e-6):.1f} s"
        how = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
        return f"{how} after {done}" + (f" — {self.failed_note}" if self.failed_note else "")


class Meter:
    """Shows nothing: the base of the others, and what library calls get by default."""

    def _open(self, task: Task) -> None:
        pass

    def _close(self, task: Task, failed: BaseException | None) -> None:
        pass

    @contextmanager
    def task(self, what: str, *, total_bytes: int | None = None, total_files: int | None = None) -> Iterator[Task]:
        t = self._make(what, total_bytes, total_files)
        self._open(t)
        try:
            yield t
        except BaseException as exc:
            self._close(t, exc)
            raise
        self._close(t, None)

    def _make(self, what: str, total_bytes: int | None, total_files: int | None) -> Task:
        return Task(what, total_bytes, total_files)


SILENT = Meter()


def _large(task: Task) -> bool:
    return (task.total_bytes or 0) >= LARGE_BYTES or (task.total_files or 0) >= LARGE_FILES


def _ahead(task: Task) -> str:
    return ", ".join(x for x in (f"{task.total_files} files" if task.total_files else "",
                                 human_bytes(task.total_bytes) if task.total_bytes else "") if x) + " ahead"


class _PlainTask(Task):
    def __init__(self, meter: "PlainMeter", *a: Any):
        super().__init__(*a)
        self.meter = meter
        self.said = False
        self.last = self.started

    def note(self, text: str) -> None:
        if self.said or self.seconds > self.meter.quiet_s:
            self.meter.say(f"{self.what}: {text}")
            self.said = True

    def total(self, *, nbytes: int | None = None, files: int | None = None) -> None:
        super().total(nbytes=nbytes, files=files)
        if not self.said and _large(self):
            self.meter.say(f"{self.what}: {_ahead(self)}")
            self.said = True

    def _changed(self) -> None:
        now = time.monotonic()
        with self._lock:
            if now - self.last < self.meter.every:
                return
            self.last = now
        self.meter.say(f"{self.what}: {self.summary()}")
        self.said = True


class PlainMeter(Meter):
    """Plain lines through ``say`` (a log file, CI, a pipe): see the module doc."""

    def __init__(self, say: Callable[[str], None], *, every: float = 5.0, quiet_s: float = 2.0):
        self.say = say
        self.every = every
        self.quiet_s = quiet_s

    def _make(self, what: str, total_bytes: int | None, total_files: int | None) -> Task:
        return _PlainTask(self, what, total_bytes, total_files)

    def _open(self, task: Task) -> None:
        assert isinstance(task, _PlainTask)
        if _large(task):
            self.say(f"{task.what}: {_ahead(task)}")
            task.said = True

    def _close(self, task: Task, failed: BaseException | None) -> None:
        assert isinstance(task, _PlainTask)
        if failed is not None:
            self.say(f"{task.what}: {task.failure(failed)}")
        elif task.said or task.seconds > self.quiet_s:
            self.say(f"{task.what}: {task.summary()}")


class _RichTask(Task):
    def __init__(self, progress: Progress, *a: Any):
        super().__init__(*a)
        self.progress = progress
        self.id: TaskID | None = None

    def _fields(self) -> dict[str, Any]:
        files = (f"{self.files}/{self.total_files} files" if self.total_files else
                 f"{self.files} files" if self.files else "")
        return {"files": files, "completed": self.nbytes, "total": self.total_bytes}

    def _changed(self) -> None:
        if self.id is not None:
            self.progress.update(self.id, **self._fields())

    def note(self, text: str) -> None:
        if self.id is not None:
            self.progress.update(self.id, description=f"{self.what}: {text}")


class RichMeter(Meter):
    """Progress bars on ``console`` (a terminal): files, bytes, rate, elapsed time; each task's bar
    gives way to one closing line."""

    def __init__(self, console: Console):
        self.console = console

    def _make(self, what: str, total_bytes: int | None, total_files: int | None) -> Task:
        progress = Progress(SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(),
                            TextColumn("{task.fields[files]}"), DownloadColumn(), TransferSpeedColumn(),
                            TimeElapsedColumn(), console=self.console, transient=True)
        return _RichTask(progress, what, total_bytes, total_files)

    def _open(self, task: Task) -> None:
        assert isinstance(task, _RichTask)
        task.progress.start()
        f = task._fields()
        task.id = task.progress.add_task(task.what, files=f["files"], total=f["total"], completed=0)

    def _close(self, task: Task, failed: BaseException | None) -> None:
        assert isinstance(task, _RichTask)
        task.progress.stop()
        said = task.failure(failed) if failed is not None else task.summary()
        self.console.print(f"[dim]•[/dim] [bold]{task.what}:[/bold] {said}", highlight=False)


def meter_for(console: Console) -> Meter:
    """Bars when ``console`` is a terminal, plain lines otherwise."""
    if console.is_terminal and not console.is_dumb_terminal:
        return RichMeter(console)
    return PlainMeter(lambda line: console.print(line, markup=False, highlight=False))
