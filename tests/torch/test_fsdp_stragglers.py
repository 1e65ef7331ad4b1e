"""runwatch.torch on FSDP2 (``fully_shard``): own time and collective wait per rank under a real
torchrun (3 ranks, gloo, the CPU), gradients untouched, and one-line refusals."""

from __future__ import annotations

import json
import math
import time
from functools import partial

import pytest

torch = pytest.importorskip("torch")

import runwatch  # noqa: E402
from runwatch.detect.fleet.monitor import FleetMonitor, fleet_anomalies  # noqa: E402
from runwatch.torch import COMPUTE_METRIC, WAIT_METRIC, NotInstrumentable, instrument  # noqa: E402
from runwatch.torch.fsdp import FSDPTimer  # noqa: E402
from tests.torch import torchrun_jobs  # noqa: E402
from tests.torch.recording_run import RecordingRun  # noqa: E402
from tests.torch.torchrun_jobs import medians  # noqa: E402

run_job = partial(torchrun_jobs.run_job, fsdp=True)


@pytest.fixture
def one_rank_group(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_a_model_neither_ddp_nor_fsdp_is_refused_in_one_line(one_rank_group):
    with pytest.raises(NotInstrumentable, match=r"or fully_shard\(model\) for FSDP2") as e:
        instrument(torch.nn.Linear(2, 2))
    assert "\n" not in str(e.value)


def test_no_process_group_is_refused_in_one_line():
    with pytest.raises(NotInstrumentable, match=r"no torch\.distributed process group") as e:
        instrument(torch.nn.Linear(2, 2))
    assert "\n" not in str(e.value)


def test_fsdp1_is_refused_in_one_line_and_fsdp2_twice_too(one_rank_group, tmp_path):
    from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard

    with runwatch.init(name="x", store=str(tmp_path / "s.db"), monitor=False, cpu_wait=False):
        fsdp1 = FullyShardedDataParallel(torch.nn.Linear(2, 2), device_id=torch.device("cpu"))
        with pytest.raises(NotInstrumentable, match=r"FSDP1 .* is not timed") as e:
            instrument(fsdp1)
        assert "\n" not in str(e.value)
        model = fully_shard(torch.nn.Sequential(torch.nn.Linear(2, 2)))
        assert isinstance(instrument(model), FSDPTimer)
        with pytest.raises(NotInstrumentable, match="already timed"):
            instrument(model)


def test_a_step_ends_at_the_first_forward_after_reduced_gradients():
    ticks = iter(float(t) for t in range(100))
    run = RecordingRun()
    timer = FSDPTimer(run, clock=lambda: next(ticks))
    calls = []

    def collective(**kw):
        calls.append(kw)

    for step in range(3):
        run.step = step
        for micro in range(2):  # two micro-batches; only the last one syncs gradients
            timer.start()
            timer.comm(collective, False, tag="all-gather")
            if micro == 1:
                timer.comm(collective, True, tag="reduce-scatter")
        timer.start()  # an evaluation forward: part of the next step, not a step of its own
        timer.comm(collective, False, tag="all-gather")
    timer.flush()
    assert len(calls) == 12 and calls[0] == {"tag": "all-gather"}
    # step 0 is start-up; steps 1 and 2 hold two micro-batches and the evaluation forward
    assert [s for s, _ in run.logged] == [1, 2]
    for _, data in run.logged:
        assert data[WAIT_METRIC] == 4.0  # 4 collectives of one tick each
        assert data[COMPUTE_METRIC] > 0 and math.isfinite(data[COMPUTE_METRIC])
    assert timer.steps == 2


def test_gradients_and_parameters_are_byte_identical_to_unhooked_fsdp(tmp_path):
    run_job(tmp_path / "hooked", "--steps", "30", "--device-ms", "1")
    run_job(tmp_path / "plain", "--steps", "30", "--device-ms", "1", "--no-instrument")
    for r in range(3):
        hooked = json.loads((tmp_path / "hooked" / f"rank{r}.json").read_text())
        plain = json.loads((tmp_path / "plain" / f"rank{r}.json").read_text())
        assert hooked["timed_steps"] == 29  # 30 steps, the first (start-up) not logged
        assert (hooked["grads"], hooked["params"]) == (plain["grads"], plain["params"])


def test_a_rank_slowed_by_half_under_fsdp_is_named(tmp_path):
    pts = run_job(tmp_path, "--slow", "1", "--factor", "0.5", "--steps", "200")
    compute = medians(pts, COMPUTE_METRIC, 120)
    wait = medians(pts, WAIT_METRIC, 120)
    wall = medians(pts, "step_time", 120)
    assert compute.idxmax() == 1 and compute[1] > 1.2 * compute.drop(1).max()
    assert wait.idxmin() == 1
    assert wall.max() / wall.min() < 1.15  # the wall time the README logs is the same
    stragglers = [a for a in fleet_anomalies(pts) if a.detector == "straggler"]
    (named,) = [a for a in stragglers if a.labels["rank"] == 1]
    assert 100 <= named.details["detected_at"] <= 150  # within 50 steps
    assert named.details["slowdown"] > 1.3 and named.details["wait_agrees"]
    assert f"named by its own compute time ({COMPUTE_METRIC})" in named.message
    assert all(a.details["slowdown"] < 1.2 for a in stragglers if a.labels["rank"] != 1)


def test_no_rank_slowed_under_fsdp_names_no_real_straggler(tmp_path):
    pts = run_job(tmp_path, "--steps", "200")
    assert set(pts.loc[pts["metric"] == COMPUTE_METRIC, "rank"].astype(int)) == {0, 1, 2}
    stragglers = [a for a in fleet_anomalies(pts) if a.detector == "straggler"]
    assert all(a.details["slowdown"] < 1.2 for a in stragglers), [a.message for a in stragglers]


def test_a_rank_hanging_before_fsdps_collectives_is_named(tmp_path):
    # Rank 2 stalls before its forward at step 60 and dies; the others enter the step's
    # all-gather and wait. A step is logged when the next one starts, so rank 2's last
    # logged step is one behind theirs: the hang detector's cue.
    pts = run_job(
        tmp_path, "--hang", "2", "--hang-step", "60", "--hang-s", "4", "--steps", "200", ok=False
    )
    last = pts[pts["metric"] == COMPUTE_METRIC].groupby(pts["rank"].astype(int))["step"].max()
    assert last[2] < last.drop(2).min()
    fm = FleetMonitor(hang={"min_timeout_s": 2.0})
    hangs = [a for a in fleet_anomalies(pts, now=time.time(), monitor=fm) if a.detector == "hang"]
    assert {a.labels["rank"] for a in hangs} == {2}
    assert "rank 2" in hangs[0].message and hangs[0].details["last_step"] == last[2]


def test_the_hf_callback_times_a_model_fsdp2_sharded_by_its_first_forward(one_rank_group, tmp_path):
    """The wiring ``RunwatchCallback`` uses, on a real ``fully_shard`` model. (accelerate
    turns FSDP on only for GPU-like devices, so a Trainer cannot shard on this CPU.)"""
    from torch.distributed.fsdp import fully_shard

    from runwatch.integrations.hf import _time_ranks_when_wrapped
    from runwatch.torch import ddp

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    with runwatch.init(
        name="hf-fsdp", store=str(tmp_path / "s.db"), monitor=False, cpu_wait=False
    ) as run:
        _time_ranks_when_wrapped(model, run)  # at on_train_begin: not sharded yet
        fully_shard(model[0])
        fully_shard(model)  # what accelerate does, in place, before the first forward
        before = len(ddp._timers)
        for step in range(6):
            model(torch.randn(3, 4)).sum().backward()
            run.log({"loss": 1.0}, step=step)
        (timer,) = ddp._timers[before:]  # registered at the first forward
        assert isinstance(timer, FSDPTimer) and timer.run is run
    pts = runwatch.open_store(str(tmp_path / "s.db"), readonly=True).read_points("hf-fsdp")
    own = pts[pts["metric"] == COMPUTE_METRIC]
    # hooked at the first forward; the second starts timing; step 1 is start-up
    assert sorted(own["step"]) == [2, 3, 4, 5]
    assert (pts.loc[pts["metric"] == WAIT_METRIC, "value"] >= 0).all()
