"""L1 smoke check of the ddtree patchset (revision 1, the registration layer) on SGLang 0.5.23.

Run by the target host's own interpreter (standard library + the installed sglang; no sglpatch code),
sent in one exec channel by ``sglang_patcher.checks.run_l1``. It takes no arguments and prints ONE
JSON object on its last stdout line::

    {"checks": [{"name": str, "status": "passed" | "failed" | "skipped", "detail": str}, ...]}

and exits 0 even when a check fails (a crash is reported by the caller as a failed L1).

What it proves, in order (each check depends on the imports of the first):

1. the patched modules import (``spec_info``, ``spec_registry``, ``server_args``,
   ``arg_groups.fields.spec``, ``arg_groups.speculative_hook``);
2. ``SpeculativeAlgorithm.from_string("DDTREE")`` returns the DDTREE member (an unpatched 0.5.23
   raises ``ValueError: Unknown speculative algorithm name``), and it is in the DFlash family;
3. the plugin registry still accepts registrations (0.5.23 refuses every ``register`` when an enum
   ``is_*`` method is missing on ``CustomSpecAlgo``);
4. ``--speculative-ddtree-*`` parse through SGLang's own ``prepare_server_args`` with their defaults
   (budget 256, topk unset = budget, hybrid override off) and explicit values;
5. the DDTREE validation accepts a valid configuration, refuses budget 0, refuses a hybrid
   Mamba/GDN target without ``--speculative-ddtree-allow-hybrid-unsafe`` and accepts it with it;
6. ``create_worker`` refuses DDTREE with the error naming revision 2 (no silent DFlash fallback).

Where validation runs in 0.5.23: ``prepare_server_args`` only parses. ``ServerArgs.resolve_once``
runs ``arg_groups.pipeline.run_resolution_pipeline``, whose ``handle_speculative_decoding`` step
ends with ``SpeculativeAlgorithm.handle_server_args(server_args)``, which dispatches to
``speculative_hook._handle_ddtree``. This script calls ``handle_server_args`` on a record prepared
the way the pipeline prepares it (raw-input snapshot, empty declaration stash, input sealed). The
pipeline's earlier steps need the target checkpoint's config through ``ModelConfig``, which cannot be
built without the model (and, in 0.5.23, without torchvision and the CUDA stack); so the target's
model configuration is supplied through ``ModelConfig``'s fixture slot (``_model_config``, handed
back as is by ``model_config_of``) as an architecture-only stand-in: the DDTREE hybrid test reads
only ``hf_config.architectures`` (and ``layer_types``).

When a third-party module SGLang imports is missing (e.g. a ``--no-deps`` install), every check is
reported ``skipped`` with ``missing module <name>``: never ``passed``.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import sys
import traceback
import types

PATCHED_MODULES = (
    "sglang.srt.speculative.spec_registry",
    "sglang.srt.speculative.spec_info",
    "sglang.srt.arg_groups.fields.spec",
    "sglang.srt.server_args",
    "sglang.srt.arg_groups.speculative_hook",
)

CHECK_NAMES = (
    "import patched modules",
    "from_string DDTREE",
    "plugin registry accepts registrations",
    "ddtree server-arg defaults",
    "ddtree server-arg flags",
    "validation accepts a valid DDTREE config",
    "validation refuses budget 0",
    "validation refuses a hybrid target without the override",
    "validation accepts a hybrid target with the override",
    "create_worker refuses DDTREE (revision 2)",
)

DEFAULT_BUDGET = 256
# A dense target and a hybrid (GDN) one, by architecture name as in the checkpoints' config.json.
DENSE_ARCH = "Qwen3ForCausalLM"
HYBRID_ARCH = "Qwen3NextForCausalLM"


class CheckFailed(Exception):
    """A check's expectation did not hold; the message is the check's detail."""


def _first_party(name: str | None) -> bool:
    return bool(name) and (name == "sglang" or name.startswith("sglang."))


def _import_all() -> tuple[dict, str | None]:
    """Import the patched modules. Returns (modules, missing third-party module name or None).

    Raises ImportError (or anything else) for a failure that is not a missing dependency.
    """
    import importlib

    mods = {}
    for name in PATCHED_MODULES:
        try:
            mods[name] = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if _first_party(exc.name):
                raise
            return mods, exc.name or str(exc)
    return mods, None


class _TargetModelConfig:
    """Stands in for ``sglang.srt.configs.model_config.ModelConfig`` of the target checkpoint: only
    its ``hf_config.architectures`` / ``layer_types`` are read by the DDTREE hybrid test."""

    def __init__(self, architecture: str):
        self.hf_config = types.SimpleNamespace(architectures=[architecture], layer_types=[])


def _server_args(extra: list[str]):
    """A ServerArgs parsed by SGLang's own ``prepare_server_args`` (a DDTREE config on CUDA)."""
    from sglang.srt.server_args import prepare_server_args

    argv = [
        # Never opened: parsing and this validation step read no checkpoint (nothing is written).
        "--model-path", "/nonexistent/sglpatch-l1/target",
        "--speculative-algorithm", "DDTREE",
        "--speculative-draft-model-path", "/nonexistent/sglpatch-l1/draft",
        "--speculative-num-draft-tokens", "16",
        "--device", "cuda",
        "--attention-backend", "triton",
        "--speculative-draft-attention-backend", "triton",
        *extra,
    ]
    return prepare_server_args(argv)


