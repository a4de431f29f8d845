"""Tests of the run/ shell scripts that launch and stop the SGLang fleet, with a fake nvidia-smi.

No GPU and no SGLang are needed: launch_sglang.sh runs in --dry-run mode against a fake
`nvidia-smi topo -m`, and stop_sglang.sh is pointed at pid files of `sleep` processes.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

Procs = list["subprocess.Popen[bytes]"]

REPO = Path(__file__).resolve().parents[1]
RUN = REPO / "run"
LAUNCH = RUN / "launch_sglang.sh"
STOP = RUN / "stop_sglang.sh"
TMUX_GENERATE = RUN / "tmux_generate.sh"
SCRIPTS = [LAUNCH, STOP, TMUX_GENERATE]
# The test-infrastructure setup scripts and the prelude they share (sourced, so shellcheck runs with -x).
SETUP_SCRIPTS = [
    RUN / "llama" / "build.sh",
    RUN / "vllm" / "setup.sh",
    RUN / "sglang" / "setup.sh",
    RUN / "lib" / "setup-prelude.sh",
]

# Variables the scripts read from the environment; a developer's shell must not leak into tests.
CONFIG_KEYS = [
    "MODEL_PATH",
    "SERVED_MODEL_NAME",
    "CONTEXT_LENGTH",
    "MEM_FRACTION",
    "MAX_RUNNING_REQUESTS",
    "TP",
    "NUM_SERVERS",
    "BASE_PORT",
    "HOST",
    "EXTRA_ARGS",
    "RUN_DIR",
    "HEALTH_TIMEOUT",
    "HEALTH_INTERVAL",
    "SGLANG_PYTHON",
    "PIN_WITH",
    "GPUS",
    "STOP_TIMEOUT",
    "CUDA_VISIBLE_DEVICES",
    "TMUX",
]

LEGEND = """
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
"""


def topo_table(gpu_nodes: list[int], node_cpus: dict[int, str], numa: bool = True) -> str:
    """The `nvidia-smi topo -m` table of GPUs on the given NUMA nodes, one NIC per node.

    numa=False prints N/A as NUMA Affinity, as nvidia-smi does on some single-socket machines.
    """
    nics = sorted(set(gpu_nodes))
    gpus = [f"GPU{i}" for i in range(len(gpu_nodes))]
    header = ["", *gpus, *(f"NIC{j}" for j in range(len(nics)))]
    lines = ["\t".join([*header, "CPU Affinity", "NUMA Affinity", "GPU NUMA ID"])]
    for i, node in enumerate(gpu_nodes):
        gpu_cells = [" X " if j == i else "NV18" for j in range(len(gpu_nodes))]
        nic_cells = ["PIX" if nic_node == node else "SYS" for nic_node in nics]
        numa_affinity = str(node) if numa else "N/A"
        cells = [f"GPU{i}", *gpu_cells, *nic_cells, node_cpus[node], numa_affinity, "", "N/A"]
        lines.append("\t".join(cells))
    for j, nic_node in enumerate(nics):
        gpu_cells = ["NODE" if node == nic_node else "SYS" for node in gpu_nodes]
        nic_cells = [" X " if k == j else "SYS" for k in range(len(nics))]
        lines.append("\t".join([f"NIC{j}", *gpu_cells, *nic_cells, "", "", "", ""]))
    nic_legend = "\nNIC Legend:\n\n" + "".join(f"  NIC{j}: mlx5_{j}\n" for j in range(len(nics)))
    return "\n".join(lines) + "\n" + LEGEND + nic_legend


# The standard node: GPU0-3 on NUMA node 0 (CPUs 0-27), GPU4-7 on node 1 (CPUs 28-55).
EIGHT_GPUS_TWO_NODES = topo_table([0, 0, 0, 0, 1, 1, 1, 1], {0: "0-27", 1: "28-55"})
# GPUs alternating between the sockets (some 8-GPU boards): GPU0,2,4,6 on node 0, GPU1,3,5,7 on node 1.
INTERLEAVED = topo_table([0, 1, 0, 1, 0, 1, 0, 1], {0: "0-27", 1: "28-55"})
ONE_GPU = topo_table([0], {0: "0-15"})


def write_exe(path: Path, text: str) -> Path:
    """Write an executable script."""
    path.write_text(text)
    path.chmod(0o755)
    return path


def fake_bin(tmp_path: Path, topo: str, numactl: bool = True) -> Path:
    """A bin folder with a fake nvidia-smi printing `topo` (and a fake numactl if asked)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "topo.txt").write_text(topo)
    gpu_count = topo.split("\n", 1)[0].count("\tGPU")
    csv = "".join(f"{i}, NVIDIA H100 80GB HBM3, 81559 MiB\\n" for i in range(gpu_count))
    write_exe(
        bin_dir / "nvidia-smi",
        f"""#!/usr/bin/env bash
here=$(dirname -- "$0")
if [[ "$*" == "topo -m" ]]; then cat "$here/topo.txt"; exit 0; fi
if [[ "$*" == "--query-gpu=index,name,memory.total --format=csv,noheader" ]]; then
  printf '{csv}'; exit 0
fi
echo "fake nvidia-smi: unsupported arguments: $*" >&2
exit 2
""",
    )
    if numactl:  # logs its options, then runs the command in place (same pid, like the real one)
        write_exe(
            bin_dir / "numactl",
            '#!/usr/bin/env bash\nopts=()\nwhile [[ $1 == --* ]]; do opts+=("$1"); shift; done\n'
            'echo "numactl ${opts[*]}"\nexec "$@"\n',
        )
    return bin_dir


def clean_env(bin_dir: Path | None, **extra: str) -> dict[str, str]:
    """The test environment: no fleet settings inherited, `bin_dir` first on PATH."""
    env = {k: v for k, v in os.environ.items() if k not in CONFIG_KEYS}
    if bin_dir is not None:
        env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env


