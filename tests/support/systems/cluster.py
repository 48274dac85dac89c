"""An emulated cluster on one machine, for the cluster tier (tests/cluster).

- ``Volume``: a real GlusterFS volume (Debian's ``glusterfs-server``; ``tests/cluster/start_glusterfs.sh``
  installs it and starts ``glusterd``) served from a brick on a size-limited tmpfs, mounted on the
  host through its FUSE client at ``/mnt/megacache-<name>``.
- ``Node``: a set of Linux namespaces (its own hostname, its own process ids and ``/proc``, its own
  mounts) with its own FUSE client of each volume, mounted at the same path as on the host, and an
  ``/etc/hosts`` that also names every node (each a loopback address of its own).
- ``Cluster.mpiexec``: one ``mpiexec`` that starts ``n`` ranks on each node (an MPMD command line,
  each part entering its node with ``nsenter``). The ranks share one hydra proxy, so MPICH is told
  to use no shared memory between them (``MPIR_CVAR_NOLOCAL``), which processes in different pid
  namespaces could not share.
- ``Cluster.torchrun``: one torchrun agent per node, rendezvousing over loopback TCP.

Faults are real: a node's ranks killed (``Node.kill``), a node hung (its ranks and its filesystem
client stopped: ``Node.hang``), a node's filesystem client killed, a volume filled.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time

from support import without_mpi
from support.inputs.corpus import MEGACACHE, RANKS_REPORTED, free_port, processes

#: where the bricks and the nodes' files live on the host
ROOT = "/run/megacache-cluster"
#: what MPICH needs to run ranks of one proxy in different pid namespaces, over TCP only
MPI_ENV = {"MPIR_CVAR_NOLOCAL": "1", "UCX_TLS": "tcp,self"}
#: how long each FUSE client caches what it looked up, as users mount: GlusterFS's defaults (an
#: entry's attributes and a name's lookup for 1 s each), and both raised, so that every node sees
#: the others' changes late on purpose (stale attributes, names removed elsewhere still resolving)
CACHING_S = {"defaults": 1, "cached": 3}


def fault_timing(caching_s: float) -> dict[str, str]:
    """Short heartbeats and stale times for fault tests, so that a hang ends in seconds. The stale
    time exceeds twice what a client may cache a heartbeat's mtime, plus a margin: the rule
    docs/operations.md gives users."""
    return {"MEGACACHE_HEARTBEAT_S": "0.25", "MEGACACHE_STALE_S": str(3 + 2 * max(caching_s - 1, 0))}


def unavailable() -> str | None:
    """Why the cluster tier cannot run on this machine (skipped), or None. Root without GlusterFS is
    not a reason: the tier then fails, saying how to install it."""
    if os.geteuid() != 0:
        return "the cluster tier needs root (namespaces, FUSE mounts, glusterd); tests/run_all.sh runs it as root"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse on this machine: GlusterFS's client cannot mount"
    return None


def gluster(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    if shutil.which("gluster") is None:
        raise AssertionError("GlusterFS is not installed: run `bash tests/cluster/start_glusterfs.sh` as root "
                             "(tests/run_all.sh does)")
    done = subprocess.run(["gluster", "--mode=script", *args], capture_output=True, text=True, timeout=60)
    if check and done.returncode != 0:
        raise AssertionError(f"gluster {' '.join(args)} failed ({done.returncode}): {done.stdout}{done.stderr}"
                             f"\nIs glusterd running? `bash tests/cluster/start_glusterfs.sh` starts it")
    return done


def _run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, timeout=60)


def _unless_gone(function, path, exc_info) -> None:
    """``shutil.rmtree``'s error handler: an entry gone already is what was wanted."""
    if not isinstance(exc_info[1], FileNotFoundError):
        raise exc_info[1]


def _unmount(path: str) -> None:
    subprocess.run(["umount", "-l", path], capture_output=True)