def _validate(extra: list[str], architecture: str):
    """Run the DDTREE validation step the resolution pipeline runs; returns the record."""
    from sglang.srt.arg_groups.arg_utils import record_fields
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    sa = _server_args(extra)
    # As run_resolution_pipeline / resolve_once prepare the record before their handlers run.
    sa._raw_input = {f.name: getattr(sa, f.name) for f in record_fields(type(sa))}
    sa._resolved_overrides = []
    sa._model_config = _TargetModelConfig(architecture)
    sa._input_frozen = True
    try:
        SpeculativeAlgorithm.from_string(sa.speculative_algorithm).handle_server_args(sa)
    finally:
        sa._input_frozen = False
    return sa


def check_from_string(mods):
    SA = mods["sglang.srt.speculative.spec_info"].SpeculativeAlgorithm
    algo = SA.from_string("DDTREE")
    if algo is not SA.DDTREE or SA.from_string("ddtree") is not SA.DDTREE:
        raise CheckFailed(f"from_string('DDTREE') returned {algo!r}")
    facts = {"is_ddtree": algo.is_ddtree(), "is_dflash": algo.is_dflash(),
             "is_dflash_family": algo.is_dflash_family()}
    if facts != {"is_ddtree": True, "is_dflash": False, "is_dflash_family": True}:
        raise CheckFailed(f"unexpected predicates {facts}")
    if SA.DFLASH.is_ddtree():
        raise CheckFailed("DFLASH.is_ddtree() is True")
    return f"SpeculativeAlgorithm.{algo.name}; {facts}"


def check_registry(mods):
    SA = mods["sglang.srt.speculative.spec_info"].SpeculativeAlgorithm
    registry = mods["sglang.srt.speculative.spec_registry"]
    if registry.CustomSpecAlgo("X", lambda sa: None).is_ddtree() is not False:
        raise CheckFailed("CustomSpecAlgo.is_ddtree() is not False")
    name = f"SGLPATCH_L1_PROBE_{os.getpid()}"
    SA.register(name)(lambda server_args: object)
    algo = SA.from_string(name)
    if not isinstance(algo, registry.CustomSpecAlgo) or algo.is_ddtree():
        raise CheckFailed(f"from_string({name!r}) returned {algo!r}")
    return f"registered {name} in this process; CustomSpecAlgo.is_ddtree() is False"


def check_defaults(mods):
    sa = _server_args([])
    got = (sa.speculative_ddtree_budget, sa.speculative_ddtree_topk,
           sa.speculative_ddtree_allow_hybrid_unsafe)
    if got != (DEFAULT_BUDGET, None, False):
        raise CheckFailed(f"(budget, topk, allow_hybrid_unsafe) = {got}, "
                          f"want ({DEFAULT_BUDGET}, None, False)")
    return f"budget={got[0]} topk={got[1]} (= budget) allow_hybrid_unsafe={got[2]}"


def check_flags(mods):
    sa = _server_args(["--speculative-ddtree-budget", "64", "--speculative-ddtree-topk", "8",
                       "--speculative-ddtree-allow-hybrid-unsafe"])
    got = (sa.speculative_ddtree_budget, sa.speculative_ddtree_topk,
           sa.speculative_ddtree_allow_hybrid_unsafe)
    if got != (64, 8, True):
        raise CheckFailed(f"parsed {got}, want (64, 8, True)")
    return "--speculative-ddtree-budget 64 --speculative-ddtree-topk 8 " \
           "--speculative-ddtree-allow-hybrid-unsafe parsed"


