"""The subcommands of ``sglpatch``. Each one resolves its inputs, calls the library, prints a result."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from . import (catalog, deploy, service_apply, service_bench, service_check, service_diff, service_hosts, service_port,
               service_refresh, service_rollback, service_snapshot, service_status)
from .cli_app import AppContext, cli, pass_app
from .errors import ConfigError, DriftError
from .inventory import default_inventory_path
from .serve.profile import RepeatedBudget, bench_budgets


@cli.command("hosts")
@click.option("--check", is_flag=True, help="Connect to each host and report interpreter, SGLang "
              "version(s), install path, writability and free disk. Exits non-zero when a host is not "
              "ok: the error's code, or 8 for a host apply could not write.")
@click.option("--tag", default=None, help="Only hosts with this tag.")
@pass_app
def hosts_cmd(app: AppContext, check: bool, tag: str | None) -> None:
    """List the inventory (hosts.yaml; without one, the embedded sandbox alone)."""
    if app.hosts_file is None and not default_inventory_path().exists():
        from .sandbox import sandbox_host  # no inventory at all: the one host that needs none
        sandbox = sandbox_host()
        hosts = [h for h in [sandbox] if not tag or tag in h.tags]
        if not hosts:
            app.err.print(f"no host is tagged {tag!r}: there is no inventory, and the embedded sandbox's "
                          f"tags are {', '.join(sandbox.tags) or 'none'}", markup=False)
    else:  # a file that exists is read, and any problem in it reported
        inv = app.inventory()
        hosts = inv.with_tag(tag) if tag else [inv.get(n) for n in inv.names()]
        if not hosts:  # an empty file (or an unused tag) is allowed, but say what to do
            if tag and inv.names():
                tags = sorted({t for n in inv.names() for t in inv.get(n).tags})
                app.err.print(f"{inv.path}: no host is tagged {tag!r} (tags in use: "
                              f"{', '.join(tags) or 'none'})", markup=False)
            else:
                app.err.print(f"{inv.path}: no hosts — add one under `hosts:` (the repository's hosts.yaml "
                              "shows the format); `--host sandbox` needs no inventory entry", markup=False)
    if not check:
        app.result(service_hosts.InventoryListing(hosts))
        return
    report = service_hosts.check_hosts(hosts)
    app.result(report)
    if not report.ok:
        raise click.exceptions.Exit(report.exit_code)


@cli.command("snapshot")
@click.argument("host", required=False)
@click.option("--host", "host_option", default=None, metavar="HOST",
              help="The host, as every other command names it (the same as the HOST argument).")
@pass_app
def snapshot_cmd(app: AppContext, host: str | None, host_option: str | None) -> None:
    """Mirror HOST's SGLang install locally with a hashed manifest."""
    if host and host_option and host != host_option:
        raise click.UsageError(f"two hosts given: {host} and --host {host_option}; name one")
    name = host or host_option
    if not name:
        raise click.UsageError("name the host: `sglpatch snapshot HOST` (or --host HOST)")
    app.result(service_snapshot.snapshot_host(app.host(name), log=app.say, meter=app.meter))


@cli.command("diff")
@click.argument("patchset")
@click.option("--host", "host_name", default=None, help="Diff against this host's install.")
@click.option("--sglang", "version", default=None, metavar="VERSION",
              help="Diff against the pristine PyPI wheel of this release (no SSH).")
