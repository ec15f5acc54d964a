"""kiln.profiler (kiln/profiler/__init__.py over kiln/profiler.h): op events with shapes, dtype,
bytes and FLOPs; record_function ranges nested with the ops; memory events; the schedule;
key_averages and its table; the Chrome trace's structure; bad input; and the size of a 10-step
GPT trace.
"""
import bisect
import json
import os

import pytest

import kiln
import kiln.nn.functional as F
from kiln.profiler import (ProfilerAction, ProfilerActivity, profile, record_function, schedule,
                           tensorboard_trace_handler)

from examples_util import load_example


def trace_of(prof, tmp_path, name="trace.json"):
    path = tmp_path / name
    prof.export_chrome_trace(str(path))
    with open(path) as f:
        return json.load(f)


def complete(trace, name=None):
    return [e for e in trace["traceEvents"]
            if e["ph"] == "X" and (name is None or e["name"] == name)]


def check_structure(trace):
    """Every event has the Chrome trace fields, and complete events nest per thread: two events
    of one thread are disjoint or one lies inside the other (times are exact to the ns)."""
    assert isinstance(trace["traceEvents"], list)
    by_tid = {}
    for e in trace["traceEvents"]:
        assert e["ph"] in ("X", "i", "C", "M"), e
        assert "pid" in e and "name" in e
        if e["ph"] == "M":
            continue
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0
        if e["ph"] == "X":
            assert e["dur"] >= 0
            by_tid.setdefault(e["tid"], []).append(
                (round(e["ts"] * 1000), round((e["ts"] + e["dur"]) * 1000), e["name"]))
    for events in by_tid.values():
        events.sort(key=lambda x: (x[0], -x[1]))
        stack = []
        for start, end, name in events:
            while stack and stack[-1][1] <= start:
                stack.pop()
            if stack:
                assert end <= stack[-1][1], f"{name} [{start}, {end}] overlaps {stack[-1]}"
            stack.append((start, end, name))
    return by_tid


def parent_of(trace, child):
    """The innermost complete event of the same thread containing `child`."""
    best = None
    for e in complete(trace):
        if e is child or e["tid"] != child["tid"]:
            continue
        if e["ts"] <= child["ts"] and child["ts"] + child["dur"] <= e["ts"] + e["dur"] + 1e-3:
            if best is None or e["dur"] < best["dur"]:
                best = e
    return best


def test_mm_event(tmp_path):
    a, b = kiln.ones(4, 3), kiln.ones(3, 5)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_flops=True) as prof:
        a.mm(b)
    trace = trace_of(prof, tmp_path)
    check_structure(trace)
    (mm,) = complete(trace, "mm")
    assert mm["cat"] == "cpu_op"
    args = mm["args"]
    assert args["Input Dims"] == [[4, 3], [3, 5]]
    assert args["Input type"] == ["float32", "float32"]
    assert args["Output Dims"] == [[4, 5]]
    assert args["FLOPs"] == 2 * 4 * 3 * 5
    assert args["Bytes"] == (12 + 15 + 20) * 4
    assert args["dtype"] == "float32" and args["Device"] == "cpu"
    assert isinstance(mm["tid"], int) and mm["dur"] >= 0


def test_record_function_nests_ops(tmp_path):
    x, w = kiln.randn(8, 16), kiln.randn(32, 16)
    with profile(record_shapes=True) as prof:
        with record_function("block"):
            F.relu(F.linear(x, w))
    trace = trace_of(prof, tmp_path)
    check_structure(trace)
    (block,) = complete(trace, "block")
    assert block["cat"] == "user_annotation"
    (lin,) = complete(trace, "linear")
    assert parent_of(trace, lin) is block
    (relu,) = complete(trace, "relu")
    assert parent_of(trace, relu) is block
    # linear's inner ops (a composite) lie inside it
    inner = [e for e in complete(trace) if parent_of(trace, e) is lin]
    assert inner, "linear recorded no inner ops"


def test_record_function_decorator():
    @record_function("helper")
    def helper(t):
        return t * 2

    with profile() as prof:
        helper(helper(kiln.ones(3)))
    rows = {r.key: r for r in prof.key_averages()}
    assert rows["helper"].count == 2
    assert rows["mul"].count == 2


