"""mpi_procs.py — the processes an mpirun started on this machine, for tests and bench/tp-rss.py.
Standard library only."""
from __future__ import annotations

from pathlib import Path


def mpi_rank_pids(launcher_pid: int) -> dict[int, int]:
    """{MPI rank: PID} of the processes mpirun (launcher_pid) started on this machine."""
    kids = {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            stat = (p / "stat").read_text()
            env = (p / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) != launcher_pid:
            continue
        for kv in env:
            if kv.startswith(b"OMPI_COMM_WORLD_RANK="):
                kids[int(kv.split(b"=", 1)[1])] = int(p.name)
    return kids
