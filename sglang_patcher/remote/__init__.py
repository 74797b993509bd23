"""Scripts that run ON the host, under the host's own Python, and the local side that sends them.

Each host-side script uses the standard library only (the host may have nothing else, and
``import sglang`` is slow or broken on a ``--no-deps`` install): ``probe.py`` is one module, the
deploy agent (``deploy_agent/``) a package of modules that :mod:`.bundle` joins into one script;
both import :mod:`.access` (may this user change a path, and why not), which :mod:`.bundle`
joins into each.
The launcher (:mod:`.launcher`) sends a script's source inside the command line, so one operation =
one exec channel, no SFTP; :mod:`.agent_client` is the deploy agent's client.
"""
