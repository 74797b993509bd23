"""The journal and the deployment records: ``journal.json`` holds the deployment in progress (its
phase says how far it got: staging, committing, pushed, rolling_back); ``deployments/<id>.json``
holds each deployment once pushed (phase pushed, verified or rolled_back)."""

from __future__ import annotations

import os

from .base import Fail, now
from .files import fsync_dir, read_json, write_json


class HostJournal:
    """The journal and records of a :class:`HostState` (which sets ``state``, ``journal_path`` and
    ``records_dir`` and has ``record_path``)."""

    def journal(self):
        return read_json(self.journal_path)

    def set_phase(self, journal, phase):
        journal["phase"] = phase
        journal.setdefault("times", {})[phase] = now()
        write_json(self.journal_path, journal)

    def drop_journal(self):
        try:
            os.unlink(self.journal_path)
        except FileNotFoundError:
            pass
        fsync_dir(self.state)

    def records(self):
        out = []
        try:
            names = sorted(os.listdir(self.records_dir))
        except FileNotFoundError:
            return out
        for n in names:
            if n.endswith(".json") and not n.startswith("."):
                rec = read_json(os.path.join(self.records_dir, n))
                if rec is not None:
                    out.append(rec)
        out.sort(key=lambda r: (r.get("times", {}).get("started", ""), r.get("id", "")))
        return out

    def record(self, did):
        rec = read_json(self.record_path(did))
        if rec is None:
            j = self.journal()
            if j and j.get("id") == did:
                return j
            raise Fail("not_found", "no deployment %s on this host (records in %s)" % (did, self.records_dir))
        return rec


def pending_fail(j):
    """The refusal of an op while another deployment's journal is pending."""
    return Fail("journal_pending", "deployment %s is pending (phase %s); deal with it first"
                % (j.get("id"), j.get("phase")), journal=j)
