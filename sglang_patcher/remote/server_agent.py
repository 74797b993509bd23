"""Host-side server agent: start, watch, query and stop an SGLang server for ``check`` and ``bench``.

Runs under the HOST's interpreter, sent by :mod:`sglang_patcher.remote.launcher`; standard library
only (it never imports sglang: the server it starts does). Invoked as ``sys.argv == [<source>, op,
json_args]``; every op prints one JSON object; an expected failure prints ``{"ok": false, "kind",
"error", ...}`` and exits 3.

A server is a detached process group (``setsid``) that outlives the agent, with a record
``<servers_dir>/<name>.json`` ({name, pid, pgid, port, argv, started, log}) written before the agent
returns and its output in ``<servers_dir>/<name>.log``. The client stops it by name; a record whose
process still runs when no client owns it is a *leftover* (an earlier run crashed or was killed) and
is reported by ``list`` and refused by ``start`` until stopped.

Ops:
  start {name, argv, env, port, servers_dir, cwd?} -> {pid, pgid, log}
      kinds of failure: ``leftover`` (a recorded server still runs: named), ``port_in_use``.
  poll {name, servers_dir, port, timeout_s} -> {alive, healthy, exit_code, log_tail}
      one ``GET /health`` (waiting at most ``timeout_s``); ``alive`` false once the process is gone.
  generate {port, requests: [{text|input_ids, sampling_params}], concurrency, timeout_s}
      -> {results: [{output_ids, text, meta_info, latency_s} | {error}], wall_s}
  bench {port, requests: [...], concurrency, timeout_s}
      -> {results: [{output_tokens, latency_s, ttft_s, meta_info} | {error}], wall_s}
      each request streamed (``stream: true``) to time its first token.
  server_info {port} -> the server's ``/server_info`` JSON
  run_client {argv, env, files: {path: text}, read, timeout_s} -> {exit_code, output_tail, read_text}
      writes ``files``, runs ``argv`` (e.g. SGLang's own benchmark client; ``~/`` at the start of
      an argument is the login user's home) to completion or the timeout, returns its output tail
      and the text of ``read`` (its result file).
  has_module {name} -> {found}: whether the host's interpreter can import ``name`` (not imported)
  paths {paths: [path]} -> {paths: {path: {exists, readable, dir, expanded, expanded_exists, parent,
      entries}}}: what the login user finds at each path (``~`` not expanded, as a server's argv is
      not; ``expanded`` the path with it expanded), and where a path is missing its nearest existing
      parent and a few of that directory's entries (``more``: how many are not listed), the first
      missing name under it (``missing``; ``direct``: the path's last name) and the entries named
      like it (``close``)
  stop {name, servers_dir, grace_s} -> {stopped, signal, was_running}
  list {servers_dir} -> {servers: [{name, pid, port, started, alive, log}]}
  log_tail {name, servers_dir, bytes} -> {text}
"""

import difflib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

EXPECTED_FAILURE_EXIT = 3


def fail(kind, error, **extra):
    out = {"ok": False, "kind": kind, "error": error}
    out.update(extra)
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
    sys.exit(EXPECTED_FAILURE_EXIT)


def answer(obj):
    obj.setdefault("ok", True)
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


# --------------------------------------------------------------------------------------------------
# records and processes
# --------------------------------------------------------------------------------------------------
def _sdir(a):
    """The op's ``servers_dir`` (``~`` is the login user's home)."""
    return os.path.expanduser(a["servers_dir"])


def _record_path(servers_dir, name):
    return os.path.join(servers_dir, name + ".json")


def _log_path(servers_dir, name):
    return os.path.join(servers_dir, name + ".log")


def _read_record(path):
    try:
        with open(path) as f:
            rec = json.load(f)
        return rec if isinstance(rec, dict) else None
    except (OSError, ValueError):
        return None