def test_memory_events(tmp_path):
    with profile(profile_memory=True) as prof:
        t = kiln.empty(1000, 100)  # 400000 bytes
        del t
    trace = trace_of(prof, tmp_path)
    check_structure(trace)
    mem = [e for e in trace["traceEvents"] if e["ph"] == "i" and e["name"] == "[memory]"]
    sizes = [e["args"]["Bytes"] for e in mem]
    assert any(s >= 400000 for s in sizes) and any(s <= -400000 for s in sizes), sizes
    for e in mem:
        assert e["args"]["Addr"] > 0 and e["args"]["Device Type"] == "cpu"
        assert e["args"]["Total Allocated"] >= 0
    assert any(e["ph"] == "C" for e in trace["traceEvents"])
    rows = {r.key: r for r in prof.key_averages()}
    assert rows["empty"].self_cpu_memory_usage >= 400000
    assert "CPU Mem" in prof.key_averages().table()


def test_no_memory_events_without_profile_memory(tmp_path):
    with profile() as prof:
        kiln.empty(1000)
    trace = trace_of(prof, tmp_path)
    assert not [e for e in trace["traceEvents"] if e["ph"] in ("i", "C")]


def test_schedule_records_only_active_steps(tmp_path):
    s = schedule(wait=1, warmup=1, active=2, repeat=1)
    assert [s(i) for i in range(5)] == [ProfilerAction.NONE, ProfilerAction.WARMUP,
                                        ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE,
                                        ProfilerAction.NONE]
    ready = []
    a = kiln.ones(2, 2)
    with profile(schedule=s, on_trace_ready=lambda p: ready.append(p.step_num)) as prof:
        for step in range(6):
            for _ in range(step + 1):  # step k runs k + 1 mms
                a = a.mm(a)
            prof.step()
    assert ready == [4]  # after step 3 ended
    trace = trace_of(prof, tmp_path)
    check_structure(trace)
    steps = sorted(e["name"] for e in complete(trace) if e["cat"] == "profiler_step")
    assert steps == ["ProfilerStep#2", "ProfilerStep#3"]
    assert len(complete(trace, "mm")) == 3 + 4
    for mm in complete(trace, "mm"):
        assert parent_of(trace, mm)["name"].startswith("ProfilerStep#")


def test_schedule_repeat_and_custom_callable():
    cycles = []
    with profile(schedule=schedule(wait=0, warmup=0, active=1, repeat=2),
                 on_trace_ready=lambda p: cycles.append(
                     {r.key: r.count for r in p.key_averages()}.get("add", 0))) as prof:
        for _ in range(4):
            kiln.ones(2) + 1
            prof.step()
    assert cycles == [1, 1]

    def every_other(step):
        return ProfilerAction.RECORD_AND_SAVE if step % 2 else ProfilerAction.NONE

    seen = []
    with profile(schedule=every_other, on_trace_ready=lambda p: seen.append(p.step_num)) as prof:
        for _ in range(4):
            prof.step()
    assert seen == [2, 4]


def test_key_averages_counts_and_table():
    a, b, c = kiln.ones(2, 3), kiln.ones(3, 2), kiln.ones(3, 3)
    with profile(record_shapes=True) as prof:
        for _ in range(3):
            a.mm(b)
        for _ in range(2):
            c.mm(c)
    rows = {r.key: r for r in prof.key_averages()}
    assert rows["mm"].count == 5
    assert rows["mm"].self_cpu_time_total <= rows["mm"].cpu_time_total
    assert rows["mm"].cpu_time == pytest.approx(rows["mm"].cpu_time_total / 5)
    shaped = {r.input_shapes: r.count for r in prof.key_averages(group_by_input_shape=True)
              if r.key == "mm"}
    assert shaped == {"[[2, 3], [3, 2]]": 3, "[[3, 3], [3, 3]]": 2}
    table = prof.key_averages(group_by_input_shape=True).table(sort_by="count", row_limit=1)
    lines = table.splitlines()
    assert "Name" in lines[1] and "# of Calls" in lines[1] and "Input Shapes" in lines[1]
    assert lines[3].split()[0] == "mm" and "[[2, 3], [3, 2]]" in lines[3]
    assert lines[-1].startswith("Self CPU time total")
    assert len(lines) == 6  # rule, header, rule, one row, rule, total