def check_valid(mods):
    from sglang.srt.arg_groups.overrides import resolution_result, resolving_view

    sa = _validate([], DENSE_ARCH)
    steps = resolution_result(sa, "speculative_num_steps")
    topk = resolution_result(sa, "speculative_eagle_topk")
    if (steps, topk) != (1, 1):
        raise CheckFailed(f"DFlash resolution did not run: num_steps={steps} eagle_topk={topk}")
    spec = mods["sglang.srt.speculative.spec_info"].SpeculativeAlgorithm.DDTREE
    width = spec.resolve_max_speculative_num_draft_tokens(sa)
    if width != DEFAULT_BUDGET + 1:
        raise CheckFailed(f"max verify width {width}, want budget + 1 = {DEFAULT_BUDGET + 1}")
    return (f"{DENSE_ARCH}: accepted; num_steps=1 eagle_topk=1 "
            f"draft_backend={resolving_view(sa).speculative_draft_attention_backend} "
            f"max verify width={width}")


def _expect_refusal(extra, architecture, *needles):
    try:
        _validate(extra, architecture)
    except ValueError as exc:
        msg = str(exc)
        missing = [n for n in needles if n not in msg]
        if missing:
            raise CheckFailed(f"refused, but the message lacks {missing}: {msg}")
        return f"refused: {msg}"
    raise CheckFailed(f"{architecture} with {extra or 'defaults'} was accepted")


def check_budget_zero(mods):
    return _expect_refusal(["--speculative-ddtree-budget", "0"], DENSE_ARCH,
                           "--speculative-ddtree-budget")


def check_hybrid_refused(mods):
    return _expect_refusal([], HYBRID_ARCH, HYBRID_ARCH, "--speculative-ddtree-allow-hybrid-unsafe")


def check_hybrid_override(mods):
    _validate(["--speculative-ddtree-allow-hybrid-unsafe"], HYBRID_ARCH)
    return f"{HYBRID_ARCH}: accepted with --speculative-ddtree-allow-hybrid-unsafe"


def check_create_worker(mods):
    SA = mods["sglang.srt.speculative.spec_info"].SpeculativeAlgorithm
    sa = _server_args([])
    try:
        worker = SA.DDTREE.create_worker(sa)
    except NotImplementedError as exc:
        if "revision 2" not in str(exc):
            raise CheckFailed(f"the error does not name revision 2: {exc}")
        return f"refused: {exc}"
    raise CheckFailed(f"create_worker returned {worker!r} (a silent fallback)")


CHECKS = (
    ("from_string DDTREE", check_from_string),
    ("plugin registry accepts registrations", check_registry),
    ("ddtree server-arg defaults", check_defaults),
    ("ddtree server-arg flags", check_flags),
    ("validation accepts a valid DDTREE config", check_valid),
    ("validation refuses budget 0", check_budget_zero),
    ("validation refuses a hybrid target without the override", check_hybrid_refused),
    ("validation accepts a hybrid target with the override", check_hybrid_override),
    ("create_worker refuses DDTREE (revision 2)", check_create_worker),
)


def _tail(exc: BaseException) -> str:
    lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
    return "".join(lines).strip().splitlines()[-1][:2000]


def run() -> list[dict]:
    results = []

    def add(name, status, detail):
        results.append({"name": name, "status": status, "detail": detail})

    try:
        mods, missing = _import_all()
    except Exception as exc:  # a first-party import error: the patched tree is broken
        add("import patched modules", "failed", _tail(exc))
        for name, _ in CHECKS:
            add(name, "skipped", "the patched modules do not import")
        return results
    if missing is not None:
        for name in CHECK_NAMES:
            add(name, "skipped", f"missing module {missing}")
        return results
    add("import patched modules", "passed", ", ".join(PATCHED_MODULES))

    for name, fn in CHECKS:
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                detail = fn(mods)
            add(name, "passed", detail)
        except SystemExit as exc:  # argparse exits on an unknown flag (an unpatched tree)
            said = err.getvalue().strip().splitlines()
            add(name, "failed", f"argument parsing exited with {exc.code}: "
                                f"{said[-1] if said else ''}")
        except CheckFailed as exc:
            add(name, "failed", str(exc))
        except ModuleNotFoundError as exc:
            if _first_party(exc.name):
                add(name, "failed", _tail(exc))
            else:
                add(name, "skipped", f"missing module {exc.name}")
        except Exception as exc:
            add(name, "failed", _tail(exc))
    return results


def main() -> int:
    # SGLang logs its resolution decisions; keep stdout for the one JSON line.
    logging.disable(logging.CRITICAL)
    captured = io.StringIO()
    with contextlib.redirect_stdout(captured):
        results = run()
    sys.stderr.write(captured.getvalue())
    sys.stdout.write(json.dumps({"checks": results}) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
