"""The entry point: ``sys.argv`` is ``[<source>, op, json_args]``; one JSON object out, exit 0, or
``{"ok": false, "kind", "error", ...}`` and exit 3 for an expected failure (:class:`Fail`)."""

from __future__ import annotations

import json
import os
import sys

from .backup import op_backup_tar, op_put_backups
from ..access import user_name
from .base import EXPECTED_FAILURE_EXIT, Fail
from .checks import op_compile
from .inspection import op_history, op_inspect
from .preflight import explain_os_error
from .prune import op_prune
from .rollback import op_rollback
from .transaction import op_finish, op_push, op_resume, op_unlock


OPS = {"inspect": op_inspect, "push": op_push, "resume": op_resume, "finish": op_finish,
       "rollback": op_rollback, "unlock": op_unlock, "history": op_history, "compile": op_compile,
       "backup_tar": op_backup_tar, "prune": op_prune, "put_backups": op_put_backups}


def main(argv):
    if len(argv) < 2 or argv[1] not in OPS:
        out, code = {"ok": False, "kind": "bad_args", "error": "unknown op; one of %s" % ", ".join(OPS)}, 3
    else:
        try:
            args = json.loads(argv[2]) if len(argv) > 2 else {}
            res = OPS[argv[1]](args)
            if res is None:
                return 0
            out, code = dict(res, ok=True), 0
        except Fail as f:
            out = dict(f.extra, ok=False, kind=f.kind, error=f.error)
            code = EXPECTED_FAILURE_EXIT
        except PermissionError as exc:  # an op met a path it may not change: said, not a traceback
            said, kinds = explain_os_error(exc)
            out = {"ok": False, "kind": "not_writable", "path": exc.filename, "kinds": kinds,
                   "user": user_name(os.geteuid()),
                   "error": "%s: %s (as %s)%s" % (argv[1], said, user_name(os.geteuid()),
                                                  "" if kinds else "; is it another user's (root's, written "
                                                  "through `sudo: true`)?")}
            code = EXPECTED_FAILURE_EXIT
    sys.stdout.write(json.dumps(out, sort_keys=True) + "\n")
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