def test_bad_input(tmp_path):
    with pytest.raises(ValueError, match="wait must be >= 0"):
        schedule(wait=-1, warmup=0, active=1)
    with pytest.raises(ValueError, match="active must be >= 1"):
        schedule(wait=0, warmup=0, active=0)
    with pytest.raises(ValueError, match="repeat must be >= 0"):
        schedule(wait=0, warmup=0, active=1, repeat=-3)
    with pytest.raises(TypeError, match="warmup must be an int"):
        schedule(wait=0, warmup=1.5, active=1)
    with pytest.raises(TypeError, match="activities"):
        profile(activities=["cpu"])
    with pytest.warns(UserWarning, match="with_stack and with_modules are ignored"):
        profile(with_stack=True)
    with pytest.warns(UserWarning, match="CUDA ops from the host side"):
        profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
    with pytest.raises(RuntimeError, match="has not been started"):
        profile().export_chrome_trace(str(tmp_path / "x.json"))
    with profile(schedule=schedule(wait=1, warmup=0, active=1)) as prof:
        with pytest.raises(RuntimeError, match="no trace has been collected yet"):
            prof.export_chrome_trace(str(tmp_path / "x.json"))
        with pytest.raises(RuntimeError, match="already running"):
            with profile():
                pass
    bad = "/nonexistent_kiln_dir/trace.json"
    with profile() as prof:
        kiln.ones(1)
    with pytest.raises(RuntimeError, match="cannot open '/nonexistent_kiln_dir/trace.json'"):
        prof.export_chrome_trace(bad)
    with pytest.raises(ValueError, match="unknown sort_by 'bogus'"):
        prof.key_averages().table(sort_by="bogus")
    with pytest.raises(ValueError, match="record_shapes"):
        prof.key_averages(group_by_input_shape=True)
    with pytest.raises(RuntimeError, match="not running"):
        prof.step()


def test_off_outside_the_block(tmp_path):
    a = kiln.ones(2, 2)
    with profile() as prof:
        a.mm(a)
    a.mm(a)  # after the block: not recorded anywhere
    with profile() as prof2:
        pass
    assert len(complete(trace_of(prof, tmp_path), "mm")) == 1
    assert not complete(trace_of(prof2, tmp_path, "t2.json"), "mm")


def test_tensorboard_trace_handler(tmp_path):
    with profile(schedule=schedule(wait=0, warmup=0, active=1, repeat=2),
                 on_trace_ready=tensorboard_trace_handler(str(tmp_path / "tb"), "w0")) as prof:
        for _ in range(3):
            kiln.ones(2).sum()
            prof.step()
    files = sorted(os.listdir(tmp_path / "tb"))
    assert len(files) == 2 and all(f.startswith("w0.") and f.endswith(".pt.trace.json")
                                   for f in files)
    with open(tmp_path / "tb" / files[0]) as f:
        check_structure(json.load(f))


def _chargpt():
    return load_example("chargpt")


def test_gpt_ten_steps_trace_size(tmp_path):
    """The issue's bar: 10 steps of the chargpt GPT (4 layers, width 256, batch 16 x 128) with
    shapes, memory and FLOPs write at most 20 MB of trace."""
    kiln.manual_seed(0)
    model = _chargpt().GPT()
    opt = kiln.optim.AdamW(model.parameters(), lr=1e-3)
    g = kiln.Generator()
    g.manual_seed(0)
    with profile(record_shapes=True, profile_memory=True, with_flops=True) as prof:
        for _ in range(10):
            idx = kiln.randint(0, 256, (16, 129), generator=g)
            x, y = idx[:, :-1].contiguous(), idx[:, 1:].contiguous()
            with record_function("forward"):
                loss = F.cross_entropy(model(x).view(-1, 256), y.view(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            prof.step()
    path = tmp_path / "gpt.json"
    prof.export_chrome_trace(str(path))
    size = os.path.getsize(path)
    assert size <= 20 * 1024 * 1024, f"10 GPT steps wrote {size / 1e6:.1f} MB"
    with open(path) as f:
        trace = json.load(f)
    check_structure(trace)
    # ProfilerStep#0..9, and #10 from the last step() to the end of the block (as PyTorch)
    steps = {e["name"]: e for e in complete(trace) if e["cat"] == "profiler_step"}
    assert sorted(steps) == sorted(f"ProfilerStep#{i}" for i in range(11))
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in steps.values())
    for e in complete(trace):
        if e["cat"] == "cpu_op":  # every op lies inside a step range
            i = bisect.bisect_right(spans, (e["ts"], float("inf"))) - 1
            assert i >= 0 and e["ts"] + e["dur"] <= spans[i][1] + 1e-3, e
    assert len(complete(trace, "forward")) == 10
    rows = {r.key: r for r in prof.key_averages()}
    assert rows["forward"].count == 10
    assert rows["linear"].flops > 0
    print(f"10 GPT steps: {size / 1e6:.2f} MB, {len(trace['traceEvents'])} events")
