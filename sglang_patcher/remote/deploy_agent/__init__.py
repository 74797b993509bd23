"""Host-side deploy agent: lock, journal, backup, stage+verify+rename, resume, rollback, history.

Standard library only; it runs under the host's own Python, sent by
:mod:`sglang_patcher.remote.launcher` (one exec channel per operation) as ONE script: the modules
of this package joined in the order of ``MODULES`` (:func:`sglang_patcher.remote.bundle.join`:
this docstring, their standard-library imports once, then each module's code without its
docstring and relative imports). Each module imports what it uses from the earlier ones, so the
package also imports as it is (tests do). ``sys.argv`` is
``[<source>, op, json_args]``. Every JSON operation prints one JSON object and exits 0; an expected
failure prints ``{"ok": false, "kind": ..., "error": ...}`` (plus details) and exits 3.

Host state lives in ``<site-packages>/.sglpatch/`` (or ``state_dir``)::

    lock                   O_EXCL file, JSON holder {user, pid, host, started, deployment, token}
    journal.json           the deployment in progress; phase staging|committing|pushed|rolling_back
    deployments/<id>.json  record: {id, patchset, revision, sglang_version, files, phase, times, ...}
    backups/<id>/<paths>   the originals the deployment replaced or deleted

Operations (``args`` keys; every op takes ``site_packages`` and optional ``state_dir``):

* ``inspect``  {paths}: live sha256/size/mode/uid/gid/nlink of each path, lock holder, pending
  journal, deployment records, free bytes and writability of site-packages and the state dir;
  ``blocked`` {path: [{reason, kind, line}]}: what would stop this user from replacing each path
  (immutable/append-only file or directory, a directory it cannot write, a read-only filesystem,
  an owner it cannot keep: ``preflight``'s test, which ``push`` makes again before its first
  write), ``state_blocked``: the same of the state dir, or null.
* ``push``     {deployment, files, holder, force, break_lock, reserve_bytes}; stdin: a tar of the
  new contents (member name = site-packages-relative path). ``files[path]`` is ``{"action":
  "write"|"delete", "sha256": new hash, "mode": new mode or null, "allowed": [live hashes accepted,
  null = absent], "expect": the live hash the client's plan saw (null = absent; optional)}``.
  Order: check payload, free disk and write permission (``preflight``: before the first write),
  take the lock, refuse a pending journal, compare each ``expect`` with the live hash (``changed``: the host moved
  on since the plan, e.g. another apply; ``force`` does not override it), check drift, journal
  ``staging``, back up the originals,
  write each new file beside its target as ``.<name>.sglpatch-<id>``, fsync, verify its sha256,
  give it the target's owner and mode, journal ``committing``, rename over the targets, delete,
  fsync directories, purge ``__pycache__/<module>.*.pyc``, journal ``pushed``, write the record.
  The lock stays held until ``finish`` or ``rollback``. A failure after the journal is undone
  whole: every file restored and verified, then this push's ``backups/<id>/`` deleted (and the
  backups dir and state dir when it made them and they are empty), then the journal dropped — no
  backup is left that no record names (one that cannot be deleted keeps the journal, so the next
  run records it).
* ``resume``   {deployment_id, holder, break_lock}: finish an interrupted push whose temp files
  are all staged and verified (phase staging/committing) → phase pushed; else ``not_resumable``.
* ``finish``   {deployment_id, holder, checks}: mark verified, drop the journal, release the lock.
* ``rollback`` {deployment_id, holder, break_lock}: restore the backups (stage+verify+rename, the
  original owner and mode), remove files the deployment added, purge bytecode, verify every file
  equals its recorded pre-deploy hash, write the restored modules' bytecode again (as pip did at
  install; the record's ``bytecode``: recompiled, failed), record it, release the lock. Refuses a
  deployment that is not the latest active one (``not_latest``).
* ``unlock``   {holder, break_lock}: release the lock (ours, or any with break_lock).
* ``prune``    {keep, holder, dry_run, break_lock}: delete the backups of rolled-back deployments
  but the ``keep`` newest (records stay, marked ``backups_pruned`` once their backups are gone);
  active ones are never touched. Backup trees that no record (nor the journal) names — left by a
  failed push of an sglpatch before failed pushes removed their own — go too, whatever ``keep``
  says, when every file in them is held elsewhere on the host (the live file, or a recorded
  deployment's backup, has its sha256); one holding bytes found nowhere else (a deployment whose
  record was lost) is kept and named (``orphans_kept``). Refused whole (``not_writable``, before
  the lock) when this user cannot take the lock, rewrite the records or delete every backup path (backups written through
  ``sudo: true``, pruned without it). With nothing to delete (a host never deployed) it takes no
  lock and changes nothing. Answers {pruned: [{id, bytes, dirs, drifted}], kept, dry_run,
  recorded, orphans: [{id, dir, bytes, files}], orphans_kept: [{id, dir, files, alone}]}:
  ``drifted`` the edited copies a forced rollback kept (``<id>.drifted/``) that go too; ``alone``
  the files of a kept orphan found nowhere else.
* ``history``  {}: all deployment records, oldest first.
* ``compile``  {paths}: ``py_compile`` each file (bytecode into a temp dir, never ``__pycache__``).
* ``backup_tar`` {deployment_id}: writes a tar of ``backups/<id>/`` to stdout (binary).
* ``put_backups`` {deployment_id, files, holder, break_lock}; stdin: a tar of lost originals
  (``files[path]`` = the record's ``before`` sha256 of each): written under ``backups/<id>/``
  (fsync, rename, hashed again), so that a rollback can read them.

Failure kinds: bad_args, bad_path, bad_payload, lock_held, journal_pending, changed, drift, no_space,
not_writable, not_regular, verify_failed, not_found, not_resumable, not_latest, push_failed,
rollback_failed, put_failed, prune_failed. A ``PermissionError`` no op foresaw is reported as
not_writable (the path, the user), never as a traceback.

Test hooks: ``SGLPATCH_AGENT_CRASH=<point>:<n>`` makes the agent die (``os._exit(137)``) at a point
of the push — ``stage:n`` after n staged files, ``partial:n`` half-way through writing the n-th temp
file, ``commit:n`` after n renames, ``pushed:0`` after the journal says pushed but before the record —
and of a rollback — ``restore:n`` after n files put back from their backups — so tests can
reproduce an interrupted upload or rollback for real. ``SGLPATCH_AGENT_FAIL=commit:<n>`` makes the
n-th rename of a push fail as renaming over an immutable file does (``PermissionError``, EPERM): a
push that fails mid-way and is undone.
"""

# the join order: each module imports only from modules before it
MODULES = ("base", "files", "lock", "journal", "host", "backup", "preflight", "inspection", "transaction",
           "rollback", "prune", "checks", "main")