class Volume:
    """A GlusterFS volume of ``size_mb`` on a tmpfs brick, mounted on the host and (``Node``) on each
    node with its clients caching ``CACHING_S[caching]`` seconds."""

    def __init__(self, name: str, size_mb: int, caching: str = "defaults"):
        self.name, self.caching = name, caching
        seconds = CACHING_S[caching]
        self.options = "" if caching == "defaults" else f",attribute-timeout={seconds},entry-timeout={seconds}"
        self.brick_root = os.path.join(ROOT, f"brick-{name}")
        self.path = f"/mnt/megacache-{name}"
        self.server = socket.gethostname()
        self._remove(quiet=True)  # what a killed test run left
        os.makedirs(self.brick_root, exist_ok=True)
        _run("mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", self.brick_root)
        os.makedirs(os.path.join(self.brick_root, "brick"))
        gluster("volume", "create", name, f"{self.server}:{self.brick_root}/brick", "force")
        gluster("volume", "start", name)
        os.makedirs(self.path, exist_ok=True)
        self.mount(self.path, "host")

    def mount(self, path: str, client: str) -> None:
        """Mount the volume at ``path`` (in the caller's mount namespace); waits until it answers."""
        _run("mount", "-t", "glusterfs", "-o", f"log-file={ROOT}/client-{self.name}-{client}.log{self.options}",
             f"{self.server}:/{self.name}", path)

    def on_brick(self, path: str) -> str:
        """``path`` (under the host's mount) where the brick holds it: what the server has now, which
        a client caching entries may show only seconds later."""
        return os.path.join(self.brick_root, "brick", os.path.relpath(path, self.path))

    def mount_command(self, client: str) -> str:
        return (f"mount -t glusterfs -o log-file={ROOT}/client-{self.name}-{client}.log{self.options} "
                f"{self.server}:/{self.name} {self.path}")

    def clear(self) -> None:
        """Everything on the volume removed (through the host's client; what a node removed
        meanwhile, which this client may still list, is skipped)."""
        for entry in os.scandir(self.path):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, onerror=_unless_gone)
            else:
                try:
                    os.unlink(entry.path)
                except FileNotFoundError:
                    pass

    def _remove(self, quiet: bool = False) -> None:
        _unmount(self.path)
        if shutil.which("gluster"):
            gluster("volume", "stop", self.name, "force", check=False)
            gluster("volume", "delete", self.name, check=False)
        _unmount(self.brick_root)

    def close(self) -> None:
        self._remove()