def run(cmd: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run a command, capturing text output (30 s at most)."""
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=30, check=False)


def dry_run(
    tmp_path: Path, *args: str, topo: str = EIGHT_GPUS_TWO_NODES, numactl: bool = True, **env: str
) -> subprocess.CompletedProcess[str]:
    """launch_sglang.sh --dry-run against a fake topology, RUN_DIR inside tmp_path."""
    base = {"MODEL_PATH": "/models/test-model", "RUN_DIR": str(tmp_path / "run")}
    proc_env = clean_env(fake_bin(tmp_path, topo, numactl), **{**base, **env})
    return run(["bash", str(LAUNCH), "--dry-run", *args], proc_env)


def commands_by_port(stdout: str) -> dict[int, str]:
    """The printed launch commands, keyed by their --port."""
    found = {}
    for line in stdout.splitlines():
        if "sglang.launch_server" in line:
            port = re.search(r"--port (\d+)", line)
            assert port, line
            found[int(port.group(1))] = line
    return found


def numactl_prefix(gpus: str, nodes: str) -> str:
    """The expected start of a launch command pinned with numactl."""
    return (
        f"CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES={gpus} "
        f"numactl --cpunodebind={nodes} --membind={nodes} python -m sglang.launch_server "
    )


# --- static checks -----------------------------------------------------------------------------


@pytest.mark.parametrize("script", SCRIPTS + SETUP_SCRIPTS, ids=lambda p: str(p.relative_to(RUN)))
def test_scripts_parse_with_bash_n(script: Path) -> None:
    """Every script is valid bash syntax."""
    proc = run(["bash", "-n", str(script)], clean_env(None))
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("script", SCRIPTS + SETUP_SCRIPTS, ids=lambda p: str(p.relative_to(RUN)))
def test_scripts_pass_shellcheck(script: Path) -> None:
    """Every script passes shellcheck."""
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (apt-get install shellcheck)")
    proc = run(["shellcheck", "-x", str(script)], clean_env(None))
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("tag", ["vllm/setup", "sglang/setup"])
def test_setup_scripts_log_through_the_shared_prelude(tag: str, tmp_path: Path) -> None:
    """A setup script without a tokenizer dies with its own tag, via the prelude, before touching its cache."""
    cache = tmp_path / "cache"
    proc = run(
        ["bash", str(RUN / f"{tag}.sh"), str(tmp_path / "no-tokenizer")], clean_env(None, GEN_PIPELINE_CACHE=str(cache))
    )
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr == f"[{tag}] ERROR: no tokenizer.json in {tmp_path / 'no-tokenizer'}\n"
    assert not cache.exists()


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_help_shows_usage_and_exit_codes(script: Path) -> None:
    """--help prints the usage block, including the exit codes, and exits 0."""
    proc = run(["bash", str(script), "--help"], clean_env(None))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(proc.stdout.lstrip()) and "Usage: run/" in proc.stdout
    assert "Exit codes:" in proc.stdout
    assert "set -euo pipefail" in script.read_text()


def test_unknown_flag_is_a_usage_error(tmp_path: Path) -> None:
    """An unknown flag exits 2 and names the flag."""
    proc = dry_run(tmp_path, "--tensor-parallel", "4")
    assert proc.returncode == 2
    assert "unknown argument: --tensor-parallel" in proc.stderr


# --- launch_sglang.sh --dry-run ----------------------------------------------------------------


def test_tp1_dry_run_pins_each_gpu_to_its_numa_node(tmp_path: Path) -> None:
    """TP 1: 8 servers on ports 30000-30007, GPU i pinned to NUMA node i // 4 with numactl."""
    proc = dry_run(tmp_path)
    assert proc.returncode == 0, proc.stderr
    cmds = commands_by_port(proc.stdout)
    assert sorted(cmds) == list(range(30000, 30008))
    for i in range(8):
        cmd = cmds[30000 + i]
        assert cmd.startswith(numactl_prefix(str(i), str(i // 4))), cmd
        port = 30000 + i
        assert f"--model-path /models/test-model --port {port} --host 127.0.0.1 --tp 1 " in cmd
        assert "--context-length 32768 --mem-fraction-static 0.85 --max-running-requests 256" in cmd
        assert cmd.endswith(f">> {tmp_path}/run/servers/server-{port}.log 2>&1")
    assert re.search(r"^3\s+30003\s+3\s+0\s+0-27\s+numactl$", proc.stdout, re.M), proc.stdout
    assert re.search(r"^4\s+30004\s+4\s+1\s+28-55\s+numactl$", proc.stdout, re.M), proc.stdout
    assert not (tmp_path / "run").exists(), "a dry run must not create the run folder"


def test_tp4_dry_run_gives_one_server_per_numa_node(tmp_path: Path) -> None:
    """TP 4: 2 servers, GPUs 0-3 on node 0 and GPUs 4-7 on node 1."""
    proc = dry_run(tmp_path, "--tp", "4")
    assert proc.returncode == 0, proc.stderr
    cmds = commands_by_port(proc.stdout)
    assert sorted(cmds) == [30000, 30001]
    assert cmds[30000].startswith(numactl_prefix("0,1,2,3", "0")), cmds[30000]
    assert cmds[30001].startswith(numactl_prefix("4,5,6,7", "1")), cmds[30001]
    assert all(" --tp 4 " in cmd for cmd in cmds.values())


def test_taskset_pins_to_the_cpu_affinity_of_the_gpus(tmp_path: Path) -> None:
    """PIN_WITH=taskset pins each server to its GPUs' CPU Affinity list."""
    proc = dry_run(tmp_path, "--tp", "2", PIN_WITH="taskset")
    assert proc.returncode == 0, proc.stderr
    cmds = commands_by_port(proc.stdout)
    assert sorted(cmds) == [30000, 30001, 30002, 30003]
    expected = {
        30000: ("0,1", "0-27"),
        30001: ("2,3", "0-27"),
        30002: ("4,5", "28-55"),
        30003: ("6,7", "28-55"),
    }
    for port, (gpus, cpus) in expected.items():
        pin = f"CUDA_VISIBLE_DEVICES={gpus} taskset -c {cpus} python "
        assert cmds[port].startswith(f"CUDA_DEVICE_ORDER=PCI_BUS_ID {pin}"), cmds[port]


def test_auto_pinning_falls_back_to_taskset_without_numactl(tmp_path: Path) -> None:
    """With no numactl on PATH, the default pinning is taskset."""
    if shutil.which("numactl") or not shutil.which("taskset"):
        pytest.skip("needs a machine with taskset and without numactl")
    proc = dry_run(tmp_path, numactl=False)
    assert proc.returncode == 0, proc.stderr
    cmd = commands_by_port(proc.stdout)[30005]
    assert "CUDA_VISIBLE_DEVICES=5 taskset -c 28-55 python -m sglang.launch_server" in cmd


def test_tp3_group_across_numa_nodes_is_refused(tmp_path: Path) -> None:
    """TP 3 puts GPUs 3,4,5 in one group across nodes 0 and 1: refused with exit 4."""
    proc = dry_run(tmp_path, "--tp", "3")
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "GPUs 3,4,5, which span NUMA nodes 0,1" in proc.stderr
    assert "GPU3 on node 0, GPU4 on node 1, GPU5 on node 1" in proc.stderr
    assert "--force" in proc.stderr
    assert not commands_by_port(proc.stdout)


def test_tp3_group_across_numa_nodes_is_accepted_with_force(tmp_path: Path) -> None:
    """--force starts the crossing TP 3 plan, binding the crossing group to both nodes."""
    proc = dry_run(tmp_path, "--tp", "3", "--force")
    assert proc.returncode == 0, proc.stderr
    cmds = commands_by_port(proc.stdout)
    assert cmds[30000].startswith(numactl_prefix("0,1,2", "0")), cmds[30000]
    assert cmds[30001].startswith(numactl_prefix("3,4,5", "0,1")), cmds[30001]
    assert "GPUs 6,7 stay idle" in proc.stderr


def test_tp8_group_of_whole_numa_nodes_is_allowed(tmp_path: Path) -> None:
    """TP 8 takes all GPUs of both nodes, which no placement avoids: allowed, bound to both."""
    proc = dry_run(tmp_path, "--tp", "8")
    assert proc.returncode == 0, proc.stderr
    cmds = commands_by_port(proc.stdout)
    assert list(cmds) == [30000]
    assert cmds[30000].startswith(numactl_prefix("0,1,2,3,4,5,6,7", "0,1")), cmds[30000]


def test_tp6_group_taking_part_of_a_node_is_refused(tmp_path: Path) -> None:
    """TP 6 takes all of node 0 and half of node 1: refused, and the hint lists TPs that fit."""
    proc = dry_run(tmp_path, "--tp", "6")
    assert proc.returncode == 4
    assert "GPUs 0,1,2,3,4,5, which span NUMA nodes 0,1" in proc.stderr
    assert "use --tp 1/2/4/8" in proc.stderr


def test_interleaved_layout_keeps_tp2_groups_on_one_node(tmp_path: Path) -> None:
    """GPUs alternating between sockets: TP 2 pairs GPUs of one node (0,2 / 4,6 / 1,3 / 5,7), nothing refused."""
    proc = dry_run(tmp_path, "--tp", "2", topo=INTERLEAVED)
    assert proc.returncode == 0, proc.stderr
    cmds = commands_by_port(proc.stdout)
    expected = {30000: ("0,2", "0"), 30001: ("4,6", "0"), 30002: ("1,3", "1"), 30003: ("5,7", "1")}
    for port, (gpus, node) in expected.items():
        assert cmds[port].startswith(numactl_prefix(gpus, node)), cmds[port]
    tp4 = commands_by_port(dry_run(tmp_path, "--tp", "4", topo=INTERLEAVED).stdout)
    assert tp4[30000].startswith(numactl_prefix("0,2,4,6", "0")) and tp4[30001].startswith(
        numactl_prefix("1,3,5,7", "1")
    )


@pytest.mark.parametrize("topo", [EIGHT_GPUS_TWO_NODES, INTERLEAVED], ids=["blocks", "interleaved"])
def test_a_refused_tp_is_never_among_the_suggested_ones(tmp_path: Path, topo: str) -> None:
    """Every TP from 1 to 8: either it starts, or it is refused with a hint that names only TPs that start."""
    started = {tp for tp in range(1, 9) if dry_run(tmp_path, "--tp", str(tp), topo=topo).returncode == 0}
    assert started == {1, 2, 4, 8}
    for tp in sorted(set(range(1, 9)) - started):
        proc = dry_run(tmp_path, "--tp", str(tp), topo=topo)
        assert proc.returncode == 4, proc.stderr
        hint = re.search(r"use --tp ([\d/]+)", proc.stderr)
        assert hint and {int(t) for t in hint.group(1).split("/")} == started, proc.stderr


def test_gpus_selects_a_subset(tmp_path: Path) -> None:
    """GPUS=0-3 (or --gpus) uses only those GPUs: TP 2 makes two servers, the other GPUs are left alone."""
    proc = dry_run(tmp_path, "--tp", "2", GPUS="0-3")
    assert proc.returncode == 0, proc.stderr
    cmds = commands_by_port(proc.stdout)
    assert sorted(cmds) == [30000, 30001] and "stay idle" not in proc.stderr
    assert cmds[30000].startswith(numactl_prefix("0,1", "0")) and cmds[30001].startswith(numactl_prefix("2,3", "0"))
    assert "on 4 GPU(s) of GPUS=0-3" in proc.stdout
    upper = commands_by_port(dry_run(tmp_path, "--gpus", "4-5,7").stdout)
    assert [cmd.split()[1] for cmd in upper.values()] == [f"CUDA_VISIBLE_DEVICES={g}" for g in (4, 5, 7)]
    assert upper[30002].startswith(numactl_prefix("7", "1"))


@pytest.mark.parametrize(
    ("gpus", "code", "message"),
    [
        ("0-3,x", 2, "GPUS must be all or a list of GPU indices"),
        ("3-1", 2, "GPUS must be all or a list of GPU indices"),
        ("0,1,1", 2, "GPUS lists a GPU twice"),
        ("6-9", 3, "GPUS=6-9 names GPU8, but nvidia-smi lists GPU0-GPU7"),
    ],
)
def test_bad_gpus_are_refused(tmp_path: Path, gpus: str, code: int, message: str) -> None:
    """A malformed or out-of-range GPUS list exits before any plan is printed."""
    proc = dry_run(tmp_path, GPUS=gpus)
    assert proc.returncode == code and message in proc.stderr, proc.stderr
    assert not commands_by_port(proc.stdout)


def bare_path(tmp_path: Path, topo: str) -> dict[str, str]:
    """An environment whose PATH holds the fake nvidia-smi, a fake taskset and the basic tools, but no numactl."""
    bin_dir = fake_bin(tmp_path, topo, numactl=False)
    for tool in ["bash", "awk", "sort", "cut", "uniq", "dirname", "cat", "env"]:
        found = shutil.which(tool)
        assert found, tool
        (bin_dir / tool).symlink_to(found)
    write_exe(bin_dir / "taskset", '#!/usr/bin/env bash\nshift 2\nexec "$@"\n')
    return {"PATH": str(bin_dir), "HOME": str(tmp_path), "MODEL_PATH": "/m", "RUN_DIR": str(tmp_path / "run")}


def test_pinning_without_numactl_warns_that_memory_is_not_bound(tmp_path: Path) -> None:
    """No numactl installed: taskset pins the CPUs, with a warning that memory stays unbound."""
    proc = run(["bash", str(LAUNCH), "--dry-run"], bare_path(tmp_path, EIGHT_GPUS_TWO_NODES))
    assert proc.returncode == 0, proc.stderr
    assert (
        "CUDA_VISIBLE_DEVICES=5 taskset -c 28-55 python -m sglang.launch_server" in commands_by_port(proc.stdout)[30005]
    )
    assert "numactl is not installed: pinning CPUs with taskset only" in proc.stderr
    with_numactl = dry_run(tmp_path)
    assert "numactl is not installed" not in with_numactl.stderr


def test_unknown_numa_affinity_falls_back_to_taskset(tmp_path: Path) -> None:
    """NUMA Affinity N/A: no numactl binding, taskset on the CPU Affinity, and a warning."""
    topo = topo_table([0, 0], {0: "0-15"}, numa=False)
    proc = dry_run(tmp_path, topo=topo)
    assert proc.returncode == 0, proc.stderr
    cmds = commands_by_port(proc.stdout)
    assert sorted(cmds) == [30000, 30001]
    assert "CUDA_VISIBLE_DEVICES=1 taskset -c 0-15 python -m sglang.launch_server" in cmds[30001]
    assert "cannot check that TP groups stay on one node" in proc.stderr


def test_single_gpu_topology_gives_one_server(tmp_path: Path) -> None:
    """One GPU with TP 1: one server on port 30000, GPU 0 on node 0."""
    proc = dry_run(tmp_path, topo=ONE_GPU)
    assert proc.returncode == 0, proc.stderr
    cmds = commands_by_port(proc.stdout)
    assert list(cmds) == [30000]
    assert cmds[30000].startswith(numactl_prefix("0", "0")), cmds[30000]


def test_more_servers_than_gpus_is_a_topology_error(tmp_path: Path) -> None:
    """Asking for more GPUs than nvidia-smi lists exits 3."""
    proc = dry_run(tmp_path, "--tp", "2", "--num-servers", "5")
    assert proc.returncode == 3
    assert "need 10 GPUs but nvidia-smi lists only 8" in proc.stderr


def test_failing_nvidia_smi_is_reported(tmp_path: Path) -> None:
    """nvidia-smi failing (no driver) exits 3 with its message."""
    bin_dir = fake_bin(tmp_path, EIGHT_GPUS_TWO_NODES)
    write_exe(
        bin_dir / "nvidia-smi",
        "#!/bin/sh\necho 'NVIDIA-SMI has failed because it couldn'\\''t communicate with the NVIDIA driver.'\nexit 9\n",
    )
    proc = run(["bash", str(LAUNCH), "--dry-run"], clean_env(bin_dir, MODEL_PATH="/m"))
    assert proc.returncode == 3
    assert "couldn't communicate with the NVIDIA driver" in proc.stderr


def test_absurd_max_running_requests_is_refused(tmp_path: Path) -> None:
    """MAX_RUNNING_REQUESTS above the limit exits 4 unless --force."""
    proc = dry_run(tmp_path, MAX_RUNNING_REQUESTS="100000")
    assert proc.returncode == 4
    assert "MAX_RUNNING_REQUESTS=100000" in proc.stderr
    forced = dry_run(tmp_path, "--force", MAX_RUNNING_REQUESTS="100000")
    assert forced.returncode == 0, forced.stderr
    assert "--max-running-requests 100000" in commands_by_port(forced.stdout)[30000]


def test_config_file_environment_and_flags_precedence(tmp_path: Path) -> None:
    """Flags beat the environment, which beats --config FILE; empty values drop their flag."""
    config = tmp_path / "fleet.env"
    config.write_text(
        "MODEL_PATH=/models/from-file\nSERVED_MODEL_NAME=gen\nTP=2\nBASE_PORT=31000\n"
        "HOST=0.0.0.0\nCONTEXT_LENGTH=8192\nMEM_FRACTION=0.9\nMAX_RUNNING_REQUESTS=64\n"
        'EXTRA_ARGS="--trust-remote-code --enable-metrics"\nSGLANG_PYTHON=/opt/sglang/bin/python\n'
    )
    proc = dry_run(
        tmp_path,
        "--config",
        str(config),
        "--num-servers",
        "3",
        MODEL_PATH="/models/from-env",
        BASE_PORT="32000",
        CONTEXT_LENGTH="",
    )
    assert proc.returncode == 0, proc.stderr
    cmds = commands_by_port(proc.stdout)
    assert sorted(cmds) == [32000, 32001, 32002]
    assert cmds[32002] == (
        numactl_prefix("4,5", "1").replace(" python ", " /opt/sglang/bin/python ")
        + "--model-path /models/from-env --port 32002 --host 0.0.0.0 --tp 2 --served-model-name gen"
        " --mem-fraction-static 0.9 --max-running-requests 64 --trust-remote-code --enable-metrics"
        f" >> {tmp_path}/run/servers/server-32002.log 2>&1"
    )


def test_bad_values_are_configuration_errors(tmp_path: Path) -> None:
    """Non-numeric TP and out-of-range MEM_FRACTION exit 2 with the variable named."""
    bad_tp = dry_run(tmp_path, "--tp", "four")
    assert bad_tp.returncode == 2
    assert "TP must be an integer" in bad_tp.stderr
    bad_mem = dry_run(tmp_path, MEM_FRACTION="1.2")
    assert bad_mem.returncode == 2
    assert "MEM_FRACTION" in bad_mem.stderr


# --- launch_sglang.sh for real, with a fake sglang ---------------------------------------------

FAKE_SGLANG_SERVER = """
import http.server, sys

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass

http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""


def fake_sglang_python(tmp_path: Path) -> Path:
    """A stand-in for SGLANG_PYTHON: `-m sglang.launch_server --port P` serves GET /health."""
    server = tmp_path / "fake_server.py"
    server.write_text(FAKE_SGLANG_SERVER)
    return write_exe(
        tmp_path / "fake-python",
        f"""#!/usr/bin/env bash
[[ $1 == -c ]] && exit 0  # launch_sglang.sh checking that sglang is importable
port=$(sed -E 's/.*--port ([0-9]+).*/\\1/' <<<"$*")
echo "fake sglang: port $port CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES args: $*"
if [[ $port == "${{FAKE_FAIL_PORT:-}}" ]]; then
  echo "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
  exit 1
fi
exec {sys.executable} {server} "$port"
""",
    )


def free_port_pair() -> int:
    """A port P such that P and P+1 are free on 127.0.0.1."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base: int = probe.getsockname()[1]
        if base >= 65535:
            continue
        with socket.socket() as second:
            try:
                second.bind(("127.0.0.1", base + 1))
            except OSError:
                continue
        return base
    raise RuntimeError("no two consecutive free ports")


def launch_for_real(tmp_path: Path, base_port: int, **env: str) -> subprocess.CompletedProcess[str]:
    """launch_sglang.sh --tp 4 (two servers) with the fake sglang, polling /health every 0.2 s."""
    (tmp_path / "model").mkdir(exist_ok=True)
    settings = {
        "MODEL_PATH": str(tmp_path / "model"),
        "RUN_DIR": str(tmp_path / "run"),
        "SGLANG_PYTHON": str(fake_sglang_python(tmp_path)),
        "HEALTH_TIMEOUT": "20",
        "HEALTH_INTERVAL": "0.2",
        **env,
    }
    proc_env = clean_env(fake_bin(tmp_path, EIGHT_GPUS_TWO_NODES), **settings)
    return run(["bash", str(LAUNCH), "--tp", "4", "--base-port", str(base_port)], proc_env)


def cleanup_servers(run_dir: Path) -> None:
    """Stop whatever a launch test left running."""
    stop(run_dir, "--timeout", "2")
    for pid_file in (run_dir / "servers").glob("*.pid"):
        pid = int(pid_file.read_text())
        if alive(pid):
            os.killpg(pid, signal.SIGKILL)


def test_launch_waits_for_health_then_stop_stops_the_fleet(tmp_path: Path) -> None:
    """Real launch: pinned servers, pid and log files, healthy report; a relaunch is refused."""
    base = free_port_pair()
    run_dir = tmp_path / "run"
    try:
        proc = launch_for_real(tmp_path, base)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "All 2 server(s) healthy" in proc.stdout
        pids = [int((run_dir / f"servers/server-{base + i}.pid").read_text()) for i in (0, 1)]
        assert all(alive(pid) for pid in pids)
        for i, (gpus, node) in enumerate([("0,1,2,3", "0"), ("4,5,6,7", "1")]):
            log = (run_dir / f"servers/server-{base + i}.log").read_text()
            assert f"numactl --cpunodebind={node} --membind={node}" in log
            assert f"fake sglang: port {base + i} CUDA_VISIBLE_DEVICES={gpus} " in log

        again = launch_for_real(tmp_path, base)
        assert again.returncode == 5
        assert "already running" in again.stderr

        stopped = stop(run_dir, "--timeout", "5")
        assert stopped.returncode == 0, stopped.stderr
        deadline = time.monotonic() + 3
        while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(alive(pid) for pid in pids)
        assert not list((run_dir / "servers").glob("*.pid"))
    finally:
        cleanup_servers(run_dir)


def test_launch_reports_a_server_that_died_with_its_log(tmp_path: Path) -> None:
    """A server that exits while loading is reported with its log tail; exit code 6."""
    base = free_port_pair()
    try:
        proc = launch_for_real(tmp_path, base, FAKE_FAIL_PORT=str(base + 1))
        assert proc.returncode == 6, proc.stdout + proc.stderr
        assert re.search(rf"^1\s+{base + 1}\s+4,5,6,7\s+\d+\s+DIED$", proc.stdout, re.M)
        assert re.search(rf"^0\s+{base}\s+0,1,2,3\s+\d+\s+healthy after", proc.stdout, re.M)
        assert "CUDA out of memory" in proc.stdout
        assert "1 of 2 server(s) did not come up" in proc.stderr
    finally:
        cleanup_servers(tmp_path / "run")


# --- stop_sglang.sh ----------------------------------------------------------------------------


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_dead(proc: subprocess.Popen[bytes], timeout: float = 5) -> bool:
    """Reap `proc`; True if it exited within `timeout`."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return False
    return True


def start(cmd: list[str], stdout: int | None = None, start_new_session: bool = False) -> subprocess.Popen[bytes]:
    """Start a background process the test owns."""
    return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=stdout, start_new_session=start_new_session)


@pytest.fixture
def procs() -> Iterator[Procs]:
    """Background processes started by a test, killed at its end whatever happens."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def write_pid_file(run_dir: Path, port: int, pid: int) -> Path:
    """Write servers/server-PORT.pid the way launch_sglang.sh does."""
    servers = run_dir / "servers"
    servers.mkdir(parents=True, exist_ok=True)
    pid_file = servers / f"server-{port}.pid"
    pid_file.write_text(f"{pid}\n")
    return pid_file


def stop(run_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run stop_sglang.sh on `run_dir`."""
    return run(["bash", str(STOP), "--run-dir", str(run_dir), *args], clean_env(None))


def test_stop_kills_exactly_the_recorded_pids(tmp_path: Path, procs: Procs) -> None:
    """Recorded sleeps get SIGTERM and their pid files go; an unrecorded sleep survives."""
    run_dir = tmp_path / "run"
    recorded = [start(["sleep", "300"]) for _ in range(2)]
    bystander = start(["sleep", "300"])
    procs.extend([*recorded, bystander])
    pid_files = [write_pid_file(run_dir, 30000 + i, p.pid) for i, p in enumerate(recorded)]
    finished = start(["true"])
    finished.wait()
    stale = write_pid_file(run_dir, 30002, finished.pid)

    proc = stop(run_dir, "--timeout", "5")
    assert proc.returncode == 0, proc.stderr
    assert all(wait_dead(p) for p in recorded)
    assert [p.returncode for p in recorded] == [-signal.SIGTERM, -signal.SIGTERM]
    assert bystander.poll() is None and alive(bystander.pid)
    assert not any(f.exists() for f in [*pid_files, stale])
    assert "stale pid file" in proc.stderr


def test_stop_escalates_to_sigkill_after_the_timeout(tmp_path: Path, procs: Procs) -> None:
    """A process that ignores SIGTERM is killed with SIGKILL once --timeout passes."""
    stubborn = start(["bash", "-c", "trap '' TERM; echo trapped; exec sleep 300"], stdout=subprocess.PIPE)
    procs.append(stubborn)
    assert stubborn.stdout is not None and stubborn.stdout.readline() == b"trapped\n"  # the trap is in place
    pid_file = write_pid_file(tmp_path / "run", 30000, stubborn.pid)
    proc = stop(tmp_path / "run", "--timeout", "1")
    assert proc.returncode == 0, proc.stderr
    assert wait_dead(stubborn) and stubborn.returncode == -signal.SIGKILL
    assert "SIGKILL" in proc.stderr
    assert not pid_file.exists()


def test_stop_also_kills_the_process_group_of_a_setsid_server(tmp_path: Path, procs: Procs) -> None:
    """A recorded group leader (as launch_sglang.sh starts them) takes its children with it."""
    leader = start(["bash", "-c", "sleep 300 & echo $!; wait"], stdout=subprocess.PIPE, start_new_session=True)
    procs.append(leader)
    assert leader.stdout is not None
    child = int(leader.stdout.readline())
    write_pid_file(tmp_path / "run", 30000, leader.pid)
    try:
        proc = stop(tmp_path / "run", "--timeout", "0")
        assert proc.returncode == 0, proc.stderr
        assert wait_dead(leader)
        deadline = time.monotonic() + 3
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(child), "the server's child process survived"
    finally:
        if alive(child):
            os.kill(child, signal.SIGKILL)


def test_stop_leaves_a_reused_pid_alone(tmp_path: Path, procs: Procs) -> None:
    """A pid file older than the process now holding that pid is stale: nothing is signalled."""
    newcomer = start(["sleep", "300"])
    procs.append(newcomer)
    pid_file = write_pid_file(tmp_path / "run", 30000, newcomer.pid)
    an_hour_ago = time.time() - 3600
    os.utime(pid_file, (an_hour_ago, an_hour_ago))
    proc = stop(tmp_path / "run", "--timeout", "0")
    assert proc.returncode == 0, proc.stderr
    assert newcomer.poll() is None and alive(newcomer.pid)
    assert "not signalling it" in proc.stderr
    assert not pid_file.exists()


def test_stop_with_no_pid_files_is_a_no_op(tmp_path: Path) -> None:
    """Nothing recorded: exit 0 and say so."""
    proc = stop(tmp_path / "run")
    assert proc.returncode == 0
    assert "nothing to stop" in proc.stderr


# --- tmux_generate.sh --------------------------------------------------------------------------


def test_tmux_generate_dry_run_prints_the_tmux_commands(tmp_path: Path) -> None:
    """--dry-run prints new-session, the `make generate` it types, and attach; runs nothing."""
    session = f"gp-test-{uuid.uuid4().hex[:8]}"
    args = ["INPUT=prompts/x.jsonl", "OUT=runs/x", "ARGS=--limit 10 --max-tokens 512"]
    proc = run(["bash", str(TMUX_GENERATE), "--dry-run", "--session", session, *args], clean_env(None))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        f"tmux new-session -d -s {session} -c {REPO}",
        f"tmux send-keys -t ={session}: 'make generate INPUT=prompts/x.jsonl OUT=runs/x "
        "'\\''ARGS=--limit 10 --max-tokens 512'\\''' Enter",
        f"tmux attach-session -t ={session}",
    ]
    assert f"tmux attach -t {session}" in proc.stderr


def test_tmux_generate_help_suggests_only_real_generate_flags() -> None:
    """Every flag in an ARGS="..." example of --help is one `gen-pipeline generate` has."""
    from gen_pipeline.cli import build_parser

    generate = build_parser("generate")._subparsers._group_actions[0].choices["generate"]  # type: ignore[union-attr]
    known = {s for a in generate._actions for s in a.option_strings}
    text = run(["bash", str(TMUX_GENERATE), "--help"], clean_env(None)).stdout
    examples = re.findall(r'ARGS="([^"]*)"', text)
    assert examples
    flags = {word for example in examples for word in example.split() if word.startswith("-")}
    assert flags and flags <= known, flags - known


def test_tmux_generate_without_tmux_is_a_clear_error(tmp_path: Path) -> None:
    """With no tmux on PATH the script exits 1 and says tmux is not installed."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ["bash", "dirname"]:
        found = shutil.which(tool)
        assert found
        (bin_dir / tool).symlink_to(found)
    bash = str(bin_dir / "bash")
    proc = run([bash, str(TMUX_GENERATE), "INPUT=x"], {"PATH": str(bin_dir), "HOME": str(tmp_path)})
    assert proc.returncode == 1
    assert "tmux is not installed" in proc.stderr


@pytest.fixture
def tmux_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """A tmux server of this test's own (its socket under tmp_path) whose shells find a fake `make` that
    records its arguments and folder in tmp_path/make-args; killed afterwards."""
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "make"
    fake.write_text(f'#!/bin/sh\necho "$PWD $*" > {tmp_path}/make-args\n')
    fake.chmod(0o755)
    env = clean_env(bin_dir, TMUX_TMPDIR=str(tmp_path), HOME=str(tmp_path))
    env.pop("TMUX", None)
    try:
        yield env
    finally:
        run(["tmux", "kill-server"], env)


def tmux_session(env: dict[str, str], name: str, busy: bool) -> None:
    """A session whose shell waits at its prompt (its job ended), or still runs a job (`busy`)."""
    run(["tmux", "new-session", "-d", "-s", name, "bash --noprofile --norc"], env).check_returncode()
    if busy:
        run(["tmux", "send-keys", "-t", f"={name}:", "sleep 300", "Enter"], env).check_returncode()
        shell = run(["tmux", "display-message", "-p", "-t", f"={name}:", "#{pane_pid}"], env).stdout.strip()
        deadline = time.monotonic() + 20
        while run(["pgrep", "-P", shell], env).returncode != 0:
            assert time.monotonic() < deadline, "the job did not start in the session"
            time.sleep(0.05)


def test_tmux_generate_resumes_in_a_session_whose_job_has_ended(tmux_env: dict[str, str], tmp_path: Path) -> None:
    """The session is still there but its job has ended (the common resume): the command is typed into
    its shell, in the repository root, instead of refusing because the session exists."""
    tmux_session(tmux_env, "gp", busy=False)
    args = ["--detach", "--session", "gp", "INPUT=prompts/x.jsonl", "OUT=runs/x"]
    proc = run(["bash", str(TMUX_GENERATE), *args], tmux_env)
    assert proc.returncode == 0, proc.stderr
    recorded = tmp_path / "make-args"
    deadline = time.monotonic() + 20
    while not recorded.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert recorded.read_text().strip() == f"{REPO} generate INPUT=prompts/x.jsonl OUT=runs/x"


def test_tmux_generate_starts_nothing_beside_a_job_still_running(tmux_env: dict[str, str], tmp_path: Path) -> None:
    """A job still runs in the session: nothing is typed into it, exit 3 saying so."""
    tmux_session(tmux_env, "gp", busy=True)
    proc = run(["bash", str(TMUX_GENERATE), "--detach", "--session", "gp", "INPUT=x", "OUT=y"], tmux_env)
    assert proc.returncode == 3 and "still running" in proc.stderr, proc.stderr
    assert not (tmp_path / "make-args").exists()


@pytest.mark.parametrize(
    ("sbatch_args", "warned"), [([], True), (["--gres=gpu:8"], False), (["--gpus-per-node=8"], False)]
)
def test_slurm_submit_warns_when_no_gpu_is_asked_for(tmp_path: Path, sbatch_args: list[str], warned: bool) -> None:
    """An SGLang fleet needs the GPUs the job asks for: submit.sh says so when no --gres/--gpus option is
    given (and passes the options on to sbatch either way)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f'#!/bin/sh\necho "$*" > {tmp_path}/sbatch-args\n')
    (bin_dir / "sbatch").chmod(0o755)
    (tmp_path / "in.jsonl").write_text("")
    argv = ["bash", str(RUN / "slurm" / "submit.sh"), str(tmp_path / "in.jsonl"), str(tmp_path / "out"), *sbatch_args]
    proc = run(argv, clean_env(bin_dir))
    assert proc.returncode == 0, proc.stderr
    assert ("no --gres or --gpus" in proc.stderr) is warned, proc.stderr
    assert all(a in (tmp_path / "sbatch-args").read_text() for a in sbatch_args)


# --- Makefile ----------------------------------------------------------------------------------


def _make_generate(
    tmp_path: Path, *variables: str, silent: bool = True
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """`make generate VAR=...` with the repository's Makefile in a scratch folder whose venv is a fake
    gen-pipeline that records its argv; the argv it got."""
    tmp_path.mkdir(exist_ok=True)
    shutil.copy(REPO / "Makefile", tmp_path / "Makefile")
    (tmp_path / "pyproject.toml").write_text("")
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    fake = bin_dir / "gen-pipeline"
    fake.write_text(f'#!{sys.executable}\nimport json, sys\nopen("argv.json", "w").write(json.dumps(sys.argv[1:]))\n')
    fake.chmod(0o755)
    os.utime(tmp_path / "pyproject.toml", (1, 1))  # older than .installed: `install` has nothing to do
    (tmp_path / ".venv" / ".installed").touch()
    make = ["make", "-s"] if silent else ["make"]
    proc = subprocess.run([*make, "generate", *variables], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60, env=clean_env(None))  # fmt: skip
    argv_file = tmp_path / "argv.json"
    import json

    return proc, json.loads(argv_file.read_text()) if argv_file.exists() else []


def test_make_test_fast_leaves_out_exactly_the_registered_end_to_end_markers(tmp_path: Path) -> None:
    """`make test-fast` runs pytest with a marker expression that names only registered markers (a typo
    would select nothing or everything), and excludes each of slow, realserver and slurm."""
    import tomllib

    shutil.copy(REPO / "Makefile", tmp_path / "Makefile")
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / ".venv").mkdir()
    os.utime(tmp_path / "pyproject.toml", (1, 1))
    (tmp_path / ".venv" / ".installed").touch()
    proc = run(["make", "-n", "-C", str(tmp_path), "test-fast"], clean_env(None))
    assert proc.returncode == 0, proc.stderr
    expression = re.search(r'-m "([^"]+)"', proc.stdout)
    assert expression, proc.stdout
    markers = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    registered = {m.split(":")[0] for m in markers}
    named = set(re.findall(r"\bnot (\w+)", expression.group(1)))
    assert named <= registered and {"slow", "realserver", "slurm"} <= named, (named, registered)


def test_make_generate_passes_paths_with_spaces_as_one_argument(tmp_path: Path) -> None:
    """INPUT='my prompts.jsonl' reaches gen-pipeline as one argument, as do the other variables."""
    proc, argv = _make_generate(tmp_path, "INPUT=my prompts.jsonl", "OUT=runs/my run", "TOKENIZER=tok dir",
                                "ARGS=--max-tokens 64 --seed 1")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert argv == ["generate", "--input", "my prompts.jsonl", "--out", "runs/my run", "--tokenizer", "tok dir",
                    "--max-tokens", "64", "--seed", "1"]  # fmt: skip
    proc, argv = _make_generate(tmp_path / "servers", "INPUT=x", "OUT=y", "SERVERS=gpu 1:30000")
    assert argv == ["generate", "--input", "x", "--out", "y", "--servers", "gpu 1:30000"]


def test_make_generate_shows_the_command_it_runs(tmp_path: Path) -> None:
    """`make generate` shows the gen-pipeline command it runs, with the values it was given, not the recipe's
    shell text (a new user's tmux pane showed `set -f; ".venv/bin/gen-pipeline" generate ${CONFIG:+--config ...`)."""
    proc, _ = _make_generate(tmp_path, "INPUT=data/p.parquet", "OUT=runs/r", "ARGS=--max-tokens 64", silent=False)
    assert proc.returncode == 0, proc.stderr
    shown = proc.stdout + proc.stderr
    assert "${" not in shown and "set -f" not in shown, shown
    assert ".venv/bin/gen-pipeline generate --input data/p.parquet --out runs/r --max-tokens 64" in shown, shown


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (["CONFIG=my run.toml"], ["generate", "--config", "my run.toml"]),
        (
            ["CONFIG=r.toml", "OUT=o", "SERVERS=h:1"],
            ["generate", "--config", "r.toml", "--out", "o", "--servers", "h:1"],
        ),
    ],
)
def test_make_generate_takes_a_config_file(tmp_path: Path, given: list[str], expected: list[str]) -> None:
    """CONFIG=FILE passes --config FILE, and then INPUT and OUT may come from the file; a variable given wins
    over the file (it is passed as a flag), and SERVERS unset passes none (the file's, else generate's)."""
    proc, argv = _make_generate(tmp_path, *given)
    assert proc.returncode == 0, proc.stderr
    assert argv == expected


@pytest.mark.parametrize("given", [[], ["INPUT=prompts/my.jsonl"], ["OUT=runs/my-run"], ["INPUT=", "OUT=runs/x"]])
def test_make_generate_without_input_or_out_runs_nothing_and_says_so(tmp_path: Path, given: list[str]) -> None:
    """INPUT and OUT have no default: `make generate` without one exits 2 with one line (it ran the sample
    prompts into runs/default, against a real fleet when one was configured)."""
    proc, argv = _make_generate(tmp_path, *given)
    assert proc.returncode == 2 and argv == []
    assert "make generate needs INPUT=FILE and OUT=DIR" in proc.stderr


@pytest.mark.parametrize(
    "variable",
    ["OUT=x;touch pwned;true", "INPUT=$(shell touch pwned)", "SERVERS=`touch pwned`", "ARGS=--seed 1; touch pwned",
     "TOKENIZER=$$(touch pwned)", "OUT=*"],
)  # fmt: skip
def test_make_generate_runs_nothing_from_a_variable(tmp_path: Path, variable: str) -> None:
    """A value with shell or make syntax is passed as text: nothing in it runs, nothing is globbed."""
    (tmp_path / "sub").mkdir()
    name = variable.partition("=")[0]
    paths = [f"{v}=x" for v in ("INPUT", "OUT") if v != name]  # both are needed
    proc, argv = _make_generate(tmp_path / "sub", variable, *paths)
    assert proc.returncode == 0, proc.stderr
    assert not list(tmp_path.rglob("pwned"))
    name, _, value = variable.partition("=")
    if name != "ARGS":
        assert value in argv
    else:
        assert argv[-4:] == ["--seed", "1;", "touch", "pwned"]  # split at whitespace, never run
