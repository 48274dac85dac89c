"""The communicator over torch.distributed: picked automatically inside an initialised process
group (as under torchrun), with the same collectives and error agreement as under MPI."""

import json
import os
import subprocess
import sys

from support import without_mpi
from support.inputs.corpus import free_port

RANK_MAIN = r"""
import json, os, sys
import torch.distributed as dist
dist.init_process_group("gloo")
from megacache.runtime.comm import get_comm
from megacache.errors import JobFailed
comm = get_comm()
out = {"name": comm.name, "rank": comm.rank, "size": comm.size,
       "allgather": comm.allgather(comm.rank * 10), "exscan": comm.exscan(comm.rank + 1),
       "on_root": comm.on_root(lambda: "planned on 0", "planning")}
try:
    comm.check("disk full" if comm.rank == 1 else None, "writing")
except JobFailed as exc:
    out["check"] = str(exc)
json.dump(out, open(sys.argv[1] + f".{comm.rank}", "w"))
dist.destroy_process_group()
"""


def test_torch_gloo_backend_is_detected_and_agrees(tmp_path):
    port = free_port()
    procs = []
    for rank in range(2):
        env = without_mpi(dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank),
                               LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                               PYTHONWARNINGS="ignore"))
        procs.append(subprocess.Popen([sys.executable, "-c", RANK_MAIN, str(tmp_path / "out")], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    for p in procs:
        output, _ = p.communicate(timeout=120)
        assert p.returncode == 0, output
    for rank in range(2):
        out = json.load(open(tmp_path / f"out.{rank}"))
        assert (out["name"], out["rank"], out["size"]) == ("torch", rank, 2)
        assert out["allgather"] == [0, 10]
        assert out["exscan"] == (0 if rank == 0 else 1)
        assert out["on_root"] == "planned on 0"
        assert "during writing" in out["check"] and "rank 1: disk full" in out["check"]
