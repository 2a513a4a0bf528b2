"""The GPU-release guard alone (providers/runner/gpu_guard.py): no agent, no runtime, no
marketplace. The GPUs and their processes come from the recorded 8 × H100 `nvidia-smi -q`
report (its third GPU ran pid 1002127 when recorded: the baseline) and its replayed
leftovers (DumpProcesses.set), as in test_runner_gpu_release.py."""

from __future__ import annotations

from providers.runner.gpu_guard import RELEASE_SETTLE_S, ReleaseGuard
from providers.runner.gpu_processes import GpuProcess, source_for
from providers.runner.nvml import DumpGpus

from .runner_helpers import H100

FREE = "GPU-566e6f65-c38e-b12f-4824-6944218668b9"  # first H100 of the dump: no process
HELD = "GPU-973565ff-45cf-12ea-4e91-33386720f7bb"  # third: pid 1002127 in the dump
RECORDED = GpuProcess(1002127, "/usr/bin/python", "C", 9212)
LEFT = GpuProcess(4242, "/opt/conda/bin/python", "C", 1024)


def _guard(source, workloads=()):
    lines: list[str] = []
    guard = ReleaseGuard([FREE, HELD], source, lambda: list(workloads), lines.append,
                         settle_s=0)
    return guard, lines


def test_without_a_source_nothing_is_held_and_there_is_no_baseline():
    guard, lines = _guard(None)
    assert guard.settle_s == 0 and RELEASE_SETTLE_S == 2.0
    guard.take_baseline()
    assert guard.baseline == {} and guard.foreign_findings() == []
    assert guard.check_released(1, [FREE, HELD]) == [] and guard.busy == {} and lines == []


def test_a_leftover_is_fatal_until_it_exits_and_the_baseline_never_counts():
    source = source_for(DumpGpus(H100))
    guard, lines = _guard(source)
    guard.take_baseline()
    assert guard.baseline == {HELD: [RECORDED]}
    [foreign] = guard.foreign_findings()
    assert (foreign.uuid, foreign.rule, foreign.severity) == (HELD, "process_foreign", "warn")
    assert guard.check_released(3, [HELD]) == []  # only the baseline process holds it

    source.set(FREE, [LEFT])
    [left] = guard.check_released(4, [FREE, HELD])
    assert (left.uuid, left.rule, left.severity) == (FREE, "process_left", "fatal")
    assert left.evidence == ("pid 4242 /opt/conda/bin/python (compute, 1024 MiB) still "
                             "holds the GPU after lease 4's workload was removed")
    assert guard.busy == {FREE: left}
    assert lines[-1] == f"GPU {FREE}: {left.evidence}; no lease starts on it until it is free"
    guard.check_released(5, [FREE])  # still held: logged once
    assert sum("no lease starts on it" in line for line in lines) == 1

    guard.recheck_busy()
    assert FREE in guard.busy  # still there
    source.set(FREE, [])
    guard.recheck_busy()
    assert guard.busy == {}
    assert lines[-1] == f"GPU {FREE}: no process holds it any more; back in service"


def test_a_baseline_process_that_exits_is_dropped_and_a_new_one_counts():
    source = source_for(DumpGpus(H100))
    guard, lines = _guard(source)
    guard.take_baseline()
    source.set(HELD, [])
    assert guard.foreign_findings() == [] and guard.baseline == {}
    assert lines[-1] == f"GPU {HELD}: {RECORDED.describe()} (running at startup) has exited"
    source.set(HELD, [RECORDED])  # the same pid and name again: a new process
    assert [f.rule for f in guard.check_released(6, [HELD])] == ["process_left"]


def test_a_replayed_leftover_appears_when_the_workload_is_removed():
    guard, _ = _guard(source_for(DumpGpus(H100, replay_process_left={FREE: [LEFT]})))
    guard.take_baseline()
    assert guard.baseline == {HELD: [RECORDED]}  # the leftover is not there at startup
    assert [(f.uuid, f.rule) for f in guard.check_released(7, [FREE])] == [
        (FREE, "process_left")]


def test_a_process_that_lets_go_within_the_settle_time_is_not_a_leftover():
    class LettingGo:
        """A live source whose GPU is held on the first ask only."""

        live = True

        def __init__(self):
            self.asked = 0

        def __call__(self, uuids):
            self.asked += 1
            held = [LEFT] if self.asked == 2 else []  # 1: the baseline; 2: just after
            return {u: (held if u == FREE else []) for u in uuids}

    source = LettingGo()
    guard, _ = _guard(source)
    guard.settle_s = 30  # asked again every 0.5 s; returns as soon as the GPU is free
    assert guard.check_released(8, [FREE]) == [] and source.asked == 3