class Node:
    """An emulated node: its namespaces are held by a ``sleep`` that is their process 1; killing it
    ends every process of the node, its filesystem clients included."""

    def __init__(self, name: str, volumes: list[Volume], names: list[str]):
        self.name = name
        ready = os.path.join(ROOT, f"{name}.ready")
        hosts = os.path.join(ROOT, "hosts")
        with open("/etc/hosts") as f:
            known = f.read()
        with open(hosts, "w") as f:
            # an address of its own each (all loopback), so that each node's name resolves back to
            # it: torchrun tells its agents apart by their fully qualified names
            f.write(known.rstrip("\n") + "\n" + "".join(f"127.0.1.{i + 1} {n}\n" for i, n in enumerate(names)))
        if os.path.exists(ready):
            os.unlink(ready)
        script = "\n".join([
            "set -e",
            f"hostname {name}",
            f"mount --bind {hosts} /etc/hosts",
            *[f"umount -l {v.path} 2>/dev/null || true" for v in volumes],
            *[v.mount_command(name) for v in volumes],
            f"touch {ready}",
            "exec sleep infinity",
        ])
        self._holder = subprocess.Popen(["unshare", "--uts", "--pid", "--mount", "--fork", "--mount-proc",
                                         "--propagation", "private", "bash", "-c", script],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while not os.path.exists(ready):
            if self._holder.poll() is not None:
                raise AssertionError(f"node {name} did not start: {self._holder.stderr.read()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"node {name} did not mount its volumes within 60 s")
            time.sleep(0.05)
        table = processes()
        self.init = next(p for p, (ppid, _) in table.items() if ppid == self._holder.pid)
        self._ns = os.readlink(f"/proc/{self.init}/ns/pid")

    def enter(self, tied: bool = True) -> list[str]:
        """The command prefix that runs a command on this node (in the caller's directory). nsenter
        forks the command into the node's pid namespace and waits for it; a ``tied`` command is
        killed with nsenter (``setpriv --pdeathsig``), as a launcher's kill lands on the task itself."""
        return ["nsenter", "-t", str(self.init), "--uts", "--mount", "--pid", f"--wd={os.getcwd()}",
                *(["setpriv", "--pdeathsig", "KILL"] if tied else [])]

    def pids(self) -> dict[int, str]:
        """This node's processes (host pids) but its process 1, with their command lines."""
        found = {}
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) == self.init:
                continue
            try:
                if os.readlink(f"/proc/{name}/ns/pid") != self._ns:
                    continue
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    found[int(name)] = f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
        return found

    def ranks(self) -> list[int]:
        """The megacache processes running on this node."""
        return [p for p, cmd in self.pids().items() if " -m megacache" in cmd and not cmd.startswith("setpriv")]

    def client(self) -> int:
        """The node's GlusterFS client process."""
        return next(p for p, cmd in self.pids().items() if cmd.startswith("/usr/sbin/glusterfs"))

    def signal(self, sig: int, pids: list[int]) -> None:
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        """The node lost: every rank on it killed at once."""
        self.signal(signal.SIGKILL, self.ranks())

    def hang(self) -> list[int]:
        """The node hung: its ranks and its filesystem client stopped. What ``resume`` continues:
        those, and the ``nsenter`` above each rank, which stops itself when its command stops."""
        ranks = self.ranks()
        self.signal(signal.SIGSTOP, [*ranks, self.client()])
        table = processes()
        return [*ranks, self.client(), *(table[p][0] for p in ranks if p in table)]

    def remount(self, volume: Volume) -> None:
        """A new filesystem client for ``volume`` on this node (after its client died)."""
        subprocess.run([*self.enter(tied=False), "sh", "-c", f"umount -l {volume.path}; {volume.mount_command(self.name)}"],
                       check=True, capture_output=True, timeout=60)

    def close(self) -> None:
        try:
            os.kill(self.init, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._holder.wait(timeout=30)


class Cluster:
    """Nodes sharing a volume (``volume.path`` is the same directory on the host and on every node)."""

    def __init__(self, volume: Volume, nodes: list[Node]):
        self.volume, self.nodes = volume, nodes
        #: the fault tests' heartbeat and stale time for this volume's caching
        self.fast = fault_timing(CACHING_S[volume.caching])
        self.stale_s = float(self.fast["MEGACACHE_STALE_S"])

    def mpiexec(self, ranks_per_node: int, *args: str, nodes: list[Node] | None = None,
                program=MEGACACHE) -> list[str]:
        """One mpiexec starting ``ranks_per_node`` ranks of ``program args`` on each of ``nodes``
        (default: all), ranks numbered node by node."""
        cmd = ["mpiexec"]
        for i, node in enumerate(nodes or self.nodes):
            cmd += ([":"] if i else []) + ["-n", str(ranks_per_node), *node.enter(), *program, *args]
        return cmd

    def env(self, **extra: str) -> dict:
        return dict(os.environ, PYTHONWARNINGS="ignore", **MPI_ENV, **extra)

    def start(self, ranks_per_node: int, *args: str, nodes: list[Node] | None = None, env: dict | None = None,
              program=MEGACACHE) -> subprocess.Popen:
        return subprocess.Popen(self.mpiexec(ranks_per_node, *args, nodes=nodes, program=program),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=self.env(**(env or {})))

    def run(self, ranks_per_node: int, *args: str, nodes: list[Node] | None = None, env: dict | None = None,
            check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
        nodes = nodes or self.nodes
        proc = self.start(ranks_per_node, *args, nodes=nodes, env=env)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            raise AssertionError(f"megacache {' '.join(args)} on the cluster did not end in {timeout} s:\n{out}\n{err}")
        done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        ranks = ranks_per_node * len(nodes)
        if check and done.returncode != 0:
            raise AssertionError(f"megacache {' '.join(args)} on {len(nodes)} nodes x {ranks_per_node} ranks "
                                 f"exited {done.returncode}:\n{out}\n{err}")
        if check and args[0] in RANKS_REPORTED and f" on {ranks} rank(s)" not in out:
            raise AssertionError(f"megacache {args[0]} launched on {ranks} ranks ran on other counts:\n{out}")
        return done

    def torchrun(self, nproc_per_node: int, script: str, *args: str, timeout: float = 120) -> list[str]:
        """``script args`` under one torchrun agent per node (a c10d rendezvous on loopback); each
        agent's output. Fails unless every agent exits 0."""
        port = free_port()
        env = without_mpi(dict(os.environ, PYTHONWARNINGS="ignore", GLOO_SOCKET_IFNAME="lo"))
        agents = [subprocess.Popen([*node.enter(), sys.executable, "-m", "torch.distributed.run",
                                    "--nnodes", str(len(self.nodes)), "--nproc-per-node", str(nproc_per_node),
                                    "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                                    # every node's loopback is the endpoint's: the first node hosts it
                                    "--rdzv-conf", f"is_host={int(i == 0)}",
                                    "--rdzv-id", "megacache-cluster", script, *args],
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
                  for i, node in enumerate(self.nodes)]
        outputs = []
        for node, agent in zip(self.nodes, agents):
            try:
                out, _ = agent.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                for a in agents:
                    a.kill()
                said = "\n".join(f"--- {n.name}:\n{a.communicate()[0][-3000:]}" for n, a in zip(self.nodes, agents))
                raise AssertionError(f"torchrun on {node.name} did not end in {timeout} s:\n{said}")
            assert agent.returncode == 0, f"torchrun on {node.name} exited {agent.returncode}:\n{out}"
            outputs.append(out)
        return outputs

    def close(self) -> None:
        for node in self.nodes:
            node.close()

