"""``hydroagent store verify|salvage``: check an episode store, and save what is intact in a damaged one.

``verify STORE.h5`` reads every row a result depends on and checks it against its seal
(docs/store_schema.md, "Damage"), then lists the intact and the damaged episodes. It exits 0 when
the store is intact, 1 when anything is damaged, 2 when the file is missing or not a store.
``salvage DAMAGED.h5 NEW.h5`` copies the intact episodes into a new store; rerunning the campaign
into NEW.h5 then redoes the damaged ones.
"""

from __future__ import annotations

import argparse
import json

__all__ = ["add_parsers", "cmd_verify", "cmd_salvage"]


def cmd_verify(args: argparse.Namespace) -> int:
    from hydroagent_hpc.store import verify_store

    health = verify_store(args.store)
    if args.json:
        print(json.dumps({"store": str(health.path), "ok": health.ok, "size_bytes": health.size_bytes,
                          "problems": list(health.problems), "intact": list(health.intact),
                          "damaged": health.damaged, "uncommitted_rows": health.uncommitted_rows}, indent=1))
        return 0 if health.ok else 1
    committed = len(health.intact) + sum(1 for k in health.damaged if not k.startswith("record "))
    print(f"{health.path}: {health.size_bytes:,} bytes")
    for problem in health.problems:
        print(f"PROBLEM {problem}")
    for eid in health.intact:
        print(f"intact  {eid}")
    for what, why in health.damaged.items():
        print(f"DAMAGED {what}: {why}")
    if health.uncommitted_rows:
        print(f"({health.uncommitted_rows} uncommitted record(s): writes that never finished; not damage)")
    print(f"intact: {len(health.intact)} of {committed} committed episodes; damaged: {len(health.damaged)}"
          + (f"; {len(health.problems)} file problem(s)" if health.problems else ""))
    if not health.ok and health.intact:
        print(f"fix: hydroagent store salvage {health.path} NEW.h5 copies the {len(health.intact)} intact episodes "
              f"into a new store; rerun the campaign into NEW.h5 to redo the damaged ones")
    return 0 if health.ok else 1


def cmd_salvage(args: argparse.Namespace) -> int:
    from hydroagent_hpc.store import salvage

    health = salvage(args.store, args.out, overwrite=args.overwrite)
    print(f"{args.out}: copied {len(health.intact)} intact episodes of {args.store} "
          f"(left out {len(health.damaged)} damaged)")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """The ``store`` subcommands."""
    s = sub.add_parser("store", help="check an episode store, or save the intact episodes of a damaged one")
    st = s.add_subparsers(dest="store_command", required=True)
    v = st.add_parser("verify", help="list intact and damaged episodes; exit 1 if anything is damaged",
                      description="Check every row of an episode store against its checksum and list the intact "
                                  "and the damaged episodes. Exit status: 0 intact, 1 damaged, 2 not a store.")
    v.add_argument("store", help="the .h5 episode store")
    v.add_argument("--json", action="store_true", help="print the result as JSON")
    v.set_defaults(func=cmd_verify)
    g = st.add_parser("salvage", help="copy the intact episodes of a (damaged) store into a new one",
                      description="Copy every intact committed episode of STORE into a new store OUT "
                                  "(written under a temporary name and renamed into place).")
    g.add_argument("store", help="the .h5 episode store to read")
    g.add_argument("out", help="the new store to write")
    g.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    g.set_defaults(func=cmd_salvage)

