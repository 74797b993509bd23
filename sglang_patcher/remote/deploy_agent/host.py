"""One host's site-packages root and state dir, with path safety: every path an op touches is
a site-packages-relative posix path that stays inside site-packages and outside the state dir."""

from __future__ import annotations

import os

from .base import STATE_NAME, Fail
from .journal import HostJournal
from .lock import HostLock


class HostState(HostLock, HostJournal):
    """The site-packages root and the state dir of one host, with path safety."""

    def __init__(self, args):
        sp = args.get("site_packages")
        if not sp or not os.path.isabs(sp):
            raise Fail("bad_args", "site_packages must be an absolute path, got %r" % (sp,))
        if not os.path.isdir(sp):
            raise Fail("bad_args", "site-packages directory %s does not exist" % sp)
        self.root = os.path.realpath(sp)
        self.state = os.path.realpath(args.get("state_dir") or os.path.join(self.root, STATE_NAME))
        self.lock_path = os.path.join(self.state, "lock")
        self.journal_path = os.path.join(self.state, "journal.json")
        self.records_dir = os.path.join(self.state, "deployments")
        self.backups_dir = os.path.join(self.state, "backups")

    # -- paths
    def target(self, rel):
        if not isinstance(rel, str) or not rel or rel.startswith("/") or "\\" in rel or "\0" in rel:
            raise Fail("bad_path", "not a site-packages-relative posix path: %r" % (rel,))
        parts = rel.split("/")
        if any(p in ("", ".", "..") for p in parts) or parts[0] == STATE_NAME:
            raise Fail("bad_path", "unsafe path %r (no '..', no empty parts, not the state dir)" % rel)
        return os.path.join(self.root, *parts)

    def temp_for(self, rel, did):
        t = self.target(rel)
        return os.path.join(os.path.dirname(t), ".%s.sglpatch-%s" % (os.path.basename(t), did))

    def backup_for(self, did, rel):
        self.target(rel)
        return os.path.join(self.backups_dir, did, *rel.split("/"))

    def record_path(self, did):
        return os.path.join(self.records_dir, did + ".json")
