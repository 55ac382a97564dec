"""The whole NTK written tile by tile (``empirical_ntk(..., out=...)``): the same numbers as the lazy
operator's ``to_dense()`` for the benchmark's networks, every destination and input kind, and a job
that survives Ctrl-C and ``SIGKILL`` and refuses a changed model or input on resume."""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lazykern.ntk import empirical_ntk
from lazykern.ntk import stream
from lazykern.ntk.stream import RECORD_SUFFIX

from .test_ntk import assert_close

DT = torch.float64
ROOT = Path(__file__).resolve().parents[1]


class _Transformer(nn.Module):
    """benchmarks/ntk.py's Transformer."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(1000, 64)
        layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(64, 10)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(ids)).mean(1))


def _net(name: str) -> tuple[nn.Module, callable]:
    """benchmarks/ntk.py's networks and a sampler of their inputs, in float64."""
    torch.manual_seed(0)
    if name == "mlp":
        net = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
        return net.double(), lambda n: torch.randn(n, 784, dtype=DT)
    if name == "cnn":
        net = nn.Sequential(nn.Conv2d(3, 16, 5, padding=2), nn.ReLU(), nn.Conv2d(16, 32, 3, stride=2, padding=1),
                            nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
        return net.double(), lambda n: torch.randn(n, 3, 16, 16, dtype=DT)
    return _Transformer().double().eval(), lambda n: torch.randint(0, 1000, (n, 32))


@pytest.mark.parametrize("symmetric", [True, False], ids=["K(X,X)", "K(X,Z)"])
@pytest.mark.parametrize("mode", ["trace", "full"])
@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer"])
def test_file_equals_the_operators_dense_kernel(name, mode, symmetric, tmp_path):
    net, sample = _net(name)
    x1 = sample(7)  # tiles of 3: blocks of 3, 3 and 1 samples, the last uneven
    x2 = None if symmetric else sample(4)
    path = tmp_path / "ntk.npy"
    got = empirical_ntk(net, x1, x2, mode=mode, out=path, block_size=3, progress=False)
    assert isinstance(got, np.memmap) and Path(got.filename) == path
    expected = empirical_ntk(net, x1, x2, mode=mode).to_dense()
    assert_close(torch.from_numpy(np.load(path)), expected, rtol=1e-12)
    record = json.loads(Path(str(path) + RECORD_SUFFIX).read_text())
    assert len(record["done"]) == 6  # the upper triangle of 3 x 3 blocks, or 3 x 2 blocks


def test_every_destination_and_input_kind(capsys):
    net, sample = _net("cnn")
    x, z = sample(9), sample(5)
    expected = empirical_ntk(net, x, z, mode="full").to_dense()
    tensor_out = torch.empty(90, 50, dtype=DT)
    assert empirical_ntk(net, x, z, mode="full", out=tensor_out, block_size=4) is tensor_out
    assert_close(tensor_out, expected, rtol=1e-12)
    assert "tiles formed" in capsys.readouterr().err  # the summary line
    array_out = np.zeros((90, 50))
    loader = DataLoader(TensorDataset(x, torch.zeros(9)), batch_size=4)  # (input, target) items
    empirical_ntk(net, loader, TensorDataset(z), mode="full", out=array_out, block_size=4, progress=False)
    assert_close(torch.from_numpy(array_out), expected, rtol=1e-12)


def test_bad_destinations_and_inputs_are_refused_in_one_line(tmp_path):
    net, sample = _net("mlp")
    x = sample(5)
    with pytest.raises(ValueError, match=r"out must be a 5 x 5 array of torch.float64"):
        empirical_ntk(net, x, mode="trace", out=torch.empty(5, 4, dtype=DT))
    with pytest.raises(ValueError, match=r"must end in \.npy"):
        empirical_ntk(net, x, mode="trace", out=tmp_path / "k.txt")
    (tmp_path / "other.npy").write_bytes(b"")
    with pytest.raises(ValueError, match="has no progress record"):
        empirical_ntk(net, x, mode="trace", out=tmp_path / "other.npy")
    with pytest.raises(ValueError, match="must read its map-style dataset in order"):
        empirical_ntk(net, DataLoader(TensorDataset(x), shuffle=True), mode="trace", out=np.zeros((5, 5)))
    with pytest.raises(ValueError, match="block_size must be a positive int"):
        empirical_ntk(net, x, mode="trace", out=np.zeros((5, 5)), block_size=0)
    with pytest.raises(ValueError, match="block_size applies with out= only"):
        empirical_ntk(net, x, mode="trace", block_size=3)


JOB = """
import sys, torch
from torch import nn
from lazykern.ntk import empirical_ntk


def make():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 16, 5, padding=2), nn.ReLU(), nn.Conv2d(16, 32, 3, stride=2, padding=1),
                        nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10)).double()
    return net, torch.randn(64, 3, 16, 16, dtype=torch.float64)


def run(net, x, path):
    return empirical_ntk(net, x, mode="trace", out=path, block_size=8, progress=False)


if __name__ == "__main__":
    import signal

    # Ctrl-C as in a terminal: a test run started in the background of a non-interactive shell
    # (`pytest &`, nohup, some CI scripts) passes SIGINT down ignored, and Python then installs no
    # KeyboardInterrupt handler: the job slept through its SIGINT in such runs.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    torch.set_num_threads(1)  # as the test's own runs: BLAS may round otherwise with other thread counts
    if "--wait-after-5" in sys.argv:
        # The interrupted run waits for its signal once 5 tiles are recorded: the job's 36 tiles take
        # a fraction of a second, less than the test process may be descheduled on a busy machine.
        import time
        from lazykern.ntk import stream

        write = stream._Destination.write_record

        def write_then_wait(self, record):
            write(self, record)
            if len(record["done"]) >= 5:
                time.sleep(600)

        stream._Destination.write_record = write_then_wait
    run(*make(), sys.argv[1])
"""


def _job(tmp_path: Path):
    """The job as a module: run here, and as a script in a process of its own that is interrupted."""
    script = tmp_path / "ntk_job.py"
    script.write_text(textwrap.dedent(JOB))
    spec = importlib.util.spec_from_file_location("ntk_job", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return script, module


def _interrupt(script: Path, path: Path, sig: int) -> int:
    """Start the job, send ``sig`` once it has recorded a few tiles; returns the tiles recorded."""
    record = Path(str(path) + RECORD_SUFFIX)
    proc = subprocess.Popen([sys.executable, str(script), str(path), "--wait-after-5"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if len(json.loads(record.read_text())["done"]) >= 5:
                break
        except (OSError, ValueError, KeyError):
            pass
        if proc.poll() is not None:
            raise AssertionError(f"the job ended before it was interrupted:\n{proc.stderr.read()[-2000:]}")
        time.sleep(0.01)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0, "the job finished before the signal reached it"
    if sig == signal.SIGINT:
        assert "KeyboardInterrupt" in err
    done = len(json.loads(record.read_text())["done"])
    assert 5 <= done < 36, done  # 8 blocks of 8: 36 tiles on and above the diagonal
    np.load(path)  # a valid .npy file
    return done


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["SIGINT", "SIGKILL"])
def test_an_interrupted_job_resumes_to_the_same_file(sig, tmp_path):
    script, job = _job(tmp_path)
    net, x = job.make()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _resume_matches(script, job, net, x, tmp_path, sig)
    finally:
        torch.set_num_threads(threads)


def _resume_matches(script, job, net, x, tmp_path, sig):
    path = tmp_path / "ntk.npy"
    _interrupt(script, path, sig)
    # The uninterrupted run takes the backward way the interrupted job timed and recorded (the two
    # ways round differently, and timing may pick either): then every bit must agree.
    way = json.loads(Path(str(path) + RECORD_SUFFIX).read_text())["way"]
    whole = tmp_path / "whole.npy"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(stream, "_faster_way", lambda *args: way)
        job.run(net, x, whole)
    bumped = copy.deepcopy(net)
    with torch.no_grad():
        bumped[0].weight[0, 0, 0, 0] += 1e-3
    with pytest.raises(ValueError, match="the model's parameters or buffers differ"):
        job.run(bumped, x, path)
    changed = x.clone()
    changed[7, 0, 0, 0] += 1e-3
    with pytest.raises(ValueError, match="x1 differ"):
        job.run(net, changed, path)
    job.run(net, x, path)
    assert np.array_equal(np.load(path), np.load(whole))
    assert os.path.getsize(path) == os.path.getsize(whole)


MEMORY_PROBE = """
import json, os, sys, threading, time, torch
from torch import nn
from lazykern.ntk import empirical_ntk

def anon():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("RssAnon:"))

torch.manual_seed(0)
net = nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 10))
x = torch.randn(int(sys.argv[2]), 64)
empirical_ntk(net, x[:600], mode="trace", out=sys.argv[1] + ".warm.npy", block_size=300, progress=False)
base = peak = anon()
done = False
def sample():
    global peak
    while not done:
        peak = max(peak, anon()); time.sleep(0.005)
thread = threading.Thread(target=sample, daemon=True); thread.start()
empirical_ntk(net, x, mode="trace", out=sys.argv[1], block_size=300, progress=False)
done = True; thread.join()
print("PEAK", (peak - base) / 2**20)
"""


@pytest.mark.slow
def test_memory_beyond_the_file_does_not_grow_with_n(tmp_path):
    """At a fixed tile size, what the job holds besides the file's mapped pages (anonymous memory,
    sampled in a fresh process after a warm-up job) stays under one bound at 1,200 and 4,800 samples
    (10 and 136 tiles; a 5.5 and an 88 MiB file): 0-19 MB measured, from run to run, at either size
    (the allocator's state decides more than N). The CNN's 4,096 -> 16,384 series, where a tile's
    features are a gigabyte, is in ``benchmarks/ntk.py --scale``."""
    script = tmp_path / "probe.py"
    script.write_text(MEMORY_PROBE)
    peaks = {}
    for n in (1200, 4800):
        proc = subprocess.run([sys.executable, str(script), str(tmp_path / f"k{n}.npy"), str(n)],
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        peaks[n] = float(proc.stdout.split("PEAK")[-1])
    print(peaks)
    assert max(peaks.values()) < 40, peaks  # the 4,800-sample kernel alone is 88 MiB