@pass_app
def diff_cmd(app: AppContext, patchset: str, host_name: str | None, version: str | None) -> None:
    """Show the unified diff PATCHSET would make (the CI dry-run). Exit 0 when it applies cleanly;
    with --host, exit 7 when files on the host have drifted (apply would refuse them)."""
    if bool(host_name) == bool(version):
        raise ConfigError("diff needs exactly one of --host HOST or --sglang VERSION",
                          hint="e.g. `sglpatch diff ddtree --sglang 0.5.23`")
    host = app.host(host_name) if host_name else None
    result = service_diff.diff_patchset(patchset, host=host, version=version, log=app.err.print, meter=app.meter)
    if app.as_json:
        app.result(result)
    else:  # the summary on stderr, the diff alone on stdout: `sglpatch diff ... > x.patch` is a patch
        app.err.print(result.summary())
        if app.console.is_terminal:
            app.console.print(deploy.diff_view(result.result.diff_text()), soft_wrap=True)
        else:
            click.echo(result.result.diff_text(), nl=False)
    if result.drifted:  # the diff is shown (from pristine copies), but apply would refuse: say so in the code
        raise click.exceptions.Exit(DriftError.exit_code)


@cli.command("apply")
@click.argument("patchset")
@click.option("--host", "host_name", required=True, help="Target host (a name from the inventory, or sandbox).")
@click.option("--dry-run", is_flag=True, help="Show the plan and the diff; change nothing.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.option("--force", is_flag=True, help="Overwrite drifted files (their originals are backed up).")
@click.option("--break-lock", is_flag=True, help=("Break the host's deploy lock when its holder is gone but cannot be checked from here "
                    "(another machine's, an unreadable lock). A holder that still runs is never broken: "
                    "wait, or stop that process. A dead process of this machine is taken over without it."))
@click.option("--gate", "gates", multiple=True, metavar="GATE",
              help="After the push: check:N (sglpatch check --level N must pass) or "
                   "bench:min-ratio=R (DDTREE tokens/s >= R x DFLASH at every concurrency). A failed "
                   "gate rolls the deployment back (exit 9). Repeatable.")
@pass_app
def apply_cmd(app: AppContext, patchset: str, host_name: str, dry_run: bool, yes: bool,
              force: bool, break_lock: bool, gates: tuple[str, ...]) -> None:
    """Apply PATCHSET to a host: strict apply, diff, backup, atomic push, smoke checks."""
    from .serve.gate import Gate

    parsed = [Gate.parse(g) for g in gates]
    host = app.host(host_name)

    def confirm(plan) -> bool:
        if yes:
            return True
        if app.as_json or not sys.stdin.isatty():
            raise ConfigError(f"{host.name}: refusing to deploy without confirmation",
                              hint="pass --yes to deploy non-interactively")
        app.say(plan)
        return click.confirm(f"Deploy to {host.name}?", default=False)

    result = service_apply.apply_patchset(patchset, host, dry_run=dry_run, force=force,
                                    break_lock=break_lock, confirm=confirm, gates=parsed, log=app.say,
                                    meter=app.meter)
    if result.status == "aborted":  # declined at the prompt: the plan is on screen already
        app.err.print(f"not deployed: nothing was changed on {host.name}", markup=False)
        raise click.exceptions.Exit(1)
    app.result(result)


@cli.command("status")
@click.option("--host", "host_name", required=True, help="Host (a name from the inventory, or sandbox).")
@click.option("--patchset", default=None, help="Also classify files against this patchset.")
@click.option("--expect", type=click.Choice(deploy.OVERALL_STATES), default=None,
              help="Exit 1 (the report printed as usual) unless the host's overall state is this one: "
                   "for scripts and fleets, e.g. --patchset ddtree --expect patched.")
@pass_app
def status_cmd(app: AppContext, host_name: str, patchset: str | None, expect: str | None) -> None:
    """Per touched file: pristine / patched (patchset, revision) / drifted; the deployment history.
    Exit 0 whatever the state, unless --expect names another one."""
    report = service_status.host_status(app.host(host_name), patchset=patchset)
    missed = expect is not None and report.overall != expect
    said = f"{report.host} is {report.overall}, not {expect} (--expect)"
    if app.as_json:
        data = report.to_json()
        if expect is not None:
            data["expected"] = expect
        if missed:  # the shape of an error document too (error, hint, exit_code, type), plus the report
            data.update(ok=False, exit_code=1, error=said, type="ExpectationFailed",
                        hint=report.note or "the files and deployments above say why")
        app.result(data)
    else:
        app.result(report)
        if missed:
            app.err.print(said, markup=False)
    if missed:
        raise click.exceptions.Exit(1)


@cli.command("prune")
@click.option("--host", "host_name", required=True, help="Host (a name from the inventory, or sandbox).")
@click.option("--keep", default=3, show_default=True, type=click.IntRange(min=0),
              help="Keep the backups of this many newest rolled-back deployments.")
@click.option("--dry-run", is_flag=True, help="Only say what would be deleted.")
@click.option("--break-lock", is_flag=True, help=("Break the host's deploy lock when its holder is gone but cannot be checked from here "
                    "(another machine's, an unreadable lock). A holder that still runs is never broken: "
                    "wait, or stop that process. A dead process of this machine is taken over without it."))
@pass_app
def prune_cmd(app: AppContext, host_name: str, keep: int, dry_run: bool, break_lock: bool) -> None:
    """Delete the host's backups of rolled-back deployments (their records stay as history), and
    this machine's backup copies of superseded deployments (their install was replaced: nothing to
    roll back); the backups of active deployments, which rollback needs, are never touched."""
    app.result(service_rollback.prune(app.host(host_name), keep=keep, dry_run=dry_run, break_lock=break_lock))


@cli.command("rollback")
@click.option("--host", "host_name", default=None,
              help="Host to roll back (default: the host of the latest local deployment record).")
@click.option("--to", "deployment", default=None, metavar="DEPLOYMENT",
              help="Undo this deployment id (default: the latest one on the host).")
@click.option("--break-lock", is_flag=True, help=("Break the host's deploy lock when its holder is gone but cannot be checked from here "
                    "(another machine's, an unreadable lock). A holder that still runs is never broken: "
                    "wait, or stop that process. A dead process of this machine is taken over without it."))
@click.option("--force", is_flag=True, help="Roll back files edited on the host since the "
              "deployment too (their edited bytes are kept under the host's backups/<id>.drifted/).")
@pass_app
def rollback_cmd(app: AppContext, host_name: str | None, deployment: str | None,
                 break_lock: bool, force: bool) -> None:
    """Restore the originals of a deployment and verify them by hash."""
    if host_name is None:
        from .errors import StateError

        try:
            host_name = service_rollback.latest_deployment_host()
        except StateError as exc:   # never deployed from here: nothing to roll back is no error (exit 0)
            said = (f"nothing to roll back: no deployment was ever made from this machine ({exc.message}); "
                    f"for a host deployed from elsewhere, name it: `sglpatch rollback --host HOST`")
            app.result({"host": None, "rolled_back": [], "already": [], "files": {}, "note": said}
                       if app.as_json else said)
            return
        app.say(f"rolling back the latest deployment, on host {host_name}")
    app.result(service_rollback.rollback(app.host(host_name), deployment=deployment,
                                break_lock=break_lock, force=force, log=app.say))


@cli.command("demo")
@click.option("--sglang", "version", default="0.5.23", show_default=True,
              help="SGLang release installed in the sandbox target.")
@click.option("--patchset", default="ddtree", show_default=True)
@click.option("--with-deps", is_flag=True,
              help="Also install SGLang's CPU dependency set in the sandbox (~2 GB, once) so the "
                   "L1 smoke check really imports the patched modules and validates DDTREE's "
                   "arguments instead of reporting skipped (the checks of the worker itself, which "
                   "needs SGLang's model stack, stay skipped).")
@pass_app
def demo_cmd(app: AppContext, version: str, patchset: str, with_deps: bool) -> None:
    """Run the whole story on the embedded default target (a local venv): no GPU host needed."""
    from .demo import run_demo

    run_demo(app, version=version, patchset=patchset, with_deps=with_deps)


@cli.group("patchset")
def patchset_group() -> None:
    """Maintainer commands for patchsets."""


@patchset_group.command("tree")
@click.argument("version")
@pass_app
def patchset_tree_cmd(app: AppContext, version: str) -> None:
    """Print the directory of the verified pristine tree of sglang VERSION (its PyPI wheel,
    downloaded and checked against RECORD once, then cached; every file is re-hashed here, and a
    modified cache rebuilt): what `diff --sglang` patches, e.g. for `git apply --check` of a saved diff."""
    from .wheelcache import pristine_tree

    tree = pristine_tree(version, verify=True, log=lambda msg: click.echo(msg, err=True), meter=app.meter).tree
    if app.as_json:
        app.result({"sglang_version": version, "tree": str(tree)})
    else:
        click.echo(str(tree))  # whole, never wrapped: `$(sglpatch patchset tree 0.5.23)`


@patchset_group.command("refresh")
@click.argument("patchset")
@click.option("--sglang", "version", required=True, metavar="VERSION")
@click.option("--tree", type=click.Path(exists=True, file_okay=False, path_type=Path), metavar="DIR",
              help="read the pristine files from this site-packages-like directory instead of the PyPI wheel")
@click.option("--unverified", is_flag=True,
              help="with --tree: take a tree without sglang-*.dist-info/RECORD (e.g. a source checkout) unchecked")
@pass_app
def patchset_refresh_cmd(app: AppContext, patchset: str, version: str, tree: Path | None, unverified: bool) -> None:
    """Recompute the pristine/expected hashes of PATCHSET for VERSION (from its PyPI wheel, or --tree)."""
    app.result(service_refresh.refresh_patchset(patchset, version, tree=tree, unverified=unverified, log=app.say,
                                        meter=app.meter))


@cli.command("check")
@click.option("--host", "host_name", required=True, help="Host (a name from the inventory, or sandbox).")
@click.option("--level", type=click.IntRange(0, 3), default=None,
              help="0-1: the deployed patchset's smoke checks; 2: the patched server starts and "
                   "answers; 3: DFLASH and DDTREE give the target's greedy tokens. Default: the "
                   "highest the host's serve profile allows.")
@click.option("--prompts", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Prompts for levels 2-3: one per line, or a JSON list (default: a built-in set).")
@click.option("--stop-leftovers", is_flag=True,
              help="First stop servers an earlier sglpatch run left running on the host.")
@pass_app
def check_cmd(app: AppContext, host_name: str, level: int | None, prompts: Path | None,
              stop_leftovers: bool) -> None:
    """Check a host: smoke checks of its deployed patchset, then a real server (levels 2-3).
    Exit 9 when a check fails (the server's log tail is in the report)."""
    from .errors import CheckFailedError

    host = app.host(host_name)
    result = service_check.check_host(host, level=level, prompts=prompts, stop_leftovers=stop_leftovers,
                                log=app.say)
    failed = result.report.failed
    # "check --level N": the level asked for; a failure below it (nothing deployed) stops the rest
    said = (f"{host.name}: check --level {result.level}: {len(failed)} check(s) failed: "
            + "; ".join(f"{c.level} {c.name}" for c in failed))
    if len(failed) == 1 and failed[0].detail:   # one failure: its reason in the error's own line
        why = " ".join(failed[0].detail.split())
        said += f" — {why[:400]}" + ("…" if len(why) > 400 else "")
    if app.as_json:
        data = result.to_json()
        if failed:
            data.update(ok=False, exit_code=CheckFailedError.exit_code, error=said,
                        type="CheckFailedError", hint="the failed checks' details say why")
        app.result(data)
        if failed:
            raise click.exceptions.Exit(CheckFailedError.exit_code)
        return
    app.result(result)
    if failed:
        raise CheckFailedError(said, hint="the failed checks' details above say why")


def _ints(text: str | None, option: str = "--concurrency") -> list[int] | None:
    if text is None:
        return None
    parts = [x.strip() for x in text.split(",")]
    if "" in parts:       # "1,,4" or a trailing comma: an empty entry, as --budgets says
        raise click.BadParameter(f"{text!r}: an empty entry; give numbers separated by commas, e.g. 1,4,16",
                                 param_hint=option)
    try:
        vals = [int(x) for x in parts]
    except ValueError:
        raise click.BadParameter(f"{text!r}: give numbers separated by commas, e.g. 1,4,16",
                                 param_hint=option) from None
    if not vals or any(v < 1 for v in vals):
        raise click.BadParameter(f"{text!r}: give numbers >= 1 separated by commas", param_hint=option)
    return vals


def _budgets(text: str | None) -> list[int | str] | None:
    """``--budgets``: whole numbers >= 1 and ``auto``, each once, separated by commas."""
    if text is None:
        return None
    parts = [x.strip() for x in text.split(",")]
    try:
        if not text.strip() or "" in parts:
            raise ValueError("an empty entry")
        return bench_budgets(parts)
    except ValueError as exc:
        # the comma tip only where the commas may be what went wrong (not for "16 is given twice")
        tip = "" if isinstance(exc, RepeatedBudget) else "; separate them by commas, e.g. 16,64,auto,schedule"
        raise click.BadParameter(f"{text!r}: {exc}{tip}", param_hint="--budgets") from None


@cli.command("bench")
@click.option("--host", "host_name", required=True, help="Host (a name from the inventory).")
@click.option("--concurrency", default=None, metavar="N,N,...",
              help="Concurrent requests to measure at (default: serve.bench.concurrency).")
@click.option("--budgets", default=None, metavar="N,N,...",
              help="DDTREE budgets, one server start each, a number a fixed budget (default: "
                   "serve.bench.budgets, else DDTREE as served: serve.ddtree.budget_schedule, else the "
                   "server's default up to serve.ddtree.budget — auto from ddtree revision 13, the fixed "
                   "budget before); auto: the server's own planner, up to serve.ddtree.budget; schedule: "
                   "the profile's budget_schedule.")
@click.option("--arms", default="none,DFLASH,DDTREE", show_default=True,
              help="Which of none (the target alone), DFLASH, DDTREE to measure.")
@click.option("--requests", type=click.IntRange(min=1), default=None,
              help="Requests per arm and concurrency (default: serve.bench.requests).")
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=None,
              help="Output tokens per request (default: serve.bench.max_new_tokens).")
@click.option("--prompts", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Prompts: one per line, or a JSON list (default: a built-in set).")
@click.option("--rounds", type=click.IntRange(min=1), default=1, show_default=True,
              help="Run the arms this many times in rotated order; figures are medians over rounds.")
@click.option("--compare", is_flag=True, help="Show the change against the last run of the same setup.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write tokens/s against concurrency per arm to this PNG.")
@click.option("--client", type=click.Choice(["auto", "sglang", "sglpatch"]), default="auto", show_default=True,
              help="Whose requests measure: SGLang's own benchmark client on the host (sglang; auto "
                   "takes it where the release has it), or sglpatch's streamed requests.")
@click.option("--sweep", is_flag=True,
              help="DDTREE at every --budgets (DFLASH beside it); the fastest budget per concurrency "
                   "becomes the host's serve.ddtree.budget_schedule in the inventory.")
@pass_app
def bench_cmd(app: AppContext, host_name: str, concurrency: str | None, budgets: str | None, arms: str,
              requests: int | None, max_new_tokens: int | None, prompts: Path | None, rounds: int,
              compare: bool, plot_path: Path | None, client: str, sweep: bool) -> None:
    """Output tokens/s, time per output token and accept length of the target alone, DFLASH and
    DDTREE on a host, side by side; stored in the local history. Exit 9 when a server fails."""
    arm_list = [a.strip() for a in arms.split(",") if a.strip()]
    if not arm_list:
        raise click.BadParameter(f"{arms!r}: name at least one of none, DFLASH, DDTREE", param_hint="--arms")
    if sweep:
        if click.get_current_context().get_parameter_source("arms") is not click.core.ParameterSource.DEFAULT:
            raise click.BadParameter("--sweep measures DFLASH and DDTREE (at every --budgets): leave --arms out",
                                     param_hint="--arms")
        arm_list = ["DFLASH", "DDTREE"]
    host = app.host(host_name)
    if budgets is not None and "DDTREE" not in arm_list:
        raise click.BadParameter(f"--budgets {budgets} measures DDTREE, which --arms {arms} leaves out",
                                 param_hint="--budgets")
    run = service_bench.bench_host(host, arms=arm_list, concurrency=_ints(concurrency), budgets=_budgets(budgets),
                             requests=requests, max_new_tokens=max_new_tokens, prompts=prompts,
                             rounds=rounds, compare=compare, plot_path=plot_path, sweep=sweep,
                             inventory_path=app.inventory_path(), client=client, log=app.say)
    app.result(run)


@patchset_group.command("port")
@click.argument("patchset")
@click.option("--from", "from_version", required=True, metavar="VERSION", help="The release the patchset targets.")
@click.option("--to", "to_version", required=True, metavar="VERSION", help="The release to carry it to.")
@click.option("--check", is_flag=True,
              help="Write nothing (with --out: only the conflicted files and the report); for CI.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None, metavar="DIR",
              help="Port into a copy of the patchset at DIR/NAME (the patchset is not touched); "
                   "conflicted files under DIR/conflicts/, the report in DIR.")
@click.option("--partial", is_flag=True,
              help="Write the target even when hunks conflict or vanished: a PARTIAL target without them "
                   "(its patchset.yaml comment says so); still exit 4 — finish it by hand "
                   "(docs/patchsets.md, \"Finishing a port by hand\").")
@pass_app
def patchset_port_cmd(app: AppContext, patchset: str, from_version: str, to_version: str, check: bool,
                      out: Path | None, partial: bool) -> None:
    """Carry PATCHSET's series from one SGLang release to another: per hunk strict first, then a
    three-way merge; report each hunk (as is, offset, merged, conflict) and each file that vanished
    or moved. Writes the new target (series, new_files, pins) only when everything carried, or with
    --partial (a PARTIAL target, to finish by hand). Exit 4 naming the hunks that did not carry,
    --partial included."""
    from .errors import ApplyError

    result = service_port.port_patchset(patchset, from_version, to_version, check=check, out=out,
                                   partial=partial, log=app.say)
    said = result.failure()
    where = result.written.get("conflicts_dir")
    hint = result.finish_steps() or (
        (f"resolve the conflicted files under {where}" if where else
         "--out DIR writes the conflicted files (three-way merges with markers) for you to resolve")
        + ("; --partial writes the target without what did not carry" if not partial and not check else ""))
    if app.as_json:
        data = result.to_json()
        if said:
            data.update(ok=False, exit_code=ApplyError.exit_code, error=said, type="ApplyError", hint=hint)
        app.result(data)
        if said:
            raise click.exceptions.Exit(ApplyError.exit_code)
        return
    app.result(result)
    if said:
        raise ApplyError(said, hint=hint)


@patchset_group.command("list")
@pass_app
def patchset_list_cmd(app: AppContext) -> None:
    """List the patchsets here: revision, SGLang releases, earlier and withdrawn revisions."""
    app.result(catalog.list_patchsets())


@patchset_group.command("show")
@click.argument("patchset")
@pass_app
def patchset_show_cmd(app: AppContext, patchset: str) -> None:
    """Show PATCHSET (NAME, NAME@REVISION or a patchset directory): its revisions (withdrawn ones
    and why), and per SGLang release the series, the files it modifies, adds and deletes, and its checks."""
    app.result(catalog.show_patchset(patchset))
