"""tests/_op_tape.py, the CPU stand-in for a CUDA graph's replay: it reads the current contents of the region's
inputs, re-makes the region's own tensors, writes into the captured outputs, freezes the region's Python decisions
and refuses host reads, as a real capture and replay do."""

from __future__ import annotations

import pytest
import torch

from _op_tape import record


def test_a_replay_reads_the_inputs_as_they_are_now_into_the_captured_outputs():
    buffer = torch.tensor([1.0, 2.0, 3.0])
    scratch = torch.zeros(3)

    def region(x):
        made = torch.arange(3, dtype=x.dtype) * x  # (3,) made inside the region, like an intermediate's memory
        scratch.copy_(made)  # an in-place write into state outside the region
        return (made.cumsum(0), scratch + 1)

    graph, outputs = record(region, buffer)
    assert outputs[0].tolist() == [0.0, 2.0, 8.0]
    buffer.copy_(torch.tensor([5.0, 5.0, 5.0]))
    scratch.zero_()
    graph.replay()
    assert outputs[0].tolist() == [0.0, 5.0, 15.0]  # the new input, through the region's recorded ops
    assert scratch.tolist() == [0.0, 5.0, 10.0] and outputs[1].tolist() == [1.0, 6.0, 11.0]


def test_python_decisions_taken_during_the_capture_stay_taken():
    state = {"calls": 0}
    buffer = torch.ones(2)

    def region(x):
        state["calls"] += 1
        scale = 10.0 if state["calls"] <= 3 else -1.0  # the warm-ups and the capture see 10: it is recorded
        return (x * scale,)

    graph, outputs = record(region, buffer)
    assert state["calls"] == 3 and outputs[0].tolist() == [10.0, 10.0]
    buffer.fill_(2.0)
    graph.replay()  # re-running the Python would now multiply by -1; the recorded op multiplies by 10
    assert outputs[0].tolist() == [20.0, 20.0] and state["calls"] == 3


@pytest.mark.parametrize("inference", [False, True], ids=["grad-mode", "inference-mode"])
@pytest.mark.parametrize("read", [lambda t: t.item(), int, float, lambda t: t.tolist()],
                         ids=["item", "int", "float", "tolist"])
def test_a_host_read_inside_the_region_is_refused(read, inference):
    """In every form, and under inference mode too, where the engine runs: there a CPU tensor's item() dispatches
    aten.item, not _local_scalar_dense, and tolist() only resolve_conj and resolve_neg (once missed: a host read in
    a captured EAGLE draft step replayed without complaint)."""
    with torch.inference_mode(inference), pytest.raises(RuntimeError, match="reads the device inside a captured region"):
        record(lambda x: (x * read(x.sum()),), torch.ones(2))


@pytest.mark.parametrize("region", [
    lambda x: (x[x > 0],),  # boolean indexing: nonzero
    lambda x: (x.index_put_((x > 0,), torch.zeros(())),),  # a boolean mask's assignment
    lambda x: (torch.masked_select(x, x > 0),),
    lambda x: (torch.unique(x),),
    lambda x: (torch.repeat_interleave(x, torch.ones(2, dtype=torch.long)),),  # its size from the data
    lambda x: (x + torch.tensor([1.0, 2.0]),),  # an upload from Python data
    lambda x: (x.to("meta"),),  # a copy to another device
], ids=["bool-index", "bool-index-put", "masked-select", "unique", "repeat-interleave", "python-data", "other-device"])
def test_ops_that_read_the_device_on_cuda_are_refused_on_the_cpu_too(region):
    with pytest.raises(RuntimeError, match="reads the device inside a captured region"):
        record(region, torch.ones(2))


def test_repeat_interleave_with_its_output_size_is_allowed():
    graph, outputs = record(lambda x: (torch.repeat_interleave(x, torch.ones(2, dtype=torch.long), output_size=2),),
                            torch.ones(2))
    graph.replay()
    assert outputs[0].tolist() == [1.0, 1.0]