def _alive(pid):
    """True while ``pid`` runs (a zombie counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _group_alive(pgid):
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _records(servers_dir):
    out = []
    try:
        names = sorted(os.listdir(servers_dir))
    except FileNotFoundError:
        return out
    for n in names:
        if n.endswith(".json"):
            rec = _read_record(os.path.join(servers_dir, n))
            if rec and isinstance(rec.get("pid"), int):
                rec["alive"] = _alive(rec["pid"]) or _group_alive(rec.get("pgid", rec["pid"]))
                out.append(rec)
    return out


def _tail(path, nbytes):
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - nbytes))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _port_free(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # as servers bind: a port held only by TIME_WAIT connections of a stopped server is free,
    # one a process listens on is not
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("0.0.0.0", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def _write_atomic(path, obj):
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with open(tmp, "w") as f:
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# --------------------------------------------------------------------------------------------------
# HTTP to the server (loopback on the host)
# --------------------------------------------------------------------------------------------------
def _url(port, path):
    return "http://127.0.0.1:%d%s" % (port, path)


def _get_json(port, path, timeout):
    with urllib.request.urlopen(_url(port, path), timeout=timeout) as r:
        return json.loads(r.read())


def _post(port, path, body, timeout):
    req = urllib.request.Request(_url(port, path), data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=timeout)


def _generate_one(port, request, timeout):
    t0 = time.monotonic()
    try:
        with _post(port, "/generate", dict(request, stream=False), timeout) as r:
            out = json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return {"error": "HTTP %d: %s" % (exc.code, exc.read()[-2000:].decode("utf-8", "replace"))}
    except (OSError, ValueError) as exc:
        return {"error": "%s: %s" % (type(exc).__name__, exc)}
    return {"output_ids": out.get("output_ids"), "text": out.get("text"),
            "meta_info": out.get("meta_info", {}), "latency_s": time.monotonic() - t0}


def _stream_one(port, request, timeout):
    """One streamed request: latency, time to first token, output tokens, final meta_info."""
    t0 = time.monotonic()
    ttft = None
    last = None
    try:
        with _post(port, "/generate", dict(request, stream=True), timeout) as r:
            for raw in r:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                if ttft is None:
                    ttft = time.monotonic() - t0
                last = json.loads(data)
    except urllib.error.HTTPError as exc:
        return {"error": "HTTP %d: %s" % (exc.code, exc.read()[-2000:].decode("utf-8", "replace"))}
    except (OSError, ValueError) as exc:
        return {"error": "%s: %s" % (type(exc).__name__, exc)}
    if last is None:
        return {"error": "the stream ended without output"}
    meta = last.get("meta_info", {})
    return {"output_tokens": meta.get("completion_tokens"), "latency_s": time.monotonic() - t0,
            "ttft_s": ttft, "meta_info": meta}


def _run_concurrently(fn, port, requests, concurrency, timeout):
    """``fn(port, request, timeout)`` for every request, ``concurrency`` at a time, in order."""
    results = [None] * len(requests)
    nxt = [0]
    lock = threading.Lock()

    def worker():
        while True:
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= len(requests):
                return
            results[i] = fn(port, requests[i], timeout)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(max(1, min(concurrency, len(requests))))]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, time.monotonic() - t0


# --------------------------------------------------------------------------------------------------
# ops
# --------------------------------------------------------------------------------------------------
def op_start(a):
    d, name, port = _sdir(a), a["name"], int(a["port"])
    os.makedirs(d, exist_ok=True)
    for rec in _records(d):
        if rec["alive"]:
            fail("leftover", "a server started by sglpatch still runs: %s (pid %d, port %s, started %s)"
                 % (rec.get("name"), rec["pid"], rec.get("port"), rec.get("started")),
                 server=rec)
        # a dead record: its process is gone, keep its log, drop the record
        try:
            os.unlink(_record_path(d, rec["name"]))
        except OSError:
            pass
    if not _port_free(port):
        fail("port_in_use", "port %d on this host is in use by another process" % port, port=port)
    log = _log_path(d, name)
    env = dict(os.environ)
    env.update({str(k): str(v) for k, v in (a.get("env") or {}).items()})
    with open(log, "ab") as logf:
        logf.write(("\n=== sglpatch: %s starting %s\n" % (time.strftime("%Y-%m-%dT%H:%M:%S"), " ".join(a["argv"]))).encode())
        logf.flush()
        try:
            proc = subprocess.Popen(a["argv"], stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                                    env=env, cwd=a.get("cwd") or d, start_new_session=True, close_fds=True)
        except OSError as exc:
            fail("start_failed", "cannot start %s: %s" % (a["argv"][0], exc))
    rec = {"name": name, "pid": proc.pid, "pgid": proc.pid, "port": port, "argv": a["argv"],
           "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "log": log, "agent_pid": os.getpid()}
    _write_atomic(_record_path(d, name), rec)
    answer({"pid": proc.pid, "pgid": proc.pid, "log": log})


def op_poll(a):
    d, name = _sdir(a), a["name"]
    rec = _read_record(_record_path(d, name))
    if rec is None:
        fail("unknown_server", "no server %r is recorded in %s" % (name, d))
    alive = _alive(rec["pid"])
    healthy = False
    if alive:
        try:
            with urllib.request.urlopen(_url(int(rec["port"]), "/health"),
                                        timeout=float(a.get("timeout_s", 2))) as r:
                healthy = r.status == 200
        except (OSError, ValueError):
            healthy = False
    answer({"alive": alive, "healthy": healthy, "log_tail": _tail(rec["log"], int(a.get("tail_bytes", 3000)))})


def op_generate(a):
    results, wall = _run_concurrently(_generate_one, int(a["port"]), a["requests"],
                                      int(a.get("concurrency", 1)), float(a.get("timeout_s", 600)))
    answer({"results": results, "wall_s": wall})


def op_bench(a):
    results, wall = _run_concurrently(_stream_one, int(a["port"]), a["requests"],
                                      int(a.get("concurrency", 1)), float(a.get("timeout_s", 600)))
    answer({"results": results, "wall_s": wall})


def op_server_info(a):
    try:
        answer({"info": _get_json(int(a["port"]), "/server_info", float(a.get("timeout_s", 30)))})
    except (OSError, ValueError) as exc:
        fail("unreachable", "GET /server_info: %s" % exc)


def op_run_client(a):
    for path, text in (a.get("files") or {}).items():
        path = os.path.expanduser(path)
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    read = os.path.expanduser(a["read"]) if a.get("read") else None
    if read and os.path.exists(read):
        os.unlink(read)
    env = dict(os.environ)
    env.update({str(k): str(v) for k, v in (a.get("env") or {}).items()})
    argv = [os.path.expanduser(x) if x.startswith("~/") else x for x in a["argv"]]
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, env=env, timeout=float(a.get("timeout_s", 3600)))
        code, out = proc.returncode, proc.stdout
    except subprocess.TimeoutExpired as exc:
        code, out = None, exc.stdout or b""
    except OSError as exc:
        fail("start_failed", "cannot run %s: %s" % (a["argv"][0], exc))
    text = ""
    if read and os.path.exists(read):
        with open(read, encoding="utf-8", errors="replace") as f:
            text = f.read()
    answer({"exit_code": code, "output_tail": out[-6000:].decode("utf-8", "replace"), "read_text": text})


def op_has_module(a):
    import importlib.util

    try:
        found = importlib.util.find_spec(a["name"]) is not None
    except (ImportError, ValueError):
        found = False
    answer({"found": found})


def op_paths(a):
    out = {}
    for path in a.get("paths", []):
        exists = os.path.exists(path)
        info = {"exists": exists, "readable": exists and os.access(path, os.R_OK | (os.X_OK if os.path.isdir(path) else 0)),
                "dir": os.path.isdir(path)}
        expanded = os.path.expanduser(path)
        if expanded != path:
            info["expanded"] = expanded
            info["expanded_exists"] = os.path.exists(expanded)
        if not exists:
            parent = os.path.dirname(os.path.abspath(expanded).rstrip("/")) or "/"
            while parent != "/" and not os.path.isdir(parent):
                parent = os.path.dirname(parent)
            info["parent"] = parent
            # the first missing name under it, and its entries named like it (a typo's neighbours)
            rest = os.path.relpath(os.path.abspath(expanded), parent).split(os.sep)
            info["missing"], info["direct"] = rest[0], len(rest) == 1
            try:
                names = sorted(os.listdir(parent))
                info["entries"], info["more"] = names[:12], max(len(names) - 12, 0)
                info["close"] = difflib.get_close_matches(rest[0], names, n=5, cutoff=0.6)
            except OSError:
                info["entries"] = None
        out[path] = info
    answer({"paths": out})


def op_stop(a):
    d, name = _sdir(a), a["name"]
    path = _record_path(d, name)
    rec = _read_record(path)
    if rec is None:
        answer({"stopped": False, "was_running": False, "signal": None})
        return
    pgid = int(rec.get("pgid", rec["pid"]))
    was = _alive(rec["pid"]) or _group_alive(pgid)
    sent = None
    if was:
        sent = "SIGTERM"
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + float(a.get("grace_s", 20))
        while time.monotonic() < deadline and (_alive(rec["pid"]) or _group_alive(pgid)):
            time.sleep(0.2)
        if _alive(rec["pid"]) or _group_alive(pgid):
            sent = "SIGKILL"
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and _group_alive(pgid):
                time.sleep(0.2)
    still = _group_alive(pgid)
    if not still:
        try:
            os.unlink(path)
        except OSError:
            pass
    else:
        fail("stop_failed", "server %s (process group %d) survived SIGKILL" % (name, pgid))
    answer({"stopped": True, "was_running": was, "signal": sent})


def op_list(a):
    answer({"servers": _records(_sdir(a))})


def op_log_tail(a):
    answer({"text": _tail(_log_path(_sdir(a), a["name"]), int(a.get("bytes", 4000)))})


OPS = {"start": op_start, "poll": op_poll, "generate": op_generate, "bench": op_bench,
       "server_info": op_server_info, "stop": op_stop, "list": op_list, "log_tail": op_log_tail,
       "run_client": op_run_client, "has_module": op_has_module, "paths": op_paths}


def main(argv):
    if len(argv) < 2 or argv[1] not in OPS:
        fail("usage", "unknown op %r; ops: %s" % (argv[1] if len(argv) > 1 else None, ", ".join(sorted(OPS))))
    args = json.loads(argv[2]) if len(argv) > 2 else {}
    OPS[argv[1]](args)


if __name__ == "__main__":
    main(sys.argv)
