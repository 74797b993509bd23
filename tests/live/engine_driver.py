"""Run greedy/sampled generations through ``sglang.Engine`` and write what came out (live tests).

Runs inside the live CPU SGLang venv (``tests/support/live_env.py``), never in pytest's own
interpreter: ``python engine_driver.py JOB.json OUT.json``.

JOB (JSON)::

    {"engines": [{"name": "dflash-b4",                       # one result entry per engine
                  "kwargs": {"model_path": ..., ...},       # sglang.Engine(**kwargs)
                  "phases": [{"name": "single", "prompts": [...], "batch": false,
                              "sampling": {"temperature": 0, "max_new_tokens": 16}}]}]}

Engines run one after another in this process (one interpreter start for all). A phase runs its
prompts one request at a time (``batch: false``) or as one batched ``generate`` call (``batch:
true``, so the scheduler runs them concurrently). OUT (JSON)::

    {"engines": [{"name", "ok": true, "init_s", "phases": [{"name", "wall_s", "results":
        [{"prompt", "output_ids", "text", "meta"}]}], "server_info": {...}}
                 | {"name", "ok": false, "error": "<exception type>: <message>", "traceback"}]}

``meta`` keeps SGLang's per-request counters (``completion_tokens``, ``spec_verify_ct``,
``spec_accept_length``, ``spec_accept_histogram``). An engine that fails to start or to generate
is reported (``ok: false``) and the next one still runs; the exit code is 0 when every engine
ran, 3 otherwise. Each engine's part of stderr starts with a ``MARK`` line naming it (SGLang's
scheduler processes write their tracebacks there, not into the exception the engine raises).
"""

from __future__ import annotations

import json
import sys
import time
import traceback

MARK = "=== engine_driver: engine "   # starts each engine's part of the log (live_sglang splits it)
META_KEYS = ("completion_tokens", "prompt_tokens", "spec_verify_ct", "spec_accept_length",
             "spec_accept_histogram", "finish_reason")


def _result(prompt: str, out: dict) -> dict:
    meta = out.get("meta_info", {})
    return {"prompt": prompt, "output_ids": out.get("output_ids"), "text": out.get("text"),
            "meta": {k: meta[k] for k in META_KEYS if k in meta}}


def run_engine(spec: dict) -> dict:
    import sglang

    t0 = time.perf_counter()
    engine = sglang.Engine(**spec["kwargs"])
    entry: dict = {"name": spec["name"], "ok": True, "init_s": round(time.perf_counter() - t0, 2),
                   "phases": []}
    try:
        for phase in spec["phases"]:
            prompts, sampling = phase["prompts"], phase["sampling"]
            t = time.perf_counter()
            if phase.get("batch"):
                outs = engine.generate(prompts, sampling)
            else:
                per = sampling if isinstance(sampling, list) else [sampling] * len(prompts)
                outs = [engine.generate(p, sp) for p, sp in zip(prompts, per)]
            entry["phases"].append({"name": phase["name"], "wall_s": round(time.perf_counter() - t, 3),
                                    "results": [_result(p, o) for p, o in zip(prompts, outs)]})
            print(f"engine_driver: {spec['name']} {phase['name']} done in "
                  f"{entry['phases'][-1]['wall_s']} s", file=sys.stderr, flush=True)
        try:
            entry["server_info"] = engine.get_server_info()
        except Exception as exc:  # informative only
            entry["server_info"] = {"error": repr(exc)}
    finally:
        engine.shutdown()
    return entry


def main(argv: list[str]) -> int:
    job_path, out_path = argv[1], argv[2]
    with open(job_path) as f:
        job = json.load(f)
    results = []
    for spec in job["engines"]:
        print(f"{MARK}{spec['name']}", file=sys.stderr, flush=True)
        try:
            results.append(run_engine(spec))
        except BaseException as exc:  # a failed start is a result too (the test reads it)
            if isinstance(exc, KeyboardInterrupt):
                raise
            results.append({"name": spec["name"], "ok": False,
                            "error": f"{type(exc).__name__}: {exc}",
                            "traceback": traceback.format_exc()[-6000:]})
            print(f"engine_driver: {spec['name']} failed: {type(exc).__name__}: {exc}",
                  file=sys.stderr, flush=True)
        with open(out_path, "w") as f:       # after every engine: a timeout keeps what ran
            json.dump({"engines": results}, f, indent=1, default=str)
    return 0 if all(r["ok"] for r in results) else 3


if __name__ == "__main__":
    sys.exit(main(sys.argv))
